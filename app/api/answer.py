"""The answer on its way out: what the engine's serving layer sends passes through
`AnswerWriter`, which ends the request's tracker exactly once and puts the
request's record into the answer.

- A JSON answer is held until complete (it is one message), then gets the
  `specgate` record and, on chat and text completions, the acceptance in OpenAI's
  own usage fields (`usage.completion_tokens_details.accepted_prediction_tokens`
  and `rejected_prediction_tokens`; null on an engine that does not speculate).
- A stream passes event by event as the engine writes it. Once the engine has
  given its last output, the few remaining events are held until the stream ends,
  and the last JSON event gets the record (the usage chunk when the client asked
  for usage): no event is added, none is delayed while tokens still come.
- A request that ran out of its time limits, or whose engine died, gets specgate's
  504 or 503 instead of the serving layer's 500; one the serving layer failed to
  read before it reached the engine gets a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.api.errors import api_error_for
from app.api.tracking import RequestTracker, failure_outcome
from app.engines.base import ASGIMessage, ASGISend, EngineError, send_whole
from app.engines.tap import RequestTap
from app.record import RequestRecord

EVENT_STREAM = b"text/event-stream"
DATA = b"data: "
ERROR_EVENT = DATA + b'{"error"'


class AnswerWriter:
    def __init__(
        self,
        send: ASGISend,
        tap: RequestTap | None,
        tracker: RequestTracker | None,
        headers: dict[str, str],
        usage_details: bool,
        on_accepted: Callable[[], None] | None = None,
    ) -> None:
        self._on_accepted = on_accepted  # the engine took the request: its answer starts with a success
        self._send, self._tap, self._tracker = send, tap, tracker
        self._extra_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._usage_details = usage_details
        self._start: ASGIMessage | None = None
        self._stream = False
        self._held: list[bytes] = []
        self.started = False  # response headers have gone to the client

    async def send(self, message: ASGIMessage) -> None:
        tap = self._tap
        if (
            self._stream
            and not self._held
            and (tap is None or not tap.finished)
            and message.get("more_body", False)
            and message["type"] == "http.response.body"
            and not message.get("body", b"").startswith(ERROR_EVENT)
        ):
            # Every event while the engine still generates: passed on as it is,
            # with no further call (this runs once per streamed event).
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            await self._on_start(message)
        elif message["type"] == "http.response.body":
            await self._on_body(message)
        else:
            await self._send(message)

    async def _on_start(self, message: ASGIMessage) -> None:
        headers = [h for h in message.get("headers", []) if h[0].lower() != b"content-length"]
        message = {**message, "headers": [*headers, *self._extra_headers]}
        content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        self._stream = content_type.startswith(EVENT_STREAM) and message["status"] < 400
        if self._stream:
            self.started = True
            await self._send(message)
            self._accepted()
        else:
            self._start = message

    async def _on_body(self, message: ASGIMessage) -> None:
        chunk: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if not self._stream:
            self._held.append(chunk)
            if not more:
                await self._send_whole(b"".join(self._held))
            return
        if chunk.startswith(ERROR_EVENT):
            chunk = self._stream_error(chunk)
        if self._held or (self._tap is not None and self._tap.finished):
            self._held.append(chunk)
            if more:
                return
            chunk, self._held = self._with_record(self._held), []
        elif not more:
            self._fail("error")  # the stream ended before the engine's last output
        await self._send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def _send_whole(self, body: bytes) -> None:
        assert self._start is not None
        status: int = self._start["status"]
        if status < 400:
            body = self._json_with_record(body)
            self._accepted()
        elif self._tap is not None and self._tap.failure is not None:
            error = api_error_for(self._tap.failure)  # specgate's 504 or 503, not the serving layer's 500
            status, body = error.status, json.dumps(error.body()).encode()
            self._fail(failure_outcome(self._tap.failure))
        elif status >= 500 and self._tap is not None and not self._tap.started:
            status, body = _input_error(body)
            self._fail("invalid")
        else:
            self._fail("invalid" if status < 500 else "error")
        self.started = True
        await send_whole(self._send, status, self._start["headers"], body)

    def _accepted(self) -> None:
        if self._on_accepted is not None:
            self._on_accepted()
            self._on_accepted = None

    async def fail(self, exc: EngineError) -> None:
        """The engine failed before or while answering: a clean error for the client."""
        error = api_error_for(exc)
        self._fail(failure_outcome(exc))
        if not self.started:
            self.started = True
            headers = [
                (b"content-type", b"application/json"),
                *[(k.lower().encode(), v.encode()) for k, v in error.headers.items()],
            ]
            await send_whole(self._send, error.status, headers, json.dumps(error.body()).encode())
        elif self._stream:
            await self._send(
                {"type": "http.response.body", "body": error.sse().encode() + b"data: [DONE]\n\n", "more_body": False}
            )

    def _stream_error(self, chunk: bytes) -> bytes:
        """An error event of the serving layer: the request has ended without its record."""
        if self._tap is not None and self._tap.failure is not None:
            self._fail(failure_outcome(self._tap.failure))
            return api_error_for(self._tap.failure).sse().encode()
        try:
            code = int(json.loads(chunk[len(DATA) :])["error"].get("code") or 500)
        except (ValueError, KeyError, TypeError, AttributeError):
            code = 500
        self._fail("invalid" if 400 <= code < 500 else "error")
        return chunk

    def _finish(self, answer: dict[str, Any] | None) -> RequestRecord | None:
        """End the request with its record; the access log names it by the answer's `id`."""
        if self._tracker is None or self._tap is None or self._tracker.ended:
            return None
        record = self._tap.record()
        if record is None:
            self._tracker.fail("error")
            return None
        answer_id = answer.get("id") if answer is not None else None
        return self._tracker.finish(record, answer_id if isinstance(answer_id, str) else None)

    def _fail(self, outcome: str) -> None:
        if self._tracker is not None:
            self._tracker.fail(outcome)

    def _json_with_record(self, body: bytes) -> bytes:
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self._finish(None)
            return body
        record = self._finish(data)
        if record is None:
            return body
        self._add_record(data, record)
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    def _with_record(self, held: list[bytes]) -> bytes:
        """The held end of a stream, its last JSON event carrying the record."""
        text = b"".join(held)
        events = text.split(b"\n\n")
        for i in range(len(events) - 1, -1, -1):
            lines = events[i].split(b"\n")
            for j in range(len(lines) - 1, -1, -1):
                if lines[j].startswith(DATA + b"{"):
                    data = json.loads(lines[j][len(DATA) :])
                    record = self._finish(data)
                    if record is None:
                        return text
                    self._add_record(data, record)
                    lines[j] = DATA + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
                    events[i] = b"\n".join(lines)
                    return b"\n\n".join(events)
        self._finish(None)
        return text

    def _add_record(self, data: dict[str, Any], record: RequestRecord) -> None:
        data["specgate"] = record.to_dict()
        usage = data.get("usage")
        if self._usage_details and isinstance(usage, dict):
            usage["completion_tokens_details"] = {
                **(usage.get("completion_tokens_details") or {}),
                **prediction_tokens(record),
            }


def prediction_tokens(record: RequestRecord) -> dict[str, int | None]:
    """OpenAI's names for a request's accepted and rejected drafts (as SGLang reports
    them); null where the engine does not speculate."""
    spec = record.spec
    if spec is None:
        return {"accepted_prediction_tokens": None, "rejected_prediction_tokens": None}
    accepted = spec.num_accepted_draft_tokens
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": spec.num_draft_tokens - accepted}


def _input_error(body: bytes) -> tuple[int, bytes]:
    """The serving layer failed on a request before it reached the engine: what
    failed was reading the client's input (vLLM left some of it unchecked), so the
    client gets a 400 with vLLM's message, not a 500."""
    try:
        error = json.loads(body)["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        message = "The request could not be read."
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return 400, json.dumps({"error": error}).encode()
