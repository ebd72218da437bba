"""One request's life, written once for every route and every engine:
route → admit → engine → record → metrics and learning → release.

The gateway reads the body only for what is its own (the `model` it routes on,
the features `auto` learns from, what a speculating engine cannot serve), then
hands the request to the chosen engine's `handle`: vLLM's own serving layer of
an in-process engine, or the upstream server of a remote one. The answer comes
back through `AnswerWriter` (app/api/answer.py), which ends the request's tracker
with the record the request's tap collected; the tracker's end feeds the metrics,
the router's learning and the access log, and gives the admission place back.
Shadow requests (app/api/shadow.py) take the same path with nobody listening.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from starlette.responses import Response

from app.api.admission import admit
from app.api.answer import AnswerWriter
from app.api.dispatch import dispatch
from app.api.errors import BadRequestError, ModelNotFoundError, ServiceUnavailableError
from app.api.state import GatewayState
from app.api.tracking import RequestTracker
from app.engines.base import ASGIReceive, ASGIScope, ASGISend, EngineError
from app.engines.pool import PoolEngine
from app.engines.tap import RequestTap
from app.policies.base import RouteRequest
from app.policies.features import body_text
from app.record import RouteDecision
from app.routing import METHOD_HEADER, RouteNotFoundError


@dataclass(frozen=True)
class Routed:
    engine: PoolEngine
    decision: RouteDecision


def request_body(raw: bytes) -> dict[str, Any] | None:
    """The JSON object of a request, or None: the engine's serving layer then answers
    the malformed body with its own 400."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def choose_engine(state: GatewayState, request: Request, body: dict[str, Any]) -> Routed:
    if state.draining:
        raise ServiceUnavailableError("The server is shutting down; retry on another replica.")
    requested = body.get("model")
    if requested is None:
        requested = state.pool.only_model()
    if not isinstance(requested, str):
        raise BadRequestError(
            "`model` is required: it names the model (and its method) to serve the request.", param="model"
        )
    temperature = body.get("temperature")
    wanted = RouteRequest(
        prompt_text=lambda: body_text(body),
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        user=body.get("user") if isinstance(body.get("user"), str) else None,
    )
    try:
        route = state.router.route(requested, request.headers.get(METHOD_HEADER), wanted)
    except RouteNotFoundError as exc:
        raise ModelNotFoundError(str(exc), param="model") from None
    engine_id, decision = route.engine, route.decision
    if decision.policy not in ("explicit", "header") and needs_baseline(body):
        baseline = state.pool.baseline_of(engine_id)
        if baseline is not None and baseline != engine_id:
            engine_id, decision = baseline, replace(decision, reason="unsupported_by_speculation")
    engine = state.pool.get(engine_id)
    if engine is None:
        raise ModelNotFoundError(f"The model '{requested}' does not exist.", param="model")
    metrics = state.metrics
    metrics.child(metrics.decisions, engine_id.model, decision.policy, engine_id.method, decision.reason).inc()
    return Routed(engine, decision)


def needs_baseline(body: dict[str, Any]) -> bool:
    """Sampling vLLM refuses on a speculating engine (`SamplingParams._validate_spec_decode`)."""
    min_p = body.get("min_p")
    return bool(body.get("logit_bias")) or (isinstance(min_p, int | float) and min_p > 1e-5)


def engine_headers(engine: PoolEngine) -> dict[str, str]:
    return {METHOD_HEADER: engine.id.method, "X-Specgate-Engine": str(engine.id)}


def engine_body(raw: bytes, body: dict[str, Any], engine: PoolEngine) -> bytes:
    """The body the engine gets: `model` names the engine, as its serving layer knows it
    (the client's own bytes when it named the engine already: no second encoding)."""
    name = str(engine.id)
    if body.get("model") == name:
        return raw
    return json.dumps({**body, "model": name}, ensure_ascii=False).encode()


async def serve_generation(state: GatewayState, request: Request, usage_details: bool) -> Response:
    raw = await request.body()
    body = request_body(raw)
    if body is None:
        return EngineResponse(state.pool.any_local(), raw)
    routed = choose_engine(state, request, body)
    engine = routed.engine
    request_id = f"specgate-{uuid.uuid4().hex}"
    admitted = await admit(
        state.admissions[engine.id], state.metrics, request_id, routed.decision, state.router.observe
    )
    payload = engine_body(raw, body, engine)
    tap = RequestTap(engine.info, admitted.clock)

    def mirror() -> None:
        state.shadows.mirror(engine.id, request.scope, body, admitted.tracker)

    return EngineResponse(engine, payload, tap, admitted.tracker, usage_details, on_accepted=mirror)


async def serve_other(state: GatewayState, request: Request) -> Response:
    """A route of the engine's serving layer that generates nothing (tokenize, detokenize):
    the model's engine answers it, without admission or a record."""
    raw = await request.body()
    body = request_body(raw)
    if body is None:
        return EngineResponse(state.pool.any_local(), raw)
    engine = choose_engine(state, request, body).engine
    return EngineResponse(engine, engine_body(raw, body, engine))


class EngineResponse(Response):
    """The engine's answer, written straight to the client through `AnswerWriter`."""

    def __init__(
        self,
        engine: PoolEngine | None,
        body: bytes,
        tap: RequestTap | None = None,
        tracker: RequestTracker | None = None,
        usage_details: bool = False,
        on_accepted: Callable[[], None] | None = None,
    ) -> None:
        if engine is None:
            raise BadRequestError("The request body is not a JSON object.")
        self.engine, self.payload, self.tap, self.tracker = engine, body, tap, tracker
        self.usage_details, self.on_accepted = usage_details, on_accepted
        self.background = None

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        writer = AnswerWriter(
            send, self.tap, self.tracker, engine_headers(self.engine), self.usage_details, self.on_accepted
        )
        try:
            await dispatch(self.engine, scope, receive, writer.send, self.payload, self.tap)
        except EngineError as exc:
            await writer.fail(exc)
        finally:
            if self.tracker is not None:
                self.tracker.fail("cancelled")  # a no-op once the request has ended
