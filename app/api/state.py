"""The one typed state object the lifespan builds and every route reads."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from app.api.admission import Admission
from app.config import Settings
from app.engines.base import EngineId
from app.engines.pool import EnginePool
from app.metrics import GatewayMetrics
from app.routing import Router


@dataclass
class GatewayState:
    settings: Settings
    pool: EnginePool
    router: Router
    metrics: GatewayMetrics
    admissions: dict[EngineId, Admission]
    draining: bool = False  # after SIGTERM: new requests get a 503, /ready says false

    def start_draining(self) -> None:
        self.draining = True

    def busy(self) -> int:
        """Requests admitted or queued, on every engine."""
        return sum(a.in_flight + a.queued for a in self.admissions.values())


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state
