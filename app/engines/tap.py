"""What one request's engine saw, for its record: the tap.

vLLM's serving layer drives the engine itself, so the gateway watches from
below it: every in-process engine hands its serving layer a `TappedEngineClient`,
whose `generate` passes each `RequestOutput` through the tap of the request
being served (a context variable set by the gateway before it calls the serving
layer; tasks the serving layer starts inherit it). The tap bounds each wait for
the engine by the request's clock and keeps the figures of vLLM's own per-request
metrics: `CompletionOutput.spec_decode_metrics` and `RequestOutput.metrics`,
never counts of streamed chunks. A remote engine sets the record it read from
its upstream's answer instead (app/engines/remote_app.py).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vllm.outputs import RequestOutput
from vllm.v1.engine.exceptions import EngineDeadError

from app.engines.base import EngineInfo, EngineTimeoutError, EngineUnavailableError
from app.engines.clock import RequestClock
from app.engines.vllm_outputs import build_record, spec_counts
from app.record import RequestRecord, SpecCounts

CURRENT_TAP: contextvars.ContextVar[RequestTap | None] = contextvars.ContextVar("specgate_tap", default=None)


@dataclass
class _Stream:
    """One `generate` call: one prompt of the request, all its choices."""

    tokens: dict[int, int] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    spec: dict[int, SpecCounts] = field(default_factory=dict)
    final: RequestOutput | None = None

    def see(self, out: RequestOutput) -> None:
        for o in out.outputs:
            self.tokens[o.index] = self.tokens.get(o.index, 0) + len(o.token_ids)
            if o.finish_reason is not None:
                self.finish[o.index] = o.finish_reason
            if o.spec_decode_metrics is not None:
                self.spec[o.index] = spec_counts(o.spec_decode_metrics)
        if out.finished:
            self.final = out


class RequestTap:
    def __init__(self, info: EngineInfo, clock: RequestClock) -> None:
        self.info = info
        self.clock = clock
        # Set when the request failed below the serving layer: out of time, or the engine died.
        self.failure: EngineTimeoutError | EngineUnavailableError | None = None
        # The engine has given its last output (of every prompt of a batch), or a
        # remote engine's record was set. An attribute, not a property: the answer's
        # writer reads it for every streamed event.
        self.finished = False
        self._streams: list[_Stream] = []
        self._open = 0  # streams without their final output yet
        self._record: RequestRecord | None = None

    @property
    def started(self) -> bool:
        """The request reached the engine (a generation began)."""
        return bool(self._streams) or self._record is not None

    def set_record(self, record: RequestRecord) -> None:
        self._record = record
        self.finished = True

    def record(self) -> RequestRecord | None:
        if self._record is None and self.finished:
            self._record = self._build()
        return self._record

    def _build(self) -> RequestRecord:
        finals = [s.final for s in self._streams if s.final is not None]
        spec = [part for s in self._streams for _, part in sorted(s.spec.items())]
        reasons = [reason for s in self._streams for _, reason in sorted(s.finish.items())]
        return build_record(
            self.info,
            finals[-1],
            spec,
            prompt_tokens=sum(len(f.prompt_token_ids or ()) for f in finals),
            completion_tokens=sum(sum(s.tokens.values()) for s in self._streams),
            finish_reasons=reasons,
        )

    async def watch(self, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        stream = _Stream()
        self._streams.append(stream)
        self._open += 1
        self.finished = False
        dog = self.clock.watchdog()
        # Runs once per engine output: no call here that the loop can do without.
        try:
            dog.waiting()
            async for out in outputs:
                dog.waiter = None  # got it: the time until the next wait is the client's
                stream.see(out)
                if out.finished:
                    self._end_stream()
                yield out
                dog.waiting()
        except asyncio.CancelledError:
            expired = dog.expired()
            if expired is None:
                raise
            self.failure = expired
            raise expired from None
        except EngineTimeoutError as exc:
            self.failure = exc
            raise
        except EngineDeadError:
            self.failure = EngineUnavailableError(f"engine {self.info.id} failed: EngineDeadError")
            raise
        finally:
            dog.close()
            # Closing vLLM's generator early aborts the request in the engine.
            await outputs.aclose()  # type: ignore[attr-defined]

    def _end_stream(self) -> None:
        self._open -= 1
        self.finished = self._open == 0


class TappedEngineClient:
    """vLLM's engine client (`AsyncLLM`) as the serving layer sees it: everything
    is the engine's own, except that `generate` reports to the current request's tap."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        outputs: AsyncIterator[RequestOutput] = self._llm.generate(*args, **kwargs)
        tap = CURRENT_TAP.get()
        return outputs if tap is None else tap.watch(outputs)
