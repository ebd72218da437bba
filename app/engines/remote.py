"""A remote engine: one method served by an OpenAI-compatible vLLM server elsewhere
(`url:` in the config), typically `vllm serve … --per-request-spec-decode-metrics
summary` on another host.

This module is the transport: one pooled httpx client per engine; `UpstreamCall`
for one request (timeouts, server-sent events as raw bytes, and closing it cancels
the request upstream, because vLLM aborts a request whose connection closes); a
background probe of `/health` and `/metrics` for `/ready` and the load gauges; and
the per-request record, built from what vLLM reports on its last chunk (usage and
`metrics`). How one request is relayed is app/engines/remote_app.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.config import ModelConfig, UpstreamSettings
from app.engines.base import (
    ASGIReceive,
    ASGIScope,
    ASGISend,
    EngineConfigError,
    EngineId,
    EngineInfo,
    EngineStats,
    EngineTimeoutError,
    EngineUnavailableError,
)
from app.engines.clock import RequestClock
from app.engines.remote_app import answer
from app.record import RequestRecord, SpecCounts, Timing

logger = logging.getLogger(__name__)
T = TypeVar("T")

PROBE_TIMEOUT_S = 2.0
EVENT_END = b"\n\n"


@dataclass(frozen=True)
class UpstreamLoad:
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None


class RemoteVLLMEngine:
    def __init__(self, engine_id: EngineId, model: ModelConfig) -> None:
        method = model.methods[engine_id.method]
        assert method.url is not None
        self.id = engine_id
        self.url = method.url
        self.settings: UpstreamSettings = method.upstream
        self.info = EngineInfo.configured(engine_id, model)  # max_model_len: from the upstream's /v1/models
        # Known once the upstream has listed it: requests need it, `/ready` waits for it.
        self.served_model_name: str | None = None
        self._client: httpx.AsyncClient | None = None
        self._up = False
        self._load = UpstreamLoad()
        self._calls: dict[str, UpstreamCall] = {}
        self._prober: asyncio.Task[None] | None = None
        self._complaint = ""  # the last discovery problem, logged once

    def prepare(self) -> None:
        env = self.settings.api_key_env
        if env and not os.environ.get(env):
            raise EngineConfigError(f"engine {self.id}: upstream.api_key_env names {env}, which is not set")

    async def start(self) -> None:
        self.prepare()
        s = self.settings
        env = s.api_key_env
        headers = {"Authorization": f"Bearer {os.environ[env]}"} if env else {}
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            # Reads are bounded by each request's clock (idle and total limits), not per socket read.
            timeout=httpx.Timeout(s.connect_timeout_s, read=None),
            limits=httpx.Limits(max_connections=s.max_connections, max_keepalive_connections=s.max_connections),
        )
        await self.probe()
        if not self._up:
            logger.warning(
                "remote engine %s: %s is not ready yet; probing every %gs", self.id, self.url, s.probe_interval_s
            )
        self._prober = asyncio.create_task(self._probe_forever())

    async def stop(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None
        for call in list(self._calls.values()):
            await call.close()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._up = False

    # ---- health and load ----

    async def health(self) -> bool:
        self._up = await self._answers("/health")
        if self._up and self.served_model_name is None:
            await self._discover()
        return self._up and self.served_model_name is not None

    def stats(self) -> EngineStats:
        load = self._load
        return EngineStats(
            up=self._up and self.served_model_name is not None,
            unfinished_requests=len(self._calls),
            running_requests=_int_or_none(load.running),
            waiting_requests=_int_or_none(load.waiting),
            kv_cache_usage=load.kv_cache_usage,
        )

    async def probe(self) -> None:
        self._load = await self._read_load() if await self.health() else UpstreamLoad()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.probe_interval_s)
            try:
                await self.probe()
            except Exception:  # a probe must never end the loop
                logger.exception("remote engine %s: probe failed", self.id)

    async def _answers(self, path: str) -> bool:
        try:
            response = await self.client.get(path, timeout=PROBE_TIMEOUT_S)
        except (httpx.HTTPError, EngineUnavailableError):
            return False
        return response.status_code == 200

    async def _discover(self) -> None:
        """The upstream's model name (the configured one, or the only one it lists)
        and its context length."""
        try:
            listing = (await self.client.get("/v1/models", timeout=PROBE_TIMEOUT_S)).json()
            models = {str(m["id"]): m for m in listing["data"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return
        wanted = self.settings.served_model_name
        if wanted is None and len(models) == 1:
            wanted = next(iter(models))
        if wanted is None or wanted not in models:
            self._complain(f"{self.url} serves {sorted(models)}; set upstream.served_model_name to one of them")
            return
        self.served_model_name = wanted
        self.info = replace(self.info, max_model_len=int(models[wanted].get("max_model_len") or 0))
        logger.info("remote engine %s: %s serves %s", self.id, self.url, wanted)

    def _complain(self, message: str) -> None:
        if message != self._complaint:
            self._complaint = message
            logger.error("remote engine %s: %s", self.id, message)

    async def _read_load(self) -> UpstreamLoad:
        try:
            response = await self.client.get("/metrics", timeout=PROBE_TIMEOUT_S)
            return parse_load(response.text, self.served_model_name) if response.status_code == 200 else UpstreamLoad()
        except (httpx.HTTPError, ValueError):
            return UpstreamLoad()

    # ---- requests ----

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise EngineUnavailableError(f"engine {self.id} is not running")
        return self._client

    async def handle(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        await answer(self, scope, receive, send)

    async def open(self, path: str, payload: dict[str, Any], request_id: str, clock: RequestClock) -> UpstreamCall:
        """POST `payload` (its `model` replaced by the upstream's name) and return
        once the upstream's status and headers are in."""
        name = self.served_model_name
        if name is None:
            raise EngineUnavailableError(f"engine {self.id}: the upstream {self.url} has not been reached yet")
        call = UpstreamCall(self, request_id, clock)
        request = self.client.build_request("POST", path, json={**payload, "model": name})
        call.response = await call.bounded(self.client.send(request, stream=True))
        self._calls[request_id] = call
        return call

    def mark_down(self) -> None:
        """The upstream refused a connection: `/ready` says so before the next probe."""
        self._up = False

    def forget(self, request_id: str) -> None:
        self._calls.pop(request_id, None)

    def record(self, call: UpstreamCall, final: Mapping[str, Any], finish_reasons: Sequence[str]) -> RequestRecord:
        """The request's record from the usage and `metrics` vLLM put on its last
        chunk (or its whole answer). Without `--per-request-spec-decode-metrics`
        upstream, the speculative figures are None: not measured."""
        usage = final.get("usage") or (final.get("response") or {}).get("usage") or {}
        metrics = final.get("metrics") or {}
        spec = _spec_counts(metrics.get("speculative_decoding"))
        n = self.info.num_speculative_tokens
        if n is None and spec is not None:
            n = len(spec.acceptance_histogram) - 1
        # Chat and completions name them prompt/completion, Responses and Messages input/output.
        completion_tokens = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        return RequestRecord(
            model=self.id.model,
            method=self.id.method,
            engine=str(self.id),
            speculative_method=self.info.speculative_method,
            num_speculative_tokens=n,
            prompt_tokens=int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
            completion_tokens=completion_tokens,
            finish_reasons=tuple(finish_reasons),
            spec=spec,
            timing=call.timing(metrics, completion_tokens),
            synthetic=self.info.synthetic,
        )


class UpstreamCall:
    """One request to the upstream: its response, its clock and its deadlines.
    `close()` (idempotent) drops the connection, which aborts the request there."""

    def __init__(self, engine: RemoteVLLMEngine, request_id: str, clock: RequestClock) -> None:
        self.engine = engine
        self.request_id = request_id
        self.clock = clock
        self.response: httpx.Response | None = None
        self.sent = time.monotonic()
        self.first_event: float | None = None
        self.last_event: float | None = None

    @property
    def status_code(self) -> int:
        assert self.response is not None
        return self.response.status_code

    @contextlib.asynccontextmanager
    async def limit(self) -> AsyncIterator[None]:
        """One wait for the upstream, bounded by the request's clock; a timeout or a
        broken connection closes the call (which aborts the request upstream)."""
        try:
            async with self.clock.wait():
                yield
        except EngineTimeoutError:
            await self.close()
            raise
        except httpx.TransportError as exc:
            await self.close()
            if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                self.engine.mark_down()
            raise EngineUnavailableError(
                f"engine {self.engine.id}: the upstream connection failed: {type(exc).__name__}"
            ) from None

    @property
    def headers(self) -> httpx.Headers:
        assert self.response is not None
        return self.response.headers

    async def bounded(self, work: Awaitable[T]) -> T:
        """`work` within the request's time limits. It runs as its own task, so the
        timeout answers at once even when httpx shields its connection clean-up from
        cancellation; the abandoned task finishes in the background."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(_consume)
        try:
            async with self.limit():
                return await asyncio.shield(task)
        except BaseException:
            task.cancel()
            raise

    async def read(self) -> bytes:
        assert self.response is not None
        return await self.bounded(self.response.aread())

    async def json(self) -> dict[str, Any]:
        try:
            data = json.loads(await self.read())
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise EngineUnavailableError(f"engine {self.engine.id}: the upstream's answer is not a JSON object")
        return data

    async def events(self) -> AsyncIterator[bytes]:
        """Server-sent events exactly as the upstream wrote them (each ends with a
        blank line); nothing is decoded here."""
        assert self.response is not None
        stream = self.response.aiter_raw()
        buffer = b""
        while True:
            try:
                chunk = await self.bounded(anext(stream))
            except StopAsyncIteration:
                return
            buffer += chunk
            while (end := buffer.find(EVENT_END)) >= 0:
                event, buffer = buffer[: end + len(EVENT_END)], buffer[end + len(EVENT_END) :]
                self.last_event = time.monotonic()
                if self.first_event is None:
                    self.first_event = self.last_event
                yield event

    async def close(self) -> None:
        self.engine.forget(self.request_id)
        if self.response is not None and not self.response.is_closed:
            await self.response.aclose()

    def timing(self, metrics: Mapping[str, Any], completion_tokens: int) -> Timing:
        """vLLM's own per-request timing where the upstream sends it
        (`--enable-per-request-metrics`); else what the gateway saw of the stream.
        TTFT of a stream is the gateway's view, the one its client has."""
        itl_ms = metrics.get("mean_itl_ms")
        queue_ms = metrics.get("queue_time_ms")
        upstream_ttft_ms = metrics.get("time_to_first_token_ms")
        first, last = self.first_event, self.last_event
        if first is not None:
            ttft: float | None = first - self.sent
        elif upstream_ttft_ms is not None and queue_ms is not None:
            ttft = (queue_ms + upstream_ttft_ms) / 1000
        else:
            ttft = None
        if itl_ms:
            decode: float | None = 1000 / itl_ms
        elif first is not None and last is not None and last > first and completion_tokens > 1:
            decode = (completion_tokens - 1) / (last - first)
        else:
            decode = None
        return Timing(
            ttft_s=ttft,
            queue_s=queue_ms / 1000 if queue_ms is not None else None,
            decode_tokens_per_s=decode,
            e2e_s=time.monotonic() - self.sent,
        )


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome, so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()


def _spec_counts(raw: Any) -> SpecCounts | None:
    if not isinstance(raw, Mapping) or raw.get("acceptance_histogram") is None:
        return None
    return SpecCounts(tuple(int(c) for c in raw["acceptance_histogram"]), int(raw["num_draft_tokens"]))


def parse_load(exposition: str, model_name: str | None) -> UpstreamLoad:
    """Running and waiting requests and KV-cache use from a vLLM server's /metrics."""
    wanted = {
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:kv_cache_usage_perc": "kv_cache_usage",
    }
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            field = wanted.get(sample.name)
            if field and (model_name is None or sample.labels.get("model_name") == model_name):
                values.setdefault(field, []).append(sample.value)
    return UpstreamLoad(
        running=sum(values["running"]) if "running" in values else None,
        waiting=sum(values["waiting"]) if "waiting" in values else None,
        # Data-parallel engines report one each: the fullest one is the one that queues.
        kv_cache_usage=max(values["kv_cache_usage"]) if "kv_cache_usage" in values else None,
    )


def _int_or_none(value: float | None) -> int | None:
    return int(value) if value is not None else None
