"""The tests start real gateway processes (real uvicorn, real vLLM engines, a
loopback port) with the launcher `specgate tune` uses; psutil adds a view of
their children for the lifecycle tests."""

from __future__ import annotations

import psutil

from app.bench.gateway import ServerProcess as GatewayProcess
from app.bench.gateway import free_port, start_gateway

__all__ = ["GatewayProcess", "descendants", "free_port", "start_gateway"]


def descendants(gateway: GatewayProcess) -> list[psutil.Process]:
    try:
        return psutil.Process(gateway.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
