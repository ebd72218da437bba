"""What many test modules share: the gateway launcher (real uvicorn, real vLLM
engines, a loopback port, the launcher `specgate tune` uses) with a psutil view of
its children, the `/metrics` reader, and the CLI runner."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.bench.gateway import ServerProcess as GatewayProcess
from app.bench.gateway import core_starts, free_port, start_gateway

__all__ = [
    "REPO",
    "GatewayProcess",
    "Samples",
    "access_entries",
    "core_starts",
    "descendants",
    "embedded_model",
    "engine_core",
    "free_port",
    "http_client",
    "run_cli",
    "running_gateway",
    "scrape",
    "series",
    "start_gateway",
    "total",
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


@contextmanager
def http_client(url: str, timeout_s: float = 300) -> Iterator[httpx.Client]:
    """A client of a test's server: generous reads (a first request compiles), quick connects."""
    with httpx.Client(base_url=url, timeout=httpx.Timeout(timeout_s, connect=10)) as http:
        yield http


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


def engine_core(gateway: GatewayProcess, method: str | None) -> psutil.Process:
    """The EngineCore that runs vLLM's speculative `method` (None: the engine that does
    not speculate), by the line it logged last as it started: the engines of a gateway
    start together, so the order of their processes says nothing."""
    pids = [pid for pid, spec in core_starts(gateway.log()) if spec == method]
    assert pids, f"no EngineCore with speculative method {method} in the gateway's log"
    return psutil.Process(pids[-1])


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


REPO = Path(__file__).resolve().parent.parent
# (name, labels) -> value of every sample of one scrape
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def access_entries(log: str) -> list[dict[str, Any]]:
    """The `specgate.access` JSON lines of a one-process gateway's log, in order."""
    marker = "specgate.access: "
    return [json.loads(line.split(marker, 1)[1]) for line in log.splitlines() if marker in line]


def scrape(http: httpx.Client) -> Samples:
    """One scrape of the gateway's `/metrics`."""
    samples: Samples = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a series' samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def series(http: httpx.Client, name: str, **labels: str) -> float:
    """`total` of a fresh scrape."""
    return total(scrape(http), name, **labels)


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`specgate ARGS` as a user runs it, from the checkout."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
