"""The `ab` policy: fixed weights across methods, to compare them on the same live
traffic. With `sticky`, a request's `user` always draws the same point in [0, 1),
so a user stays on one method; without a user the draw is random. When the drawn
method's engine is not ready, the draw is repeated over the ready ones (and the
decision says so)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from app.config import ABConfig
from app.policies.base import EngineLoad, RouteRequest
from app.record import RouteDecision


class ABPolicy:
    name = "ab"

    def __init__(self, config: ABConfig) -> None:
        self.weights = dict(config.weights)
        self.sticky = config.sticky
        self._random = random.Random(config.seed)

    def choose(self, request: RouteRequest, loads: dict[str, EngineLoad]) -> tuple[str, RouteDecision]:
        point = self._point(request.user)
        method = _pick(list(self.weights), self.weights, point)
        reason = "weight"
        if not loads[method].ready:
            ready = [m for m in self.weights if loads[m].ready]
            if ready:
                method, reason = _pick(ready, self.weights, point), "reweighted"
        return method, RouteDecision(policy=self.name, reason=reason, load=loads[method].busy)

    def _point(self, user: str | None) -> float:
        if self.sticky and user:
            digest = hashlib.sha256(user.encode()).digest()
            return int.from_bytes(digest[:8], "big") / 2**64
        return self._random.random()


def _pick(methods: Sequence[str], weights: dict[str, float], point: float) -> str:
    total = sum(weights[m] for m in methods)
    edge = 0.0
    for method in methods:
        edge += weights[method] / total
        if point < edge:
            return method
    return methods[-1]
