"""GET /v1/models, /health, /ready and /engines (specgate's view of its engines)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.errors import NotFoundError
from app.api.security import require_api_key, require_metrics_key
from app.api.state import GatewayState, gateway_state
from app.engines.base import Engine

router = APIRouter()
_CREATED = int(time.time())


@router.get("/v1/models", dependencies=[Depends(require_api_key)])
async def list_models(state: GatewayState = Depends(gateway_state)) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for name, model in state.pool.config.models.items():
        data.append(_model_card(name, name, {"default_method": model.default_method}))
        for alias in model.serving.served_model_name or ():
            data.append(_model_card(alias, name, {"default_method": model.default_method, "alias_of": name}))
        for policy in model.policies:
            data.append(_model_card(f"{name}:{policy}", name, {"policy": policy}))
        for engine in state.pool:
            if engine.id.model == name:
                data.append(_model_card(str(engine.id), name, _engine_extra(engine)))
    return {"object": "list", "data": data}


def _model_card(model_id: str, root: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": _CREATED, "owned_by": "specgate", "root": root, **extra}


def _engine_extra(engine: Engine) -> dict[str, Any]:
    info = engine.info
    return {
        "method": info.id.method,
        "speculative_method": info.speculative_method,
        "num_speculative_tokens": info.num_speculative_tokens,
        "synthetic": info.synthetic,
        "max_model_len": info.max_model_len,
    }


@router.get("/metrics", response_class=Response, dependencies=[Depends(require_metrics_key)])
async def metrics(state: GatewayState = Depends(gateway_state)) -> Response:
    port = state.settings.metrics_port
    if port is not None:
        raise NotFoundError(f"/metrics is served on port {port}.")
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: GatewayState = Depends(gateway_state)) -> JSONResponse:
    engines = {str(e.id): await e.health() for e in state.pool}
    ok = bool(engines) and all(engines.values()) and not state.draining
    body = {"ready": ok, "engines": engines, "draining": state.draining}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/engines", dependencies=[Depends(require_api_key)])
async def engines(state: GatewayState = Depends(gateway_state)) -> dict[str, Any]:
    return {
        "engines": [
            {
                "engine": str(e.id),
                **_engine_extra(e),
                "target": e.info.target,
                "speculative_config": e.info.speculative_config,
                "url": e.info.url,
                **asdict(e.stats()),
            }
            for e in state.pool
        ]
    }


@router.get("/policy", dependencies=[Depends(require_api_key)])
async def policy(state: GatewayState = Depends(gateway_state)) -> dict[str, Any]:
    """What each model's routing policies know: `auto`'s estimates per cell, its
    settings, and the shadow requests in flight (docs/auto.md)."""
    models: dict[str, Any] = {}
    for name, model in state.pool.config.models.items():
        learner = state.router.learner(name)
        models[name] = {
            "default_method": model.default_method,
            "policies": model.policies,
            "auto": None
            if learner is None
            else {
                "candidates": learner.methods,
                "fallback": learner.fallback,
                **learner.config.model_dump(exclude={"methods", "fallback"}),
                "estimates": learner.estimates.table(),
            },
            "ab": model.ab.model_dump() if model.ab else None,
            "shadow": None
            if model.shadow is None
            else {
                **model.shadow.model_dump(),
                "in_flight": state.shadows.in_flight(name),
            },
        }
    return {"models": models}
