"""Every Prometheus series of the gateway, fed by one record per finished request
(app/record.py); docs/metrics.md lists the series."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.record import RequestRecord, Timing

LABELS = ("model", "method")
# vLLM's own names, so `vllm bench serve` and vLLM's dashboards work unchanged.
VLLM_LABELS = ("model_name", "engine")
MAL_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0)
RATIO_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
RATE_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0)
TOKEN_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Children:
    """A series' child per label values, looked up once: prometheus_client's `labels()`
    converts every value to a string and takes a lock on each call, and a finished
    request touches some thirty series (it was most of the gateway's own per-request
    CPU under load)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*labels)
        return child


@dataclass(frozen=True)
class AdmissionSeries:
    """The two series one engine's admission moves (app/api/admission.py)."""

    queued: Gauge
    overloaded: Counter


class GatewayMetrics:
    """Every series specgate exports, in its own registry, fed by `RequestRecord`s.

    With several API processes (app/frontends.py) prometheus_client runs in its
    multiprocess mode, as vLLM's own API servers do: every process writes its
    counters, histograms and gauges to files in PROMETHEUS_MULTIPROC_DIR, and /metrics,
    whichever process answers it, sums them all (each gauge says how: `livesum`,
    the processes alive). The engine collector's gauges are that process's view."""

    def __init__(self) -> None:
        self.child = Children()
        self.registry = CollectorRegistry(auto_describe=True)
        self._collectors: list[Collector] = []
        self._merged: CollectorRegistry | None = None  # built at the first scrape, several API processes only
        reg, lab = self.registry, LABELS
        self.requests = Counter("specgate_requests", "Finished requests by outcome.", (*lab, "outcome"), registry=reg)
        self.prompt_tokens = Counter("specgate_prompt_tokens", "Prompt tokens.", lab, registry=reg)
        self.output_tokens = Counter("specgate_output_tokens", "Generated tokens.", lab, registry=reg)
        self.spec_steps = Counter("specgate_spec_steps", "Verification steps with drafts.", lab, registry=reg)
        self.draft_tokens = Counter("specgate_spec_draft_tokens", "Draft tokens proposed.", lab, registry=reg)
        self.accepted_tokens = Counter("specgate_spec_accepted_tokens", "Draft tokens accepted.", lab, registry=reg)
        self.accepted_by_position = Counter(
            "specgate_spec_accepted_tokens_by_position",
            "Accepted drafts at a draft position (1..N).",
            (*lab, "position"),
            registry=reg,
        )
        self.mal = Histogram(
            "specgate_request_acceptance_length",
            "Per-request mean acceptance length.",
            lab,
            buckets=MAL_BUCKETS,
            registry=reg,
        )
        self.acceptance = Histogram(
            "specgate_request_draft_acceptance_ratio",
            "Per-request accepted/drafted.",
            lab,
            buckets=RATIO_BUCKETS,
            registry=reg,
        )
        self.decode_rate = Histogram(
            "specgate_request_decode_tokens_per_second",
            "Per-request decode tokens/s.",
            lab,
            buckets=RATE_BUCKETS,
            registry=reg,
        )
        self.tpot = Histogram(
            "specgate_request_time_per_output_token_seconds",
            "Per-request decode s/token.",
            lab,
            buckets=TPOT_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            "specgate_request_ttft_seconds", "Time to first token.", lab, buckets=LATENCY_BUCKETS, registry=reg
        )
        self.e2e = Histogram(
            "specgate_request_e2e_seconds", "Arrival to final output.", lab, buckets=LATENCY_BUCKETS, registry=reg
        )
        self.output_length = Histogram(
            "specgate_request_output_tokens", "Generated tokens per request.", lab, buckets=TOKEN_BUCKETS, registry=reg
        )
        self.in_flight = Gauge(
            "specgate_requests_in_flight",
            "Requests admitted and not finished.",
            lab,
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "specgate_requests_queued",
            "Requests waiting at the gateway for a place.",
            lab,
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.rejected = Counter(
            "specgate_requests_rejected", "Requests refused before reaching an engine.", (*lab, "reason"), registry=reg
        )
        self.decisions = Counter(
            "specgate_route_decisions",
            "Routing decisions by policy, method and reason.",
            ("model", "policy", "method", "reason"),
            registry=reg,
        )
        self.shadow = ShadowMetrics(reg)
        self._vllm = VllmCompatibleMetrics(reg)

    def admission(self, model: str, method: str) -> AdmissionSeries:
        return AdmissionSeries(self.queued.labels(model, method), self.rejected.labels(model, method, "overloaded"))

    def add_engine(self, model: str, method: str, num_speculative_tokens: int | None) -> None:
        """Create an engine's series at zero, so rates and `vllm bench serve`'s
        before/after deltas work from the first request. Spec series only for
        speculating engines (`num_speculative_tokens` not None)."""
        lab = (model, method)
        for counter in (self.prompt_tokens, self.output_tokens):
            counter.labels(*lab)
        self.child(self.in_flight, *lab)
        self.child(self.queued, *lab)
        self.child(self.rejected, *lab, "overloaded")
        if num_speculative_tokens is not None:
            for counter in (self.spec_steps, self.draft_tokens, self.accepted_tokens):
                counter.labels(*lab)
            for position in range(1, num_speculative_tokens + 1):
                self.child(self.accepted_by_position, *lab, str(position))
        self._vllm.add_engine(f"{model}:{method}", num_speculative_tokens)

    def observe(self, record: RequestRecord) -> None:
        """Count one finished request, from exactly the record its client got."""
        lab = (record.model, record.method)
        self.child(self.requests, *lab, record.outcome).inc()
        self.child(self.prompt_tokens, *lab).inc(record.prompt_tokens)
        self.child(self.output_tokens, *lab).inc(record.completion_tokens)
        self.child(self.output_length, *lab).observe(record.completion_tokens)
        self._observe_timing(lab, record.timing)
        if record.spec is not None:
            self._observe_spec(lab, record)
        self._vllm.observe(record)

    def observe_failure(self, model: str, method: str, outcome: str) -> None:
        self.child(self.requests, model, method, outcome).inc()

    def _observe_timing(self, lab: tuple[str, str], timing: Timing) -> None:
        if timing.ttft_s is not None:
            self.child(self.ttft, *lab).observe(timing.ttft_s)
        if timing.e2e_s is not None:
            self.child(self.e2e, *lab).observe(timing.e2e_s)
        if timing.decode_tokens_per_s and timing.time_per_output_token_s:
            self.child(self.decode_rate, *lab).observe(timing.decode_tokens_per_s)
            self.child(self.tpot, *lab).observe(timing.time_per_output_token_s)

    def _observe_spec(self, lab: tuple[str, str], record: RequestRecord) -> None:
        spec = record.spec
        assert spec is not None
        self.child(self.spec_steps, *lab).inc(spec.num_spec_steps)
        self.child(self.draft_tokens, *lab).inc(spec.num_draft_tokens)
        self.child(self.accepted_tokens, *lab).inc(spec.num_accepted_draft_tokens)
        for position, count in enumerate(spec.accepted_by_position(), start=1):
            self.child(self.accepted_by_position, *lab, str(position)).inc(count)
        if record.mean_acceptance_length is not None:
            self.child(self.mal, *lab).observe(record.mean_acceptance_length)
        if record.draft_acceptance_rate is not None:
            self.child(self.acceptance, *lab).observe(record.draft_acceptance_rate)

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)
        self._collectors.append(collector)

    def exposed(self) -> CollectorRegistry:
        """What /metrics shows: this registry, or with several API processes every
        process's series summed, plus this process's own collectors."""
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return self.registry
        if self._merged is None:  # the files are read at each collect: one registry serves every scrape
            self._merged = CollectorRegistry()
            MultiProcessCollector(self._merged, directory)  # type: ignore[no-untyped-call]
            for collector in self._collectors:
                self._merged.register(collector)
        return self._merged

    def exposition(self) -> bytes:
        return generate_latest(self.exposed())


