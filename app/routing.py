"""Which engine serves a request.

The OpenAI `model` field is `<model>` or `<model>:<method>`; the `X-Spec-Method`
header, when present, overrides the method. A model without an explicit method
goes to its policy, today `DefaultMethodPolicy`; a load-aware `auto` policy
slots in by implementing `MethodPolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from app.config import SpecgateConfig
from app.engines.base import EngineId

METHOD_HEADER = "X-Spec-Method"


class RouteNotFoundError(LookupError):
    """No engine for the requested model or method; the message is client-facing."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    methods: tuple[str, ...]
    default_method: str


@dataclass(frozen=True)
class Route:
    engine: EngineId
    reason: str  # "explicit", "header" or the deciding policy's name


class MethodPolicy(Protocol):
    name: str

    def choose(self, model: ModelEntry) -> str: ...


class DefaultMethodPolicy:
    name = "default"

    def choose(self, model: ModelEntry) -> str:
        return model.default_method


class Router:
    def __init__(
        self,
        models: Mapping[str, ModelEntry],
        policies: Mapping[str, MethodPolicy] | None = None,
    ) -> None:
        self._models = dict(models)
        self._policies = dict(policies or {})
        self._fallback = DefaultMethodPolicy()

    @classmethod
    def from_config(cls, config: SpecgateConfig) -> Router:
        models = {
            name: ModelEntry(name, tuple(model.methods), model.default_method)
            for name, model in config.models.items()
        }
        return cls(models)

    def engine_ids(self) -> list[EngineId]:
        return [EngineId(m.name, method) for m in self._models.values() for method in m.methods]

    def route(self, requested: str, method_header: str | None = None) -> Route:
        name, _, method = requested.partition(":")
        entry = self._models.get(name)
        if entry is None:
            raise RouteNotFoundError(f"The model '{name}' does not exist.")
        if method_header:
            method, reason = method_header.strip(), "header"
        elif method:
            reason = "explicit"
        else:
            policy = self._policies.get(name, self._fallback)
            method, reason = policy.choose(entry), policy.name
        if method not in entry.methods:
            known = ", ".join(entry.methods)
            raise RouteNotFoundError(
                f"The model '{name}' has no method '{method}' (methods: {known})."
            )
        return Route(EngineId(name, method), reason)
