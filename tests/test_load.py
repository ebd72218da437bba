"""The load a request meets over its life (app/policies/load.py) and what `auto`
does with it. `ManualClock` is a fake: the unit's real clock is time.monotonic,
and these tests need to say exactly when each request arrives and ends."""

from __future__ import annotations

import pytest

from app.config import AutoConfig
from app.policies.auto import AutoPolicy
from app.policies.base import EngineLoad, RouteRequest
from app.policies.load import LoadMeter, RecentLoads
from app.record import RequestRecord, RouteDecision, Timing


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_request_that_starts_a_burst_met_the_burst() -> None:
    clock = ManualClock()
    meter = LoadMeter(shared=True, clock=clock)
    first = meter.mark()
    meter.change("ngram", 1)
    clock.now = 1.0
    for _ in range(15):
        meter.change("none", 1)
    clock.now = 10.0
    # Alone for 1 s, then beside 15 others for 9 s.
    assert meter.met_since(first, "ngram") == pytest.approx(13.5)
    assert meter.busy == 16


def test_apart_from_a_shared_device_a_request_meets_its_engine_only() -> None:
    clock = ManualClock()
    meter = LoadMeter(shared=False, clock=clock)
    mark = meter.mark()
    meter.change("ngram", 1)
    for _ in range(4):
        meter.change("none", 1)
    clock.now = 2.0
    assert meter.met_since(mark, "ngram") == 0.0
    assert meter.met_since(mark, "none") == pytest.approx(3.0)
    assert meter.met_since(meter.mark(), "none") is None  # over no time


def test_recent_loads_forget_what_ended_before_the_window() -> None:
    clock = ManualClock()
    recent = RecentLoads(window_s=10, clock=clock)
    assert recent.mean() is None
    recent.add(15.0)
    clock.now = 5.0
    recent.add(5.0)
    assert recent.mean() == 10.0
    clock.now = 12.0
    assert recent.mean() == 5.0
    clock.now = 16.0
    assert recent.mean() is None


METHODS = ("none", "ngram")
REQUEST = RouteRequest(prompt_text=lambda: "What is the capital of France? Answer briefly.", temperature=0)


def observe(policy: AutoPolicy, method: str, load_met: float, rate: float, times: int = 3) -> None:
    """Records that arrived on an idle device (load 0) but met `load_met`."""
    for _ in range(times):
        policy.observe(
            RequestRecord(
                model="m",
                method=method,
                engine=f"m:{method}",
                speculative_method=method,
                num_speculative_tokens=None,
                prompt_tokens=10,
                completion_tokens=48,
                finish_reasons=("length",),
                spec=None,
                timing=Timing(e2e_s=48 / rate, decode_tokens_per_s=rate),
                route=RouteDecision("explicit", "requested", REQUEST.features.bucket, load=0, load_met=load_met),
            )
        )


def idle() -> dict[str, EngineLoad]:
    return {m: EngineLoad(ready=True, full=False, busy=0) for m in METHODS}


@pytest.mark.parametrize(("window_s", "expected"), [(10.0, "none"), (0.0, "ngram")])
def test_auto_expects_the_load_that_requests_ended_lately_met(window_s: float, expected: str) -> None:
    """Alone, ngram is faster; among 15 others, none is. The device is idle when
    the first request of a burst arrives, but the requests that ended just
    before met 15 others: with a window, the burst's first goes where the burst
    will run well."""
    clock = ManualClock()
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0, load_window_s=window_s), clock=clock)
    observe(policy, "ngram", 0.0, 20.0)
    observe(policy, "none", 0.0, 16.0)
    clock.now = 20.0
    observe(policy, "ngram", 15.0, 6.0)
    observe(policy, "none", 15.0, 8.0)
    method, decision = policy.choose(REQUEST, idle())
    assert method == expected and decision.load == 0
    assert decision.expected_load == (15.0 if window_s else 0.0)
    clock.now = 31.0  # nothing ended for longer than the window: the load now is what counts
    assert policy.choose(REQUEST, idle())[0] == "ngram"


def test_records_are_learnt_at_the_load_they_met_not_the_one_they_found() -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0, load_window_s=0))
    observe(policy, "none", 15.0, 8.0)
    cells = {(row["method"], row["cell"]): row["count"] for row in policy.estimates.table()}
    assert cells[("none", f"{REQUEST.features.bucket}/mid")] == 3
    assert ("none", f"{REQUEST.features.bucket}/idle") not in cells
