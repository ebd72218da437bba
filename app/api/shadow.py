"""Shadow traffic: a configured share of a model's requests is mirrored to a
candidate method (`shadow:` in the model's config, docs/auto.md).

The client only ever sees the primary's answer: the mirror starts once the
primary's engine has taken the request (its answer began with a success) or,
with `start: after_primary`, once the primary has ended, for engines that share
one device. It runs as its own task, through the same dispatch as any request
(app/api/exchange.py), not streamed, with nobody reading its answer; its record
goes only to the `specgate_shadow_*` series and to the model's `auto` estimates.
Shadows never queue: one is dropped (and counted) when the model already has
`max_in_flight` of them, or when the candidate engine is down or has no free place.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.api.admission import Admission
from app.api.dispatch import dispatch
from app.api.tracking import RequestTracker
from app.config import ShadowConfig
from app.engines.base import ASGIMessage, ASGIScope, EngineError, EngineId
from app.engines.clock import RequestClock
from app.engines.pool import EnginePool, PoolEngine
from app.engines.tap import RequestTap
from app.metrics import ShadowMetrics
from app.record import RequestRecord, RouteDecision

logger = logging.getLogger(__name__)


class Shadows:
    def __init__(
        self,
        configs: dict[str, ShadowConfig],
        metrics: ShadowMetrics,
        pool: EnginePool,
        admissions: dict[EngineId, Admission],
        learn: Callable[[RequestRecord], None],
    ) -> None:
        self._configs = configs  # model -> its shadow
        self._random = {name: random.Random(c.seed) for name, c in self._configs.items()}
        self._in_flight = dict.fromkeys(self._configs, 0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._metrics = metrics
        self._pool, self._admissions, self._learn = pool, admissions, learn
        for name, shadow in self._configs.items():
            for reason in ("shadow_limit", "engine_busy", "engine_down"):
                self._metrics.dropped.labels(name, shadow.method, reason)

    def in_flight(self, model: str) -> int:
        return self._in_flight.get(model, 0)

    def mirror(self, primary: EngineId, scope: ASGIScope, body: dict[str, Any], tracker: RequestTracker) -> None:
        """Maybe start a mirror of a request the engine `primary` has just taken."""
        config = self._configs.get(primary.model)
        if config is None or primary.method == config.method or self._random[primary.model].random() >= config.share:
            return
        if self._in_flight[primary.model] >= config.max_in_flight:
            self._drop(primary.model, config.method, "shadow_limit")
            return
        self._in_flight[primary.model] += 1
        shadow = EngineId(primary.model, config.method)
        task = asyncio.create_task(self._run(shadow, config, dict(scope), body, tracker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(
        self,
        shadow: EngineId,
        config: ShadowConfig,
        scope: ASGIScope,
        body: dict[str, Any],
        primary: RequestTracker,
    ) -> None:
        try:
            if config.start == "after_primary":
                await primary.done.wait()
            engine = self._pool.get(shadow)
            if engine is None or not engine.stats().up:
                self._drop(shadow.model, shadow.method, "engine_down")
                return
            admission = self._admissions[shadow]
            release = admission.try_enter()
            if release is None:
                self._drop(shadow.model, shadow.method, "engine_busy")
                return
            bucket = primary.route.bucket if primary.route else None
            decision = RouteDecision(policy="shadow", reason="mirror", bucket=bucket, load=admission.in_flight - 1)
            tap = RequestTap(engine.info, RequestClock(shadow, admission.limits))
            try:
                await _unheard(engine, scope, body, tap)
            finally:
                release()
            record = tap.record()
            if record is None:
                self._metrics.requests.labels(shadow.model, shadow.method, "error").inc()
                return
            record = replace(record, route=decision)
            self._metrics.observe(record)
            self._learn(record)
        finally:
            self._in_flight[shadow.model] -= 1

    def _drop(self, model: str, method: str, reason: str) -> None:
        self._metrics.dropped.labels(model, method, reason).inc()


async def _unheard(engine: PoolEngine, scope: ASGIScope, body: dict[str, Any], tap: RequestTap) -> None:
    """Run the mirror to its end, not streamed; its answer goes nowhere."""
    mirror = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    mirror["model"] = str(engine.id)
    never = asyncio.Event()

    async def receive() -> ASGIMessage:
        await never.wait()  # nobody disconnects from a shadow
        return {"type": "http.disconnect"}

    async def discard(message: ASGIMessage) -> None:
        return None

    try:
        await dispatch(engine, scope, receive, discard, json.dumps(mirror, ensure_ascii=False).encode(), tap)
    except EngineError as exc:
        logger.warning("shadow request on %s failed: %s", engine.id, exc)
