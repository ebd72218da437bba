"""One request's time limits: how long it may wait for the engine's next output
(idle) and how long it may take in all (total, from its admission). Every wait
for an engine goes through `RequestClock.wait`, in-process and remote alike."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.config import Limits
from app.engines.base import EngineId, EngineTimeoutError


@dataclass
class RequestClock:
    engine: EngineId
    limits: Limits = field(default_factory=Limits)
    started: float = field(default_factory=time.monotonic)

    def _budget(self) -> tuple[float, str]:
        idle, total = self.limits.idle_timeout_s, self.limits.total_timeout_s
        if total is not None and self.started + total - time.monotonic() < idle:
            return max(0.0, self.started + total - time.monotonic()), f"{total:g} s (total_timeout_s)"
        return idle, f"{idle:g} s without output (idle_timeout_s)"

    @contextlib.asynccontextmanager
    async def wait(self) -> AsyncIterator[None]:
        """Bound one wait for the engine; on expiry raise `EngineTimeoutError` (the
        caller then aborts the engine request, as for any error)."""
        budget, which = self._budget()
        try:
            async with asyncio.timeout(budget):
                yield
        except TimeoutError:
            raise EngineTimeoutError(f"engine {self.engine}: the request ran out of time after {which}") from None

    def left(self) -> float | None:
        """Seconds left of the total, or None without a total limit."""
        total = self.limits.total_timeout_s
        return None if total is None else max(0.0, self.started + total - time.monotonic())
