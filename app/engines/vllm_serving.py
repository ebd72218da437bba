"""vLLM's own OpenAI serving layer over one in-process engine, built the way
`vllm serve` builds it: its argument parser reads the same command line
`specgate vllm-command` prints, `build_app` makes its FastAPI application and
`init_app_state` its serving objects (chat, completions, responses, Anthropic
messages, tokenization) over the engine. So every field, default, validation
error and streamed event of a request routed to the engine is vLLM's.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from argparse import Namespace
from contextlib import AsyncExitStack
from types import SimpleNamespace
from typing import Any, NoReturn

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from vllm import __version__ as VLLM_VERSION
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app
from vllm.exceptions import VLLMError
from vllm.utils.argparse_utils import FlexibleArgumentParser

from app.config import ModelConfig
from app.engines.base import ASGIReceive, ASGIScope, ASGISend, EngineConfigError, EngineId
from app.engines.vllm_command import serve_args

# vLLM 0.33 moved `vllm serve`'s parser and its start-up checks to entrypoints.common
# (the CPU build is 0.32, GPU hosts run 0.33: scripts/gpu_install.py).
if tuple(int(p) for p in VLLM_VERSION.split(".")[:2] if p.isdigit()) >= (0, 33):
    from vllm.entrypoints.common.cli_args import (  # type: ignore[import-not-found, unused-ignore]
        make_arg_parser,
        validate_api_server_args,
        validate_parsed_serve_args,
    )
else:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args

__all__ = [
    "ServingRoutes",
    "build_serving_app",
    "make_arg_parser",
    "serving_args",
    "validate_api_server_args",
    "validate_parsed_serve_args",
]


logger = logging.getLogger("specgate")


class _Refusal(Exception):
    pass


def serving_args(engine_id: EngineId, model: ModelConfig) -> Namespace:
    """The parsed `vllm serve` arguments of one engine, checked by vLLM's own parser
    and its start-up checks; a refusal names the engine."""
    parser = make_arg_parser(FlexibleArgumentParser())

    def refuse(message: str) -> NoReturn:
        raise _Refusal(message)

    parser.error = refuse  # argparse would exit the process
    try:
        args = parser.parse_args(["--model", *serve_args(engine_id.model, model, engine_id.method)])
        validate_parsed_serve_args(args)
        # `vllm serve` merges the parser flag into its structured-outputs config as a side
        # effect of building its engine; the engine is built apart here, so merge a copy.
        if args.reasoning_parser:
            args.structured_outputs_config = dataclasses.replace(
                args.structured_outputs_config, reasoning_parser=args.reasoning_parser
            )
        validate_api_server_args(args)  # the tool and reasoning parsers exist
    except (_Refusal, VLLMError, TypeError, ValueError, KeyError) as exc:
        text = (exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise EngineConfigError(f"vLLM rejected the serving options of engine {engine_id}: {first}") from None
    # Responses name the engine (`model:method`), as every specgate answer does.
    args.served_model_name = [str(engine_id)]
    # CORS is the gateway's policy (`cors_origins`): vLLM's application allows no
    # origin of its own unless the serving options name some (older vLLMs allowed all).
    if "allowed_origins" not in model.serving.extra_args:
        args.allowed_origins = []
    parsed: Namespace = args
    return parsed


async def build_serving_app(engine_client: Any, args: Namespace) -> FastAPI:
    """vLLM's application and serving state over `engine_client`. Its lifespan never
    runs: the gateway owns the engine's life, and only its routes are used."""
    tasks = await engine_client.get_supported_tasks()
    root = logging.getLogger()
    level = root.level
    try:
        app = build_app(args, tasks, engine_client.model_config)
        await init_app_state(engine_client, app.state, args, tasks)
    finally:
        # Something vLLM imports while building its app sets the root logger to ERROR,
        # which silenced the gateway's own INFO lines (the access log among them).
        root.setLevel(level)
    # vLLM's handler of a dead engine stops the uvicorn server it finds here; the
    # gateway restarts the engine instead and keeps serving the others.
    app.state.server = SimpleNamespace(should_exit=False)
    # vLLM's HTTP metrics middleware counts requests for its own /metrics, which no
    # client reaches behind the gateway (specgate counts each request itself); it
    # was about 7% of the gateway process's samples under load (py-spy).
    app.user_middleware = [m for m in app.user_middleware if m.cls is not PrometheusInstrumentatorMiddleware]
    app.middleware_stack = None  # Starlette builds it at the first request
    served: FastAPI = app
    return served


class ServingRoutes:
    """vLLM's application as the gateway calls it: each of its own routes directly,
    without the middleware stack around them.

    That stack is Starlette's error middleware, vLLM's CORS, its elastic-EP scaling
    check and the exception middleware. Behind the gateway, every streamed event
    passed through three of them, on top of the gateway's own layers, and none has
    anything to do there:
    - vLLM's CORS allows no origin unless its serving options name some (CORS is
      the gateway's policy, `cors_origins`);
    - nothing scales an engine in the gateway;
    - vLLM's exception handlers still answer every error, by the route's own
      handling, the same way for the same exception.

    When the serving options add middleware of their own (CORS origins, request-id
    headers, an API key, `--middleware`), or a path is not one of the app's plain
    routes, the whole application answers, as before."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        extra = [m.cls for m in app.user_middleware if not _idle(m)]
        self._routes: dict[tuple[str, str], APIRoute] = {}
        if extra:
            names = ", ".join(sorted(getattr(cls, "__name__", str(cls)) for cls in extra))
            logger.info("vLLM's serving options add middleware (%s): its whole application answers", names)
        else:
            for route in app.router.routes:
                if isinstance(route, APIRoute) and not route.param_convertors:
                    for method in route.methods:
                        self._routes[(route.path, method)] = route
        exceptions: dict[Any, Any] = {}
        statuses: dict[int, Any] = {}
        for key, handler in app.exception_handlers.items():
            if isinstance(key, int):
                statuses[key] = handler
            else:
                exceptions[key] = handler
        # Starlette gives the handler of Exception (or 500) to its error middleware,
        # which logs the error and answers with it: the route's handling does both here.
        fallback = exceptions.pop(Exception, None) or statuses.pop(500, None)
        if fallback is not None:
            exceptions[Exception] = _logged(fallback)
        self._handlers = (exceptions, statuses)

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        route = self._routes.get((scope["path"], scope["method"]))
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # vLLM's handlers find their serving objects on app.state
        scope["router"] = self.app.router
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        scope["starlette.exception_handlers"] = self._handlers
        async with AsyncExitStack() as stack:
            scope["fastapi_middleware_astack"] = stack
            await route.app(scope, receive, send)


def _idle(middleware: Any) -> bool:
    """Middleware of vLLM's application that does nothing behind the gateway."""
    cls, options = middleware.cls, middleware.kwargs
    if cls is CORSMiddleware:
        return not options.get("allow_origins") and not options.get("allow_origin_regex")
    # The scaling check by name: vLLM has moved its modules between releases (0.32 here, 0.33 on GPUs).
    return cls is PrometheusInstrumentatorMiddleware or getattr(cls, "__name__", "") == "ScalingMiddleware"


def _logged(handler: Any) -> Any:
    async def answer(request: Request, exc: Exception) -> Response:
        logger.error("error in vLLM's serving layer on %s", request.url.path, exc_info=exc)
        response = handler(request, exc)
        answered: Response = await response if inspect.isawaitable(response) else response
        return answered

    return answer
