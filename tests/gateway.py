"""The tests start real gateway processes (real uvicorn, real vLLM engines, a
loopback port) with the launcher `specgate tune` uses; psutil adds a view of
their children for the lifecycle tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from app.bench.gateway import ServerProcess as GatewayProcess
from app.bench.gateway import free_port, start_gateway

__all__ = ["GatewayProcess", "descendants", "free_port", "start_gateway", "wait_for"]


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
