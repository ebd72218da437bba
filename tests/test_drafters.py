"""Generated drafters (app/drafters.py): EAGLE-3, DFlash, a small draft model and
native MTP (on a MiMo re-packaging of the embedded model) run end to end through a real gateway on this
machine with constant-token probe drafters, whose accepted drafts are known
exactly from the baseline's greedy output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from safetensors import safe_open
from tokenizers import Tokenizer

from app.config import ConfigError, Settings, parse_config
from app.drafters import SIDECAR, TargetShape, generated_drafter
from app.embedded import resolve_embedded_targets
from tests.gateway import GatewayProcess, embedded_model, running_gateway, write_config

MODEL = "smollm2"
MIMO = "mimo"  # the embedded model re-packaged as MiMo, with an MTP probe layer
# engine -> (generated kind, N)
ENGINES = {
    f"{MODEL}:eagle3": ("eagle3-probe", 3),
    f"{MODEL}:dflash": ("dflash-probe", 3),
    f"{MODEL}:draft_model": ("draft-model-probe", 3),
    f"{MIMO}:mtp": ("mimo-mtp-probe", 1),
}
PROMPTS = [
    "Describe the history of the city of Rome in a few sentences.",
    "List the names of the planets of the solar system.",
    "What is the capital of France, and what is it famous for?",
]


def target_folder() -> Path:
    return Path(embedded_model()["target"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("drafters")
    methods: dict[str, Any] = {"none": {}}
    for engine, (kind, n) in ENGINES.items():
        if engine.startswith(f"{MODEL}:"):
            method = engine.partition(":")[2]
            methods[method] = {"speculative_config": {"method": method, "model": f"generated:{kind}",
                                                      "num_speculative_tokens": n}}
    mimo_target = str(generated_drafter(target_folder(), "mimo-mtp-probe", Settings().cache_dir))
    mtp = {"speculative_config": {"method": "mtp", "num_speculative_tokens": ENGINES[f"{MIMO}:mtp"][1]}}
    models = {
        MODEL: embedded_model(default_method="none", methods=methods),
        MIMO: embedded_model(target=mimo_target, default_method="none", methods={"none": {}, "mtp": mtp}),
    }
    with running_gateway(tmp / "gateway.log", write_config(tmp / "drafters.yaml", models)) as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=httpx.Timeout(300, connect=10)) as client:
        yield client


def ask(http: httpx.Client, engine: str, prompt: str) -> tuple[str, list[str], dict[str, Any]]:
    reply = http.post("/v1/chat/completions", json={
        "model": engine, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64, "temperature": 0, "logprobs": True,
    })
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


@pytest.mark.parametrize("engine", list(ENGINES))
def test_probe_drafter_is_lossless_and_accepts_exactly_the_baselines_probe_tokens(
    http: httpx.Client, engine: str
) -> None:
    model, _, method = engine.partition(":")
    kind, n = ENGINES[engine]
    probe = json.loads((generated_drafter(target_folder(), kind, Settings().cache_dir) / SIDECAR)
                       .read_text())["probe_token"]
    probe_text = Tokenizer.from_file(str(target_folder() / "tokenizer.json")).decode([probe])
    accepted_before = counter(http, "specgate_spec_accepted_tokens_total", model, method)
    expected_total = 0
    for prompt in PROMPTS:
        text, tokens, _ = ask(http, f"{model}:none", prompt)
        spec_text, spec_tokens, record = ask(http, engine, prompt)
        assert (spec_text, spec_tokens) == (text, tokens)  # lossless, token for token
        assert record["method"] == method and record["speculative_method"] == method
        assert record["num_speculative_tokens"] == n
        assert record["num_draft_tokens"] == n * record["num_spec_steps"]
        # Every draft is the probe: one is accepted wherever the target's next token is the probe
        # (the first output token comes from the prefill, not from a draft).
        expected = sum(1 for token in tokens[1:] if token == probe_text)
        assert record["num_accepted_draft_tokens"] == expected, (prompt, tokens)
        expected_total += expected
    assert expected_total > 0, "the prompts should make the baseline write the probe token"
    assert counter(http, "specgate_spec_accepted_tokens_total", model, method) - accepted_before == expected_total


def test_the_mimo_repackaging_answers_as_the_embedded_model(http: httpx.Client) -> None:
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


@pytest.mark.parametrize(("kind", "message"), [("medusa", "unknown generated drafter"),
                                               ("mimo-mtp", "is a target with an MTP layer")])
def test_wrong_generated_drafter_names_the_key(tmp_path: Path, kind: str, message: str) -> None:
    raw = {"models": {"m": {"target": str(target_folder()), "default_method": "e", "methods": {
        "e": {"speculative_config": {"method": "eagle3", "model": f"generated:{kind}", "num_speculative_tokens": 2}}}}}}
    with pytest.raises(ConfigError, match=r"models\.m\.methods\.e\.speculative_config\.model: ") as error:
        resolve_embedded_targets(parse_config(raw), tmp_path)
    assert message in str(error.value)
