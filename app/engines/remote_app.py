"""How a remote engine answers one HTTP request: the client's body goes upstream
on the same route, its `model` swapped for the upstream's name, and the answer
comes back as the upstream wrote it.

Streamed events pass through as bytes with only the `"model"` value swapped (a
JSON string cannot contain the bytes `"model":"`, so the swap cannot touch
generated text). A chat or completion stream always asks upstream for the usage
chunk, because vLLM puts its per-request metrics there: that chunk gives the
request's record (to the request's tap), and loses its `usage` if the client did
not ask for it. On the other routes the record comes from the usage of the last
event that has one. Upstream refusals about the client's request (400, 413, 422,
429) are passed on; any other failure is the gateway's 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import httpx

from app.engines.base import ASGIReceive, ASGIScope, ASGISend, EngineId, EngineUnavailableError, send_whole
from app.engines.clock import RequestClock
from app.engines.tap import CURRENT_TAP, RequestTap
from app.record import RequestRecord


class UpstreamCall(Protocol):
    """What the relay uses of one upstream request (app/engines/remote.py's UpstreamCall)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> httpx.Headers: ...
    async def read(self) -> bytes: ...
    async def json(self) -> dict[str, Any]: ...
    def events(self) -> AsyncIterator[bytes]: ...
    async def close(self) -> None: ...


class Upstream(Protocol):
    """What the relay uses of a remote engine (app/engines/remote.py's RemoteVLLMEngine)."""

    id: EngineId
    served_model_name: str | None

    async def open(self, path: str, payload: dict[str, Any], request_id: str, clock: RequestClock) -> UpstreamCall: ...
    def record(self, call: Any, final: Mapping[str, Any], finish_reasons: Sequence[str]) -> RequestRecord: ...


CLIENT_STATUSES = frozenset({400, 413, 422, 429})
USAGE_CHUNK_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
DONE = b"data: [DONE]\n\n"


async def answer(engine: Upstream, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    tap = CURRENT_TAP.get()
    clock = tap.clock if tap is not None else RequestClock(engine.id)
    relay = _Relay(engine, scope["path"], json.loads(body), tap)
    async with _closed_by_disconnect(receive):
        call = await engine.open(scope["path"], relay.upstream_payload(), f"specgate-{uuid.uuid4().hex}", clock)
        try:
            if call.status_code >= 400:
                await relay.refusal(call, send)
            elif call.headers.get("content-type", "").startswith("text/event-stream"):
                await relay.stream(call, send)
            else:
                await relay.whole(call, send)
        finally:
            await call.close()


@contextlib.asynccontextmanager
async def _closed_by_disconnect(receive: ASGIReceive) -> AsyncIterator[None]:
    """A client that goes away cancels the relay, whose call then closes: vLLM aborts
    a request whose connection closes."""
    task = asyncio.current_task()
    assert task is not None
    left = False

    async def watch() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()
    finally:
        watcher.cancel()


class _Relay:
    def __init__(self, engine: Upstream, path: str, body: dict[str, Any], tap: RequestTap | None) -> None:
        self.engine, self.path, self.body, self.tap = engine, path, body, tap
        self.usage_chunk = path in USAGE_CHUNK_ROUTES and bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        upstream = engine.served_model_name or ""
        self._upstream_model = b'"model":' + json.dumps(upstream, ensure_ascii=False).encode()
        self._model = b'"model":' + json.dumps(str(engine.id), ensure_ascii=False).encode()

    def upstream_payload(self) -> dict[str, Any]:
        payload = dict(self.body)
        if self.usage_chunk:
            payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
        return payload

    async def refusal(self, call: UpstreamCall, send: ASGISend) -> None:
        content = await call.read()
        status = call.status_code
        if status not in CLIENT_STATUSES:
            raise EngineUnavailableError(f"engine {self.engine.id}: the upstream answered HTTP {status}")
        headers = [(b"content-type", b"application/json")]
        headers += [(k.encode(), v.encode()) for k, v in call.headers.items() if k.lower() == "retry-after"]
        await send_whole(send, status, headers, content)

    async def whole(self, call: UpstreamCall, send: ASGISend) -> None:
        data = await call.json()
        reasons = [c.get("finish_reason") for c in sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))]
        self._record(call, data, [r for r in reasons if r])
        if "model" in data:
            data["model"] = str(self.engine.id)
        content = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        await send_whole(send, call.status_code, [(b"content-type", b"application/json")], content)

    async def stream(self, call: UpstreamCall, send: ASGISend) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": call.status_code,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        finish: dict[int, str] = {}
        last_usage: dict[str, Any] | None = None
        ended = False
        async for event in call.events():
            payload = event.split(b"data:", 1)[1].strip() if b"data:" in event else b""
            if payload == b"[DONE]" or payload.startswith(b'{"error"'):
                ended = True
            elif self.usage_chunk and b'"choices":[]' in payload and b'"usage":' in payload:
                final = json.loads(payload)
                self._record(call, final, [finish[i] for i in sorted(finish)])
                if not self.include_usage:
                    final.pop("usage", None)
                event = b"data: " + json.dumps(final, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
            elif b'"finish_reason":"' in payload:
                for choice in json.loads(payload).get("choices", []):
                    if choice.get("finish_reason"):
                        finish[choice["index"]] = choice["finish_reason"]
            elif not self.usage_chunk and b'"usage":' in payload:
                last_usage = json.loads(payload)
            await send(
                {
                    "type": "http.response.body",
                    "body": event.replace(self._upstream_model, self._model, 1),
                    "more_body": True,
                }
            )
        if last_usage is not None:
            self._record(call, last_usage, [])
        if self.usage_chunk and not ended and (self.tap is None or not self.tap.finished):
            raise EngineUnavailableError(f"engine {self.engine.id}: the upstream ended the stream early")
        tail = b"" if ended or self.path not in USAGE_CHUNK_ROUTES else DONE
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    def _record(self, call: UpstreamCall, final: dict[str, Any], finish_reasons: list[str]) -> None:
        if self.tap is not None:
            self.tap.set_record(self.engine.record(call, final, finish_reasons))
