"""One method of a specgate config as a `vllm serve` command line: what to run on
another host so that a remote engine (`url:`) serves exactly what the in-process
engine would, with the per-request metrics the gateway reads."""

from __future__ import annotations

import json
import sys
from typing import Any

from app.config import EngineSettings, ModelConfig

VLLM_SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]  # what `vllm serve` runs


def flag_value(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def engine_flags(kwargs: dict[str, Any]) -> list[str]:
    """AsyncEngineArgs keyword arguments as vllm serve flags (`--enforce-eager`, `--no-x` for False)."""
    flags: list[str] = []
    for key, value in kwargs.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", flag_value(value)]
    return flags


def serve_args(model_name: str, model: ModelConfig, method: str) -> list[str]:
    """The arguments after `vllm serve` for one method of a model."""
    args = [model.target, "--served-model-name", model_name]
    if model.tokenizer:
        args += ["--tokenizer", model.tokenizer]
    args += engine_flags(model.engine_for(method).to_engine_kwargs())
    args += engine_flags(model.serving.to_flags())
    spec = model.methods[method].speculative_config
    if spec is not None:
        # vLLM refuses per-request acceptance figures on an engine without speculation.
        args += ["--speculative-config", flag_value(dict(spec)), "--per-request-spec-decode-metrics", "summary"]
    return [*args, "--enable-per-request-metrics"]


def as_vllm_serve_runs(engine: EngineSettings) -> EngineSettings:
    """The engine settings `vllm serve` actually runs: on CPU its platform turns
    `distributed_executor_backend: uni` into `mp`, which the gateway keeps
    (app/engines/vllm_local.py). A gateway measured against `vllm serve` takes these,
    so that both run the same engine."""
    if engine.extra_args.get("distributed_executor_backend") != "uni":
        return engine
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return engine
    return engine.merged(EngineSettings(extra_args={"distributed_executor_backend": "mp"}))
