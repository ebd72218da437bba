"""uvicorn with a graceful SIGTERM. The first SIGTERM (or `POST /admin/drain`)
starts a drain: new requests get a 503 and `/ready` a 503, so a load balancer
moves on, while the requests in flight finish, for up to `drain_timeout_s`; then
uvicorn stops, the lifespan stops the engines, and the process exits 0. Ctrl-C
(SIGINT) stops at once, as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.api.state import GatewayState

logger = logging.getLogger("specgate")
LISTENING = "specgate: listening on"  # start_gateway reads the port from this line
DRAINING = "draining:"


class GatewayServer(uvicorn.Server):  # type: ignore[misc]
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.gateway: GatewayState = app.state.gateway
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        app.state.drain = self.start_drain

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._loop is not None:
            # Not recorded as a captured signal: uvicorn would re-raise it after
            # the shutdown, and the exit status would be SIGTERM's, not 0.
            self._loop.call_soon_threadsafe(self.start_drain)
            return
        super().handle_exit(sig, frame)

    def start_drain(self) -> None:
        if self.gateway.draining:
            return
        self.gateway.start_draining()
        logger.info("%s %d requests in flight or queued; new ones get a 503", DRAINING, self.gateway.busy())
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.gateway.settings.drain_timeout_s
        # busy() spans every engine's admission: a poll for the length of a drain is simplest.
        while self.gateway.busy() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        self.should_exit = True


STARTUP_FAILURE = 3  # uvicorn's exit status when the app did not start


def run(app: FastAPI, host: str, port: int, log_level: str) -> None:
    serve_on(app, bind(host, port), log_level)


def serve_on(app: FastAPI, sock: socket.socket, log_level: str) -> None:
    """Serve on a socket bound already (before the engines started)."""
    # After the drain, what is still open gets a few seconds before it is cut.
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)
    server = GatewayServer(config, app)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the shutdown has run already, as with uvicorn.run
        server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def bind(host: str, port: int, shared: bool = False) -> socket.socket:
    """The listening address, bound before the engines start: uvicorn would bind it
    only after them, tens of seconds later, when the port may have been taken (or
    was in use from the start, which should fail at once). Port 0 picks a free
    port, named in the log line. `shared`: the port is bound with SO_REUSEPORT, so
    that each of several API processes can listen on it with a socket of its own."""
    sock = _socket(host, shared)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        logger.error("cannot listen on %s port %d: %s", host, port, exc)
        sys.exit(STARTUP_FAILURE)
    shown = f"[{host}]" if ":" in host else host
    logger.info(
        "%s http://%s:%d (engines starting; connections are refused until they are up)",
        LISTENING,
        shown,
        sock.getsockname()[1],
    )
    return sock


def listener_beside(bound: socket.socket) -> socket.socket:
    """A socket of this process on the port `bound` holds (bound with SO_REUSEPORT):
    the kernel spreads new connections evenly over every socket listening there,
    where processes accepting on one shared socket get them unevenly (whichever
    wakes first takes the next)."""
    host, port = bound.getsockname()[:2]
    sock = _socket(host, True)
    sock.bind((host, port))
    return sock


def _socket(host: str, shared: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock
