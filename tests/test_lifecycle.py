"""Start-up and shutdown of a gateway of its own: Ctrl-C leaves no engine
process behind, and an engine that cannot start fails start-up (no hang)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.gateway import descendants, start_gateway


def one_engine_config(tmp_path: Path, **engine: Any) -> Path:
    settings = {"max_model_len": 1024, "kv_cache_memory_bytes": 268435456, "enforce_eager": True, **engine}
    raw = {"models": {"tiny": {"target": "embedded:smollm2", "engine": settings,
                               "methods": {"none": {}}, "default_method": "none"}}}
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
    assert gw.interrupt() == 0, gw.log()[-3000:]
    assert all_gone(children), [p.pid for p in children if p.is_running()]


def test_engine_that_cannot_start_fails_startup(tmp_path: Path) -> None:
    # A KV cache of 4 KiB cannot hold a single block: vLLM refuses to start.
    gw = start_gateway(tmp_path / "gw.log", one_engine_config(tmp_path, kv_cache_memory_bytes=4096))
    started = time.monotonic()
    code = gw.proc.wait(timeout=600)
    children = descendants(gw)
    assert code != 0
    assert time.monotonic() - started < 600
    log = gw.log()
    assert "tiny:none" in log
    assert "Engine core initialization failed" in log or "memory" in log.lower()
    assert all_gone(children)
