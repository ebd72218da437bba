"""The FastAPI application: engines start in the lifespan and stop with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import chat, completions, system
from app.api.errors import install_error_handlers
from app.api.state import GatewayState
from app.config import Settings, SpecgateConfig
from app.engines.collector import EngineCollector
from app.engines.pool import EnginePool
from app.metrics import GatewayMetrics
from app.routing import Router


def build_app(config: SpecgateConfig, settings: Settings) -> FastAPI:
    pool = EnginePool(config)
    metrics = GatewayMetrics()
    metrics.register(EngineCollector(pool))
    for engine in pool:
        metrics.add_engine(engine.id.model, engine.id.method, engine.info.num_speculative_tokens)
    state = GatewayState(settings=settings, pool=pool, router=Router.from_config(config), metrics=metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.pool.start()
        try:
            yield
        finally:
            await state.pool.stop()

    app = FastAPI(title="specgate", version=_version(), lifespan=lifespan)
    app.state.gateway = state
    install_error_handlers(app)
    for module in (chat, completions, system):
        app.include_router(module.router)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specgate")
    except PackageNotFoundError:
        return "0.0.0"
