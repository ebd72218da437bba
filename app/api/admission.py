"""Admission per engine: at most `max_in_flight` requests at the engine; up to
`max_queued` more wait at the gateway, first come first served; beyond that a
429 with Retry-After at once, without touching the engine. So the gateway's
memory is bounded by in-flight + queued requests whatever the clients send.

A place is held from admission until the request's tracker ends (answer, error,
timeout or disconnect), then handed to the oldest waiter. A model's `LoadMeter`
(app/policies/load.py) counts every request from its arrival to its end, queued
or not, so each record says the load it met.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from app.api.errors import GatewayTimeoutError, OverloadedError
from app.api.tracking import RequestTracker
from app.config import Limits
from app.engines.base import EngineId, EngineTimeoutError
from app.engines.clock import RequestClock
from app.metrics import AdmissionSeries, GatewayMetrics
from app.policies.load import LoadMeter
from app.record import RequestRecord, RouteDecision


class Admission:
    def __init__(
        self, engine: EngineId, limits: Limits, series: AdmissionSeries, meter: LoadMeter | None = None
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.meter = meter
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._queued_gauge = series.queued
        self._rejected = series.overloaded

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """No place now: a new request would wait, or be refused."""
        return self.in_flight >= self.limits.max_in_flight or bool(self._waiters)

    async def enter(self, clock: RequestClock) -> Callable[[], None]:
        """Take a place (waiting for one if the queue has room); returns its release."""
        if not self.full:
            self.in_flight += 1
            self._count(1)
            return self._release_once()
        if len(self._waiters) >= self.limits.max_queued:
            self._rejected.inc()
            raise OverloadedError(
                f"engine {self.engine} is at its limit ({self.limits.max_in_flight} requests in flight, "
                f"{self.limits.max_queued} queued); retry later",
                headers={"Retry-After": str(self.limits.retry_after_s)},
            )
        self._count(1)
        try:
            await self._wait(clock)
        except BaseException:
            self._count(-1)
            raise
        return self._release_once()

    async def _wait(self, clock: RequestClock) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._queued_gauge.inc()
        try:
            async with clock.wait():
                await asyncio.shield(waiter)
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # a place was handed over as we left: pass it on
            else:
                waiter.cancel()
                self._waiters.remove(waiter)
            raise
        finally:
            self._queued_gauge.dec()

    def try_enter(self) -> Callable[[], None] | None:
        """A place now or never (shadow requests: they never queue)."""
        if self.full:
            return None
        self.in_flight += 1
        self._count(1)
        return self._release_once()

    def _release_once(self) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._count(-1)
                self._release()

        return release

    def _count(self, delta: int) -> None:
        if self.meter is not None:
            self.meter.change(self.engine.method, delta)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place moves on: in_flight stays
                return
        self.in_flight -= 1


@dataclass
class Admitted:
    """An admitted request: its clock (started before it queued) and its tracker,
    whose end gives the place back."""

    clock: RequestClock
    tracker: RequestTracker


async def admit(
    admission: Admission,
    metrics: GatewayMetrics,
    request_id: str,
    route: RouteDecision | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> Admitted:
    """Wait for a place; the tracker then carries the route decision into the record
    and hands the finished record to `on_record` (the router's learning)."""
    clock = RequestClock(admission.engine, admission.limits)
    # Marked before a place is taken: time queued counts in the load the request met.
    meter = admission.meter
    load_met = partial(meter.met_since, meter.mark(), admission.engine.method) if meter is not None else None
    try:
        release = await admission.enter(clock)
    except EngineTimeoutError as exc:
        metrics.rejected.labels(admission.engine.model, admission.engine.method, "queue_timeout").inc()
        raise GatewayTimeoutError(str(exc)) from None
    tracker = RequestTracker(
        metrics, admission.engine, request_id, on_end=release, route=route, on_record=on_record, load_met=load_met
    )
    return Admitted(clock, tracker)
