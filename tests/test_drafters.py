"""Generated drafters (app/drafters/): EAGLE-3, DFlash, a small draft model and
native MTP (on a MiMo re-packaging of the embedded model) run end to end through a
real gateway on this machine with constant-token probe drafters, whose accepted
drafts are known exactly from the baseline's greedy output. Suffix decoding runs
beside them (it needs no drafter); DSpark is checked as far as vLLM goes here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from safetensors import safe_open
from tokenizers import Tokenizer

from app.config import ConfigError, parse_config
from app.drafters import SIDECAR, TargetShape, generated_drafter, probe_token
from app.drafters.common import probe_accepts
from app.embedded import resolve_embedded_targets
from tests.support import embedded_model, http_client, running_gateway, write_config

pytestmark = pytest.mark.engine  # starts gateways of its own

MODEL = "smollm2"
MIMO = "mimo"  # the embedded model re-packaged as MiMo, with an MTP probe layer
GEMMA = "gemma"  # a tiny random Gemma-4 target, with a probe Gemma-4 MTP assistant
# engine -> (generated kind: the drafter, or the target for native MTP; N)
ENGINES = {
    f"{MODEL}:eagle3": ("eagle3-probe", 3),
    f"{MODEL}:dflash": ("dflash-probe", 3),
    f"{MODEL}:draft_model": ("draft-model-probe", 3),
    f"{MIMO}:mtp": ("mimo-mtp-probe", 1),
    f"{GEMMA}:mtp": ("gemma4-assistant-probe", 3),
}
MAX_TOKENS = 64
KV_BYTES = 256 * 1024 * 1024
SUFFIX_N = 8  # suffix decoding (arctic-inference's suffix tree): no drafter at all
PROMPTS = [
    "Describe the history of the city of Rome in a few sentences.",
    "List the names of the planets of the solar system.",
    "What is the capital of France, and what is it famous for?",
]


def target_folder() -> Path:
    return Path(embedded_model()["target"])


def groups() -> dict[str, dict[str, Any]]:
    """The engines, as two gateways' configs: all nine at once beside the session's
    default gateway filled this machine's 24 GiB and the kernel thrashed. The second
    group keeps `smollm2:none`, which the MiMo re-packaging is compared with."""
    methods: dict[str, Any] = {"none": {}}
    for engine, (kind, n) in ENGINES.items():
        if engine.startswith(f"{MODEL}:"):
            method = engine.partition(":")[2]
            methods[method] = {
                "speculative_config": {"method": method, "model": f"generated:{kind}", "num_speculative_tokens": n}
            }
    methods["suffix"] = {"speculative_config": {"method": "suffix", "num_speculative_tokens": SUFFIX_N}}
    mtp = {"speculative_config": {"method": "mtp", "num_speculative_tokens": ENGINES[f"{MIMO}:mtp"][1]}}
    assistant = {
        "speculative_config": {
            "method": "mtp",
            "model": "generated:gemma4-assistant-probe",
            "num_speculative_tokens": ENGINES[f"{GEMMA}:mtp"][1],
        }
    }
    # A quarter of the default KV budget each keeps five engines well within memory.
    engine = {**embedded_model()["engine"], "kv_cache_memory_bytes": KV_BYTES}
    return {
        "drafters": {MODEL: embedded_model(engine=engine, default_method="none", methods=methods)},
        "mtp": {
            MODEL: embedded_model(engine=engine, default_method="none", methods={"none": {}}),
            MIMO: embedded_model(
                target="generated:mimo-mtp-probe",
                engine=engine,
                default_method="none",
                methods={"none": {}, "mtp": mtp},
            ),
            GEMMA: embedded_model(
                target="generated:gemma4", engine=engine, default_method="none", methods={"none": {}, "mtp": assistant}
            ),
        },
    }


class GroupGateways:
    """One group's gateway at a time, started when a test first needs one of its
    models and stopped when a test needs the other group (the tests are ordered so
    that each starts once)."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._configs = groups()
        self._running: str | None = None
        self._stack = ExitStack()
        self._http: httpx.Client | None = None

    def http(self, *models: str) -> httpx.Client:
        """A client of a gateway that serves all of `models`: the running one if it does."""
        if self._http is not None and self._running and set(models) <= set(self._configs[self._running]):
            return self._http
        self.close()
        group = next(g for g, config in self._configs.items() if set(models) <= set(config))
        config = write_config(self._tmp / f"{group}.yaml", self._configs[group])
        gateway = self._stack.enter_context(running_gateway(self._tmp / f"{group}.log", config))
        http = self._stack.enter_context(http_client(gateway.url))
        self._running, self._http = group, http
        return http

    def close(self) -> None:
        self._stack.close()
        self._running, self._http = None, None


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupGateways]:
    gateways = GroupGateways(tmp_path_factory.mktemp("drafters"))
    try:
        yield gateways
    finally:
        gateways.close()


