"""Calling an engine's application with a body of the gateway's choosing: the
one step every request takes, the client's and the shadows' (app/api/shadow.py)."""

from __future__ import annotations

from app.api.body_limit import replay_body
from app.engines.base import ASGIReceive, ASGIScope, ASGISend
from app.engines.pool import PoolEngine
from app.engines.tap import CURRENT_TAP, RequestTap

# The scope keys the gateway's own router set; the engine's application sets its own.
_ROUTER_KEYS = (
    "app",
    "router",
    "endpoint",
    "route",
    "path_params",
    "fastapi_astack",
    "fastapi_inner_astack",
    "fastapi_function_astack",
)


async def dispatch(
    engine: PoolEngine,
    scope: ASGIScope,
    receive: ASGIReceive,
    send: ASGISend,
    body: bytes,
    tap: RequestTap | None,
) -> None:
    """Call the engine's application with `body` as the request body; `tap` is the
    current request's tap while it runs (and in every task it starts)."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
    inner = {k: v for k, v in scope.items() if k not in _ROUTER_KEYS}
    inner["headers"] = [*headers, (b"content-length", str(len(body)).encode())]
    token = CURRENT_TAP.set(tap)
    try:
        await engine.handle(inner, replay_body(body, receive), send)
    finally:
        CURRENT_TAP.reset(token)
