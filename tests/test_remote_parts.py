"""Remote engines without a server: their config, the `vllm serve` line specgate
prints for a method, and reading an upstream's load gauges."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from app.config import ConfigError, parse_config
from app.engines.remote import parse_load
from tests.support import run_cli


def config_with(method: dict[str, Any]) -> dict[str, Any]:
    return {"models": {"m": {"target": "/models/x", "default_method": "r", "methods": {"none": {}, "r": method}}}}


def error_of(method: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(config_with(method), source="cfg.yaml")
    return str(info.value)


def test_remote_method_config() -> None:
    method = parse_config(config_with({"url": "http://host-2:8000/", "upstream": {"connect_timeout_s": 3}}))
    remote = method.models["m"].methods["r"]
    assert remote.remote and remote.url == "http://host-2:8000"
    assert remote.upstream.connect_timeout_s == 3 and remote.upstream.probe_interval_s == 5
    assert not method.models["m"].methods["none"].remote


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ({"url": "ftp://host:21"}, "cfg.yaml: models.m.methods.r.url: url 'ftp://host:21' must be an http"),
        ({"url": "http://"}, "models.m.methods.r.url: url 'http://' must be an http:// or https:// URL with a host"),
        (
            {"url": "http://h:1", "engine": {"dtype": "bfloat16"}},
            "models.m.methods.r: 'engine' settings do not apply to a remote method (url)",
        ),
        ({"upstream": {"max_connections": 4}}, "models.m.methods.r: 'upstream' settings need a 'url'"),
        ({"url": "http://h:1", "upstream": {"connect_timeout_s": 0}}, "models.m.methods.r.upstream.connect_timeout_s:"),
        ({"url": "http://h:1", "limits": {"idle_timeout_s": 0}}, "models.m.methods.r.limits.idle_timeout_s:"),
        (
            {"url": "http://h:1", "upstream": {"retries": 3}},
            "models.m.methods.r.upstream.retries: Extra inputs are not permitted",
        ),
    ],
)
def test_remote_config_errors_name_the_key(method: dict[str, Any], expected: str) -> None:
    assert expected in error_of(method)


def parse_flags(args: list[str]) -> dict[str, str | bool]:
    flags: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
            flags[arg] = value
    return flags


def test_vllm_command_prints_the_methods_engine() -> None:
    result = run_cli("vllm-command", "smollm2:ngram")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[:2] == ["vllm", "serve"] and argv[2].endswith("SmolLM2-135M-Instruct")
    flags = parse_flags(argv[3:])
    assert flags["--enforce-eager"] is True
    assert flags["--served-model-name"] == "smollm2"
    assert flags["--max-model-len"] == "4096" and flags["--dtype"] == "float32"
    assert '"method":"ngram"' in str(flags["--speculative-config"])
    assert "--per-request-spec-decode-metrics" in argv and "--enable-per-request-metrics" in argv
    # A baseline gets no speculative flags: vLLM refuses per-request spec metrics without speculation.
    baseline = shlex.split(run_cli("vllm-command", "smollm2:none").stdout)
    assert "--speculative-config" not in baseline and "--per-request-spec-decode-metrics" not in baseline


def test_vllm_command_names_the_engines_on_a_typo() -> None:
    result = run_cli("vllm-command", "smollm2:eagle")
    assert result.returncode == 2
    assert "no engine 'smollm2:eagle' (engines: smollm2:none, smollm2:ngram)" in result.stderr


# Hand-written in the shape of vLLM's /metrics with two data-parallel engines and a
# second model; the real exposition is read in tests/test_remote.py.
EXPOSITION = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="other"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""


def test_upstream_load_sums_engines_of_the_served_model() -> None:
    load = parse_load(EXPOSITION, "m")
    assert (load.running, load.waiting, load.kv_cache_usage) == (5.0, 1.0, 0.5)
    assert parse_load("", "m").running is None