def ask(
    http: httpx.Client, engine: str, prompt: str, max_tokens: int = MAX_TOKENS
) -> tuple[str, list[str], dict[str, Any]]:
    reply = http.post(
        "/v1/chat/completions",
        json={
            "model": engine,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": True,
        },
    )
    assert reply.status_code == 200, reply.text
    data = reply.json()
    tokens = [t["token"] for t in data["choices"][0]["logprobs"]["content"]]
    return data["choices"][0]["message"]["content"], tokens, data["specgate"]


def counter(http: httpx.Client, name: str, model: str, method: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("model") == model and sample.labels.get("method") == method
    )


def test_suffix_decoding_is_lossless_and_drafts_from_earlier_answers(gateways: GroupGateways) -> None:
    http = gateways.http(MODEL)
    for prompt in PROMPTS:
        text, tokens, _ = ask(http, f"{MODEL}:none", prompt)
        first = ask(http, f"{MODEL}:suffix", prompt)
        again = ask(http, f"{MODEL}:suffix", prompt)
        assert first[:2] == (text, tokens) and again[:2] == (text, tokens)
        record = again[2]
        assert record["speculative_method"] == "suffix" and record["num_speculative_tokens"] == SUFFIX_N
        # The first answer is now in the global suffix tree: the same answer is mostly drafted from it.
        assert record["num_accepted_draft_tokens"] > first[2]["num_accepted_draft_tokens"], (first[2], record)
        assert record["mean_acceptance_length"] > 3, record


@pytest.mark.parametrize("engine", list(ENGINES))
def test_probe_drafter_is_lossless_and_accepts_exactly_the_baselines_probe_tokens(
    gateways: GroupGateways, engine: str
) -> None:
    model, _, method = engine.partition(":")
    http = gateways.http(model)
    n = ENGINES[engine][1]
    probe_text = Tokenizer.from_file(str(target_folder() / "tokenizer.json")).decode([probe_token(target_folder())])
    accepted_before = counter(http, "specgate_spec_accepted_tokens_total", model, method)
    expected_total = 0
    for prompt in PROMPTS:
        text, tokens, _ = ask(http, f"{model}:none", prompt)
        longer = ask(http, f"{model}:none", prompt, MAX_TOKENS + n)[1]
        spec_text, spec_tokens, record = ask(http, engine, prompt)
        assert (spec_text, spec_tokens) == (text, tokens)  # lossless, token for token
        assert record["method"] == method and record["speculative_method"] == method
        assert record["num_speculative_tokens"] == n
        assert record["num_draft_tokens"] == n * record["num_spec_steps"]
        # Every draft is the probe: drafts are accepted exactly where the target writes the probe.
        expected = probe_accepts(longer, probe_text, n, limit=len(tokens))
        assert record["num_accepted_draft_tokens"] == expected, (prompt, tokens)
        expected_total += expected
    assert expected_total > 0, "the prompts should make the baseline write the probe token"
    assert counter(http, "specgate_spec_accepted_tokens_total", model, method) - accepted_before == expected_total


def test_the_mimo_repackaging_answers_as_the_embedded_model(gateways: GroupGateways) -> None:
    http = gateways.http(MIMO, MODEL)
    for prompt in PROMPTS:
        assert ask(http, f"{MIMO}:none", prompt)[:2] == ask(http, f"{MODEL}:none", prompt)[:2]


