"""The one typed state object the lifespan builds and every route reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from app.api.admission import Admission

if TYPE_CHECKING:
    from app.api.shadow import Shadows
from app.config import Settings
from app.engines.base import EngineId
from app.engines.pool import EnginePool
from app.metrics import GatewayMetrics
from app.policies.base import EngineLoad
from app.routing import Router


@dataclass
class GatewayState:
    settings: Settings
    pool: EnginePool
    router: Router
    metrics: GatewayMetrics
    admissions: dict[EngineId, Admission]
    shadows: Shadows
    draining: bool = False  # after SIGTERM: new requests get a 503, /ready says false

    def start_draining(self) -> None:
        self.draining = True

    def busy(self) -> int:
        """Requests admitted or queued, on every engine."""
        return sum(a.in_flight + a.queued for a in self.admissions.values())


class PoolLoads:
    """The routing policies' view of the engines: up, at their admission limit, busy."""

    def __init__(self, pool: EnginePool, admissions: dict[EngineId, Admission]) -> None:
        self._pool, self._admissions = pool, admissions

    def load(self, engine: EngineId) -> EngineLoad:
        found, admission = self._pool.get(engine), self._admissions.get(engine)
        if found is None or admission is None:
            return EngineLoad(ready=False, full=True, busy=0)
        return EngineLoad(
            ready=found.stats().up,
            full=admission.full,
            busy=admission.in_flight + admission.queued,
        )


async def gateway_state(request: Request) -> GatewayState:  # a coroutine: no worker thread
    state: GatewayState = request.app.state.gateway
    return state
