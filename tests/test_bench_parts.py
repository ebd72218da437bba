"""The bench and tune pieces that need no server: target discovery from
`/v1/models`, reading speculative figures in both servers' formats, request
bodies, tune's candidates, its pick and its config snippet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm.entrypoints.generate.base.protocol import PerRequestMetrics, SpeculativeDecodingMetrics
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

from app.bench.client import RequestSettings, Target
from app.bench.records import Load, RequestResult, SpecSample
from app.bench.runner import BenchError, default_baselines, resolve_targets
from app.bench.stats import Acceptance, CellSummary, Latency, summarize
from app.bench.tune import TunePlan, candidate_config, candidates, default_ns, pick_best, snippet
from app.bench.workloads import chat
from app.config import MethodConfig, parse_config

GATEWAY_CARDS: list[dict[str, Any]] = [
    {"id": "m", "root": "m", "default_method": "ngram"},
    {"id": "m:none", "root": "m", "method": "none", "num_speculative_tokens": None},
    {"id": "m:ngram", "root": "m", "method": "ngram", "num_speculative_tokens": 4},
    {"id": "other:none", "root": "other", "method": "none", "num_speculative_tokens": None},
]
# What `vllm serve` lists: no method, the folder as root.
VLLM_CARDS: list[dict[str, Any]] = [{"id": "smollm2", "object": "model", "owned_by": "vllm", "root": "/models/x"}]


def test_targets_of_one_gateway_model_and_its_baseline() -> None:
    targets = resolve_targets(GATEWAY_CARDS, model="m")
    assert targets == (Target("m:none", "none", None), Target("m:ngram", "ngram", 4))
    assert default_baselines(targets) == ("m:none",)


def test_targets_default_to_every_engine_and_explicit_ones_are_checked() -> None:
    everything = resolve_targets(GATEWAY_CARDS)
    assert [t.model for t in everything] == ["m:none", "m:ngram", "other:none"]
    # Two models: rows are named by the whole target, and each model has its baseline.
    assert [t.method for t in everything] == ["m:none", "m:ngram", "other:none"]
    assert default_baselines(everything) == ("m:none", "other:none")
    assert resolve_targets(GATEWAY_CARDS, targets=["m:ngram"]) == (Target("m:ngram", "ngram", 4),)
    with pytest.raises(BenchError, match=r"unknown target\(s\) m:eagle3"):
        resolve_targets(GATEWAY_CARDS, targets=["m:eagle3"])
    with pytest.raises(BenchError, match="no engines of model 'x'"):
        resolve_targets(GATEWAY_CARDS, model="x")


def test_each_model_is_sped_up_against_its_own_baseline() -> None:
    def result(target: str, e2e_s: float) -> RequestResult:
        return RequestResult(
            target=target,
            method=target,
            num_speculative_tokens=None,
            workload="chat",
            load=Load("concurrency", 1),
            prompt_id="p",
            start_s=0.0,
            e2e_s=e2e_s,
            output_tokens=10,
        )

    results = [result("a:none", 1.0), result("a:ngram", 0.5), result("b:none", 2.0), result("b:ngram", 1.0)]
    own = {c.target: c.speedup for c in summarize(results, ("a:none", "b:none"))}
    assert own == {"a:none": 1.0, "a:ngram": 2.0, "b:none": 1.0, "b:ngram": 2.0}
    one = {c.target: c.speedup for c in summarize(results, "a:none")}  # one baseline given: it serves all
    assert one == {"a:none": 1.0, "a:ngram": 2.0, "b:none": 0.5, "b:ngram": 1.0}


def test_a_plain_server_is_benched_by_its_listed_models_without_baseline() -> None:
    targets = resolve_targets(VLLM_CARDS)
    assert targets == (Target("smollm2", "smollm2", None),)
    assert default_baselines(targets) == ()


def test_spec_sample_from_specgate_record() -> None:
    body = {"specgate": {"num_speculative_tokens": 3, "acceptance_histogram": [2, 1, 0, 4], "num_draft_tokens": 21}}
    sample = SpecSample.from_response(body)
    assert sample == SpecSample((2, 1, 0, 4), 21, 3)
    assert (sample.num_spec_steps, sample.num_accepted_draft_tokens) == (7, 13)
    assert SpecSample.from_response({"specgate": {"acceptance_histogram": None}}) is None  # a baseline
    assert SpecSample.from_response({"usage": {}}) is None  # a plain server: not measured


def test_spec_sample_from_vllm_serve_per_request_metrics() -> None:
    # Built with vLLM's own classes, as `vllm serve --per-request-spec-decode-metrics` does.
    metrics = RequestSpecDecodeMetrics.new(num_spec_tokens=4)
    for drafted, accepted in ((4, 4), (4, 1), (4, 0), (2, 2)):
        metrics.observe(drafted, accepted)
    payload = PerRequestMetrics(speculative_decoding=SpeculativeDecodingMetrics(**metrics.to_dict()))
    sample = SpecSample.from_response({"usage": {}, "metrics": payload.model_dump()})
    assert sample == SpecSample((1, 1, 1, 0, 1), 14, 4)
    assert (
        Acceptance(sample.acceptance_histogram, 14, 4).mean_acceptance_length
        == metrics.to_dict()["mean_acceptance_length"]
    )


def test_request_body_streams_with_usage() -> None:
    prompt = chat(1).prompts[0]
    body = RequestSettings(max_tokens=9).body(Target("m:ngram", "ngram", 4), prompt)
    assert body["model"] == "m:ngram" and body["max_tokens"] == 9 and body["temperature"] == 0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == prompt.to_openai()


@pytest.mark.parametrize("load", [Load("concurrency", 16), Load("rate", 0.5), Load("rate", 1 / 3)])
def test_load_label_round_trips(load: Load) -> None:
    assert Load.parse(str(load)) == load


def plan(tmp_path: Path, method: str = "ngram", **changes: Any) -> TunePlan:
    raw = {
        "models": {
            "m": {
                "target": "/models/m",
                "engine": {"max_model_len": 2048, "dtype": "float32"},
                "default_method": method,
                "methods": {
                    "none": {},
                    method: {
                        "speculative_config": {"method": method, "num_speculative_tokens": 4, "prompt_lookup_min": 3}
                    },
                },
            }
        }
    }
    config = parse_config(raw)
    fields: dict[str, Any] = {
        "config": config,
        "model": "m",
        "method_name": method,
        "template": config.models["m"].methods[method],
        "ns": (1, 3),
        "lookup_max": (),
        "workload": chat(2),
        "concurrency": 1,
        "settings": RequestSettings(),
        "out_dir": tmp_path,
    }
    return TunePlan(**{**fields, **changes})


def test_default_sweeps_follow_the_study() -> None:
    assert default_ns("eagle3") == (1, 2, 3, 4, 5, 6, 7)
    assert default_ns("dflash") == default_ns("dspark") == (3, 7, 11, 15)


def test_candidates_sweep_n_and_lookup_max_after_the_baseline(tmp_path: Path) -> None:
    found = candidates(plan(tmp_path, lookup_max=(2, 4)))
    assert [c.name for c in found] == ["none", "ngram-n1-l2", "ngram-n1-l4", "ngram-n3-l2", "ngram-n3-l4"]
    spec = found[1].method.speculative_config
    assert spec == {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2, "prompt_lookup_max": 2}
    assert found[4].method.speculative_config == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 3, "prompt_lookup_max": 4
    }  # fmt: skip


def test_candidate_config_serves_only_that_engine(tmp_path: Path) -> None:
    p = plan(tmp_path)
    raw = candidate_config(p, candidates(p)[2])
    config = parse_config(yaml.safe_load(yaml.safe_dump(raw)))
    model = config.models["m"]
    assert list(model.methods) == ["ngram-n3"] and model.default_method == "ngram-n3"
    assert model.methods["ngram-n3"].num_speculative_tokens == 3
    assert model.engine.dtype == "float32" and model.target == "/models/m"


def cell(method: str, n: int | None, rate: float, speedup: float | None = None) -> CellSummary:
    none = Latency(None, None, None)
    return CellSummary(
        "chat", Load("concurrency", 1), f"m:{method}", method, n, 4, 0, 100, 1.0, rate, speedup, None, none, none, none
    )


def test_pick_best_is_the_fastest_and_ties_go_to_the_lower_n() -> None:
    cells = [cell("none", None, 99.0), cell("x-n1", 1, 40.0), cell("x-n3", 3, 50.0), cell("x-n5", 5, 50.4)]
    assert pick_best(cells, tie_tolerance=0.01).method == "x-n3"  # type: ignore[union-attr]
    assert pick_best(cells, tie_tolerance=0.0).method == "x-n5"  # type: ignore[union-attr]
    assert pick_best([cell("none", None, 9.0)], 0.01) is None


def test_snippet_is_a_config_block_and_says_when_speculation_loses(tmp_path: Path) -> None:
    p = plan(tmp_path)
    best = cell("ngram-n3", 3, 8.0, speedup=0.8)
    text = snippet(p, best, cell("none", None, 10.0))
    assert "N=3 (8.0 tok/s, 0.80x the baseline)" in text and "serve without speculation" in text
    block = yaml.safe_load(text)["models"]["m"]["methods"]["ngram"]
    assert MethodConfig(**block).num_speculative_tokens == 3
