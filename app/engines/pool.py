"""The engines of a config: validated together, started, stopped together.

In-process engines with a fixed KV budget (`kv_cache_memory_bytes`, as every CPU
engine has) start together: none sizes its KV cache from the memory left, so none
needs to see what another took. The others then start one after another, each
sizing its cache from what the engines before it left. Remote engines only open a
connection pool and probe their server, so they start alongside.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

from vllm.utils.gc_utils import freeze_gc_heap

from app.config import BASELINE_METHOD, ModelConfig, SpecgateConfig
from app.engines.base import Engine, EngineId
from app.engines.core_links import CoreLinks
from app.engines.remote import RemoteVLLMEngine
from app.engines.vllm_local import LocalVLLMEngine

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 60.0

# Every engine is an `Engine`: the API never asks which kind answers a request.
PoolEngine = LocalVLLMEngine | RemoteVLLMEngine


def make_engine(engine_id: EngineId, model: ModelConfig, links: CoreLinks | None = None) -> PoolEngine:
    if model.methods[engine_id.method].remote:
        return RemoteVLLMEngine(engine_id, model)
    return LocalVLLMEngine(engine_id, model, links)


class EnginePool:
    """`links`: in one API process of several, the supervisor's engine cores (app/frontends.py)."""

    def __init__(self, config: SpecgateConfig, links: CoreLinks | None = None) -> None:
        self.config = config
        self._engines: dict[EngineId, PoolEngine] = {}
        self._watchers: list[asyncio.Task[None]] = []
        for model_name, model in config.models.items():
            for method in model.methods:
                engine_id = EngineId(model_name, method)
                self._engines[engine_id] = make_engine(engine_id, model, links)

    def __iter__(self) -> Iterator[PoolEngine]:
        return iter(self._engines.values())

    def __len__(self) -> int:
        return len(self._engines)

    def get(self, engine_id: EngineId) -> PoolEngine | None:
        return self._engines.get(engine_id)

    def only_model(self) -> str | None:
        """The model a request without `model` means: the only one, as `vllm serve` has."""
        return next(iter(self.config.models)) if len(self.config.models) == 1 else None

    def baseline_of(self, engine_id: EngineId) -> EngineId | None:
        """An engine of the same model that does not speculate: the `none` method, else the first."""
        model = self.config.models[engine_id.model]
        plain = [name for name, m in model.methods.items() if m.speculative_config is None]
        if not plain:
            return None
        return EngineId(engine_id.model, BASELINE_METHOD if BASELINE_METHOD in plain else plain[0])

    def any_local(self) -> LocalVLLMEngine | None:
        """An in-process engine, whose serving layer can answer a body that is not JSON."""
        return next((e for e in self if isinstance(e, LocalVLLMEngine)), None)

    def prepare(self) -> None:
        """vLLM validates every engine's config before the first one starts."""
        for engine in self:
            engine.prepare()

    async def start(self) -> None:
        await asyncio.to_thread(self.prepare)
        together: list[PoolEngine] = [e for e in self if isinstance(e, RemoteVLLMEngine) or e.fixed_kv_budget]
        alone = [e for e in self if e not in together]
        started: list[Engine] = []  # stopping one that never (fully) started is harmless
        try:
            started.extend(together)
            results = await asyncio.gather(*(e.start() for e in together), return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
            for engine in alone:
                started.append(engine)
                await engine.start()
        except BaseException:
            logger.error("an engine failed to start; stopping the %d started with it", len(started))
            await _stop_all(reversed(started))
            raise
        self._watchers = [asyncio.create_task(_keep_alive(e)) for e in self if isinstance(e, LocalVLLMEngine)]
        settle_heap()

    async def stop(self) -> None:
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await _stop_all(reversed(list(self)))


async def _keep_alive(engine: LocalVLLMEngine) -> None:
    """Restart an in-process engine whose EngineCore died, waiting 1, 2, 4 … 60 s
    between failed attempts. Meanwhile its requests get a 503 and /ready says it is
    down; the other engines are not touched."""
    backoff = RESTART_BACKOFF_S
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        if not engine.dead:
            continue
        logger.error("engine %s is dead; restarting it in %g s", engine.id, backoff)
        await asyncio.sleep(backoff)
        try:
            await engine.restart()
        except Exception:  # the next round tries again, later
            logger.exception("engine %s did not restart", engine.id)
            backoff = min(backoff * 2, MAX_RESTART_BACKOFF_S)
        else:
            settle_heap()
            logger.info("engine %s restarted", engine.id)
            backoff = RESTART_BACKOFF_S


def settle_heap() -> None:
    """Mark what is alive once the engines are up as static, as `vllm serve` does after
    its start-up (`freeze_gc_heap`): Python's cyclic GC then never walks again the
    hundreds of thousands of objects of vLLM, torch and the engines' serving layers.
    Unfrozen, each full collection walked them all from the token path, a pause of
    tens to hundreds of milliseconds that grew with load. After a restart the heap is
    thawed first, so that the dead engine's objects can be collected."""
    gc.unfreeze()
    freeze_gc_heap()


async def _stop_all(engines: Iterator[Engine]) -> None:
    for engine in engines:
        try:
            await engine.stop()
        except Exception:  # one engine's failure must not leave the others running
            logger.exception("error while stopping engine %s", engine.id)
