"""POST /v1/completions (legacy text completions)."""

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
from app.api.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from app.api.proxy import forward
from app.api.security import require_api_key
from app.api.sse import Chunk, respond, usage_of
from app.api.state import GatewayState, gateway_state
from app.engines.base import ChoiceDelta, TextPrompt, TokenLogprob
from app.engines.remote import RemoteVLLMEngine

router = APIRouter()


@router.post("/v1/completions", response_model=None, dependencies=[Depends(require_api_key)])
async def create_completion(
    body: CompletionRequest, request: Request, state: GatewayState = Depends(gateway_state)
) -> Response:
    return await cancel_on_disconnect(request, _serve(body, request, state))


async def _serve(body: CompletionRequest, request: Request, state: GatewayState) -> Response:
    routed = resolve_engine(state, request, body)
    engine = routed.engine
    raw = body.single_prompt()
    if isinstance(engine, RemoteVLLMEngine):
        return await forward(state, engine, "/v1/completions", body, routed.decision, new_request_id("cmpl"))
    prompt = TextPrompt(text=raw) if isinstance(raw, str) else TextPrompt(token_ids=raw)
    sampling = sampling_from(body, body.max_tokens, body.logprobs)
    generation = await start_generation(state, engine, prompt, sampling, new_request_id("cmpl"), routed.decision)
    request_id, model, logprobs = generation.request_id, str(engine.id), body.logprobs is not None
    renderer = _ChunkRenderer(request_id, model, logprobs)
    return await respond(generation, body, renderer, lambda c: _response(request_id, model, c, logprobs))


def _response(request_id: str, model: str, collected: Collected, logprobs: bool) -> CompletionResponse:
    choices = [
        CompletionChoice(
            index=index,
            text="".join(choice.text),
            logprobs=_logprobs(choice.logprobs, 0) if logprobs else None,
            finish_reason=choice.finish_reason,
        )
        for index, choice in sorted(collected.choices.items())
    ]
    return CompletionResponse(
        id=request_id,
        model=model,
        choices=choices,
        usage=usage_of(collected.record),
        specgate=collected.record.to_dict(),
    )


def _logprobs(tokens: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return CompletionLogprobs(
        tokens=[t.token for t in tokens],
        token_logprobs=[t.logprob for t in tokens],
        top_logprobs=[{top.token: top.logprob for top in t.top} for t in tokens],
        text_offset=offsets,
    )


class _ChunkRenderer:
    def __init__(self, request_id: str, model: str, logprobs: bool) -> None:
        self._id, self._model, self._created = request_id, model, int(time.time())
        self._logprobs = logprobs
        self._offsets: dict[int, int] = {}

    def _chunk(self, choices: list[CompletionChoice]) -> CompletionResponse:
        return CompletionResponse(id=self._id, model=self._model, created=self._created, choices=choices)

    def deltas(self, choices: Sequence[ChoiceDelta]) -> list[Chunk]:
        chunks: list[Chunk] = []
        for delta in choices:
            logprobs = None
            if self._logprobs:
                offset = self._offsets.get(delta.index, 0)
                logprobs = _logprobs(delta.logprobs or (), offset)
                self._offsets[delta.index] = offset + len(delta.text)
            choice = CompletionChoice(
                index=delta.index, text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason
            )
            chunks.append(self._chunk([choice]))
        return chunks

    def empty(self) -> Chunk:
        return self._chunk([])
