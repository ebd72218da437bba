"""Can the installed vLLM run these specgate configs? No GPU, no download: introspection only.

Dockerfile.rocm runs it against the image's own vLLM (the image's vLLM is not the one the
test suite runs against), so a base-image tag without per-request spec-decode metrics, or
without a method, engine argument or speculative_config field a shipped config uses, fails
the build instead of the first start:

    python3 deploy/check_vllm.py deploy/configs/*.yaml
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

from app.config import ConfigError, load_config

# specgate's per-request MAL, acceptance rate and histogram come from this (vLLM >= 0.29).
PER_REQUEST_METRICS = "per_request_spec_decode_metrics"
# The argument specgate itself adds to every engine (app/engines/vllm_local.py).
SPECGATE_ENGINE_ARGS = {"model", "served_model_name", "disable_log_stats", "enable_log_requests", "tokenizer"}


def problems(paths: list[Path]) -> list[str]:
    from vllm import AsyncEngineArgs
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    engine_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    methods = set(typing.get_args(SpeculativeMethod))
    found = [f"vLLM has no AsyncEngineArgs.{name}" for name in sorted(SPECGATE_ENGINE_ARGS - engine_fields)]
    if PER_REQUEST_METRICS not in engine_fields:
        found.append(f"vLLM has no AsyncEngineArgs.{PER_REQUEST_METRICS}: specgate needs vLLM >= 0.29")
    for path in paths:
        try:
            config = load_config(path)
        except ConfigError as exc:
            found.append(str(exc))
            continue
        for model_name, model in config.models.items():
            for method_name, method in model.methods.items():
                where = f"{path.name}: engine {model_name}:{method_name}"
                for name in sorted(set(model.engine_for(method_name).to_engine_kwargs()) - engine_fields):
                    found.append(f"{where}: vLLM has no engine argument {name!r}")
                spec = method.speculative_config or {}
                for name in sorted(set(spec) - spec_fields):
                    found.append(f"{where}: vLLM's speculative_config has no field {name!r}")
                if spec and spec["method"] not in methods:
                    found.append(f"{where}: vLLM has no speculative method {spec['method']!r}")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: check_vllm.py CONFIG.yaml...\n")
        return 2
    import vllm

    found = problems([Path(arg) for arg in argv])
    for line in found:
        sys.stderr.write(f"check_vllm: {line}\n")
    if not found:
        sys.stdout.write(f"check_vllm: vLLM {vllm.__version__} knows everything {len(argv)} config(s) use\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
