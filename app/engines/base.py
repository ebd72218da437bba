"""The engine interface every backend implements, and the backend-neutral types
that cross it.

Every engine has the same life cycle, health and load (`Engine`). How it answers
differs: an in-process vLLM engine generates from a prompt (`GeneratingEngine`:
prompts in, `EngineOutput` deltas out, a `RequestRecord` on the last), while a
remote engine (app/engines/remote.py) forwards the client's OpenAI body to a vLLM
server and passes its answer through without re-encoding every token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.config import ModelConfig
from app.metrics import RequestRecord


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


@dataclass(frozen=True)
class ChatPrompt:
    messages: list[dict[str, Any]]
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TextPrompt:
    text: str | None = None
    token_ids: list[int] | None = None


Prompt = ChatPrompt | TextPrompt


@dataclass(frozen=True)
class Sampling:
    """OpenAI sampling fields plus the vLLM extensions a client may send."""

    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[TopLogprob, ...]


@dataclass(frozen=True)
class ChoiceDelta:
    index: int
    text: str
    num_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class EngineOutput:
    choices: tuple[ChoiceDelta, ...]
    prompt_tokens: int
    record: RequestRecord | None = None

    @property
    def finished(self) -> bool:
        return self.record is not None


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

    async def abort(self, request_id: str) -> None: ...


class GeneratingEngine(Engine, Protocol):
    """An engine the gateway drives token by token (in-process vLLM)."""

    def generate(
        self, prompt: Prompt, sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineOutput]:
        """Deltas as they come; the last one carries the record. Closing the
        iterator early aborts the request in the engine."""
        ...
