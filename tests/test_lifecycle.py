"""Start-up and shutdown of a gateway of its own: Ctrl-C leaves no engine
process behind, an engine that cannot start fails start-up (no hang), and a
port in use fails it at once, before any engine starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from app.server import STARTUP_FAILURE
from tests.support import GatewayProcess, core_starts, descendants, engine_core, start_gateway

pytestmark = pytest.mark.engine  # starts gateways of its own


def one_engine_config(tmp_path: Path, methods: dict[str, Any] | None = None, one_process: bool = False) -> Path:
    """`one_process`: the model runs in its EngineCore (`uni`, as the embedded default's
    engines), no Worker process to start; else vLLM's choice on CPU."""
    settings: dict[str, Any] = {"max_model_len": 1024, "kv_cache_memory_bytes": 268435456, "enforce_eager": True}
    if one_process:
        settings["extra_args"] = {"distributed_executor_backend": "uni"}
    raw = {
        "models": {
            "tiny": {
                "target": "embedded:smollm2",
                "engine": settings,
                "methods": methods or {"none": {}},
                "default_method": "none",
            }
        }
    }
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def all_gone(processes: list[psutil.Process], timeout_s: float = 30) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return all(p.status() == psutil.STATUS_ZOMBIE for p in alive)


def test_ctrl_c_stops_every_engine_process(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path / "gw.log", one_engine_config(tmp_path))
    gw.wait_ready()
    children = descendants(gw)
    assert children, "the engine runs in child processes"
    # vLLM's choice on CPU (its executor `mp`): the model runs in a Worker beside the core.
    assert engine_core(gw, None).children(), "a Worker process under the EngineCore"
    assert gw.interrupt() == 0, gw.log()[-3000:]
    assert all_gone(children), [p.pid for p in children if p.is_running()]


def test_engine_that_cannot_start_fails_startup(tmp_path: Path) -> None:
    """Two engines start together; one cannot (a KV cache of 4 KiB holds no block, so
    vLLM refuses it): start-up fails without a hang, and the other engine's processes,
    started alongside, are stopped too."""
    bad = {"engine": {"kv_cache_memory_bytes": 4096}}
    gw = start_gateway(tmp_path / "gw.log", one_engine_config(tmp_path, {"none": {}, "broken": bad}, one_process=True))
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 600
    while gw.proc.poll() is None and time.monotonic() < deadline:
        seen.update((p.pid, p) for p in descendants(gw))
        time.sleep(0.5)
    assert gw.proc.poll() is not None and gw.proc.returncode != 0
    log = gw.log()
    assert "tiny:broken" in log
    assert "Engine core initialization failed" in log or "memory" in log.lower()
    cores = {pid for pid, _ in core_starts(log)}
    assert len(cores) == 2 and cores <= set(seen), "both engines' cores were started, as the gateway's children"
    assert all_gone(list(seen.values()))


def test_port_in_use_fails_before_any_engine_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = [
            sys.executable,
            "-m",
            "app",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--config",
            str(one_engine_config(tmp_path)),
        ]
        done = subprocess.run(serve, capture_output=True, text=True, timeout=120)
    assert done.returncode == STARTUP_FAILURE, done.stderr[-3000:]
    assert f"cannot listen on 127.0.0.1 port {port}" in done.stderr
    assert "tiny:none" not in done.stderr, "an engine was started before the port was bound"


def test_the_default_engines_run_their_models_in_their_cores(gateway: GatewayProcess) -> None:
    """The embedded default's `distributed_executor_backend: uni`, kept on CPU where vLLM
    would turn it into `mp` (app/engines/vllm_local.py): no Worker process to spawn."""
    cores = [engine_core(gateway, method) for method in (None, "ngram")]
    assert len({core.pid for core in cores}) == 2
    assert all(core.children() == [] for core in cores), [core.children() for core in cores]
