"""Synthetic acceptance (vLLM's `rejection_sample_method: synthetic`) on this
machine, through specgate's vLLM plugin (app/engines/vllm_plugin.py): engines with
random generated EAGLE-3 and DFlash drafters, native MTP on the MiMo re-packaging
with a random MTP layer, and a random Gemma-4 MTP assistant on a tiny generated
Gemma-4, accept drafts at set per-position rates.
Rates of 1 then 0 make the acceptance exact, so every step's record is known; the
engines are labelled synthetic in the record, /v1/models and /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import GatewayProcess, embedded_model, http_client, running_gateway, write_config

pytestmark = pytest.mark.engine  # starts gateways of its own

MODEL = "smollm2"
MIMO = "mimo"  # the embedded model re-packaged as MiMo, with a random MTP layer
GEMMA = "gemma"  # a tiny random Gemma-4, for a random Gemma-4 MTP assistant
TARGETS = {MIMO: "generated:mimo-mtp", GEMMA: "generated:gemma4"}
# engine -> (vLLM method, random generated drafter or None, per-position rates)
ENGINES = {
    f"{MODEL}:eagle3-synthetic": ("eagle3", "eagle3", [1.0, 1.0, 0.0]),
    f"{MODEL}:dflash-synthetic": ("dflash", "dflash", [1.0, 1.0, 1.0, 0.0]),
    f"{MIMO}:mtp-synthetic": ("mtp", None, [1.0, 0.0]),
    f"{GEMMA}:mtp-synthetic": ("mtp", "gemma4-assistant", [1.0, 1.0, 0.0]),
}
KV_BYTES = 256 * 1024 * 1024  # six engines: a quarter of the default KV budget each
PROMPT = "Tell me about the history of Rome."


def accepted_per_step(rates: list[float]) -> int:
    return sum(1 for rate in rates if rate == 1.0)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("synthetic")
    methods: dict[str, dict[str, Any]] = {MODEL: {"none": {}}, MIMO: {}, GEMMA: {}}
    for engine, (method, kind, rates) in ENGINES.items():
        model, _, name = engine.partition(":")
        spec = {
            "method": method,
            "num_speculative_tokens": len(rates),
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": rates,
            **({"model": f"generated:{kind}"} if kind else {}),
        }
        methods[model][name] = {"speculative_config": spec}
    engine = {**embedded_model()["engine"], "kv_cache_memory_bytes": KV_BYTES}
    models = {MODEL: embedded_model(engine=engine, default_method="none", methods=methods[MODEL])}
    for model, target in TARGETS.items():
        models[model] = embedded_model(
            target=target, engine=engine, default_method="mtp-synthetic", methods=methods[model]
        )
    with running_gateway(tmp / "gateway.log", write_config(tmp / "synthetic.yaml", models)) as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with http_client(gateway.url) as client:
        yield client


def samples(http: httpx.Client, name: str) -> list[Any]:
    families = text_string_to_metric_families(http.get("/metrics").text)
    return [s for family in families for s in family.samples if s.name == name]


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_drafts_are_accepted_exactly_at_the_set_rates(http: httpx.Client, engine: str, temperature: float) -> None:
    method, rates = engine.partition(":")[2], ENGINES[engine][2]
    n, k = len(rates), accepted_per_step(rates)
    steps = 12
    # Every step yields k accepted drafts and the target's token: stop on a step boundary,
    # and never on EOS (a random drafter could propose it).
    reply = http.post(
        "/v1/chat/completions",
        json={
            "model": engine,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 1 + steps * (k + 1),
            "temperature": temperature,
            "ignore_eos": True,
            "seed": 1,
        },
    )
    assert reply.status_code == 200, reply.text
    record = reply.json()["specgate"]
    assert record["synthetic"] is True and record["method"] == method
    assert record["num_spec_steps"] == steps
    assert record["acceptance_histogram"] == [steps if i == k else 0 for i in range(n + 1)]
    assert record["mean_acceptance_length"] == k + 1
    assert record["num_draft_tokens"] == n * steps and record["num_accepted_draft_tokens"] == k * steps


def test_synthetic_engines_are_labelled_in_models_and_metrics(http: httpx.Client) -> None:
    cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    for engine in ENGINES:
        assert cards[engine]["synthetic"] is True
    assert cards[f"{MODEL}:none"]["synthetic"] is False
    info = {
        f"{s.labels['model']}:{s.labels['method']}": s.labels
        for s in samples(http, "specgate_engine_info")
        if s.value == 1
    }
    for engine, (spec_method, _, rates) in ENGINES.items():
        assert info[engine]["synthetic"] == "true"
        assert info[engine]["speculative_method"] == spec_method
        assert info[engine]["num_speculative_tokens"] == str(len(rates))
    baseline_info = info[f"{MODEL}:none"]
    assert baseline_info["synthetic"] == "false" and baseline_info["num_speculative_tokens"] == ""
    baseline = http.post(
        "/v1/chat/completions",
        json={"model": f"{MODEL}:none", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8},
    )
    assert baseline.json()["specgate"]["synthetic"] is False


def test_counters_add_up_the_synthetic_records(http: httpx.Client) -> None:
    method = "eagle3-synthetic"

    def accepted() -> float:
        return sum(
            s.value
            for s in samples(http, "specgate_spec_accepted_tokens_total")
            if s.labels["model"] == MODEL and s.labels["method"] == method
        )

    before = accepted()
    total = 0
    for max_tokens in (7, 13):
        reply = http.post(
            "/v1/chat/completions",
            json={
                "model": f"{MODEL}:{method}",
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        total += reply.json()["specgate"]["num_accepted_draft_tokens"]
    assert total > 0
    assert accepted() - before == total
