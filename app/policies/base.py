"""What a method policy sees: the request (cheap features, sampling, user) and the
live state of each engine of the model (ready, at its admission limit, load)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from app.engines.base import EngineId
from app.policies.features import RequestFeatures, features_of


@dataclass(frozen=True)
class EngineLoad:
    ready: bool  # up, and the gateway is not draining
    full: bool  # no free place: a request now would queue or be refused
    busy: int  # requests admitted or queued at the gateway


class LoadView(Protocol):
    def load(self, engine: EngineId) -> EngineLoad: ...


@dataclass
class RouteRequest:
    """A request as the router sees it; the prompt text is read only if a policy asks."""

    prompt_text: Callable[[], str] = field(default=lambda: "")
    temperature: float | None = None
    user: str | None = None

    @cached_property
    def features(self) -> RequestFeatures:
        return features_of(self.prompt_text(), self.temperature)


def eligible(methods: Sequence[str], loads: dict[str, EngineLoad]) -> list[str]:
    """The methods a policy may pick: ready and with a free place; else ready ones
    (they queue); else all (the request gets the engine's 503)."""
    free = [m for m in methods if loads[m].ready and not loads[m].full]
    if free:
        return free
    ready = [m for m in methods if loads[m].ready]
    return ready or list(methods)
