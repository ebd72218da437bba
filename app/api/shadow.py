"""Shadow traffic: a configured share of a model's requests is mirrored to a
candidate method (`shadow:` in the model's config, docs/auto.md).

The client only ever sees the primary's answer: the mirror starts once the
primary's engine has accepted it and given its first output (or, with
`start: after_primary`, once the primary has ended, for engines that share one
device), runs as its own task, and its record
goes only to the `specgate_shadow_*` series and to the model's `auto` estimates.
Shadows never queue: one is dropped (and counted) when the model already has
`max_in_flight` of them, or when the candidate engine is down or has no free place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from dataclasses import replace

from app.api.state import GatewayState
from app.api.tracking import RequestTracker
from app.config import ShadowConfig, SpecgateConfig
from app.engines.base import EngineError, EngineId, GeneratingEngine, Prompt, Sampling
from app.engines.vllm_local import LocalVLLMEngine
from app.metrics import GatewayMetrics, RequestRecord, RouteDecision

logger = logging.getLogger(__name__)


class Shadows:
    def __init__(self, config: SpecgateConfig, metrics: GatewayMetrics) -> None:
        self._configs: dict[str, ShadowConfig] = {n: m.shadow for n, m in config.models.items() if m.shadow}
        self._random = {name: random.Random(c.seed) for name, c in self._configs.items()}
        self._in_flight = dict.fromkeys(self._configs, 0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._metrics = metrics.shadow
        for name, shadow in self._configs.items():
            for reason in ("shadow_limit", "engine_busy", "engine_down"):
                self._metrics.dropped.labels(name, shadow.method, reason)

    def in_flight(self, model: str) -> int:
        return self._in_flight.get(model, 0)

    def mirror(
        self, state: GatewayState, primary: EngineId, prompt: Prompt, sampling: Sampling, tracker: RequestTracker
    ) -> None:
        """Maybe start a mirror of the primary request just admitted on `primary`."""
        config = self._configs.get(primary.model)
        if config is None or primary.method == config.method or self._random[primary.model].random() >= config.share:
            return
        if self._in_flight[primary.model] >= config.max_in_flight:
            self._drop(primary.model, config.method, "shadow_limit")
            return
        self._in_flight[primary.model] += 1
        task = asyncio.create_task(self._run(state, EngineId(primary.model, config.method), config, prompt,
                                             sampling, tracker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(
        self, state: GatewayState, shadow: EngineId, config: ShadowConfig, prompt: Prompt, sampling: Sampling,
        primary: RequestTracker,
    ) -> None:
        try:
            if config.start == "after_primary":
                await primary.done.wait()
            engine = state.pool.get(shadow)
            if not isinstance(engine, LocalVLLMEngine) or not engine.stats().up:
                self._drop(shadow.model, shadow.method, "engine_down")
                return
            admission = state.admissions[shadow]
            release = admission.try_enter()
            if release is None:
                self._drop(shadow.model, shadow.method, "engine_busy")
                return
            bucket = primary.route.bucket if primary.route else None
            decision = RouteDecision(policy="shadow", reason="mirror", bucket=bucket, load=admission.in_flight - 1)
            try:
                record = await _generate(engine, prompt, sampling)
            finally:
                release()
            if record is None:
                self._metrics.requests.labels(shadow.model, shadow.method, "error").inc()
                return
            record = replace(record, route=decision)
            self._metrics.observe(record)
            state.router.observe(record)
        finally:
            self._in_flight[shadow.model] -= 1

    def _drop(self, model: str, method: str, reason: str) -> None:
        self._metrics.dropped.labels(model, method, reason).inc()


async def _generate(engine: GeneratingEngine, prompt: Prompt, sampling: Sampling) -> RequestRecord | None:
    """Run the mirror to its end; its record, or None if the engine failed."""
    request_id = f"shadow-{uuid.uuid4().hex}"
    stream = engine.generate(prompt, sampling, request_id)
    record = None
    try:
        async for out in stream:
            record = out.record or record
    except EngineError as exc:
        logger.warning("shadow request on %s failed: %s", engine.id, exc)
        return None
    finally:
        if record is None:
            await stream.aclose()  # type: ignore[attr-defined]
            with contextlib.suppress(EngineError):
                await engine.abort(request_id)
    return record
