"""Several API processes over the same engines: `specgate serve --api-processes N`.

Run the way `vllm serve --api-server-count N` runs (vllm/entrypoints/cli/serve.py):
this process, the supervisor, binds the port, starts each in-process
engine's EngineCore once with vLLM's own launcher (`bind_engine_zmq_listeners`,
`launch_core_engines`: the handshake, one input and one output listener per API
process): those with a fixed KV budget together, as a single gateway starts them,
forking one at a time; the others one after another. Then it starts N API
processes. Each is a whole gateway (routes, admission, records, metrics) whose
in-process engines are vLLM clients of those cores, client i of N
(app/engines/core_links.py). Unlike vLLM's API servers, which accept on one shared
socket (the process that wakes first takes the next connection: measured on a GPU,
4 processes got 41%, 31%, 14% and 14% of the requests), each listens on a socket of
its own on the supervisor's port (SO_REUSEPORT; the supervisor's own socket holds the
port and never listens), so the kernel spreads connections evenly over them. No
request takes a hop between processes.
Remote engines need nothing shared: each process has its own client of the upstream.

What must hold for the whole host (docs/operations.md, "Several API processes"):
- /metrics sums every process (prometheus_client's multiprocess mode, app/metrics.py);
- an engine's `max_in_flight` and `max_queued` are divided among the processes;
- a core that dies is seen here: every process is told at once (its requests end
  with a 503, /ready names it), the core starts again, and each process gets the
  new core's listeners;
- SIGTERM is passed to every API process, which drains; then the cores stop.
  SIGINT stops everything at once. An API process whose supervisor is gone stops.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from app.config import Settings, SpecgateConfig
from app.engines.base import EngineId
from app.engines.core_links import CORE, DIED, CoreLinks
from app.engines.pool import MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S

logger = logging.getLogger("specgate.frontends")

# Cores start from several threads at once (Supervisor.start_cores), and vLLM forks each
# core's process unless CUDA is up here. filelock (4.x, which vLLM's dependencies bring)
# refuses an os.fork while another thread is inside one: "os.fork is unsafe while filelock
# is changing descriptor ownership" (seen on an H100). So one fork at a time; the long
# wait for each core's READY still overlaps.
FORKING = threading.Lock()


@dataclass
class Core:
    """One in-process engine's EngineCore, which the supervisor owns."""

    engine: EngineId
    manager: Any  # vLLM's CoreEngineProcManager
    # vLLM's EngineZmqListeners, which the API processes adopt; held here for as long as
    # the core runs (dropping it would close them and remove their socket files).
    listeners: Any

    def handed_over(self) -> None:
        """The API processes hold their copies of the listeners now."""
        for listener in (*self.listeners.inputs, *self.listeners.outputs):
            listener.close()

    def sentinels(self) -> list[int]:
        return [proc.sentinel for proc in self.manager.processes]

    def stop(self) -> None:
        self.manager.shutdown()
        self.listeners.cleanup()


def start_core(engine: EngineId, config: Any, processes: int) -> tuple[Core, list[dict[str, Any]]]:
    """The engine's EngineCore, ready (vLLM's handshake done), and for each API process
    the client addresses vLLM's `AsyncLLM` takes (what `APIServerProcessManager` hands
    each API server)."""
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
    from vllm.v1.executor import Executor

    logger.info("starting the core of engine %s for %d API processes", engine, processes)
    zmq = bind_engine_zmq_listeners(config, processes)
    try:
        # Leaving the block waits for the core's READY; the API processes connect later.
        with contextlib.ExitStack() as launched:
            with FORKING:  # entering forks the core's process
                launch = launched.enter_context(
                    launch_core_engines(config, Executor.get_class(config), True, zmq.addresses)
                )
            manager, coordinator = launch.engine_manager, launch.coordinator
    except BaseException:
        zmq.cleanup()
        raise
    clients = []
    for inputs, outputs in zip(zmq.inputs, zmq.outputs, strict=True):
        client = {
            "input_address": inputs.address,
            "output_address": outputs.address,
            "input_listener": inputs.socket,
            "output_listener": outputs.socket,
        }
        if coordinator is not None:
            client["stats_update_address"] = coordinator.get_stats_publish_address()
        clients.append(client)
    return Core(engine, manager, zmq), clients


def run_api_process(
    index: int,
    count: int,
    settings: Settings,
    config: SpecgateConfig,
    sock: socket.socket,
    clients: dict[str, dict[str, Any]],
    supervisor: Connection,
) -> None:
    """An API process (spawned): a whole gateway over the supervisor's engine cores."""
    from app.api.app import build_app
    from app.server import listener_beside, serve_on

    logging.basicConfig(level=settings.log_level.upper(), format=f"%(levelname)s %(name)s [api {index}]: %(message)s")
    app = build_app(config, settings, CoreLinks(index, count, clients, supervisor))
    app.state.gateway.pool.prepare()
    own = listener_beside(sock)  # bound now, listening once this process's engines are up
    sock.close()
    serve_on(app, own, settings.log_level.lower())


