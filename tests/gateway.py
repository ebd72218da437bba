"""The tests start real gateway processes (real uvicorn, real vLLM engines, a
loopback port) with the launcher `specgate tune` uses; psutil adds a view of
their children for the lifecycle tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import yaml

from app.bench.gateway import ServerProcess as GatewayProcess
from app.bench.gateway import free_port, start_gateway

__all__ = [
    "GatewayProcess",
    "descendants",
    "embedded_model",
    "free_port",
    "running_gateway",
    "start_gateway",
    "wait_for",
    "write_config",
]


@contextmanager
def running_gateway(
    log: Path, config: Path | None = None, extra_env: dict[str, str] | None = None
) -> Iterator[GatewayProcess]:
    """A gateway, ready on entry and stopped on exit (its log printed if it did not stop cleanly)."""
    gateway = start_gateway(log, config, extra_env=extra_env)
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        if gateway.interrupt() != 0:
            print(gateway.log()[-3000:])


def embedded_model(**overrides: Any) -> dict[str, Any]:
    """The embedded default model's config block (target, engine, methods), with `overrides`."""
    from app.cli import read_config
    from app.config import Settings

    model = read_config(Settings(config=None)).models["smollm2"]
    block = {
        "target": model.target,
        "engine": model.engine.model_dump(exclude_unset=True),
        "default_method": model.default_method,
        "methods": {name: m.model_dump(exclude_unset=True) for name, m in model.methods.items()},
    }
    return {**block, **overrides}


def write_config(path: Path, models: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path


def descendants(gateway: GatewayProcess) -> list[psutil.Process]:
    try:
        return psutil.Process(gateway.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False
