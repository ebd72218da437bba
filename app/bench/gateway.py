"""Start and stop an OpenAI-compatible server as a child process on a free
loopback port: `specgate serve`, as `specgate tune` does for each candidate
engine (and the tests for theirs), or `vllm serve` (scripts/gateway_vs_direct.py).
A separate process per candidate is what gives its memory back."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

START_TIMEOUT_S = 900.0

# The line each EngineCore writes as it starts: its pid and its speculative method (None: none).
CORE_START = re.compile(
    r"\(EngineCore pid=(\d+)\).*Initializing a V1 LLM engine.*?"
    r"speculative_config=(?:None|SpeculativeConfig\(method='(\w+)')"
)


def core_starts(log: str) -> list[tuple[int, str | None]]:
    """(pid, speculative method or None) of every EngineCore start in a log, in order."""
    return [(int(pid), spec or None) for pid, spec in CORE_START.findall(log)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    name: str = "gateway"
    ready_path: str = "/ready"  # answers 200 once every engine is up

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"{self.url}{self.ready_path}", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log()[-4000:]}")

    def interrupt(self, timeout_s: float = 120) -> int:
        """Ctrl-C, as a user would (the gateway then stops its engines), and wait for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            # Its own process group: this also takes down engine processes it left behind.
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise


def start_server(
    cmd: list[str], port: int, log_path: Path, name: str, ready_path: str, extra_env: dict[str, str] | None = None
) -> ServerProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(extra_env or {})}
    with log_path.open("wb") as log:
        # Its own session: a Ctrl-C meant for the caller does not reach it, and its whole group can be killed.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return ServerProcess(proc, port, log_path, name, ready_path)


def start_gateway(log_path: Path, config: Path | None = None, extra_env: dict[str, str] | None = None) -> ServerProcess:
    """`specgate serve` on a port the gateway picks and binds itself (port 0), read
    back from its log: a port chosen here could be taken before the gateway binds it."""
    cmd = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", "0"]
    if config is not None:
        cmd += ["--config", str(config)]
    server = start_server(cmd, 0, log_path, "gateway", "/ready", extra_env)
    server.port = _listening_port(server)
    return server


def _listening_port(server: ServerProcess, timeout_s: float = 300.0) -> int:
    from app.server import LISTENING

    pattern = re.compile(re.escape(LISTENING) + r" http://\S+:(\d+)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = pattern.search(server.log())
        if found:
            return int(found.group(1))
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{server.name} did not bind a port after {timeout_s}s:\n{server.log()[-4000:]}")