def test_generated_drafters_have_the_layout_vllm_loads(tmp_path: Path) -> None:
    target = target_folder()
    shape = TargetShape.of(target)
    eagle3 = generated_drafter(target, "eagle3", tmp_path)
    config = json.loads((eagle3 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == shape.vocab
    with safe_open(str(eagle3 / "model.safetensors"), "pt") as weights:
        assert weights.get_slice("fc.weight").get_shape() == [shape.hidden, 3 * shape.hidden]
        assert weights.get_slice("midlayer.self_attn.q_proj.weight").get_shape() == [shape.hidden, 2 * shape.hidden]
        assert "embed_tokens.weight" not in set(weights.keys())  # shared with the target
    dflash = generated_drafter(target, "dflash-probe", tmp_path)
    config = json.loads((dflash / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["draft_vocab_size"] == 1
    with safe_open(str(dflash / "model.safetensors"), "pt") as weights:
        assert weights.get_slice("lm_head.weight").get_shape() == [1, shape.hidden]
        assert weights.get_tensor("d2t").tolist() == [json.loads((dflash / SIDECAR).read_text())["probe_token"]]
    written = (eagle3 / "model.safetensors").stat().st_mtime_ns
    assert generated_drafter(target, "eagle3", tmp_path) == eagle3  # written once
    assert (eagle3 / "model.safetensors").stat().st_mtime_ns == written


def test_a_generated_target_that_is_a_drafter_names_the_key(tmp_path: Path) -> None:
    raw = {"models": {"m": {"target": "generated:eagle3", "default_method": "none", "methods": {"none": {}}}}}
    with pytest.raises(ConfigError, match=r"models\.m\.target: 'eagle3' is not a generated target"):
        resolve_embedded_targets(parse_config(raw), tmp_path)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("medusa", "unknown generated drafter"),
        ("mimo-mtp", "is a generated target, not a drafter"),
        ("gemma4-assistant", "needs a Gemma-4 text target"),
    ],
)
def test_wrong_generated_drafter_names_the_key(tmp_path: Path, kind: str, message: str) -> None:
    raw = {
        "models": {
            "m": {
                "target": str(target_folder()),
                "default_method": "e",
                "methods": {
                    "e": {
                        "speculative_config": {
                            "method": "eagle3",
                            "model": f"generated:{kind}",
                            "num_speculative_tokens": 2,
                        }
                    }
                },
            }
        }
    }
    with pytest.raises(ConfigError, match=r"models\.m\.methods\.e\.speculative_config\.model: ") as error:
        resolve_embedded_targets(parse_config(raw), tmp_path)
    assert message in str(error.value)


def dspark_config(drafter: Path, **extra: Any) -> Any:
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    target = ModelConfig(model=str(target_folder()), max_model_len=1024)
    return SpeculativeConfig(
        method="dspark",
        model=str(drafter),
        num_speculative_tokens=3,
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
        **extra,
    )


def test_a_generated_dspark_drafter_passes_vllms_speculative_config(tmp_path: Path) -> None:
    drafter = generated_drafter(target_folder(), "dspark", tmp_path)
    config = dspark_config(drafter)
    assert config.method == "dspark" and config.parallel_drafting
    assert config.draft_model_config.architectures == ["Qwen3DSparkModel"]
    with pytest.raises(ValueError, match="dspark_draft_topk must be between 1 and the draft vocabulary size"):
        dspark_config(drafter, dspark_draft_topk=10**6)


def test_a_dspark_engine_is_refused_here_by_vllms_model_runner_check(tmp_path: Path) -> None:
    # What docs/methods.md says: only vLLM's V2 model runner serves DSpark, and it needs Triton.
    dspark = {"speculative_config": {"method": "dspark", "model": "generated:dspark", "num_speculative_tokens": 3}}
    config = write_config(
        tmp_path / "dspark.yaml", {MODEL: embedded_model(methods={"none": {}, "dspark": dspark}, default_method="none")}
    )
    done = subprocess.run(
        [sys.executable, "-m", "app", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"engine {MODEL}:dspark" in done.stderr
    assert "Model Runner V1 does not support: dspark speculative decoding" in done.stderr