class ShadowMetrics:
    """Mirrored requests (docs/auto.md): apart from the primary series, so that no
    client-facing figure counts them."""

    def __init__(self, reg: CollectorRegistry) -> None:
        self.child = Children()
        lab = LABELS
        self.requests = Counter(
            "specgate_shadow_requests", "Finished shadow requests by outcome.", (*lab, "outcome"), registry=reg
        )
        self.dropped = Counter(
            "specgate_shadow_dropped", "Mirrors not sent, by reason.", (*lab, "reason"), registry=reg
        )
        self.output_tokens = Counter("specgate_shadow_output_tokens", "Tokens generated by shadows.", lab, registry=reg)
        self.draft_tokens = Counter("specgate_shadow_spec_draft_tokens", "Draft tokens of shadows.", lab, registry=reg)
        self.accepted_tokens = Counter(
            "specgate_shadow_spec_accepted_tokens", "Accepted drafts of shadows.", lab, registry=reg
        )
        self.spec_steps = Counter("specgate_shadow_spec_steps", "Verification steps of shadows.", lab, registry=reg)
        self.decode_rate = Histogram(
            "specgate_shadow_request_decode_tokens_per_second",
            "Per-shadow-request decode tokens/s.",
            lab,
            buckets=RATE_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "specgate_shadow_request_e2e_seconds",
            "Shadow request arrival to final output.",
            lab,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )

    def observe(self, record: RequestRecord) -> None:
        lab = (record.model, record.method)
        self.child(self.requests, *lab, record.outcome).inc()
        self.child(self.output_tokens, *lab).inc(record.completion_tokens)
        if record.timing.decode_tokens_per_s:
            self.child(self.decode_rate, *lab).observe(record.timing.decode_tokens_per_s)
        if record.timing.e2e_s is not None:
            self.child(self.e2e, *lab).observe(record.timing.e2e_s)
        if record.spec is not None:
            self.child(self.spec_steps, *lab).inc(record.spec.num_spec_steps)
            self.child(self.draft_tokens, *lab).inc(record.spec.num_draft_tokens)
            self.child(self.accepted_tokens, *lab).inc(record.spec.num_accepted_draft_tokens)


