"""vLLM's own OpenAI serving layer over one in-process engine, built the way
`vllm serve` builds it: its argument parser reads the same command line
`specgate vllm-command` prints, `build_app` makes its FastAPI application and
`init_app_state` its serving objects (chat, completions, responses, Anthropic
messages, tokenization) over the engine. So every field, default, validation
error and streamed event of a request routed to the engine is vLLM's.
"""

from __future__ import annotations

import dataclasses
import logging
from argparse import Namespace
from types import SimpleNamespace
from typing import Any, NoReturn

from fastapi import FastAPI
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from vllm import __version__ as VLLM_VERSION
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app
from vllm.exceptions import VLLMError
from vllm.utils.argparse_utils import FlexibleArgumentParser

from app.config import ModelConfig
from app.engines.base import EngineConfigError, EngineId
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
    "build_serving_app",
    "make_arg_parser",
    "serving_args",
    "validate_api_server_args",
    "validate_parsed_serve_args",
]


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
