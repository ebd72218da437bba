"""The engine interface every backend implements, and the types that cross it.

Every engine has the same life cycle, health and load, and answers the same way:
an HTTP request of vLLM's OpenAI API in, its answer out (`Engine.handle`, an ASGI
call). An in-process engine answers with vLLM's own serving layer over its
`AsyncLLM`; a remote engine (app/engines/remote.py) passes the request to a
`vllm serve` elsewhere and its answer back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.config import ModelConfig

ASGIScope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
ASGIReceive = Callable[[], Awaitable[ASGIMessage]]
ASGISend = Callable[[ASGIMessage], Awaitable[None]]


async def send_whole(send: ASGISend, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """A whole HTTP answer in one body message, with its content-length."""
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class EngineError(Exception):
    """Base of errors raised by engines; the API maps each to an HTTP status."""


class EngineInputError(EngineError):
    """The request is invalid for this engine (a 400): the message is safe to show."""


class EngineUnavailableError(EngineError):
    """The engine is down or failed mid-request (a 503)."""


class EngineTimeoutError(EngineError):
    """The request ran out of time (a 504); the engine request has been abandoned."""


class EngineConfigError(ValueError):
    """An engine's configuration cannot be used; the message names the engine."""


@dataclass(frozen=True)
class EngineId:
    model: str
    method: str

    def __str__(self) -> str:
        return f"{self.model}:{self.method}"


@dataclass(frozen=True)
class EngineInfo:
    id: EngineId
    target: str
    speculative_method: str
    num_speculative_tokens: int | None
    speculative_config: dict[str, Any] | None
    max_model_len: int
    url: str | None = None  # the upstream server of a remote engine
    synthetic: bool = False  # drafts accepted at set rates: not lossless (config.MethodConfig.synthetic)

    @staticmethod
    def configured(engine_id: EngineId, model: ModelConfig) -> EngineInfo:
        """What the config says; `max_model_len` (0 here) is learnt when the engine starts."""
        method = model.methods[engine_id.method]
        return EngineInfo(
            id=engine_id,
            target=model.target,
            speculative_method=method.speculative_method,
            num_speculative_tokens=method.num_speculative_tokens,
            speculative_config=method.speculative_config,
            max_model_len=0,
            url=method.url,
            synthetic=method.synthetic,
        )


@dataclass(frozen=True)
class EngineStats:
    up: bool
    unfinished_requests: int
    running_requests: int | None = None
    waiting_requests: int | None = None
    kv_cache_usage: float | None = None
    restarts: int = 0  # times the gateway restarted it after it died


class Engine(Protocol):
    """One engine serving one (model, method): what the pool, `/ready`,
    `/engines` and the metrics need of it."""

    id: EngineId
    info: EngineInfo

    def prepare(self) -> None:
        """Validate the configuration (cheap: no process, no network)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def health(self) -> bool: ...

    def stats(self) -> EngineStats: ...

    async def handle(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        """Answer one OpenAI-API HTTP request (an ASGI call): vLLM's own serving layer
        of an in-process engine, or the upstream server of a remote one. The request's
        tap (app/engines/tap.py) is current while it runs and gets its record."""
        ...
