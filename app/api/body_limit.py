"""Request bodies over `max_bytes` get a 413 in OpenAI's error body before the
route reads them: at once when Content-Length says so, or as soon as a chunked
body passes the limit (buffering at most `max_bytes`)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import APIError, error_response


class PayloadTooLargeError(APIError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        body = await self._read_chunked(receive)
        if body is None:
            await self._refuse(scope, receive, send)
            return
        await self.app(scope, replay_body(body, receive), send)

    async def _read_chunked(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return None
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLargeError(f"The request body is larger than {self.max_bytes} bytes.")
        await error_response(error)(scope, receive, send)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` as the whole request body, then the client's own
    messages (its disconnect, when it comes)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the disconnect, when it comes

    return replay
