"""Admission and time limits as units: the real `Admission` and `RequestClock`
driven by asyncio tasks (no engine needed for what they decide)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from app.api.admission import Admission
from app.api.errors import OverloadedError
from app.config import Limits
from app.engines.base import EngineId, EngineTimeoutError
from app.engines.clock import RequestClock
from app.metrics import GatewayMetrics
from app.policies.load import LoadMeter

ENGINE = EngineId("m", "x")


def admission(**limits: int) -> tuple[Admission, GatewayMetrics]:
    metrics = GatewayMetrics()
    return Admission(ENGINE, Limits(**limits), metrics.admission(ENGINE.model, ENGINE.method)), metrics


def clock(**limits: float) -> RequestClock:
    return RequestClock(ENGINE, Limits(**limits))


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"model": "m", "method": "x", **labels})
    return value or 0.0


async def enter_later(adm: Admission, order: list[int], i: int) -> Callable[[], None]:
    release = await adm.enter(clock())
    order.append(i)
    return release


def test_places_queue_and_overflow() -> None:
    async def scenario() -> None:
        adm, metrics = admission(max_in_flight=2, max_queued=2, retry_after_s=3)
        first = [await adm.enter(clock()) for _ in range(2)]
        order: list[int] = []
        waiting = [asyncio.create_task(enter_later(adm, order, i)) for i in range(2)]
        await asyncio.sleep(0.01)
        assert (adm.in_flight, adm.queued) == (2, 2)
        assert sample(metrics, "specgate_requests_queued") == 2
        with pytest.raises(OverloadedError) as refused:
            await adm.enter(clock())
        assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "3"}
        assert sample(metrics, "specgate_requests_rejected_total", reason="overloaded") == 1
        first[0]()
        first[0]()  # releasing twice gives back one place only
        await asyncio.sleep(0.01)
        assert order == [0] and (adm.in_flight, adm.queued) == (2, 1)
        first[1]()
        second = [await task for task in waiting]
        assert order == [0, 1] and adm.queued == 0
        for release in second:
            release()
        assert adm.in_flight == 0 and sample(metrics, "specgate_requests_queued") == 0

    asyncio.run(scenario())


def test_a_waiter_that_leaves_gives_up_its_turn() -> None:
    async def scenario() -> None:
        adm, _ = admission(max_in_flight=1, max_queued=2)
        held = await adm.enter(clock())
        order: list[int] = []
        leaving = asyncio.create_task(enter_later(adm, order, 0))
        staying = asyncio.create_task(enter_later(adm, order, 1))
        await asyncio.sleep(0.01)
        leaving.cancel()  # the client went away while queued
        await asyncio.sleep(0.01)
        assert adm.queued == 1
        held()
        (await staying)()
        assert order == [1] and adm.in_flight == 0

    asyncio.run(scenario())


def test_a_waiter_out_of_time_gets_a_timeout() -> None:
    async def scenario() -> None:
        adm, _ = admission(max_in_flight=1, max_queued=1)
        held = await adm.enter(clock())
        with pytest.raises(EngineTimeoutError, match="total_timeout_s"):
            await adm.enter(clock(total_timeout_s=0.05))
        assert adm.queued == 0
        held()
        assert adm.in_flight == 0

    asyncio.run(scenario())


def test_clock_idle_and_total_limits() -> None:
    async def wait(c: RequestClock, seconds: float) -> None:
        async with c.wait():
            await asyncio.sleep(seconds)

    async def scenario() -> None:
        with pytest.raises(EngineTimeoutError, match="idle_timeout_s"):
            await wait(clock(idle_timeout_s=0.05), 1)
        total = clock(total_timeout_s=0.15, idle_timeout_s=0.1)
        await wait(total, 0.06)  # each wait is under the idle limit...
        await wait(total, 0.06)
        with pytest.raises(EngineTimeoutError, match="total_timeout_s"):
            await wait(total, 0.06)  # ...but the total runs out
        await wait(clock(idle_timeout_s=1), 0.01)

    asyncio.run(scenario())


def test_the_load_meter_counts_every_request_from_arrival_to_end() -> None:
    """Queued requests count (they meet the load too); refused ones never do."""

    async def scenario() -> None:
        meter = LoadMeter(shared=True)
        series = GatewayMetrics().admission(ENGINE.model, ENGINE.method)
        adm = Admission(ENGINE, Limits(max_in_flight=1, max_queued=1), series, meter)

        def agrees() -> bool:
            return meter.busy == adm.in_flight + adm.queued

        held = await adm.enter(clock())
        order: list[int] = []
        waiting = asyncio.create_task(enter_later(adm, order, 0))
        await asyncio.sleep(0.01)
        assert meter.busy == 2 and agrees()
        with pytest.raises(OverloadedError):
            await adm.enter(clock())
        assert meter.busy == 2 and adm.try_enter() is None
        waiting.cancel()
        await asyncio.sleep(0.01)
        assert meter.busy == 1 and agrees()
        held()
        held()
        assert meter.busy == 0 and agrees()
        shadow = adm.try_enter()
        assert shadow is not None and meter.busy == 1
        shadow()
        assert meter.busy == 0

    asyncio.run(scenario())


# The watchdog: one timer bounds a stream's successive waits. The source stands in for
# an engine's outputs (no real engine stalls or paces itself on demand).


async def watched(limits: RequestClock, gaps: list[float], between: float = 0.0, tasks: bool = False) -> int:
    """Wait for each output under the watchdog (each wait in a task of its own when
    `tasks`, as vLLM's merge of several choices does); sleep `between` between waits."""
    dog = limits.watchdog()
    got = 0
    try:
        for gap in gaps:

            async def one(gap: float = gap) -> None:
                dog.waiting()
                try:
                    await asyncio.sleep(gap)
                except asyncio.CancelledError:
                    expired = dog.expired()
                    if expired is None:
                        raise
                    raise expired from None
                dog.waiter = None  # the wait got its output, as the tap marks it

            await (asyncio.create_task(one()) if tasks else one())
            got += 1
            await asyncio.sleep(between)
    finally:
        dog.close()
    return got


@pytest.mark.parametrize("tasks", [False, True])
def test_watchdog_bounds_each_wait_not_the_stream(tasks: bool) -> None:
    # 12 outputs 20 ms apart: 240 ms in all, no wait near the 100 ms idle limit.
    assert asyncio.run(watched(clock(idle_timeout_s=0.1), [0.02] * 12, tasks=tasks)) == 12


@pytest.mark.parametrize("tasks", [False, True])
def test_watchdog_ends_a_stalled_wait_on_time(tasks: bool) -> None:
    async def run() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EngineTimeoutError) as info:
            await watched(clock(idle_timeout_s=0.1), [0.01, 0.01, 5.0], tasks=tasks)
        return str(info.value), loop.time() - started

    message, took = asyncio.run(run())
    assert "idle_timeout_s" in message
    assert 0.1 <= took < 0.5


def test_watchdog_does_not_count_time_between_waits() -> None:
    # The consumer takes 150 ms between outputs (a slow client): only waits count.
    assert asyncio.run(watched(clock(idle_timeout_s=0.1), [0.01] * 3, between=0.15)) == 3


def test_watchdog_ends_at_the_total_limit() -> None:
    async def run() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EngineTimeoutError) as info:
            await watched(clock(idle_timeout_s=10, total_timeout_s=0.2), [0.03] * 100)
        return str(info.value), loop.time() - started

    message, took = asyncio.run(run())
    assert "total_timeout_s" in message
    assert 0.17 <= took < 0.5


def test_watchdog_leaves_other_cancellations_alone() -> None:
    async def run() -> None:
        task = asyncio.create_task(watched(clock(idle_timeout_s=10), [5.0]))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
