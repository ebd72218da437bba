"""Which engine serves a request.

The OpenAI `model` field is `<model>`, `<model>:<method>` or `<model>:<policy>`
(`auto`, `ab`: app/policies/); the `X-Spec-Method` header, when present,
overrides the part after the colon. A bare `<model>` goes to its
`default_method`, which may itself be a policy. Every route comes with a
`RouteDecision` that says why; it rides on the request's record into the
response, the metrics, and (for a model with `auto`) back into the policy's
estimates through `observe`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from app.config import ModelConfig, SpecgateConfig
from app.engines.base import EngineId
from app.policies.ab import ABPolicy
from app.policies.auto import AutoPolicy
from app.policies.base import EngineLoad, LoadView, RouteRequest
from app.policies.load import LoadMeter
from app.record import RequestRecord, RouteDecision

METHOD_HEADER = "X-Spec-Method"


class RouteNotFoundError(LookupError):
    """No engine for the requested model or method; the message is client-facing."""


@dataclass(frozen=True)
class Route:
    engine: EngineId
    decision: RouteDecision

    @property
    def policy(self) -> str:
        return self.decision.policy


class MethodPolicy(Protocol):
    name: str

    def choose(self, request: RouteRequest, loads: dict[str, EngineLoad]) -> tuple[str, RouteDecision]: ...


@dataclass
class ModelRoutes:
    name: str
    methods: tuple[str, ...]
    default_method: str
    policies: dict[str, MethodPolicy]
    learner: AutoPolicy | None = None  # the model's `auto`, fed by every record of the model

    @classmethod
    def from_config(cls, name: str, model: ModelConfig) -> ModelRoutes:
        methods = tuple(model.methods)
        policies: dict[str, MethodPolicy] = {}
        learner = None
        if model.auto is not None:
            learner = AutoPolicy(methods, model.auto)
            policies["auto"] = learner
        if model.ab is not None:
            policies["ab"] = ABPolicy(model.ab)
        return cls(name, methods, model.default_method, policies, learner)


class _AllReady:
    """The load view before the gateway has engines (tests of routing alone)."""

    def load(self, engine: EngineId) -> EngineLoad:
        return EngineLoad(ready=True, full=False, busy=0)


class Router:
    def __init__(
        self, models: Mapping[str, ModelRoutes], loads: LoadView | None = None, aliases: Mapping[str, str] | None = None
    ) -> None:
        self._models = dict(models)
        self.loads: LoadView = loads or _AllReady()
        self._aliases = dict(aliases or {})  # further names of a model (its serving.served_model_name)

    @classmethod
    def from_config(cls, config: SpecgateConfig, loads: LoadView | None = None) -> Router:
        models = {name: ModelRoutes.from_config(name, m) for name, m in config.models.items()}
        return cls(models, loads, config.aliases())

    def engine_ids(self) -> list[EngineId]:
        return [EngineId(m.name, method) for m in self._models.values() for method in m.methods]

    def policy_routes(self, model: str) -> list[str]:
        return list(self._models[model].policies) if model in self._models else []

    def learner(self, model: str) -> AutoPolicy | None:
        entry = self._models.get(model)
        return entry.learner if entry else None

    def meter(self, model: str) -> LoadMeter | None:
        """The load meter of a model that learns (its `auto`'s)."""
        learner = self.learner(model)
        return learner.meter if learner else None

    def route(self, requested: str, method_header: str | None = None, request: RouteRequest | None = None) -> Route:
        name, _, method = requested.partition(":")
        name = self._aliases.get(name, name)
        entry = self._models.get(name)
        if entry is None:
            raise RouteNotFoundError(f"The model '{name}' does not exist.")
        request = request or RouteRequest()
        if method_header:
            method, policy = method_header.strip(), "header"
        elif method:
            policy = "explicit"
        else:
            method, policy = entry.default_method, "default"
        decision = RouteDecision(policy=policy, reason="requested")
        if method in entry.policies:
            method, decision = entry.policies[method].choose(request, self._loads(entry))
        if method not in entry.methods:
            known = ", ".join([*entry.methods, *entry.policies])
            raise RouteNotFoundError(f"The model '{name}' has no method '{method}' (methods: {known}).")
        engine = EngineId(name, method)
        if entry.learner is not None and decision.bucket is None:
            # Every request of a learning model teaches `auto`, whoever chose its method.
            load = entry.learner.load_of(method, self._loads(entry))
            decision = replace(decision, bucket=request.features.bucket, load=load)
        return Route(engine, decision)

    def observe(self, record: RequestRecord) -> None:
        """A finished request's record, for the model's `auto` estimates."""
        learner = self.learner(record.model)
        if learner is not None:
            learner.observe(record)

    def _loads(self, entry: ModelRoutes) -> dict[str, EngineLoad]:
        return {m: self.loads.load(EngineId(entry.name, m)) for m in entry.methods}
