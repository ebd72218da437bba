"""The routing policies as plain objects, driven by a recorded request log.

`tests/data/bench-requests.jsonl` is a real `specgate bench` log of the embedded
model (edit and chat prompts, `none` and `ngram`, concurrency 1 and 4). The replay
asks the policy for a method, answers with a recorded request of that method on
that workload and load, and feeds the record back, as the gateway does."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from statistics import mean

import pytest

from app.bench.workloads import chat, edit
from app.config import ABConfig, AutoConfig, ConfigError, parse_config
from app.policies.ab import ABPolicy
from app.policies.auto import AutoPolicy
from app.policies.base import EngineLoad, RouteRequest
from app.policies.features import features_of
from app.record import RequestRecord, RouteDecision, Timing

LOG = [json.loads(line) for line in (Path(__file__).parent / "data" / "bench-requests.jsonl").read_text().splitlines()]
TEXTS = {p.id: "\n".join(text for _, text in p.messages) for w in (edit(200), chat(200)) for p in w.prompts}
METHODS = ("none", "ngram")
BUSY = {"c=1": 0, "c=4": 3}


def loads(busy: int = 0, **overrides: EngineLoad) -> dict[str, EngineLoad]:
    return {m: overrides.get(m, EngineLoad(ready=True, full=False, busy=busy)) for m in METHODS}


def request_for(row: dict[str, object]) -> RouteRequest:
    text = TEXTS[str(row["prompt_id"])]
    return RouteRequest(prompt_text=lambda: text, temperature=0)


def record_of(row: dict[str, object], method: str, decision: RouteDecision, slowdown: float = 1.0) -> RequestRecord:
    return RequestRecord(
        model="m",
        method=method,
        engine=f"m:{method}",
        speculative_method=method,
        num_speculative_tokens=None,
        prompt_tokens=int(str(row["prompt_tokens"])),
        completion_tokens=int(str(row["output_tokens"])),
        finish_reasons=("length",),
        spec=None,
        timing=Timing(e2e_s=float(str(row["e2e_s"])) * slowdown, decode_tokens_per_s=10.0 / slowdown),
        route=decision,
    )


def measured_rate(workload: str, load: str, method: str) -> float:
    return mean(
        r["output_tokens"] / r["e2e_s"]
        for r in LOG
        if (r["workload"], r["load"], r["method"]) == (workload, load, method)
    )


def replay(
    policy: AutoPolicy,
    steps: int,
    workloads: tuple[str, ...] = ("edit", "chat"),
    load: str = "c=1",
    seed: int = 0,
    slowdown: Callable[[str], float] = lambda method: 1.0,
) -> list[tuple[str, str, RouteDecision]]:
    """(workload, chosen method, decision) per step."""
    rng = random.Random(seed)
    prompts = [r for r in LOG if r["workload"] in workloads and r["load"] == load]
    out = []
    for _ in range(steps):
        prompt = rng.choice(prompts)
        method, decision = policy.choose(request_for(prompt), loads(BUSY[load]))
        answer = rng.choice(
            [r for r in LOG if (r["workload"], r["load"], r["method"]) == (prompt["workload"], load, method)]
        )
        policy.observe(record_of(answer, method, decision, slowdown(method)))
        out.append((str(prompt["workload"]), method, decision))
    return out


def share(choices: list[tuple[str, str, RouteDecision]], workload: str, method: str) -> float:
    picked = [m for w, m, _ in choices if w == workload]
    return picked.count(method) / len(picked)


@pytest.mark.parametrize("load", ["c=1", "c=4"])
def test_auto_converges_to_the_method_that_measured_faster_on_each_workload(load: str) -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0.1, seed=1))
    choices = replay(policy, 300, load=load)
    for workload in ("edit", "chat"):
        faster = max(METHODS, key=lambda m: measured_rate(workload, load, m))
        assert share(choices[-150:], workload, faster) >= 0.75, (workload, faster)


def test_edit_and_chat_prompts_fall_in_different_buckets() -> None:
    buckets = {w: {request_for(r).features.bucket for r in LOG if r["workload"] == w} for w in ("edit", "chat")}
    assert buckets["edit"].isdisjoint(buckets["chat"])


def test_auto_leaves_a_method_that_turns_slow() -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0.1, seed=2, memory=20))
    before = replay(policy, 150, workloads=("edit",))
    assert share(before[-50:], "edit", "ngram") >= 0.8
    # ngram's engine now takes 4x as long per request (e.g. its drafter went wrong).
    after = replay(policy, 150, workloads=("edit",), seed=3, slowdown=lambda m: 4.0 if m == "ngram" else 1.0)
    assert share(after[-60:], "edit", "none") >= 0.8


@pytest.mark.parametrize("exploration", [0.0, 0.05, 0.2])
def test_exploration_stays_within_its_share(exploration: float) -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=exploration, seed=4))
    choices = replay(policy, 1000)
    explored = sum(1 for _, _, d in choices if d.reason == "exploration")
    # Binomial(1000, p): mean 1000p, sd <= 13; 4 sd either way.
    assert abs(explored - 1000 * exploration) <= 4 * (1000 * exploration * (1 - exploration)) ** 0.5
    assert {d.reason for _, _, d in choices} <= {"cold_start", "best_estimate", "exploration"}


def test_auto_never_picks_an_engine_that_is_down_or_full_when_another_can_serve() -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0.5, seed=5, priors={"ngram": 50.0, "none": 5.0}))
    request = request_for(LOG[0])
    down = {"ngram": EngineLoad(ready=False, full=False, busy=0)}
    full = {"ngram": EngineLoad(ready=True, full=True, busy=8)}
    assert {policy.choose(request, loads(**down))[0] for _ in range(100)} == {"none"}
    assert {policy.choose(request, loads(**full))[0] for _ in range(100)} == {"none"}
    # Both full: the ready ones still serve (they queue); nothing ready: still an answer (the engine's 503).
    both_full = loads(**full, none=EngineLoad(ready=True, full=True, busy=8))
    assert policy.choose(request, both_full)[0] in METHODS
    nothing = loads(none=EngineLoad(False, False, 0), ngram=EngineLoad(False, False, 0))
    assert policy.choose(request, nothing)[0] in METHODS


def test_priors_decide_the_cold_start_and_records_replace_them() -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0, priors={"none": 100.0, "ngram": 1.0}))
    method, decision = policy.choose(request_for(LOG[0]), loads())
    assert (method, decision.reason, decision.estimate) == ("none", "prior", 100.0)
    assert dict(decision.estimates) == {"none": 100.0, "ngram": 1.0}
    for _ in range(3):  # three real records of `none` at ~9 tok/s; ngram's prior (1.0) still loses
        policy.observe(record_of(LOG[0], "none", decision))
    method, decision = policy.choose(request_for(LOG[0]), loads())
    assert method == "none" and decision.reason == "best_estimate"
    assert decision.estimate == pytest.approx(LOG[0]["output_tokens"] / LOG[0]["e2e_s"], rel=1e-3)


def test_estimates_compare_like_with_like_load() -> None:
    """ngram measured only at idle and none only busy: both fall back to the bucket level."""
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0, min_samples=1))
    request = request_for(LOG[0])
    _, decision = policy.choose(request, loads())
    policy.observe(record_of(LOG[0], "ngram", RouteDecision("auto", "x", decision.bucket, load=0)))
    policy.observe(record_of(LOG[1], "none", RouteDecision("auto", "x", decision.bucket, load=10)))
    table = {(row["method"], row["cell"]) for row in policy.estimates.table()}
    assert (("ngram", f"{decision.bucket}/idle") in table) and (("none", f"{decision.bucket}/mid") in table)
    _, decision = policy.choose(request, loads())
    values = dict(decision.estimates)
    assert values["ngram"] == pytest.approx(LOG[0]["output_tokens"] / LOG[0]["e2e_s"], rel=1e-3)
    assert values["none"] == pytest.approx(LOG[1]["output_tokens"] / LOG[1]["e2e_s"], rel=1e-3)


def test_latency_objective_learns_decode_rate() -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0, min_samples=1, objective="latency"))
    _, decision = policy.choose(request_for(LOG[0]), loads())
    policy.observe(record_of(LOG[0], "none", decision, slowdown=2.0))  # decode 5 tok/s
    assert policy.estimates.table()[-1]["value"] == 5.0


def observe_rate(policy: AutoPolicy, method: str, bucket: str, load: int, rate: float, times: int = 3) -> None:
    """`times` records of `method` at `rate` output tokens/s, routed at `load`."""
    for _ in range(times):
        policy.observe(
            RequestRecord(
                model="m",
                method=method,
                engine=f"m:{method}",
                speculative_method=method,
                num_speculative_tokens=None,
                prompt_tokens=10,
                completion_tokens=100,
                finish_reasons=("length",),
                spec=None,
                timing=Timing(e2e_s=100 / rate, decode_tokens_per_s=rate),
                route=RouteDecision("auto", "x", bucket, load=load),
            )
        )


def test_a_shared_device_is_judged_at_its_total_load() -> None:
    request = request_for(LOG[0])
    busy_ngram = loads(ngram=EngineLoad(ready=True, full=False, busy=8))
    choices = {}
    for shared in (True, False):
        policy = AutoPolicy(METHODS, AutoConfig(exploration=0, shared_device=shared))
        bucket = request.features.bucket
        observe_rate(policy, "none", bucket, 0, 20.0)  # alone on the device
        observe_rate(policy, "none", bucket, 8, 8.0)  # among 8 others
        observe_rate(policy, "ngram", bucket, 8, 10.0)
        method, decision = policy.choose(request, busy_ngram)
        choices[shared] = (method, decision.load)
    # Shared: an idle `none` engine would run beside ngram's 8 requests, so it is judged at load 8.
    assert choices == {True: ("ngram", 8), False: ("none", 0)}


@pytest.mark.parametrize(("none_rate", "expected"), [(10.3, ("ngram", "running")), (11.0, ("none", "best_estimate"))])
def test_a_busy_shared_device_keeps_its_method_unless_another_is_clearly_better(
    none_rate: float, expected: tuple[str, str]
) -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0, switch_margin=0.05))
    request = request_for(LOG[0])
    observe_rate(policy, "none", request.features.bucket, 8, none_rate)
    observe_rate(policy, "ngram", request.features.bucket, 8, 10.0)
    method, decision = policy.choose(request, loads(ngram=EngineLoad(ready=True, full=False, busy=8)))
    assert (method, decision.reason) == expected


def test_a_busy_shared_device_explores_only_what_its_cell_has_not_measured() -> None:
    policy = AutoPolicy(METHODS, AutoConfig(exploration=0.5, seed=7))
    request = request_for(LOG[0])
    bucket = request.features.bucket
    observe_rate(policy, "none", bucket, 8, 10.0)
    observe_rate(policy, "ngram", bucket, 0, 10.0)  # measured only on an idle device

    def explored(busy: int) -> int:
        reasons = [policy.choose(request, loads(none=EngineLoad(True, False, busy)))[1].reason for _ in range(200)]
        return reasons.count("exploration")

    assert explored(8) > 50  # ngram has no record at this load yet
    observe_rate(policy, "ngram", bucket, 8, 9.0)
    assert explored(8) == 0  # now it has: exploring would slow the 8 requests of `none`
    assert explored(0) > 50  # an idle device explores at the configured share


def test_ab_weights_hold_and_users_stick() -> None:
    policy = ABPolicy(ABConfig(weights={"none": 3, "ngram": 1}, seed=6))
    anonymous = Counter(policy.choose(RouteRequest(), loads())[0] for _ in range(4000))
    assert abs(anonymous["none"] / 4000 - 0.75) < 0.03
    users = Counter(policy.choose(RouteRequest(user=f"user-{i}"), loads())[0] for i in range(4000))
    assert abs(users["none"] / 4000 - 0.75) < 0.03
    for i in range(20):
        assert len({policy.choose(RouteRequest(user=f"u{i}"), loads())[0] for _ in range(5)}) == 1
    method, decision = policy.choose(RouteRequest(), loads(none=EngineLoad(False, False, 0)))
    assert method == "ngram" and decision.reason in ("weight", "reweighted")


def test_features() -> None:
    code = features_of("Fix this:\n```python\ndef f(x):\n    return x\n```", 0)
    assert code.code and code.greedy and code.bucket == "code/varied/greedy"
    prose = features_of("Tell me about the sea. " * 5, None)
    assert not prose.code and not prose.greedy and prose.repetition > 0.5
    assert prose.bucket == "prose/repetitive/sampled"
    assert features_of("", 0.7).repetition == 0.0


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"auto": {"methods": ["none", "eagle"]}}, "auto.methods: 'eagle' is not one of the methods"),
        ({"auto": {"priors": {"ngram": 0}}}, "prior of 'ngram' must be > 0"),
        ({"ab": {"weights": {"nope": 1}}}, "ab.weights: 'nope' is not one of the methods"),
        ({"shadow": {"method": "ngram", "share": 1.5}}, "models.m.shadow.share: Input should be less than or equal"),
        ({"default_method": "auto"}, "default_method 'auto' is not one of the methods (ngram, none)"),
        ({"methods": {"auto": {}}, "default_method": "auto"}, "method name 'auto' is reserved"),
    ],
)
def test_policy_config_errors_name_the_key(model: dict[str, object], message: str) -> None:
    raw = {"target": "t", "default_method": "none", "methods": {"none": {}, "ngram": {}}, **model}
    with pytest.raises(ConfigError, match=r"^config: models\.m") as error:
        parse_config({"models": {"m": raw}})
    assert message in str(error.value)
