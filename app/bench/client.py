"""The load generator: streamed chat completions against any OpenAI-compatible
endpoint, under closed-loop (fixed concurrency) or open-loop (Poisson) load.

Client-side times only (TTFT, inter-chunk gaps, end to end); token counts come
from `usage` and speculative figures from the server's per-request record,
never from counting chunks: a lagging consumer gets several engine steps merged
into one chunk.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.bench.records import Load, RequestResult, SpecSample
from app.bench.workloads import Prompt

TIMEOUT = httpx.Timeout(900, connect=10)


@dataclass(frozen=True)
class Target:
    """What to send as `model`, and how to label its rows."""

    model: str
    method: str
    num_speculative_tokens: int | None = None


@dataclass(frozen=True)
class RequestSettings:
    max_tokens: int = 256
    temperature: float = 0.0
    extra_body: tuple[tuple[str, Any], ...] = ()

    def body(self, target: Target, prompt: Prompt) -> dict[str, Any]:
        return {
            "model": target.model,
            "messages": prompt.to_openai(),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            **dict(self.extra_body),
        }


@dataclass
class _Stream:
    """What one SSE stream told us, as it arrives."""

    sent: float
    first: float | None = None
    last: float | None = None
    gaps: list[float] | None = None
    final: dict[str, Any] | None = None  # the chunk that carried `usage`
    error: str | None = None

    def on_event(self, event: dict[str, Any], now: float) -> None:
        if "error" in event:
            self.error = _error_text(event)
            return
        if event.get("usage") is not None:
            self.final = event
        if any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
            if self.first is None:
                self.first, self.gaps = now, []
            elif self.last is not None and self.gaps is not None:
                self.gaps.append(now - self.last)
            self.last = now


def _error_text(body: dict[str, Any]) -> str:
    error = body.get("error")
    if isinstance(error, dict):
        return f"{error.get('type', 'error')}: {error.get('message', '')}"
    return str(error or body)


async def _read_stream(response: httpx.Response, stream: _Stream) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        stream.on_event(json.loads(data), time.perf_counter())


async def send(
    client: httpx.AsyncClient, target: Target, prompt: Prompt, settings: RequestSettings, load: Load, t0: float
) -> RequestResult:
    """One streamed request; failures become a result with `error` set, never an exception."""
    stream = _Stream(sent=time.perf_counter())
    try:
        async with client.stream("POST", "/v1/chat/completions", json=settings.body(target, prompt)) as response:
            if response.status_code != 200:
                await response.aread()
                stream.error = f"HTTP {response.status_code}: {_error_body(response)}"
            else:
                await _read_stream(response, stream)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    return _result(target, prompt, load, t0, stream, time.perf_counter())


def _error_body(response: httpx.Response) -> str:
    try:
        return _error_text(response.json())
    except ValueError:
        return response.text[:200]


def _result(target: Target, prompt: Prompt, load: Load, t0: float, stream: _Stream, end: float) -> RequestResult:
    final = stream.final or {}
    usage = final.get("usage") or {}
    record: dict[str, Any] = final.get("specgate") or {}
    error = stream.error
    if error is None and stream.final is None:
        error = "stream ended without a usage chunk"
    return RequestResult(
        target=target.model,
        method=target.method,
        num_speculative_tokens=target.num_speculative_tokens,
        workload=prompt.workload,
        load=load,
        prompt_id=prompt.id,
        start_s=stream.sent - t0,
        e2e_s=end - stream.sent,
        ttft_s=None if stream.first is None else stream.first - stream.sent,
        itl_s=tuple(stream.gaps or ()),
        prompt_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
        spec=SpecSample.from_response(final),
        error=error,
        served_by=record.get("method"),
        route_reason=(record.get("route") or {}).get("reason"),
        load_met=(record.get("route") or {}).get("load_met"),
    )


OnDone = Callable[[RequestResult], None]


async def closed_loop(
    client: httpx.AsyncClient,
    target: Target,
    prompts: Sequence[Prompt],
    settings: RequestSettings,
    concurrency: int,
    on_done: OnDone,
    duration_s: float | None = None,
) -> list[RequestResult]:
    """`concurrency` workers take the next prompt as soon as their last answer ended;
    all prompts are sent, or (with `duration_s`) prompts cycle until time is up."""
    load, t0 = Load("concurrency", concurrency), time.perf_counter()
    results: list[RequestResult] = []
    counter = itertools.count()  # shared: each worker takes the next prompt index

    async def worker() -> None:
        for i in counter:
            if duration_s is None and i >= len(prompts):
                return
            if duration_s is not None and time.perf_counter() - t0 >= duration_s:
                return
            result = await send(client, target, prompts[i % len(prompts)], settings, load, t0)
            results.append(result)
            on_done(result)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def open_loop(
    client: httpx.AsyncClient,
    target: Target,
    prompts: Sequence[Prompt],
    settings: RequestSettings,
    rate: float,
    on_done: OnDone,
    duration_s: float | None = None,
    seed: int = 0,
) -> list[RequestResult]:
    """Poisson arrivals at `rate` requests/s whatever the server's pace (seeded, so
    every target sees the same arrival times)."""
    load, t0 = Load("rate", rate), time.perf_counter()
    rng = random.Random(seed)
    tasks: list[asyncio.Task[RequestResult]] = []
    arrival = 0.0
    for i in itertools.count():
        if duration_s is None and i >= len(prompts):
            break
        if duration_s is not None and arrival >= duration_s:
            break
        await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
        task = asyncio.create_task(send(client, target, prompts[i % len(prompts)], settings, load, t0))
        task.add_done_callback(lambda t: None if t.cancelled() else on_done(t.result()))
        tasks.append(task)
        arrival += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


def run_load(
    client: httpx.AsyncClient,
    target: Target,
    prompts: Sequence[Prompt],
    settings: RequestSettings,
    load: Load,
    on_done: OnDone,
    duration_s: float | None = None,
) -> Awaitable[list[RequestResult]]:
    if load.kind == "concurrency":
        return closed_loop(client, target, prompts, settings, int(load.value), on_done, duration_s)
    return open_loop(client, target, prompts, settings, load.value, on_done, duration_s)
