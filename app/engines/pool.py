"""The engines of a config: validated together, started one after another (each
start blocks until its EngineCore process is ready and, on a GPU, the memory
check of the next engine must see what the previous one took), stopped together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from app.config import SpecgateConfig
from app.engines.base import EngineId
from app.engines.vllm_local import LocalVLLMEngine

logger = logging.getLogger(__name__)


class EnginePool:
    def __init__(self, config: SpecgateConfig) -> None:
        self.config = config
        self._engines: dict[EngineId, LocalVLLMEngine] = {
            EngineId(model_name, method): LocalVLLMEngine(EngineId(model_name, method), model)
            for model_name, model in config.models.items()
            for method in model.methods
        }

    def __iter__(self) -> Iterator[LocalVLLMEngine]:
        return iter(self._engines.values())

    def __len__(self) -> int:
        return len(self._engines)

    def get(self, engine_id: EngineId) -> LocalVLLMEngine | None:
        return self._engines.get(engine_id)

    def prepare(self) -> None:
        """vLLM validates every engine's config before the first one starts."""
        for engine in self:
            engine.prepare()

    async def start(self) -> None:
        await asyncio.to_thread(self.prepare)
        started: list[LocalVLLMEngine] = []
        try:
            for engine in self:
                await asyncio.to_thread(engine.start)
                started.append(engine)
                await engine.warm_up()
        except BaseException:
            logger.error("an engine failed to start; stopping the %d already started", len(started))
            for engine in reversed(started):
                engine.shutdown()
            raise

    def stop(self) -> None:
        for engine in reversed(list(self)):
            try:
                engine.shutdown()
            except Exception:  # one engine's failure must not leave the others running
                logger.exception("error while stopping engine %s", engine.id)
