"""How an answer leaves: one JSON body, or server-sent events exactly as OpenAI frames them: `data: <json>\\n\\n` per
chunk, `data: [DONE]` last. Every delta is written as soon as the engine gives
it (nothing buffered); the request record rides on the final chunk, the usage
chunk when `stream_options.include_usage` is set.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.responses import Response, StreamingResponse

from app.api.errors import api_error_for
from app.api.generation import Collected, Generation, collect, engine_headers
from app.api.protocol import ChatCompletionChunk, CompletionResponse, SamplingFields, Usage
from app.engines.base import ChoiceDelta, EngineError
from app.metrics import RequestRecord

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"

Chunk = ChatCompletionChunk | CompletionResponse


class ChunkRenderer(Protocol):
    def deltas(self, choices: Sequence[ChoiceDelta]) -> list[Chunk]: ...

    def empty(self) -> Chunk: ...


def usage_of(record: RequestRecord) -> Usage:
    return Usage(
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        total_tokens=record.prompt_tokens + record.completion_tokens,
    )


def sse_event(chunk: Chunk, include_usage: bool) -> str:
    exclude = set()
    if not include_usage:
        exclude.add("usage")
    if chunk.specgate is None:
        exclude.add("specgate")
    return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"


async def sse_events(
    generation: Generation, renderer: ChunkRenderer, include_usage: bool
) -> AsyncIterator[str]:
    try:
        async for out in generation.outputs():
            chunks = renderer.deltas(out.choices)
            if out.record is not None:
                if include_usage or not chunks:
                    chunks.append(renderer.empty())
                last = chunks[-1]
                last.specgate = out.record.to_dict()
                if include_usage:
                    last.usage = usage_of(out.record)
            for chunk in chunks:
                yield sse_event(chunk, include_usage)
        yield DONE
    except EngineError as exc:
        # Headers are gone: the error travels as an event, then the stream ends.
        yield api_error_for(exc).sse()
        yield DONE
    except Exception:
        logger.exception("stream %s failed", generation.request_id)
        yield api_error_for(RuntimeError()).sse()
        yield DONE
    finally:
        await generation.close()


def sse_response(events: AsyncIterator[str | bytes], headers: Mapping[str, str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def respond(
    generation: Generation,
    body: SamplingFields,
    renderer: ChunkRenderer,
    build: Callable[[Collected], BaseModel],
) -> Response:
    """Stream the generation as SSE, or collect it into the body `build` makes."""
    headers = engine_headers(generation.engine)
    if body.stream:
        return sse_response(sse_events(generation, renderer, body.include_usage), headers)
    collected = await collect(generation)
    return JSONResponse(build(collected).model_dump(mode="json"), headers=headers)
