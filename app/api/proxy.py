"""Answers from a remote engine (a method with `url:`).

The client's validated body goes upstream with its `model` swapped for the
upstream's name; a stream always asks for the usage chunk, because vLLM puts its
per-request metrics there. The answer comes back as the upstream wrote it:
streamed events pass through as bytes with only the `"model"` value swapped
(a JSON string cannot contain the bytes `"model":"`, so the swap cannot touch
generated text), and only the events that finish a choice or carry the usage are
parsed. The last chunk is specgate's, as for in-process engines: no choices, the
`specgate` record, and `usage` if the client asked for it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from starlette.responses import Response

from app.api.admission import admit
from app.api.errors import ServiceUnavailableError, api_error_for
from app.api.generation import engine_headers
from app.api.protocol import SamplingFields
from app.api.sse import sse_response
from app.api.state import GatewayState
from app.api.tracking import RequestTracker, failure_outcome
from app.engines.base import EngineError
from app.engines.remote import RemoteVLLMEngine, UpstreamCall
from app.metrics import RouteDecision

DONE = b"data: [DONE]\n\n"
# Upstream refusals that are about the client's request: passed on as they are.
# Anything else (401, 404, 5xx) is the gateway's or the upstream's problem: a 503.
CLIENT_STATUSES = frozenset({400, 413, 422, 429})


def upstream_payload(body: SamplingFields) -> dict[str, Any]:
    payload = body.model_dump(mode="json", exclude_unset=True)
    if body.stream:
        payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    return payload


async def forward(
    state: GatewayState, engine: RemoteVLLMEngine, path: str, body: SamplingFields, decision: RouteDecision,
    request_id: str,
) -> Response:
    admitted = await admit(state.admissions[engine.id], state.metrics, request_id, decision, state.router.observe)
    tracker = admitted.tracker
    try:
        call = await engine.open(path, upstream_payload(body), request_id, admitted.clock)
    except EngineError as exc:
        tracker.fail(failure_outcome(exc))
        raise api_error_for(exc) from None
    except BaseException:
        tracker.fail("cancelled")
        raise
    relay = _Relay(engine, call, tracker, body.include_usage)
    if body.stream and call.status_code < 400:
        return sse_response(relay.events(), engine_headers(engine))
    try:
        return await (relay.answer() if call.status_code < 400 else relay.refusal())
    except EngineError as exc:
        tracker.fail(failure_outcome(exc))
        raise api_error_for(exc) from None
    finally:
        await call.close()
        tracker.fail("cancelled")  # a no-op once the request has ended


class _Relay:
    def __init__(
        self, engine: RemoteVLLMEngine, call: UpstreamCall, tracker: RequestTracker, include_usage: bool
    ) -> None:
        self.engine, self.call, self.tracker = engine, call, tracker
        self.include_usage = include_usage
        self.model = str(engine.id)
        upstream = engine.served_model_name or ""
        self._upstream_model = b'"model":' + json.dumps(upstream, ensure_ascii=False).encode()
        self._model = b'"model":' + json.dumps(self.model, ensure_ascii=False).encode()

    async def refusal(self) -> Response:
        content = await self.call.read()
        status = self.call.status_code
        if status not in CLIENT_STATUSES:
            self.tracker.fail("error")
            raise ServiceUnavailableError(f"engine {self.engine.id}: the upstream answered HTTP {status}")
        self.tracker.fail("invalid")
        headers = {k: v for k, v in self.call.headers.items() if k.lower() == "retry-after"}
        return Response(content, status, headers=headers, media_type="application/json")

    async def answer(self) -> Response:
        data = await self.call.json()
        reasons = [c.get("finish_reason") for c in sorted(data.get("choices", []), key=lambda c: c["index"])]
        record = self.tracker.finish(self.engine.record(self.call, data, [r for r in reasons if r]))
        data.pop("metrics", None)
        data.update(model=self.model, specgate=record.to_dict())
        return JSONResponse(data, headers=engine_headers(self.engine))

    async def events(self) -> AsyncIterator[bytes]:
        finish: dict[int, str] = {}
        try:
            async for event in self.call.events():
                payload = event.removeprefix(b"data:").strip()
                if not event.startswith(b"data:"):  # comments (keep-alives) and other fields
                    yield event
                elif payload == b"[DONE]":
                    break
                elif payload.startswith(b'{"error"'):
                    self.tracker.fail("error")
                    yield event
                    break
                elif b'"choices":[]' in payload and b'"usage":' in payload:
                    yield self._last_chunk(json.loads(payload), [finish[i] for i in sorted(finish)])
                else:
                    if b'"finish_reason":"' in payload:
                        for choice in json.loads(payload)["choices"]:
                            if choice.get("finish_reason"):
                                finish[choice["index"]] = choice["finish_reason"]
                    yield event.replace(self._upstream_model, self._model, 1)
            if not self.tracker.ended:
                self.tracker.fail("error")
                error = ServiceUnavailableError(f"engine {self.engine.id}: the upstream ended the stream early")
                yield error.sse().encode()
            yield DONE
        except EngineError as exc:
            # Headers are gone: the error travels as an event, then the stream ends.
            self.tracker.fail(failure_outcome(exc))
            yield api_error_for(exc).sse().encode()
            yield DONE
        except (ValueError, KeyError, TypeError):
            self.tracker.fail("error")
            error = ServiceUnavailableError(f"engine {self.engine.id}: the upstream sent an event that is not valid")
            yield error.sse().encode()
            yield DONE
        finally:
            await self.call.close()
            self.tracker.fail("cancelled")

    def _last_chunk(self, final: dict[str, Any], finish_reasons: list[str]) -> bytes:
        record = self.tracker.finish(self.engine.record(self.call, final, finish_reasons))
        final.pop("metrics", None)
        if not self.include_usage:
            final.pop("usage", None)
        final.update(model=self.model, specgate=record.to_dict())
        return f"data: {json.dumps(final, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
