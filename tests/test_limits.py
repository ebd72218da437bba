"""Limits and faults against a real gateway with real in-process engines: `none`
has one place, one queue slot and a 30 s total limit; `ngram` has the defaults
and is killed and restarted; `timed` (no speculation) has a 5 s total limit, for
the requests meant to run out of time; last, SIGTERM drains the gateway."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import (
    GatewayProcess,
    access_entries,
    descendants,
    embedded_model,
    engine_core,
    http_client,
    running_gateway,
    series,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.engine  # starts gateways of its own

MODEL = "smollm2"
ENGINE = f"{MODEL}:none"
SPEC = f"{MODEL}:ngram"
TOTAL_S = 30  # from admission: a slow first token on a busy machine plus the queue checks must fit inside it
# A second engine without speculation, with a short time limit: the requests that are meant
# to run out of time cost little, and the other engines keep their limits.
TIMED = f"{MODEL}:timed"
TIMED_TOTAL_S = 5
LONG = {
    "model": ENGINE,
    "messages": [{"role": "user", "content": "Write a very long essay about the history of Europe."}],
    "max_tokens": 3000,
    "ignore_eos": True,
}
MAX_BODY = 65536
SHORT = {"model": ENGINE, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("limits")
    ngram = embedded_model()["methods"]["ngram"]
    model = embedded_model(
        default_method="none",
        methods={
            "none": {"limits": {"max_in_flight": 1, "max_queued": 1, "retry_after_s": 2, "total_timeout_s": TOTAL_S}},
            "ngram": ngram,
            "timed": {"limits": {"total_timeout_s": TIMED_TOTAL_S}},
        },
    )
    config = write_config(tmp / "limited.yaml", {MODEL: model})  # engines start in this order
    with running_gateway(tmp / "gateway.log", config, extra_env={"SPECGATE_MAX_BODY_BYTES": str(MAX_BODY)}) as gateway:
        with httpx.Client(base_url=gateway.url, timeout=120) as warm:  # the first request of an engine is slow
            for method in ("none", "ngram", "timed"):
                reply = warm.post("/v1/chat/completions", json={**SHORT, "model": f"{MODEL}:{method}"})
                assert reply.status_code == 200
        yield gateway


@pytest.fixture(scope="module")
def gw(limited: GatewayProcess) -> Iterator[httpx.Client]:
    with http_client(limited.url, 120) as client:
        yield client


def unfinished(gw: httpx.Client, engine: str = ENGINE) -> int:
    engines = {e["engine"]: e for e in gw.get("/engines").json()["engines"]}
    return int(engines[engine]["unfinished_requests"])


def test_beyond_place_and_queue_a_429_at_once(gw: httpx.Client, limited: GatewayProcess) -> None:
    try:
        beyond_place_and_queue(gw, limited)
    except AssertionError as exc:  # once failed in CI only: say what the gateway saw
        raise AssertionError(f"{exc}\n--- the gateway's log, last lines ---\n{limited.log()[-4000:]}") from None


def beyond_place_and_queue(gw: httpx.Client, limited: GatewayProcess) -> None:
    queued_status: list[int | str] = []  # its status, or what its client raised

    def queued_client() -> None:
        try:
            with (
                httpx.Client(base_url=limited.url, timeout=120) as own,
                own.stream("POST", "/v1/chat/completions", json={**SHORT, "stream": True}) as response,
            ):
                queued_status.append(response.status_code)
                response.read()
        except httpx.HTTPError as exc:
            queued_status.append(repr(exc))

    rejected_before = series(gw, "specgate_requests_rejected_total", reason="overloaded")
    sent = time.monotonic()
    with (
        httpx.Client(base_url=limited.url, timeout=120) as own,
        own.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as first,
    ):
        assert first.status_code == 200
        lines = first.iter_lines()
        first_line = next(lines)
        first_token_s = time.monotonic() - sent
        waiter = threading.Thread(target=queued_client)
        waiter.start()
        # Well inside the first request's 30 s: CI once took over 10 s to see it queued.
        queued = wait_for(lambda: series(gw, "specgate_requests_queued", method="none") == 1, 20)
        assert queued, (
            f"first token after {first_token_s:.1f} s ({first_line[:80]!r}); queued client: "
            f"{queued_status}; {time.monotonic() - sent:.1f} s since the first was sent"
        )
        started = time.monotonic()
        refused = gw.post("/v1/chat/completions", json=SHORT)
        assert time.monotonic() - started < 2
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "2"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert refused.json()["error"]["code"] == "engine_overloaded"
        assert unfinished(gw) == 1  # the refused request never reached the engine
        assert queued_status == []  # the queued one waits for the place
    # The first client left: its place goes to the queued request, which is answered.
    waiter.join(60)
    assert queued_status == [200], f"queued client: {queued_status}, {time.monotonic() - sent:.1f} s since the first"
    assert series(gw, "specgate_requests_rejected_total", reason="overloaded") == rejected_before + 1
    assert wait_for(lambda: unfinished(gw) == 0, 15)
    assert series(gw, "specgate_requests_queued") == 0
    assert gw.post("/v1/chat/completions", json=SHORT).status_code == 200


def test_total_timeout_aborts_the_engine_request(gw: httpx.Client) -> None:
    long = {**LONG, "model": TIMED}
    timeouts_before = series(gw, "specgate_requests_total", outcome="timeout")
    started = time.monotonic()
    reply = gw.post("/v1/chat/completions", json=long)
    took = time.monotonic() - started
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["type"] == "timeout_error" and "total_timeout_s" in reply.json()["error"]["message"]
    assert TIMED_TOTAL_S - 0.5 < took < TIMED_TOTAL_S + 10
    assert wait_for(lambda: unfinished(gw, TIMED) == 0, 10)

    with gw.stream("POST", "/v1/chat/completions", json={**long, "stream": True}) as response:
        assert response.status_code == 200
        events = [e for e in response.read().split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["type"] == "timeout_error"
    assert len(events) > 3  # tokens flowed until the deadline
    assert wait_for(lambda: unfinished(gw, TIMED) == 0, 10)
    assert series(gw, "specgate_requests_total", outcome="timeout") == timeouts_before + 2
    assert gw.post("/v1/chat/completions", json=SHORT).status_code == 200


def test_limits_in_the_config_file_name_the_key(tmp_path: Path) -> None:
    from app.config import ConfigError, parse_config

    raw = {
        "models": {"m": {"target": "x", "default_method": "a", "limits": {"max_in_flight": 0}, "methods": {"a": {}}}}
    }
    with pytest.raises(ConfigError, match=r"models\.m\.limits\.max_in_flight: Input should be greater than 0"):
        parse_config(raw)


# ---- soak: 150 requests of every kind, 32 at a time ----

SOAK_REQUESTS = 120  # with 30 more before them as a warm-up: 150 requests, about 2 min here
SOAK_CONCURRENCY = 32


@dataclass
class SoakResult:
    kind: str
    status: int | None = None  # None: the client left on purpose
    complete: bool = False  # a full answer: finish_reason and a record
    error_type: str | None = None
    answer_id: str | None = None  # a stream's id (vLLM's), as the access log names a finished request
    left_after_s: float | None = None  # a client that left: when, from just before it sent the request
    closed_after_s: float | None = None  # and when its connection was closed


def soak_plan(seed: int) -> list[str]:
    kinds = (
        ["answer"] * 55 + ["stream"] * 15 + ["disconnect"] * 10 + ["timeout"] * 5 + ["overload"] * 10 + ["oversize"] * 5
    )
    rng = random.Random(seed)
    return [rng.choice(kinds) for _ in range(SOAK_REQUESTS)]


async def soak_one(client: httpx.AsyncClient, kind: str, i: int) -> SoakResult:
    prompt = [{"role": "user", "content": f"Count from {i} to {i + 9}, separated by commas."}]
    if kind == "oversize":
        body = {"model": SPEC, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}
        reply = await client.post("/v1/chat/completions", json=body)
        return SoakResult(kind, reply.status_code, error_type=reply.json()["error"]["code"])
    if kind in ("answer", "overload", "timeout"):
        # `overload` meets the baseline's one place and one queue, `timeout` a short time limit.
        model = {"answer": SPEC, "overload": ENGINE, "timeout": TIMED}[kind]
        tokens = 3000 if kind == "timeout" else 16
        body = {"model": model, "messages": prompt, "max_tokens": tokens, "ignore_eos": kind == "timeout"}
        reply = await client.post("/v1/chat/completions", json=body)
        data = reply.json()
        if reply.status_code != 200:
            return SoakResult(kind, reply.status_code, error_type=data["error"]["type"])
        finished = data["choices"][0]["finish_reason"] in ("stop", "length") and data["specgate"] is not None
        return SoakResult(kind, 200, complete=finished and data["specgate"]["completion_tokens"] > 0)
    body = {
        "model": SPEC,
        "messages": prompt,
        "max_tokens": 16 if kind == "stream" else 400,
        "stream": True,
        "ignore_eos": kind == "disconnect",
    }
    sent = time.monotonic()
    leaving: SoakResult | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        events: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
            if kind == "disconnect" and len(events) == 3:
                answer_id = json.loads(events[0].removeprefix("data: "))["id"]
                leaving = SoakResult(kind, answer_id=answer_id, left_after_s=time.monotonic() - sent)
                break  # leaving the block closes the connection mid-stream
        if leaving is None:
            last = json.loads(events[-2].removeprefix("data: "))
            if "error" in last:
                return SoakResult(kind, response.status_code, error_type=last["error"]["type"])
            return SoakResult(kind, response.status_code, complete=events[-1] == "data: [DONE]" and "specgate" in last)
    # When the connection was closed: a close that waits on the answer would be the client's doing.
    leaving.closed_after_s = time.monotonic() - sent
    return leaving


async def soak(url: str, plan: list[str]) -> list[SoakResult]:
    gate = asyncio.Semaphore(SOAK_CONCURRENCY)
    limits = httpx.Limits(max_connections=SOAK_CONCURRENCY * 2)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10), limits=limits) as client:

        async def run(i: int, kind: str) -> SoakResult:
            async with gate:
                return await soak_one(client, kind, i)

        return await asyncio.gather(*(run(i, kind) for i, kind in enumerate(plan)))


def outcome_counts(gw: httpx.Client) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(gw.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "specgate_requests_total":
                counts[sample.labels["outcome"]] = counts.get(sample.labels["outcome"], 0) + sample.value
            if sample.name == "specgate_requests_rejected_total":
                key = f"rejected:{sample.labels['reason']}"
                counts[key] = counts.get(key, 0) + sample.value
    return counts


def test_soak_every_request_ends_cleanly_and_nothing_leaks(gw: httpx.Client, limited: GatewayProcess) -> None:
    process = psutil.Process(limited.proc.pid)
    asyncio.run(soak(limited.url, soak_plan(seed=1)[:30]))  # warm-up: allocator and connection pools
    assert wait_for(lambda: all(e["unfinished_requests"] == 0 for e in gw.get("/engines").json()["engines"]), 30)
    fds_before, rss_before = process.num_fds(), process.memory_info().rss
    counts_before = outcome_counts(gw)

    results = asyncio.run(soak(limited.url, soak_plan(seed=2)))

    # Every request ended in a full answer or a clean error of the kind expected.
    clean = {"overload": {429, 504}, "timeout": {429, 504}, "oversize": {413}}
    for result in results:
        if result.kind == "disconnect":
            assert result.status is None
        elif result.status == 200:
            assert result.complete or result.error_type == "timeout_error", result
        else:
            assert result.status in clean.get(result.kind, set()), result
            assert result.error_type is not None
    by_status: dict[tuple[str, int | None], int] = {}
    for result in results:
        by_status[(result.kind, result.status)] = by_status.get((result.kind, result.status), 0) + 1
    print("soak results (kind, status): count", dict(sorted(by_status.items(), key=str)))
    # The plan's first 32 requests start at once, four of them on the baseline's one place and one queue.
    assert any(r.status == 429 for r in results), "the load should have exceeded the `none` engine's limits"
    assert all(r.complete for r in results if r.kind in ("answer", "stream"))

    # Afterwards: no engine request left, descriptors and memory back near the start.
    assert wait_for(lambda: all(e["unfinished_requests"] == 0 for e in gw.get("/engines").json()["engines"]), 30)
    assert series(gw, "specgate_requests_in_flight") == 0 and series(gw, "specgate_requests_queued") == 0
    assert wait_for(lambda: process.num_fds() <= fds_before + 8, 15)  # closed client sockets go away
    fds_after, rss_after = process.num_fds(), process.memory_info().rss
    print(f"soak fds {fds_before} -> {fds_after}, rss {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert rss_after <= rss_before * 1.15 + 32 * 2**20

    # The counters moved by exactly what the clients saw.
    after = outcome_counts(gw)

    def moved(key: str) -> float:
        return after.get(key, 0) - counts_before.get(key, 0)

    answered = sum(1 for r in results if r.complete)
    timed_out = sum(1 for r in results if r.error_type == "timeout_error")
    left = [r for r in results if r.kind == "disconnect"]
    late = finished_anyway(left, limited.log())
    assert moved("cancelled") == len(left) - len(late), (moved("cancelled"), len(left), late)
    assert moved("stop") + moved("length") == answered + len(late)
    assert moved("rejected:overloaded") == sum(1 for r in results if r.status == 429)
    assert moved("timeout") + moved("rejected:queue_timeout") == timed_out
    assert moved("error") == 0 and moved("invalid") == 0


def finished_anyway(left: list[SoakResult], log: str) -> list[dict[str, Any]]:
    """The access-log lines of clients that left whose request still ran to its end.
    The soak checks the accounting (each such request is counted once, as finished,
    not as cancelled); that a client leaving stops its request is test_disconnect's.
    In CI (twice, never in six runs here) up to half the soak's leavers were noticed
    only at the end of their answer: each is reported with when its client left and
    when its connection closed, to find out why."""
    finished = {entry["request_id"]: entry for entry in access_entries(log)}
    late = [(finished[r.answer_id], r) for r in left if r.answer_id in finished]
    for entry, r in late:
        # A warning, not a print: pytest's summary shows it in CI, where it was seen.
        warnings.warn(
            f"soak leaver: client left after {r.left_after_s:.1f} s, closed after {r.closed_after_s:.1f} s; "
            f"its request ran on: {entry}",
            UserWarning,
            stacklevel=2,
        )
    return [entry for entry, _ in late]


def ready_engines(gw: httpx.Client) -> dict[str, bool]:
    engines: dict[str, bool] = gw.get("/ready").json()["engines"]
    return engines


def test_a_dead_engine_is_restarted_while_the_other_serves(gw: httpx.Client, limited: GatewayProcess) -> None:
    baseline_core, ngram_core = engine_core(limited, None), engine_core(limited, "ngram")
    spec = f"{MODEL}:ngram"
    with gw.stream("POST", "/v1/chat/completions", json={**LONG, "model": spec, "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(lines)
        ngram_core.kill()  # as an OOM killer would
        events = [line for line in lines if line.startswith("data: ")]
    # The request in flight ends with a clean error event, then [DONE].
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["type"] == "service_unavailable"
    assert wait_for(lambda: ready_engines(gw) == {ENGINE: True, spec: False, TIMED: True}, 10)
    # While it is down: its requests get a 503, the other engine serves without an error.
    down = gw.post("/v1/chat/completions", json={**SHORT, "model": spec})
    assert down.status_code == 503
    answers = [gw.post("/v1/chat/completions", json=SHORT) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    # It comes back by itself, answers as before, and the restart is counted.
    assert wait_for(lambda: gw.get("/ready").status_code == 200, 240), limited.log()[-3000:]
    again = gw.post("/v1/chat/completions", json={**SHORT, "model": spec, "temperature": 0})
    base = gw.post("/v1/chat/completions", json={**SHORT, "temperature": 0})
    assert again.status_code == 200
    assert again.json()["choices"][0]["message"]["content"] == base.json()["choices"][0]["message"]["content"]
    assert series(gw, "specgate_engine_restarts_total", method="ngram") == 1
    assert series(gw, "specgate_engine_restarts_total", method="none") == 0
    assert baseline_core.is_running() and not ngram_core.is_running()


def test_sigterm_drains_then_exits_cleanly(gw: httpx.Client, limited: GatewayProcess) -> None:
    """Last in this module: it stops the module's gateway."""
    children = descendants(limited)
    assert children, "the in-process engine runs in a child process"
    answers: list[httpx.Response] = []
    medium = {**SHORT, "max_tokens": 48, "ignore_eos": True}
    worker = threading.Thread(target=lambda: answers.append(gw.post("/v1/chat/completions", json=medium)))
    worker.start()
    assert wait_for(lambda: unfinished(gw) == 1, 10)
    limited.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: gw.get("/ready").json().get("draining") is True, 5)
    assert gw.get("/ready").status_code == 503
    late = gw.post("/v1/chat/completions", json=SHORT)
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    worker.join(60)
    # The request admitted before SIGTERM got its whole answer.
    assert answers and answers[0].status_code == 200
    assert answers[0].json()["usage"]["completion_tokens"] == 48
    assert limited.proc.wait(60) == 0
    assert wait_for(lambda: not any(child.is_running() for child in children), 30)
