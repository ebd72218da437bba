"""An in-process vLLM `AsyncLLM` serving one (model, method), answering through
vLLM's own OpenAI serving layer (app/engines/vllm_serving.py).

Lifecycle: `prepare()` builds and validates the vLLM config and serving options
(cheap, no process); `start()` returns once the EngineCore process is up, its
serving layer is built and it has answered one tiny request; `stop()` stops that
process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from argparse import Namespace
from dataclasses import replace
from typing import Any

from pydantic import ValidationError
from vllm import AsyncEngineArgs, SamplingParams
from vllm.config import VllmConfig
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from app.config import ModelConfig, describe_validation_error
from app.engines import vllm_plugin
from app.engines.base import (
    ASGIReceive,
    ASGIScope,
    ASGISend,
    EngineConfigError,
    EngineId,
    EngineInfo,
    EngineStats,
    EngineUnavailableError,
)
from app.engines.core_links import CoreLinks
from app.engines.tap import TappedEngineClient
from app.engines.vllm_serving import ServingRoutes, build_serving_app, serving_args
from app.engines.vllm_stats import (
    SchedulerSnapshot,
    SilentPrometheusStatLogger,
    SnapshotStatLogger,
)

# Engines with a set KV budget start together, from threads (app/engines/pool.py), and
# vLLM forks each core's process unless CUDA is up here. filelock (4.x, which vLLM's
# dependencies bring) refuses an os.fork while another thread is inside one, before any
# process exists (seen on an H100, where the supervisor of several API processes now
# forks one core at a time: app/frontends.py). vLLM's fork is deep inside AsyncLLM, so a
# start that met another's fork is made again.
FORK_REFUSED = "is unsafe while filelock is changing descriptor ownership"
FORK_ATTEMPTS = 4

logger = logging.getLogger(__name__)


def fixed_kv_budget(config: VllmConfig) -> bool:
    """Whether an engine's KV cache has a set size (`kv_cache_memory_bytes`), so that it
    can start beside others: it sizes nothing from the memory they leave."""
    return config.cache_config.kv_cache_memory_bytes is not None


def build_engine_args(engine_id: EngineId, model: ModelConfig) -> AsyncEngineArgs:
    method = model.methods[engine_id.method]
    kwargs: dict[str, Any] = model.engine_for(engine_id.method).to_engine_kwargs()
    kwargs.update(
        model=model.target,
        served_model_name=[engine_id.model],
        disable_log_stats=False,  # RequestOutput.metrics is None without stats
        enable_log_requests=False,
    )
    if model.tokenizer:
        kwargs["tokenizer"] = model.tokenizer
    if model.serving.reasoning_parser:
        # The engine needs it too: structured outputs are not enforced while the model reasons.
        kwargs["reasoning_parser"] = model.serving.reasoning_parser
    if method.speculative_config is not None:
        kwargs["speculative_config"] = dict(method.speculative_config)
        # Only valid with speculation: vLLM refuses it on a baseline engine.
        kwargs["per_request_spec_decode_metrics"] = "summary"
    try:
        return AsyncEngineArgs(**kwargs)
    except TypeError as exc:
        raise EngineConfigError(f"engine {engine_id}: {exc}") from None


def engine_config(engine_id: EngineId, model: ModelConfig, api_processes: int = 1, api_rank: int = 0) -> VllmConfig:
    """vLLM's validated config of the engine. With several API processes, the same
    process count and rank `vllm serve --api-server-count` gives its supervisor (-1)
    and each API server."""
    # Before vLLM loads its plugins (building the config does): specgate's vLLM plugin
    # acts in this process and the engine processes it starts, which inherit it.
    os.environ[vllm_plugin.ACTIVE] = "1"
    args = build_engine_args(engine_id, model)
    args._api_process_count, args._api_process_rank = api_processes, api_rank
    try:
        # A gateway is an API server: vLLM then sizes its batch limits as `vllm serve` does
        # (on a large GPU 1024 sequences / 16384 tokens instead of the library's 128 / 2048).
        config: VllmConfig = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    except ValidationError as exc:
        detail = describe_validation_error(exc, f"engine {engine_id}")
        raise EngineConfigError(f"vLLM rejected the configuration of {detail}") from None
    except (ValueError, TypeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EngineConfigError(f"vLLM rejected the configuration of engine {engine_id}: {first}") from None
    if args.distributed_executor_backend == "uni":
        one_process_on_cpu(config)
    return config


def one_process_on_cpu(config: VllmConfig) -> None:
    """`distributed_executor_backend: uni` asked for explicitly, kept on CPU: vLLM's CPU
    platform turns it into `mp` (a Worker process beside each EngineCore, so that OMP
    threads can be bound to cores), and a spawned Worker imports vLLM again, about 10 s
    of every engine's start on a small CPU host. With `uni` the model runs in the
    EngineCore process, its OMP threads unbound; greedy outputs are the same."""
    from vllm.platforms import current_platform

    parallel = config.parallel_config
    if current_platform.is_cpu() and parallel.world_size == 1:
        parallel.distributed_executor_backend = "uni"


class LocalVLLMEngine:
    def __init__(self, engine_id: EngineId, model: ModelConfig, links: CoreLinks | None = None) -> None:
        self.id = engine_id
        self._model = model
        # Set in an API process of several: the EngineCore is the supervisor's, this is one client of it.
        self._links = links
        if links is not None:
            links.on_died(engine_id, self._core_died)
        self._vllm_config: VllmConfig | None = None
        self._llm: AsyncLLM | None = None
        self._args: Namespace | None = None
        self._serving: ServingRoutes | None = None
        # Set once start() has finished (serving layer built, warm-up answered): /ready and
        # the stats say "up" only then, not as soon as AsyncLLM exists mid-(re)start.
        self._started = False
        self._snapshot = SchedulerSnapshot()
        self.restarts = 0
        self._wanted = False
        self.info = EngineInfo.configured(engine_id, model)

    def prepare(self) -> None:
        """Let vLLM validate the whole configuration before any engine starts."""
        if self._vllm_config is not None:
            return
        self._args = serving_args(self.id, self._model)
        links = self._links
        rank = (links.count, links.index) if links is not None else (1, 0)
        self._vllm_config = engine_config(self.id, self._model, *rank)
        spec = self._vllm_config.speculative_config
        self.info = replace(
            self.info,
            num_speculative_tokens=spec.num_speculative_tokens if spec else None,
            max_model_len=self._vllm_config.model_config.max_model_len,
        )

    @property
    def fixed_kv_budget(self) -> bool:
        """Whether the engine's KV cache has a set size, not one taken from the memory
        left when it starts (app/engines/pool.py). Known once prepared."""
        return self._vllm_config is not None and fixed_kv_budget(self._vllm_config)

    async def start(self) -> None:
        self._wanted = True
        # EngineCore start-up blocks for tens of seconds: off the event loop.
        await asyncio.to_thread(self._start_blocking)
        assert self._args is not None
        self._serving = ServingRoutes(await build_serving_app(TappedEngineClient(self.llm), self._args))
        await self.warm_up()
        self._started = True

    def _start_blocking(self) -> None:
        if self._vllm_config is None:
            self.prepare()
        assert self._vllm_config is not None
        snapshot = self._snapshot

        def snapshot_logger(config: VllmConfig, index: int) -> SnapshotStatLogger:
            return SnapshotStatLogger(config, index, snapshot)

        client: dict[str, Any] = {}
        if self._links is not None:
            links = self._links
            client = {"client_addresses": links.take(self.id), "client_count": links.count, "client_index": links.index}
        logger.info("starting engine %s%s", self.id, " (a client of its core)" if client else "")
        for attempt in range(1, FORK_ATTEMPTS + 1):
            try:
                self._llm = AsyncLLM.from_vllm_config(
                    self._vllm_config,
                    stat_loggers=[SilentPrometheusStatLogger, snapshot_logger],
                    disable_log_stats=False,
                    usage_context=UsageContext.OPENAI_API_SERVER,
                    **client,
                )
                return
            except RuntimeError as exc:
                if FORK_REFUSED not in str(exc) or attempt == FORK_ATTEMPTS:
                    raise
                logger.warning("engine %s: its core's fork met another engine's (%s); starting it again", self.id, exc)
                time.sleep(0.2 * attempt)

    async def warm_up(self) -> None:
        """One tiny request, so the first client does not pay for lazy kernel set-up
        (seconds on CPU) in its TTFT."""
        params = SamplingParams(max_tokens=2)
        async for _ in self.llm.generate({"prompt": "Hello"}, params, f"warmup-{self.id}-{uuid.uuid4().hex[:8]}"):
            pass

    async def stop(self) -> None:
        self._wanted = False
        self.shutdown()

    def shutdown(self) -> None:
        self._started = False
        if self._llm is not None:
            logger.info("stopping engine %s", self.id)
            self._llm.shutdown()
            self._llm = None
            self._serving = None

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise EngineUnavailableError(f"engine {self.id} is not running")
        return self._llm

    async def handle(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        """Answer one HTTP request with vLLM's serving layer of this engine."""
        if self._serving is None or self._llm is None or self._llm.errored:
            raise EngineUnavailableError(f"engine {self.id} is not running")
        await self._serving(scope, receive, send)

    async def health(self) -> bool:
        return self._up

    @property
    def _up(self) -> bool:
        return self._started and self._llm is not None and not self._llm.errored

    @property
    def dead(self) -> bool:
        """Meant to run (started, not stopped), but its EngineCore is gone or a restart failed."""
        return self._wanted and (self._llm is None or self._llm.errored)

    async def restart(self) -> None:
        """Clean up what is left of a dead engine and start it again; raises if the start fails.
        A client of the supervisor's core waits for the supervisor to start the core again."""
        self.restarts += 1
        self.shutdown()
        if self._links is not None:
            await self._links.wait_for_core(self.id)
        await self.start()

    def _core_died(self) -> None:
        """The supervisor saw this engine's core die: what vLLM's own monitor does for a
        core it owns, so that every request waiting on it ends with EngineDeadError now."""
        llm = self._llm
        if llm is not None and not llm.engine_core.resources.engine_dead:
            llm.engine_core.resources.engine_dead = True
            llm.engine_core.shutdown()

    def stats(self) -> EngineStats:
        llm = self._llm
        return EngineStats(
            up=self._up,
            unfinished_requests=llm.get_num_unfinished_requests() if llm else 0,
            running_requests=self._snapshot.running,
            waiting_requests=self._snapshot.waiting,
            kv_cache_usage=self._snapshot.kv_cache_usage,
            restarts=self.restarts,
        )
