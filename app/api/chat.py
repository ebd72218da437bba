"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.api.generation import (
    Collected,
    cancel_on_disconnect,
    new_request_id,
    resolve_engine,
    sampling_from,
    start_generation,
)
from app.api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    LogprobEntry,
    TopLogprobEntry,
)
from app.api.proxy import forward
from app.api.security import require_api_key
from app.api.sse import Chunk, respond, usage_of
from app.api.state import GatewayState, gateway_state
from app.engines.base import ChatPrompt, ChoiceDelta, TokenLogprob
from app.engines.remote import RemoteVLLMEngine

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None, dependencies=[Depends(require_api_key)])
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: GatewayState = Depends(gateway_state)
) -> Response:
    return await cancel_on_disconnect(request, _serve(body, request, state))


async def _serve(body: ChatCompletionRequest, request: Request, state: GatewayState) -> Response:
    routed = resolve_engine(state, request, body)
    engine = routed.engine
    if isinstance(engine, RemoteVLLMEngine):
        return await forward(state, engine, "/v1/chat/completions", body, routed.decision, new_request_id("chatcmpl"))
    prompt = ChatPrompt([m.to_engine() for m in body.messages], body.chat_template_kwargs or {})
    sampling = sampling_from(body, body.output_limit(), body.logprobs_k())
    generation = await start_generation(state, engine, prompt, sampling, new_request_id("chatcmpl"), routed.decision)
    request_id, model, logprobs = generation.request_id, str(engine.id), body.logprobs
    renderer = _ChunkRenderer(request_id, model, logprobs)
    return await respond(generation, body, renderer, lambda c: _response(request_id, model, c, logprobs))


def _response(
    request_id: str, model: str, collected: Collected, logprobs: bool
) -> ChatCompletionResponse:
    choices = [
        ChatChoice(
            index=index,
            message=AssistantMessage(content="".join(choice.text)),
            logprobs=_logprobs(choice.logprobs) if logprobs else None,
            finish_reason=choice.finish_reason,
        )
        for index, choice in sorted(collected.choices.items())
    ]
    return ChatCompletionResponse(
        id=request_id,
        model=model,
        choices=choices,
        usage=usage_of(collected.record),
        specgate=collected.record.to_dict(),
    )


def _logprobs(tokens: Sequence[TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            LogprobEntry(
                token=t.token,
                logprob=t.logprob,
                bytes=list(t.token.encode()),
                top_logprobs=[
                    TopLogprobEntry(token=top.token, logprob=top.logprob, bytes=list(top.token.encode()))
                    for top in t.top
                ],
            )
            for t in tokens
        ]
    )


class _ChunkRenderer:
    def __init__(self, request_id: str, model: str, logprobs: bool) -> None:
        self._id, self._model, self._created = request_id, model, int(time.time())
        self._logprobs = logprobs
        self._started: set[int] = set()

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self._id, model=self._model, created=self._created, choices=choices)

    def deltas(self, choices: Sequence[ChoiceDelta]) -> list[Chunk]:
        chunks: list[Chunk] = []
        for delta in choices:
            if delta.index not in self._started:
                # OpenAI opens each choice with a role-only delta.
                self._started.add(delta.index)
                role = ChatChunkChoice(index=delta.index, delta=ChatDelta(role="assistant", content=""))
                chunks.append(self._chunk([role]))
            choice = ChatChunkChoice(
                index=delta.index,
                delta=ChatDelta(content=delta.text),
                logprobs=_logprobs(delta.logprobs or ()) if self._logprobs else None,
                finish_reason=delta.finish_reason,
            )
            chunks.append(self._chunk([choice]))
        return chunks

    def empty(self) -> Chunk:
        return self._chunk([])
