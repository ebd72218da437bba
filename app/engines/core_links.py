"""An API process's links to engine cores it does not own.

With `--api-processes N` the supervisor (app/frontends.py) starts every in-process
engine's EngineCore once, and each of the N API processes is one of N vLLM clients
of it, as `vllm serve --api-server-count N` runs them: `AsyncLLM` with the client
addresses (the input and output listeners the supervisor bound for this process),
client index and count. The supervisor watches the cores: it tells each process
when one died (its requests then end with a 503 at once) and, once it has started
it again, hands each process new listeners to adopt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from app.engines.base import EngineId, EngineUnavailableError

logger = logging.getLogger(__name__)

# Supervisor → API process messages: (DIED, engine) and (CORE, engine, client addresses).
DIED = "died"
CORE = "core"


class CoreLinks:
    def __init__(
        self, index: int, count: int, clients: dict[str, dict[str, Any]], supervisor: Connection | None = None
    ) -> None:
        self.index = index  # this process's client index at every core
        self.count = count
        self._supervisor = supervisor
        self._clients = dict(clients)  # engine → client addresses not adopted yet
        self._arrived: dict[str, asyncio.Event] = {}
        self._on_died: dict[str, Callable[[], None]] = {}

    def take(self, engine: EngineId) -> dict[str, Any]:
        """The client addresses of the engine's core; each set is adopted by one client."""
        found = self._clients.pop(str(engine), None)
        if found is None:
            raise EngineUnavailableError(f"engine {engine}: its core is being restarted")
        return found

    async def wait_for_core(self, engine: EngineId) -> None:
        """Until the supervisor has handed over the addresses of the engine's new core."""
        key = str(engine)
        while key not in self._clients:
            event = self._arrived.setdefault(key, asyncio.Event())
            await event.wait()
            event.clear()

    def on_died(self, engine: EngineId, callback: Callable[[], None]) -> None:
        self._on_died[str(engine)] = callback

    def listen(self) -> None:
        """Read the supervisor's messages in a thread (a blocking pipe), each handled on
        the running loop. The pipe closing means the supervisor is gone, and its engine
        cores with it: this process stops too (no API process outlives the gateway)."""
        conn, loop = self._supervisor, asyncio.get_running_loop()
        if conn is None:
            return

        def read() -> None:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    logger.error("the supervisor is gone; stopping")
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                loop.call_soon_threadsafe(self._deliver, message)

        threading.Thread(target=read, name="specgate-core-links", daemon=True).start()

    def _deliver(self, message: tuple[Any, ...]) -> None:
        kind, engine = message[0], message[1]
        if kind == DIED:
            logger.error("engine %s: its core died (seen by the supervisor)", engine)
            callback = self._on_died.get(engine)
            if callback is not None:
                callback()
        elif kind == CORE:
            self._clients[engine] = message[2]
            self._arrived.setdefault(engine, asyncio.Event()).set()
