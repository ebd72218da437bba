"""The routes of vLLM's OpenAI serving layer that the gateway serves: each one is
routed to an engine and answered there (app/api/exchange.py), so every field a
client sends means what it means to `vllm serve`. `/v1/models` stays specgate's
own (app/api/system.py); docs/api.md lists what vLLM serves and specgate does not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.responses import Response

from app.api.errors import APIError, error_response
from app.api.exchange import serve_generation, serve_other
from app.api.security import check_api_key, require_api_key
from app.api.state import GatewayState, gateway_state
from app.engines.base import ASGIReceive, ASGIScope, ASGISend

# Routes that generate: admitted, recorded, counted. The value: the usage carries
# OpenAI's accepted/rejected prediction tokens (chat and text completions).
GENERATION_ROUTES: dict[str, bool] = {
    "/v1/chat/completions": True,
    "/v1/chat/completions/batch": True,
    "/v1/completions": True,
    "/v1/responses": False,
    "/v1/messages": False,
    "/inference/v1/generate": False,
}
# Routes answered by the model's engine that generate nothing: no admission, no record.
OTHER_ROUTES = (
    "/tokenize",
    "/detokenize",
    "/v1/messages/count_tokens",
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/responses/render",
    "/v1/messages/render",
)

router = APIRouter(dependencies=[Depends(require_api_key)])

Route = Callable[[Request, GatewayState], Awaitable[Response]]


def _generation(usage_details: bool) -> Route:
    async def generate(request: Request, state: GatewayState = Depends(gateway_state)) -> Response:
        return await serve_generation(state, request, usage_details)

    return generate


async def _other(request: Request, state: GatewayState = Depends(gateway_state)) -> Response:
    return await serve_other(state, request)


class EngineRoutes:
    """Answers the routes above before FastAPI's router does, with the same handlers
    and the same key check: FastAPI would resolve the routes' dependencies per request
    (Request objects, exit stacks, dependency solving), a cost `vllm serve` does not
    have in front of the same serving layer. The routes stay registered below, for
    the OpenAPI schema; any other method or path goes on to FastAPI."""

    def __init__(self, app: Callable[[ASGIScope, ASGIReceive, ASGISend], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        path = scope.get("path", "")
        generation = GENERATION_ROUTES.get(path)
        if scope["type"] != "http" or scope["method"] != "POST" or (generation is None and path not in _OTHER):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        state: GatewayState = scope["app"].state.gateway
        try:
            check_api_key(request)
            if generation is None:
                response = await serve_other(state, request)
            else:
                response = await serve_generation(state, request, generation)
        except APIError as exc:
            response = error_response(exc)
        await response(scope, receive, send)


_OTHER = frozenset(OTHER_ROUTES)

for _path, _details in GENERATION_ROUTES.items():
    router.add_api_route(_path, _generation(_details), methods=["POST"], response_model=None)
for _path in OTHER_ROUTES:
    router.add_api_route(_path, _other, methods=["POST"], response_model=None)


def request_models() -> dict[str, type[BaseModel]]:
    """vLLM's request models of the routes, for the OpenAPI schema only: the gateway
    never parses a body with them (the engine's serving layer does)."""
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import BatchChatCompletionRequest, ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeCompletionRequest

    return {
        "/v1/chat/completions": ChatCompletionRequest,
        "/v1/chat/completions/batch": BatchChatCompletionRequest,
        "/v1/completions": CompletionRequest,
        "/v1/responses": ResponsesRequest,
        "/v1/messages": AnthropicMessagesRequest,
        "/v1/messages/count_tokens": AnthropicCountTokensRequest,
        "/tokenize": TokenizeCompletionRequest,
        "/detokenize": DetokenizeRequest,
        "/v1/chat/completions/render": ChatCompletionRequest,
        "/v1/completions/render": CompletionRequest,
        "/v1/responses/render": ResponsesRequest,
        "/v1/messages/render": AnthropicMessagesRequest,
    }


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema of the gateway, with vLLM's request bodies on the routes above."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        models = request_models()
        names, defs = models_json_schema(
            [(m, "validation") for m in models.values()], ref_template="#/components/schemas/{model}"
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        for path, model in models.items():
            body = {"required": True, "content": {"application/json": {"schema": names[(model, "validation")]}}}
            schema["paths"][path]["post"]["requestBody"] = body
        app.openapi_schema = schema
    return app.openapi_schema