class VllmCompatibleMetrics:
    """The `vllm:*` series vLLM's own tools read, one `model_name` per engine
    ("model:method"), correct for every engine at once."""

    def __init__(self, reg: CollectorRegistry) -> None:
        self.child = Children()
        lab = VLLM_LABELS
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Spec decode drafts.", lab, registry=reg)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens.", lab, registry=reg)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted tokens.", lab, registry=reg)
        self.accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position (0-based).",
            (*lab, "position"),
            registry=reg,
        )
        self.success = Counter("vllm:request_success", "Finished requests.", (*lab, "finished_reason"), registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", lab, registry=reg)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens.", lab, registry=reg)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", lab, buckets=LATENCY_BUCKETS, registry=reg
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Mean inter-token latency per request.",
            lab,
            buckets=TPOT_BUCKETS,
            registry=reg,
        )

    def add_engine(self, engine: str, num_speculative_tokens: int | None) -> None:
        lab = (engine, "0")
        for counter in (self.generation_tokens, self.prompt_tokens):
            counter.labels(*lab)
        if num_speculative_tokens is not None:
            for counter in (self.drafts, self.draft_tokens, self.accepted):
                counter.labels(*lab)
            for position in range(num_speculative_tokens):
                self.child(self.accepted_per_pos, *lab, str(position))

    def observe(self, record: RequestRecord) -> None:
        lab = (record.engine, "0")
        self.child(self.success, *lab, record.outcome).inc()
        self.child(self.generation_tokens, *lab).inc(record.completion_tokens)
        self.child(self.prompt_tokens, *lab).inc(record.prompt_tokens)
        if record.timing.ttft_s is not None:
            self.child(self.ttft, *lab).observe(record.timing.ttft_s)
        if record.timing.time_per_output_token_s is not None:
            self.child(self.itl, *lab).observe(record.timing.time_per_output_token_s)
        spec = record.spec
        if spec is None:
            return
        self.child(self.drafts, *lab).inc(spec.num_spec_steps)
        self.child(self.draft_tokens, *lab).inc(spec.num_draft_tokens)
        self.child(self.accepted, *lab).inc(spec.num_accepted_draft_tokens)
        for position, count in enumerate(spec.accepted_by_position()):
            self.child(self.accepted_per_pos, *lab, str(position)).inc(count)
