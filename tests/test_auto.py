"""The `auto`, `ab` and shadow policies end to end: a real gateway with real
in-process engines (`none` and `ngram` of the embedded model), whose model has all
three configured. The shadows start after their primary has answered, because the
engines of this machine share its two cores (docs/auto.md)."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.bench.workloads import chat, edit
from tests.prometheus import dashboard_queries, needs_policies, start_prometheus, substitute
from tests.support import GatewayProcess, embedded_model, http_client, running_gateway, series, wait_for, write_config

pytestmark = pytest.mark.engine  # starts gateways of its own

MODEL = "smollm2"
METHODS = ("none", "ngram")
AB_WEIGHTS = {"none": 3, "ngram": 1}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("auto")
    model = embedded_model(
        default_method="auto",
        auto={"exploration": 0.1, "min_samples": 3, "seed": 11, "load_window_s": 120},
        ab={"weights": AB_WEIGHTS, "seed": 12},
        shadow={"method": "ngram", "share": 0.5, "max_in_flight": 1, "start": "after_primary", "seed": 13},
    )
    with running_gateway(tmp / "gateway.log", write_config(tmp / "auto.yaml", {MODEL: model})) as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with http_client(gateway.url) as client:
        yield client


def settle(http: httpx.Client) -> None:
    """Wait until no shadow runs, so that the next request has the engines to itself."""
    assert wait_for(lambda: http.get("/policy").json()["models"][MODEL]["shadow"]["in_flight"] == 0, 60)


def ask(http: httpx.Client, model: str, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    settle(http)
    body = {"model": model, "messages": messages, "max_tokens": 24, "temperature": 0, **extra}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    assert reply.headers["X-Specgate-Engine"] == f"{MODEL}:{data['specgate']['method']}"
    return data


def rate(record: dict[str, Any]) -> float:
    return float(record["completion_tokens"] / record["e2e_s"])


def test_policy_routes_are_listed_and_every_decision_is_explained(http: httpx.Client) -> None:
    cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    assert cards[f"{MODEL}:auto"]["policy"] == "auto" and cards[f"{MODEL}:ab"]["policy"] == "ab"
    assert cards[MODEL]["default_method"] == "auto"
    before = {m: series(http, "specgate_route_decisions_total", policy="auto", method=m) for m in METHODS}
    records = [ask(http, MODEL, [{"role": "user", "content": f"Name {i} colours."}])["specgate"] for i in range(4)]
    for record in records:
        route = record["route"]
        assert route["policy"] == "auto" and route["objective"] == "throughput"
        assert route["reason"] in ("cold_start", "best_estimate", "exploration")
        assert route["bucket"] == "prose/varied/greedy" and route["load"] == 0
        assert set(route["estimates"]) == set(METHODS)
    chosen = Counter(r["method"] for r in records)
    after = {m: series(http, "specgate_route_decisions_total", policy="auto", method=m) for m in METHODS}
    assert {m: after[m] - before[m] for m in METHODS} == {m: chosen[m] for m in METHODS}
    # An explicit method is explained too, and teaches `auto` all the same.
    explicit = ask(http, f"{MODEL}:ngram", [{"role": "user", "content": "Hi."}])["specgate"]["route"]
    assert explicit["policy"] == "explicit" and explicit["reason"] == "requested" and explicit["bucket"]


@pytest.mark.parametrize("workload", ["edit", "chat"])
def test_auto_ends_up_on_the_method_that_measured_faster(http: httpx.Client, workload: str) -> None:
    prompts = [
        [{"role": role, "content": text} for role, text in p.messages]
        for p in (edit(21) if workload == "edit" else chat(21)).prompts
    ]
    # Both methods measured on the same prompts, through the gateway (auto learns from these too).
    measured = {
        m: statistics.mean(rate(ask(http, f"{MODEL}:{m}", p)["specgate"]) for p in prompts[:5]) for m in METHODS
    }
    picks = [ask(http, f"{MODEL}:auto", p)["specgate"] for p in prompts[5:]]
    late = Counter(r["method"] for r in picks[-10:])
    faster, slower = sorted(METHODS, key=lambda m: -measured[m])
    print(f"{workload}: measured tok/s {measured}, auto's last 10: {dict(late)}")
    for record in picks:  # every exploiting decision took the best of its own estimates
        route = record["route"]
        assert route["policy"] == "auto"
        assert route["bucket"].startswith("code/" if workload == "edit" else "prose/")
        if route["reason"] == "best_estimate":
            assert route["estimate"] == max(v for v in route["estimates"].values() if v is not None)
    explored = sum(1 for r in picks if r["route"]["reason"] == "exploration")
    assert explored <= 6  # Binomial(16, 0.1): P(> 6) < 1e-3
    if measured[faster] > 1.15 * measured[slower]:  # a clear difference: auto must have found it
        assert late[faster] >= 6, (measured, late)  # P(> 4 of 10 explored) < 2e-3


def test_ab_weights_hold_and_a_user_sticks(http: httpx.Client) -> None:
    short = [{"role": "user", "content": "Say yes."}]
    picks = Counter(
        ask(http, f"{MODEL}:ab", short, max_tokens=2, user=f"user-{i}")["specgate"]["method"] for i in range(48)
    )
    # Binomial(48, 0.75): sd 3; 3.5 sd either way.
    assert abs(picks["none"] - 36) <= 10.5, picks
    sticky = {ask(http, f"{MODEL}:ab", short, max_tokens=2, user="alice")["specgate"]["method"] for _ in range(4)}
    assert len(sticky) == 1
    assert series(http, "specgate_route_decisions_total", policy="ab") == 52


def test_a_shadow_never_changes_the_answer_or_its_latency(http: httpx.Client) -> None:
    question = [{"role": "user", "content": "Write the numbers from one to twenty in words."}]
    primaries_on_ngram = series(http, "specgate_requests_total", method="ngram")
    learnt_before = sum(r["count"] for r in estimates_of(http, "ngram"))
    answers, with_shadow, without = set(), [], []
    for _ in range(12):
        mirrored = series(http, "specgate_shadow_requests_total", method="ngram")
        started = time.perf_counter()
        data = ask(http, f"{MODEL}:none", question, max_tokens=24, ignore_eos=True)
        took = time.perf_counter() - started
        settle(http)
        answers.add(data["choices"][0]["message"]["content"])
        assert data["specgate"]["method"] == "none" and data["specgate"]["completion_tokens"] == 24
        shadowed = series(http, "specgate_shadow_requests_total", method="ngram") > mirrored
        (with_shadow if shadowed else without).append(took)
    assert len(answers) == 1
    assert with_shadow and without, "a 0.5 share should mirror some of 12 requests and not others"
    assert 0.67 < statistics.median(with_shadow) / statistics.median(without) < 1.5
    # Shadows count only in their own series (and in auto's estimates), never as primaries.
    assert series(http, "specgate_requests_total", method="ngram") == primaries_on_ngram
    assert series(http, "specgate_shadow_output_tokens_total", method="ngram") >= 24 * len(with_shadow)
    assert sum(r["count"] for r in estimates_of(http, "ngram")) > learnt_before


def estimates_of(http: httpx.Client, method: str) -> list[dict[str, Any]]:
    table = http.get("/policy").json()["models"][MODEL]["auto"]["estimates"]
    return [row for row in table if row["method"] == method and row["cell"] == "all"]


def test_shadows_beyond_their_limit_are_dropped_not_queued(http: httpx.Client) -> None:
    settle(http)
    dropped = series(http, "specgate_shadow_dropped_total", reason="shadow_limit")
    body = {
        "model": f"{MODEL}:none",
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": 12,
        "ignore_eos": True,
        "temperature": 0,
        # Streamed: a stream's mirror is counted in flight from its first event, not from
        # the end of its answer, so the mirrors of 12 streams that start together overlap
        # however their ends spread (CI saw 12 unstreamed answers end over 2.5 s: no drop).
        "stream": True,
    }
    statuses: list[int] = []
    primaries = 12
    together = threading.Barrier(primaries)

    def send() -> None:
        with httpx.Client(base_url=str(http.base_url), timeout=120) as own:
            together.wait(30)
            statuses.append(own.post("/v1/chat/completions", json=body).status_code)

    threads = [threading.Thread(target=send) for _ in range(primaries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert statuses == [200] * primaries
    # The 12 streams start together; max_in_flight is 1, so all mirrors but one are dropped.
    assert series(http, "specgate_shadow_dropped_total", reason="shadow_limit") > dropped
    settle(http)
    assert all(e["unfinished_requests"] == 0 for e in http.get("/engines").json()["engines"])


def test_prometheus_evaluates_the_policy_panels(http: httpx.Client, gateway: GatewayProcess, tmp_path: Path) -> None:
    prom = start_prometheus(tmp_path, gateway.port)
    try:
        prom.wait_for_target()
        mirrored = series(http, "specgate_shadow_requests_total", method="ngram")
        for i in range(4):
            ask(http, f"{MODEL}:auto", [{"role": "user", "content": f"Name {i} rivers."}])
            ask(http, f"{MODEL}:ab", [{"role": "user", "content": "Say yes."}], max_tokens=2)
        for _ in range(16):  # a 0.5 share: P(no shadow in 16) = 2e-5
            if series(http, "specgate_shadow_requests_total", method="ngram") > mirrored:
                break
            ask(http, f"{MODEL}:none", [{"role": "user", "content": "Count to five."}])
        settle(http)
        time.sleep(4)  # a few scrapes after the last request
        queries = [(name, expr) for name, expr in dashboard_queries() if needs_policies(expr)]
        assert len(queries) >= 4
        results = {expr: prom.query(substitute(expr, MODEL)) for _, expr in queries}
        assert all(results.values()), [expr for expr, result in results.items() if not result]
        for expr, result in results.items():
            if "specgate_shadow_dropped_total" not in expr:  # the others saw traffic in the window
                assert max(float(r["value"][1]) for r in result) > 0, expr
    finally:
        prom.stop()


def test_every_record_says_the_load_it_met_and_auto_expects_it(http: httpx.Client) -> None:
    """Last in the module: the burst's loads stay in `auto`'s window (120 s here)."""
    settle(http)

    def send(i: int) -> dict[str, Any]:
        body = {
            "model": f"{MODEL}:none",
            "messages": [{"role": "user", "content": f"Describe {i} cities."}],
            "max_tokens": 24,
            "temperature": 0,
        }
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        route: dict[str, Any] = reply.json()["specgate"]["route"]
        return route

    with ThreadPoolExecutor(4) as pool:
        burst = list(pool.map(send, range(4)))
    met = sorted(route["load_met"] for route in burst)
    print(f"loads met by a burst of 4: {met}")
    assert met[0] > 0 and met[-1] > 1.5  # the first to end ran beside the 3 others nearly all its life
    assert all(route["load_met"] <= 3 for route in burst)
    # The next request arrives at an idle gateway, yet `auto` expects what the burst met.
    route = ask(http, MODEL, [{"role": "user", "content": "Name a colour."}])["specgate"]["route"]
    assert route["load"] == 0 and route["expected_load"] > 0
