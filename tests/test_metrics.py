"""/metrics against the per-request records: counters move by exactly what the
responses reported; the registry's names, units and labels follow the rules;
a real Prometheus evaluates every dashboard query and agrees with the records."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.metrics import GatewayMetrics
from app.record import RequestRecord, SpecCounts, Timing
from tests.conftest import MODEL
from tests.prometheus import dashboard_queries, needs_policies, start_prometheus, substitute
from tests.support import GatewayProcess, access_entries, scrape, total, wait_for

PROMPTS = [
    "Repeat this list exactly: red, green, blue, cyan, magenta, yellow, black, white.",
    "Name three rivers in Europe.",
]


def send_traffic(client: openai.OpenAI, http: httpx.Client) -> list[dict[str, Any]]:
    records = []
    for method in ("none", "ngram"):
        for prompt in PROMPTS:
            reply = client.chat.completions.create(
                model=f"{MODEL}:{method}", temperature=0, max_tokens=48, messages=[{"role": "user", "content": prompt}]
            )
            records.append(reply.model_extra["specgate"])
        stream = client.chat.completions.create(
            model=f"{MODEL}:{method}",
            temperature=0,
            max_tokens=24,
            messages=[{"role": "user", "content": PROMPTS[0]}],
            stream=True,
            stream_options={"include_usage": True},
        )
        records.append(list(stream)[-1].model_extra["specgate"])
        text = client.completions.create(model=f"{MODEL}:{method}", prompt="One, two, three,", max_tokens=16)
        records.append(text.model_extra["specgate"])
        records += other_routes(http, f"{MODEL}:{method}")
    return records


def other_routes(http: httpx.Client, model: str) -> list[dict[str, Any]]:
    """One request on each of the other generation routes, streamed and not: every
    one is recorded and counted the same way."""
    messages = [{"role": "user", "content": PROMPTS[0]}]
    bodies = [
        ("/v1/completions", {"prompt": ["One, two,", "Red, green,"], "max_tokens": 8}),
        ("/v1/chat/completions/batch", {"messages": [messages, messages], "max_tokens": 8}),
        ("/v1/responses", {"input": PROMPTS[0], "max_output_tokens": 12}),
        ("/v1/responses", {"input": PROMPTS[0], "max_output_tokens": 12, "stream": True}),
        ("/v1/messages", {"messages": messages, "max_tokens": 12}),
        ("/v1/messages", {"messages": messages, "max_tokens": 12, "stream": True}),
    ]
    records = []
    for path, body in bodies:
        with http.stream("POST", path, json={**body, "model": model, "temperature": 0}) as response:
            assert response.status_code == 200, (path, response.read())
            raw = response.read().decode()
        if body.get("stream"):
            datas = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: {")]
            record = json.loads(datas[-1])["specgate"]
        else:
            record = json.loads(raw)["specgate"]
        assert record["engine"] == model and record["completion_tokens"] > 0, path
        records.append(record)
    return records


def by_method(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[record["method"]].append(record)
    return grouped


def test_counters_move_by_exactly_the_records(http: httpx.Client, client: openai.OpenAI) -> None:
    before = scrape(http)
    records = send_traffic(client, http)
    after = scrape(http)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    for method, recs in by_method(records).items():
        lab = {"model": MODEL, "method": method}
        vlab = {"model_name": f"{MODEL}:{method}"}
        assert delta("specgate_requests_total", **lab) == len(recs)
        assert delta("specgate_output_tokens_total", **lab) == sum(r["completion_tokens"] for r in recs)
        assert delta("specgate_prompt_tokens_total", **lab) == sum(r["prompt_tokens"] for r in recs)
        assert delta("specgate_request_e2e_seconds_count", **lab) == len(recs)
        assert delta("vllm:generation_tokens_total", **vlab) == sum(r["completion_tokens"] for r in recs)
        steps = sum(r["num_spec_steps"] or 0 for r in recs)
        assert delta("specgate_spec_steps_total", **lab) == steps
        assert delta("vllm:spec_decode_num_drafts_total", **vlab) == steps
        assert delta("specgate_spec_draft_tokens_total", **lab) == sum(r["num_draft_tokens"] or 0 for r in recs)
        accepted = sum(r["num_accepted_draft_tokens"] or 0 for r in recs)
        assert delta("specgate_spec_accepted_tokens_total", **lab) == accepted
        assert delta("vllm:spec_decode_num_accepted_tokens_total", **vlab) == accepted
        if method == "none":
            assert steps == 0 and total(after, "specgate_spec_steps_total", **lab) == 0
            continue
        assert steps > 0
        for position in range(1, 5):
            expected = sum(sum(r["acceptance_histogram"][position:]) for r in recs)
            assert delta("specgate_spec_accepted_tokens_by_position_total", **lab, position=str(position)) == expected
            assert (
                delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", **vlab, position=str(position - 1))
                == expected
            )


def test_engine_gauges(http: httpx.Client) -> None:
    samples = scrape(http)
    for method in ("none", "ngram"):
        assert total(samples, "specgate_engine_up", model=MODEL, method=method) == 1
        assert total(samples, "specgate_requests_in_flight", model=MODEL, method=method) == 0
        assert 0 <= total(samples, "specgate_engine_kv_cache_usage_ratio", model=MODEL, method=method) <= 1
    assert total(samples, "specgate_engine_info", model=MODEL, method="none", speculative_method="none") == 1
    assert total(samples, "specgate_engine_info", method="ngram", num_speculative_tokens="4") == 1


def test_registry_names_units_and_labels() -> None:
    metrics = GatewayMetrics()
    metrics.observe(
        RequestRecord(
            model="m",
            method="x",
            engine="m:x",
            speculative_method="ngram",
            num_speculative_tokens=2,
            prompt_tokens=5,
            completion_tokens=9,
            finish_reasons=("stop",),
            spec=SpecCounts((1, 1, 2), 8),
            timing=Timing(ttft_s=0.1, decode_tokens_per_s=20.0, e2e_s=0.5),
        )
    )
    metrics.observe_failure("m", "x", "cancelled")
    allowed = {
        "model",
        "method",
        "outcome",
        "position",
        "model_name",
        "engine",
        "finished_reason",
        "le",
        "reason",
        "policy",
    }
    for family in metrics.registry.collect():
        assert family.name.startswith(("specgate_", "vllm:")), family.name
        assert ":" not in family.name or family.name.startswith("vllm:")
        for sample in family.samples:
            assert set(sample.labels) <= allowed, sample
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
        if family.type == "histogram" and family.name.startswith("specgate_request_"):
            assert family.name.endswith(("_seconds", "_length", "_ratio", "_per_second", "_tokens"))


def test_prometheus_evaluates_dashboards_and_agrees(
    gateway: GatewayProcess, client: openai.OpenAI, http: httpx.Client, tmp_path: Path
) -> None:
    prom = start_prometheus(tmp_path, gateway.port)
    try:
        prom.wait_for_target()
        time.sleep(2)
        start = time.time()
        records = send_traffic(client, http)
        time.sleep(4)  # a few scrapes and rule evaluations after the last request
        end = time.time()
        queries = [(name, expr) for name, expr in dashboard_queries() if not needs_policies(expr)]
        assert len(queries) >= 10
        empty = [f"{name}: {expr}" for name, expr in queries if not prom.query(substitute(expr, MODEL))]
        assert not empty, "queries without data:\n" + "\n".join(empty)
        check_against_records(prom, by_method(records), start, end)
        assert prom.query('specgate:speedup_over_baseline:1m{method="ngram"} > 0')
    finally:
        prom.stop()


def check_against_records(prom: Any, grouped: dict[str, list[dict[str, Any]]], start: float, end: float) -> None:
    def delta(expr: str) -> float:
        now, then = prom.query(expr, at=end), prom.query(expr, at=start)
        return float(now[0]["value"][1]) - (float(then[0]["value"][1]) if then else 0.0)

    sel = f'{{model="{MODEL}",method="ngram"}}'
    steps = sum(r["num_spec_steps"] for r in grouped["ngram"])
    accepted = sum(r["num_accepted_draft_tokens"] for r in grouped["ngram"])
    prom_accepted = delta(f"sum(specgate_spec_accepted_tokens_total{sel})")
    prom_mal = 1 + prom_accepted / delta(f"sum(specgate_spec_steps_total{sel})")
    assert prom_mal == pytest.approx(1 + accepted / steps)

    def mean_rate(method: str) -> tuple[float, float]:
        s = f'{{model="{MODEL}",method="{method}"}}'
        prom_mean = delta(f"sum(specgate_request_decode_tokens_per_second_sum{s})") / delta(
            f"sum(specgate_request_decode_tokens_per_second_count{s})"
        )
        rates = [r["decode_tokens_per_s"] for r in grouped[method] if r["decode_tokens_per_s"]]
        return prom_mean, sum(rates) / len(rates)

    (prom_ngram, rec_ngram), (prom_none, rec_none) = mean_rate("ngram"), mean_rate("none")
    assert prom_ngram / prom_none == pytest.approx(rec_ngram / rec_none, rel=1e-6)


def test_access_log_has_one_json_line_per_request_without_text(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    marker = "zanzibar-quokka-marker"
    reply = client.chat.completions.create(
        model=f"{MODEL}:ngram", max_tokens=8, messages=[{"role": "user", "content": f"Say {marker} twice."}]
    )

    def mine() -> list[dict[str, Any]]:
        return [entry for entry in access_entries(gateway.log()) if entry["request_id"] == reply.id]

    assert wait_for(lambda: bool(mine()), 10)  # written after the answer is sent
    log = gateway.log()
    entries = mine()
    assert len(entries) == 1
    entry = entries[0]
    assert (entry["model"], entry["method"]) == (MODEL, "ngram")
    assert entry["completion_tokens"] == reply.usage.completion_tokens  # type: ignore[union-attr]
    assert entry["mean_acceptance_length"] == reply.model_extra["specgate"]["mean_acceptance_length"]
    assert entry["outcome"] == reply.choices[0].finish_reason
    assert marker not in log
