"""What happens when a request ends, exactly once whatever way it ends: the
metrics see its record (or its failure), the in-flight gauge drops, and one
structured JSON line goes to the `specgate.access` logger (never prompt or
completion text)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace

from app.engines.base import EngineId, EngineInputError, EngineTimeoutError
from app.metrics import GatewayMetrics
from app.record import RequestRecord, RouteDecision

logger = logging.getLogger("specgate.access")


class RequestTracker:
    def __init__(
        self,
        metrics: GatewayMetrics,
        engine: EngineId,
        request_id: str,
        on_end: Callable[[], None] | None = None,
        route: RouteDecision | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        load_met: Callable[[], float | None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._engine = engine
        self._request_id = request_id
        self._on_end = on_end
        self.route = route
        self._on_record = on_record
        self._load_met = load_met
        self._ended = False
        self.done = asyncio.Event()  # set when the request has ended, however it ended
        metrics.child(metrics.in_flight, engine.model, engine.method).inc()

    def finish(self, record: RequestRecord, answer_id: str | None = None) -> RequestRecord:
        """End with the engine's record; returns it with the route decision, as the
        client, the metrics and the routing policy all get it. `answer_id`: the id
        the client sees (vLLM's), which then names the request in the access log."""
        route = self.route
        if route is not None and self._load_met is not None:
            met = self._load_met()
            route = replace(route, load_met=None if met is None else round(met, 2))
        record = replace(record, route=route)
        if self._end():
            self._metrics.observe(record)
            if self._on_record is not None:
                self._on_record(record)
            _log(answer_id or self._request_id, self._engine, record.outcome, record)
        return record

    @property
    def ended(self) -> bool:
        return self._ended

    def fail(self, outcome: str) -> None:
        """`outcome`: "invalid" (engine refused it), "error" (engine failed),
        "timeout" (out of time), "cancelled" (the client left)."""
        if self._end():
            self._metrics.observe_failure(self._engine.model, self._engine.method, outcome)
            _log(self._request_id, self._engine, outcome, None)

    def _end(self) -> bool:
        if self._ended:
            return False
        self._ended = True
        self.done.set()
        self._metrics.child(self._metrics.in_flight, self._engine.model, self._engine.method).dec()
        if self._on_end is not None:
            self._on_end()
        return True


def failure_outcome(exc: Exception) -> str:
    """The outcome of an engine error: the engine refused the request, ran out of time, or failed."""
    if isinstance(exc, EngineInputError):
        return "invalid"
    return "timeout" if isinstance(exc, EngineTimeoutError) else "error"


def _log(request_id: str, engine: EngineId, outcome: str, record: RequestRecord | None) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    line: dict[str, object] = {
        "request_id": request_id,
        "model": engine.model,
        "method": engine.method,
        "outcome": outcome,
    }
    if record is not None:
        line.update(
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            mean_acceptance_length=record.mean_acceptance_length,
            draft_acceptance_rate=record.draft_acceptance_rate,
            ttft_s=record.timing.ttft_s,
            decode_tokens_per_s=record.timing.decode_tokens_per_s,
            e2e_s=record.timing.e2e_s,
        )
        if record.route is not None:
            line.update(policy=record.route.policy, route_reason=record.route.reason)
    logger.info(json.dumps(line))
