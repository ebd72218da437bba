"""Config validation: one clear line naming the key path, before any engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import ConfigError, EngineSettings, load_config, parse_config
from app.engines.base import EngineId
from app.engines.vllm_serving import serving_args
from tests.support import REPO, run_cli


def model(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "target": "/models/x",
        "methods": {"none": {}, "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}},
        "default_method": "none",
    }
    return {**base, **overrides}


def error_of(raw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, source="cfg.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_valid_config_round_trips() -> None:
    config = parse_config({"models": {"m": model()}})
    assert config.models["m"].methods["ngram"].speculative_method == "ngram"
    assert config.models["m"].methods["ngram"].num_speculative_tokens == 4
    assert config.models["m"].methods["none"].speculative_method == "none"
    assert not config.models["m"].methods["ngram"].synthetic


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, "cfg.yaml: models: Field required"),
        ([], "cfg.yaml: the top level must be a mapping"),
        ({"models": {}}, "cfg.yaml: models: "),
        ({"models": {"m": model(default_method="eagle3")}}, "default_method 'eagle3' is not one of the methods"),
        ({"models": {"m": model(engine={"max_model_len": -1})}}, "cfg.yaml: models.m.engine.max_model_len:"),
        (
            {"models": {"m": model(engine={"gpu_memory_utilisation": 0.5})}},
            "cfg.yaml: models.m.engine.gpu_memory_utilisation: Extra inputs are not permitted",
        ),
        (
            {
                "models": {
                    "m": model(methods={"x": {"speculative_config": {"num_speculative_tokens": 3}}}, default_method="x")
                }
            },
            "models.m.methods.x.speculative_config: speculative_config needs an explicit 'method'",
        ),
        ({"models": {"a:b": model()}}, "model name 'a:b' must be non-empty, without ':'"),
        ({"models": {"m": model(methods={"x:y": {}}, default_method="x:y")}}, "method name 'x:y'"),
        ({"models": {"m": model(target=None)}}, "cfg.yaml: models.m.target:"),
        (
            {
                "models": {
                    "m": model(
                        methods={
                            "none": {},
                            "eagle3": {
                                "speculative_config": {
                                    "method": "eagle3",
                                    "model": "/d",
                                    "num_speculative_tokens": 3,
                                    "rejection_sample_method": "synthetic",
                                    "synthetic_acceptance_length": 2.5,
                                }
                            },
                        }
                    )
                }
            },
            "models.m.methods: method 'eagle3' has rejection_sample_method 'synthetic' (output not lossless): "
            "its name must say so, e.g. 'eagle3-synthetic'",
        ),
    ],
)
def test_invalid_configs_name_the_key(raw: Any, expected: str) -> None:
    assert expected in error_of(raw)


def test_load_config_reports_yaml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_method_engine_settings_override_model_settings() -> None:
    base = EngineSettings(max_model_len=2048, enforce_eager=True, extra_args={"a": 1, "b": 1})
    merged = base.merged(EngineSettings(enforce_eager=False, device_ids=[2, 3], extra_args={"b": 2}))
    assert merged.to_engine_kwargs() == {
        "max_model_len": 2048,
        "enforce_eager": False,
        "device_ids": [2, 3],
        "a": 1,
        "b": 2,
    }


def shipped_configs() -> list[Path]:
    """The default, the deploy configs and the ones the docs' measurements ran (not
    the `tune.yaml` blocks `specgate tune` wrote there: parts to paste into one)."""
    root = REPO
    docs = [path for path in sorted((root / "docs").rglob("*.yaml")) if path.name != "tune.yaml"]
    return [root / "app" / "default_config.yaml", *sorted((root / "deploy").rglob("*.yaml")), *docs]


def test_shipped_configs_load() -> None:
    for path in shipped_configs():
        raw = yaml.safe_load(path.read_text())
        if isinstance(raw, dict) and "models" in raw:
            parse_config(raw, source=str(path))


def test_serve_refuses_invalid_file_before_any_engine(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": {"m": model(default_method="nope")}}))
    result = run_cli("serve", "--config", str(path), "--port", "1")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("specgate:")]
    assert len(lines) == 1 and "models.m: default_method 'nope'" in lines[0]


def test_vllm_rejection_names_model_and_method(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_maximum": 3}
    raw = {
        "models": {"tiny": model(target="embedded:smollm2", methods={"none": {}, "typo": {"speculative_config": spec}})}
    }
    path.write_text(yaml.safe_dump(raw))
    result = run_cli("check-config", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "engine tiny:typo" in result.stderr
    assert "prompt_lookup_maximum" in result.stderr


def test_check_config_accepts_the_default() -> None:
    result = run_cli("check-config")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok  smollm2:ngram  method=ngram  N=4" in result.stdout


def test_shipped_configs_use_only_fields_vllm_knows() -> None:
    # No download: introspect the installed vLLM's own config classes.
    import dataclasses
    import typing

    from vllm import AsyncEngineArgs
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    engine_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    methods = set(typing.get_args(SpeculativeMethod))
    checked = 0
    for path in shipped_configs():
        raw = yaml.safe_load(path.read_text())
        if not (isinstance(raw, dict) and "models" in raw):
            continue
        config = parse_config(raw, source=str(path))
        for name, served in config.models.items():
            for method_name, method in served.methods.items():
                where = f"{path.name}: {name}:{method_name}"
                assert set(served.engine_for(method_name).to_engine_kwargs()) <= engine_fields, where
                if method.speculative_config is not None:
                    assert set(method.speculative_config) <= spec_fields, where
                    assert method.speculative_config["method"] in methods, where
                if not method.remote:
                    # vLLM's own `vllm serve` parser and start-up checks take the serving flags.
                    args = serving_args(EngineId(name, method_name), served)
                    assert args.served_model_name == [f"{name}:{method_name}"], where
                checked += 1
    assert checked >= 5


def test_study_configs_name_their_models_parsers() -> None:
    """Every study config serves tools and reasoning with the parsers its model's
    recipe gives; vLLM knows every one of them."""
    from app.engines.vllm_serving import validate_api_server_args

    configs = sorted((REPO / "deploy" / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        for name, served in parse_config(yaml.safe_load(path.read_text()), source=str(path)).models.items():
            flags = served.serving.to_flags()
            assert flags["enable_auto_tool_choice"] and flags["tool_call_parser"], f"{path.name}: {name}"
            assert flags["reasoning_parser"], f"{path.name}: {name}"
            local = next((m for m, cfg in served.methods.items() if not cfg.remote), None)
            if local is not None:
                validate_api_server_args(serving_args(EngineId(name, local), served))


@pytest.mark.parametrize(
    ("serving", "expected"),
    [
        ({"tool_call_parser": "nonesuch", "enable_auto_tool_choice": True}, "invalid tool call parser: nonesuch"),
        ({"enable_auto_tool_choice": True}, "--enable-auto-tool-choice requires --tool-call-parser"),
        ({"reasoning_parser": "nonesuch"}, "invalid reasoning parser: nonesuch"),
        ({"extra_args": {"no_such_flag": 1}}, "unrecognized arguments: --no-such-flag"),
        ({"chat_template_content_format": "html"}, "models.m.serving.chat_template_content_format"),
        ({"chat_template": "/nonexistent/tool_chat.jinja"}, "appears path-like, but doesn't exist"),
    ],
)
def test_serving_options_are_checked_by_vllms_parser(serving: dict[str, Any], expected: str) -> None:
    from app.engines.base import EngineConfigError

    try:
        config = parse_config({"models": {"m": model(serving=serving)}}, source="cfg.yaml")
        serving_args(EngineId("m", "none"), config.models["m"])
    except (ConfigError, EngineConfigError) as exc:
        assert expected in str(exc)
        assert "m:none" in str(exc) or "models.m.serving" in str(exc)
    else:
        pytest.fail("accepted")


@pytest.mark.parametrize(
    ("extra", "origins"), [({}, []), ({"allowed_origins": '["https://a.example"]'}, ["https://a.example"])]
)
def test_engines_allow_no_cors_origin_unless_named(extra: dict[str, Any], origins: list[str]) -> None:
    # CORS is the gateway's policy; an engine's application answers origins only where its serving options name them.
    config = parse_config({"models": {"m": model(serving={"extra_args": extra})}}, source="cfg.yaml")
    assert serving_args(EngineId("m", "none"), config.models["m"]).allowed_origins == origins


def test_a_serving_flag_among_engine_args_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"models\.m\.engine\.extra_args.*reasoning_parser is a serving flag"):
        parse_config({"models": {"m": model(engine={"extra_args": {"reasoning_parser": "qwen3"}})}}, source="c.yaml")


def test_serving_options_reach_the_vllm_command() -> None:
    from app.engines.vllm_command import serve_args

    served = parse_config(
        {
            "models": {
                "m": model(
                    serving={
                        "tool_call_parser": "xlam",
                        "enable_auto_tool_choice": True,
                        "default_chat_template_kwargs": {"enable_thinking": False},
                    }
                )
            }
        }
    ).models["m"]
    line = serve_args("m", served, "none")
    assert line[line.index("--tool-call-parser") + 1] == "xlam"
    assert "--enable-auto-tool-choice" in line
    assert line[line.index("--default-chat-template-kwargs") + 1] == '{"enable_thinking":false}'
