"""The FastAPI application: engines start in the lifespan and stop with it;
around the routes, the body-size limit, keys and CORS (app/api/security.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from wsgiref.simple_server import WSGIServer

from fastapi import FastAPI
from prometheus_client import start_http_server

from app.api import admin, routes, system
from app.api.admission import Admission
from app.api.body_limit import BodySizeLimit
from app.api.errors import install_error_handlers
from app.api.security import install_security
from app.api.shadow import Shadows
from app.api.state import GatewayState, PoolLoads
from app.config import Settings, SpecgateConfig
from app.engines.base import EngineId
from app.engines.collector import EngineCollector
from app.engines.core_links import CoreLinks
from app.engines.pool import EnginePool
from app.metrics import GatewayMetrics
from app.routing import Router

logger = logging.getLogger("specgate")


def build_app(config: SpecgateConfig, settings: Settings, links: CoreLinks | None = None) -> FastAPI:
    """`links`: this is one API process of several (app/frontends.py), over the supervisor's engine cores."""
    pool = EnginePool(config, links)
    processes = links.count if links is not None else 1
    metrics = GatewayMetrics()
    metrics.register(EngineCollector(pool))
    for engine in pool:
        metrics.add_engine(engine.id.model, engine.id.method, engine.info.num_speculative_tokens)
    admissions: dict[EngineId, Admission] = {}
    router = Router.from_config(config, PoolLoads(pool, admissions))
    for engine in pool:
        # Each of several API processes admits its share: together they hold the host's limits.
        limits = config.models[engine.id.model].limits_for(engine.id.method).shared_by(processes)
        series = metrics.admission(engine.id.model, engine.id.method)
        admissions[engine.id] = Admission(engine.id, limits, series, router.meter(engine.id.model))
    shadowed = {name: model.shadow for name, model in config.models.items() if model.shadow}
    shadows = Shadows(shadowed, metrics.shadow, pool, admissions, router.observe)
    state = GatewayState(
        settings=settings, pool=pool, router=router, metrics=metrics, admissions=admissions, shadows=shadows
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if links is not None:
            links.listen()
        await state.pool.start()
        if links is not None:
            logger.info("API process %d of %d: engines up", links.index, links.count)
        metrics_server = _start_metrics_server(state)
        try:
            yield
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
            await state.shadows.stop()
            await state.pool.stop()

    app = FastAPI(title="specgate", version=_version(), lifespan=lifespan)
    app.state.gateway = state
    app.state.drain = state.start_draining  # the server replaces it with one that also exits
    install_error_handlers(app)
    app.add_middleware(routes.EngineRoutes)  # innermost: after the body limit and CORS
    install_security(app, settings)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    for module in (routes, system, admin):
        app.include_router(module.router)
    app.openapi = lambda: routes.openapi_schema(app)  # type: ignore[method-assign]
    return app


def _start_metrics_server(state: GatewayState) -> WSGIServer | None:
    """`/metrics` on a port of its own (prometheus_client's server, a thread)."""
    port = state.settings.metrics_port
    if port is None:
        return None
    server, _ = start_http_server(port, addr=state.settings.host, registry=state.metrics.exposed())
    return server


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specgate")
    except PackageNotFoundError:
        return "0.0.0"
