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

    def watchdog(self) -> Watchdog:
        """One timer for a stream's successive waits (see `Watchdog`)."""
        return Watchdog(self)


class Watchdog:
    """Bounds each of a stream's successive waits for the engine, as `RequestClock.wait`
    does, with one timer for the whole stream instead of one per output: on a GPU an
    output comes every millisecond or two, and a timer armed and cancelled per output
    (plus its context manager) was a measurable part of the gateway's per-token cost.

    `waiting()` before each wait (a clock read) and clearing `waiter` after it; the timer
    fires about once per idle period, checks the wait then in progress, and cancels the
    waiting task only if that wait has run out of time. `expired()` then turns the
    cancellation into the clock's `EngineTimeoutError`."""

    def __init__(self, clock: RequestClock) -> None:
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._idle = clock.limits.idle_timeout_s
        total = clock.limits.total_timeout_s
        # The loop's clock is time.monotonic, the clock's own.
        self._total_end = None if total is None else clock.started + total
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0.0  # when the timer fires (loop time)
        # The task waiting now, if any: the waiter clears it when its wait has its
        # output (an attribute, not a method: the tap does so once per engine output).
        self.waiter: asyncio.Task[object] | None = None
        self._deadline = 0.0  # loop time at which the current wait runs out
        self._by_total = False  # the current wait ends at the total limit, not the idle one
        self._expired = False

    def waiting(self) -> None:
        """A wait for the engine begins (in the current task)."""
        now = self._loop.time()
        deadline, self._by_total = now + self._idle, False
        if self._total_end is not None and self._total_end < deadline:
            deadline, self._by_total = self._total_end, True
            if deadline <= now:
                raise self._error()
        self.waiter = asyncio.current_task()
        self._deadline = deadline
        handle = self._handle
        if handle is None or self._armed > deadline:  # the total may end a wait early
            if handle is not None:
                handle.cancel()
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        self._armed = when
        self._handle = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        self._handle = None
        now = self._loop.time()
        if self.waiter is None:  # between waits: the next one starts its own budget
            self._arm(now + self._idle)
        elif now >= self._deadline:
            self._expired = True
            self.waiter.cancel()
        else:
            self._arm(self._deadline)

    def expired(self) -> EngineTimeoutError | None:
        """After a `CancelledError`: the clock's error if the watchdog caused it (the
        task's cancellation is then withdrawn), else None (someone else cancelled)."""
        if not self._expired:
            return None
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return self._error()

    def _error(self) -> EngineTimeoutError:
        limits = self._clock.limits
        if self._by_total:
            why = f"{limits.total_timeout_s:g} s (total_timeout_s)"
        else:
            why = f"{limits.idle_timeout_s:g} s without output (idle_timeout_s)"
        return EngineTimeoutError(f"engine {self._clock.engine}: the request ran out of time after {why}")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
