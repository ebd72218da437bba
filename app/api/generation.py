"""What chat and text completions share: find the engine, start the generation
(so that a request the engine refuses still gets a proper 4xx status, before
any byte of a stream is sent), collect a non-streamed answer, abort on
disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field, replace

from fastapi import Request
from starlette.responses import Response

from app.api.admission import admit
from app.api.errors import (
    APIError,
    ModelNotFoundError,
    ServiceUnavailableError,
    api_error_for,
)
from app.api.protocol import SamplingFields
from app.api.state import GatewayState
from app.api.tracking import RequestTracker, failure_outcome
from app.engines.base import (
    ChoiceDelta,
    Engine,
    EngineError,
    EngineOutput,
    GeneratingEngine,
    Prompt,
    Sampling,
    TokenLogprob,
)
from app.engines.clock import RequestClock
from app.engines.pool import PoolEngine
from app.metrics import RequestRecord, RouteDecision
from app.policies.base import RouteRequest
from app.routing import METHOD_HEADER, RouteNotFoundError


def sampling_from(body: SamplingFields, max_tokens: int | None, logprobs: int | None) -> Sampling:
    return Sampling(
        n=body.n,
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=body.seed,
        stop=body.stop_list(),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias=body.logit_bias,
        logprobs=logprobs,
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
    )


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Routed:
    engine: PoolEngine
    decision: RouteDecision


def resolve_engine(state: GatewayState, request: Request, body: SamplingFields) -> Routed:
    if state.draining:
        raise ServiceUnavailableError("The server is shutting down; retry on another replica.")
    wanted = RouteRequest(prompt_text=body.prompt_text, temperature=body.temperature, user=body.user)
    try:
        route = state.router.route(body.model, request.headers.get(METHOD_HEADER), wanted)
    except RouteNotFoundError as exc:
        raise ModelNotFoundError(str(exc), param="model") from None
    engine = state.pool.get(route.engine)
    if engine is None:
        raise ModelNotFoundError(f"The model '{body.model}' does not exist.", param="model")
    decision = route.decision
    state.metrics.decisions.labels(route.engine.model, decision.policy, route.engine.method, decision.reason).inc()
    return Routed(engine, decision)


def engine_headers(engine: Engine) -> dict[str, str]:
    return {METHOD_HEADER: engine.id.method, "X-Specgate-Engine": str(engine.id)}


@dataclass
class Generation:
    """A started generation: its first output and the rest of the stream."""

    engine: GeneratingEngine
    request_id: str
    first: EngineOutput
    rest: AsyncIterator[EngineOutput]
    tracker: RequestTracker
    clock: RequestClock
    finished: bool = False

    async def outputs(self) -> AsyncIterator[EngineOutput]:
        try:
            async for out in self._outputs():
                if out.record is not None:
                    self.finished = True
                    out = replace(out, record=self.tracker.finish(out.record))
                yield out
        except EngineError as exc:
            self.tracker.fail(failure_outcome(exc))
            raise

    async def _outputs(self) -> AsyncIterator[EngineOutput]:
        yield self.first
        if self.first.finished:
            return
        while True:
            try:
                async with self.clock.wait():
                    out = await anext(self.rest)
            except StopAsyncIteration:
                return
            yield out

    async def close(self) -> None:
        """Abort the engine request if it is still running (idempotent)."""
        await self.rest.aclose()  # type: ignore[attr-defined]
        if not self.finished:
            await self.engine.abort(self.request_id)
            self.tracker.fail("cancelled")


async def start_generation(
    state: GatewayState, engine: GeneratingEngine, prompt: Prompt, sampling: Sampling, request_id: str,
    decision: RouteDecision | None = None,
) -> Generation:
    admitted = await admit(state.admissions[engine.id], state.metrics, request_id, decision, state.router.observe)
    tracker = admitted.tracker
    stream = engine.generate(prompt, sampling, request_id)
    try:
        async with admitted.clock.wait():
            first = await anext(stream)
    except EngineError as exc:
        tracker.fail(failure_outcome(exc))
        await _abandon(stream, engine, request_id)
        raise api_error_for(exc) from None
    except StopAsyncIteration:
        tracker.fail("error")
        raise ServiceUnavailableError(f"engine {engine.id} ended the request without output") from None
    except BaseException:
        tracker.fail("cancelled")
        await _abandon(stream, engine, request_id)
        raise
    # Mirrored only once the engine has accepted the request: a refused one has nothing to compare.
    state.shadows.mirror(state, engine.id, prompt, sampling, tracker)
    return Generation(engine, request_id, first, stream, tracker, admitted.clock)


async def _abandon(stream: AsyncIterator[EngineOutput], engine: GeneratingEngine, request_id: str) -> None:
    await stream.aclose()  # type: ignore[attr-defined]
    await engine.abort(request_id)


@dataclass
class ChoiceText:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Collected:
    prompt_tokens: int
    choices: dict[int, ChoiceText]
    record: RequestRecord


async def collect(generation: Generation) -> Collected:
    choices: dict[int, ChoiceText] = {}
    record: RequestRecord | None = None
    prompt_tokens = generation.first.prompt_tokens
    try:
        async for out in generation.outputs():
            for delta in out.choices:
                _append(choices.setdefault(delta.index, ChoiceText()), delta)
            record = out.record or record
    except EngineError as exc:
        raise api_error_for(exc) from None
    finally:
        await generation.close()
    if record is None:
        raise ServiceUnavailableError(f"engine {generation.engine.id} stopped before finishing the request")
    return Collected(prompt_tokens, choices, record)


def _append(choice: ChoiceText, delta: ChoiceDelta) -> None:
    choice.text.append(delta.text)
    if delta.logprobs:
        choice.logprobs.extend(delta.logprobs)
    if delta.finish_reason is not None:
        choice.finish_reason = delta.finish_reason


async def cancel_on_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Run `work`, cancelling it (and so aborting its engine request) if the
    client goes away first: vLLM's `with_cancellation` pattern, because a
    non-streamed request otherwise runs on in the engine for nobody."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, APIError):
        await task
    return Response(status_code=499)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