class Supervisor:
    def __init__(self, settings: Settings, config: SpecgateConfig, processes: int) -> None:
        self.settings, self.config, self.processes = settings, config, processes
        self.cores: dict[EngineId, Core] = {}
        self.api: list[BaseProcess] = []
        self.pipes: list[Connection] = []  # the supervisor's end of each API process's pipe
        self.stopping = False

    def engines(self) -> dict[EngineId, Any]:
        """Every in-process engine's vLLM config, as the supervisor of N API processes has it."""
        return {
            EngineId(name, method): self.engine_config(EngineId(name, method))
            for name, model in self.config.models.items()
            for method, spec in model.methods.items()
            if not spec.remote
        }

    def engine_config(self, engine: EngineId) -> Any:
        from app.engines.vllm_local import engine_config

        return engine_config(engine, self.config.models[engine.model], self.processes, -1)

    def start_cores(self) -> list[dict[str, dict[str, Any]]]:
        """Every engine's core, and each API process's clients of them. Cores with a set
        KV budget start together (as EnginePool.start does); the others one after another,
        since each sizes its cache from the memory the ones before it left."""
        from app.engines.vllm_local import fixed_kv_budget

        configs = self.engines()  # vLLM validates every engine before the first starts
        together = [e for e, c in configs.items() if fixed_kv_budget(c)]
        per_process: list[dict[str, dict[str, Any]]] = [{} for _ in range(self.processes)]

        def started(engine: EngineId, core: Core, clients: list[dict[str, Any]]) -> None:
            self.cores[engine] = core  # from here on, shutdown() stops it
            for index, client in enumerate(clients):
                per_process[index][str(engine)] = client

        with ThreadPoolExecutor(max_workers=max(1, len(together)), thread_name_prefix="core-start") as pool:
            futures = {pool.submit(start_core, e, configs[e], self.processes): e for e in together}
            try:
                for future in as_completed(futures):
                    started(futures[future], *future.result())
            finally:
                # On a failure or Ctrl-C the others still finish starting (a start cannot be
                # cut short from here): keep them, so that shutdown() stops them too.
                wait_all(futures)
                for future, engine in futures.items():
                    if engine not in self.cores and future.exception() is None:
                        started(engine, *future.result())
        for engine in (e for e in configs if e not in together):
            started(engine, *start_core(engine, configs[engine], self.processes))
        return per_process

    def start(self, sock: socket.socket) -> None:
        per_process = self.start_cores()
        spawn = multiprocessing.get_context("spawn")
        for index in range(self.processes):
            theirs, ours = spawn.Pipe(duplex=False)
            args = (index, self.processes, self.settings, self.config, sock, per_process[index], theirs)
            proc = spawn.Process(target=run_api_process, name=f"specgate-api-{index}", args=args)
            proc.start()
            theirs.close()
            self.api.append(proc)
            self.pipes.append(ours)
        for core in self.cores.values():
            core.handed_over()

    def stop_api(self, sig: int) -> None:
        for proc in self.api:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, sig)

    def watch(self) -> int:
        """Until every API process has ended: restart dead cores; 0 when they ended
        because they were asked to, else 1."""
        while True:
            alive = [p for p in self.api if p.exitcode is None]
            if not alive:
                return 0 if self.stopping else 1
            watched: dict[int, EngineId | None] = {p.sentinel: None for p in alive}
            for engine_id, core in self.cores.items():
                watched.update(dict.fromkeys(core.sentinels(), engine_id))
            for sentinel in wait(list(watched), timeout=1.0):
                engine = watched[sentinel]  # type: ignore[index]  # wait() returns what it was given
                if engine is not None and not self.stopping:
                    self.restart(engine)
                elif engine is None and not self.stopping:
                    logger.error("an API process exited unexpectedly; stopping the gateway")
                    self.stopping = True
                    self.stop_api(signal.SIGINT)

    def restart(self, engine: EngineId) -> None:
        """The core of `engine` died: tell every API process, start it again (waiting
        1, 2, 4 … 60 s between failed attempts), hand each process its listeners."""
        logger.error("the core of engine %s died; restarting it", engine)
        self._send((DIED, str(engine)))
        old = self.cores.pop(engine)
        old.stop()
        backoff = RESTART_BACKOFF_S
        while not self.stopping:
            time.sleep(backoff)
            try:
                core, clients = start_core(engine, self.engine_config(engine), self.processes)
            except Exception:
                logger.exception("the core of engine %s did not start", engine)
                backoff = min(backoff * 2, MAX_RESTART_BACKOFF_S)
                continue
            self.cores[engine] = core
            for pipe, client in zip(self.pipes, clients, strict=True):
                self._send_one(pipe, (CORE, str(engine), client))
            core.handed_over()
            logger.info("the core of engine %s restarted", engine)
            return

    def _send(self, message: tuple[Any, ...]) -> None:
        for pipe in self.pipes:
            self._send_one(pipe, message)

    @staticmethod
    def _send_one(pipe: Connection, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # that API process is gone; watch() sees it
            pipe.send(message)

    def shutdown(self) -> None:
        self.stopping = True
        deadline = time.monotonic() + self.settings.drain_timeout_s + 15
        for proc in self.api:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join(5)
        for core in self.cores.values():
            core.stop()
        for pipe in self.pipes:
            pipe.close()


def serve_processes(settings: Settings, config: SpecgateConfig, processes: int) -> int:
    """The supervisor's life: start the cores and the API processes, then watch them."""
    from app.server import STARTUP_FAILURE, bind

    metrics_dir = tempfile.mkdtemp(prefix="specgate-metrics-")
    # Read by prometheus_client when each API process imports it (they are spawned).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    supervisor = Supervisor(settings, config, processes)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        # SIGTERM: every API process drains, then exits; SIGINT: they stop at once.
        supervisor.stopping = True
        if not supervisor.api:
            raise KeyboardInterrupt  # still starting the cores: stop that
        supervisor.stop_api(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sock = bind(settings.host, settings.port, shared=True)  # holds the port; never listens
    try:
        try:
            supervisor.start(sock)
        except KeyboardInterrupt:
            return 0
        except Exception as exc:
            logger.error("the gateway did not start: %s", exc)
            return STARTUP_FAILURE
        if supervisor.stopping:  # a signal came while they started
            supervisor.stop_api(signal.SIGINT)
        return supervisor.watch()
    finally:
        supervisor.shutdown()
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        sys.stdout.flush()
