"""The one typed state object the lifespan builds and every route reads."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from app.config import Settings
from app.engines.pool import EnginePool
from app.metrics import GatewayMetrics
from app.routing import Router


@dataclass
class GatewayState:
    settings: Settings
    pool: EnginePool
    router: Router
    metrics: GatewayMetrics


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state
