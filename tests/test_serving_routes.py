"""`ServingRoutes`: vLLM's routes called without its application's middleware stack,
answering every error with the application's own exception handlers. A small
FastAPI application stands in for vLLM's (built as vLLM builds its own: CORS
middleware allowing no origin, handlers for ValueError and for Exception), so that the error paths a
real engine cannot be made to take on demand are exercised; test_parity compares
the real routes with `vllm serve`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware.cors import CORSMiddleware

from app.engines.vllm_serving import ServingRoutes


class Marker:
    """Middleware that vLLM adds for some serving options (request-id headers, API keys)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["marked"] = True
        await self.app(scope, receive, send)


def application(*middleware: type, origins: tuple[str, ...] = ()) -> FastAPI:
    app = FastAPI()
    app.add_middleware(CORSMiddleware, allow_origins=list(origins))
    for cls in middleware:
        app.add_middleware(cls)
    app.state.answer = "from app.state"

    @app.post("/v1/ok")
    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"state": request.app.state.answer, "marked": request.scope.get("marked", False)})

    @app.post("/v1/value")
    async def value() -> JSONResponse:
        raise ValueError("bad value")

    @app.post("/v1/crash")
    async def crash() -> JSONResponse:
        raise RuntimeError("boom")

    @app.exception_handler(ValueError)
    async def on_value(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError"}}, status_code=400)

    @app.exception_handler(Exception)
    async def on_any(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "InternalServerError"}}, status_code=500)

    return app


def call(
    routes: ServingRoutes, path: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(routes(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


def test_a_route_is_called_directly_with_the_apps_state() -> None:
    status, headers, body = call(ServingRoutes(application()), "/v1/ok", ((b"origin", b"http://elsewhere"),))
    assert status == 200
    assert body == b'{"state":"from app.state","marked":false}'
    assert b"access-control-allow-origin" not in headers


def test_errors_get_the_apps_own_handlers(caplog: pytest.LogCaptureFixture) -> None:
    routes = ServingRoutes(application())
    assert call(routes, "/v1/value")[::2] == (400, b'{"error":{"message":"bad value","type":"BadRequestError"}}')
    with caplog.at_level(logging.ERROR, logger="specgate"):
        status, _, body = call(routes, "/v1/crash")
    assert (status, body) == (500, b'{"error":{"message":"boom","type":"InternalServerError"}}')
    # Starlette's error middleware would have logged it: the route's handling logs it here.
    assert any(r.exc_info and isinstance(r.exc_info[1], RuntimeError) for r in caplog.records)


def test_other_middleware_keeps_the_whole_application() -> None:
    status, _, body = call(ServingRoutes(application(Marker)), "/v1/ok")
    assert status == 200
    assert body == b'{"state":"from app.state","marked":true}'


def test_origins_named_in_the_serving_options_keep_vllms_cors() -> None:
    routes = ServingRoutes(application(origins=("*",)))
    status, headers, _ = call(routes, "/v1/ok", ((b"origin", b"http://elsewhere"),))
    assert status == 200
    assert headers[b"access-control-allow-origin"] == b"*"


def test_an_unknown_path_goes_to_the_whole_application() -> None:
    status, _, _ = call(ServingRoutes(application()), "/v1/nowhere")
    assert status == 404
