"""The per-request record: what one finished request cost and what speculation
bought it. The same record goes into the response (the `specgate` field), into the
metrics (app/metrics.py), to the routing policies and to the access log, so none of
them can disagree.

Speculative figures come only from vLLM's per-request metrics; a figure that was
not measured is None (null in JSON), never a made-up zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class SpecCounts:
    """One sequence's speculative counts, as vLLM's RequestSpecDecodeMetrics has them."""

    acceptance_histogram: tuple[int, ...]
    num_draft_tokens: int

    # Cached: the record, the metrics and the policies each read them (frozen: never stale).
    @cached_property
    def num_spec_steps(self) -> int:
        return sum(self.acceptance_histogram)

    @cached_property
    def num_accepted_draft_tokens(self) -> int:
        return sum(j * count for j, count in enumerate(self.acceptance_histogram))

    def accepted_by_position(self) -> list[int]:
        """Accepted drafts per draft position 1..N: acceptance is a prefix, so a
        step that accepted j drafts accepted positions 1..j. Exact."""
        width = len(self.acceptance_histogram) - 1
        return [sum(self.acceptance_histogram[p:]) for p in range(1, width + 1)]

    @staticmethod
    def combine(parts: Sequence[SpecCounts]) -> SpecCounts:
        """Sum over the sequences of an n>1 request (exact: counts add up)."""
        width = max(len(p.acceptance_histogram) for p in parts)
        histogram = [0] * width
        for part in parts:
            for j, count in enumerate(part.acceptance_histogram):
                histogram[j] += count
        return SpecCounts(tuple(histogram), sum(p.num_draft_tokens for p in parts))


@dataclass(frozen=True)
class Timing:
    """Engine-side timing of one request (seconds); None where not measured."""

    ttft_s: float | None = None
    queue_s: float | None = None
    decode_tokens_per_s: float | None = None
    e2e_s: float | None = None

    @property
    def time_per_output_token_s(self) -> float | None:
        return 1.0 / self.decode_tokens_per_s if self.decode_tokens_per_s else None

    def to_dict(self) -> dict[str, float | None]:
        # Not dataclasses.asdict: it deep-copies every value, once per answer.
        return {
            "ttft_s": self.ttft_s,
            "queue_s": self.queue_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "e2e_s": self.e2e_s,
        }


@dataclass(frozen=True)
class RouteDecision:
    """Why a request went to its engine: the policy, its reason, and what `auto`
    knew when it chose (docs/auto.md)."""

    policy: str  # "explicit", "header", "default", "auto", "ab" or "shadow"
    reason: str  # e.g. "requested", "best_estimate", "running", "exploration", "prior", "cold_start", "weight"
    bucket: str | None = None  # the request's feature bucket, when its model learns
    load: int | None = None  # requests at the chosen engine (the device, when shared) when it was chosen
    expected_load: float | None = None  # the load `auto` expected it to meet over its life
    load_met: float | None = None  # the mean load it met over its life, measured when it ended
    objective: str | None = None
    estimate: float | None = None  # expected objective value of the chosen method
    estimates: tuple[tuple[str, float | None], ...] = ()  # every candidate's

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "reason": self.reason,
            "bucket": self.bucket,
            "load": self.load,
            "expected_load": self.expected_load,
            "load_met": self.load_met,
            "objective": self.objective,
            "estimate": self.estimate,
            "estimates": dict(self.estimates) if self.estimates else None,
        }


@dataclass(frozen=True)
class RequestRecord:
    model: str
    method: str
    engine: str
    speculative_method: str
    num_speculative_tokens: int | None
    prompt_tokens: int
    completion_tokens: int
    finish_reasons: tuple[str, ...]
    spec: SpecCounts | None
    timing: Timing = field(default_factory=Timing)
    route: RouteDecision | None = None
    synthetic: bool = False  # the engine accepts drafts at set rates: its output is not the target's

    @property
    def outcome(self) -> str:
        """One finish reason for the whole request: for n > 1, the least complete
        of its choices (abort over length over stop)."""
        for reason in ("abort", "length"):
            if reason in self.finish_reasons:
                return reason
        return self.finish_reasons[0] if self.finish_reasons else "stop"

    @property
    def mean_acceptance_length(self) -> float | None:
        # MAL counts the bonus token (the study's and vLLM's definition); over
        # zero speculative steps it is undefined, not 1.
        if self.spec is None or self.spec.num_spec_steps == 0:
            return None
        return 1.0 + self.spec.num_accepted_draft_tokens / self.spec.num_spec_steps

    @property
    def draft_acceptance_rate(self) -> float | None:
        if self.spec is None or self.spec.num_draft_tokens == 0:
            return None
        return self.spec.num_accepted_draft_tokens / self.spec.num_draft_tokens

    def to_dict(self) -> dict[str, Any]:
        """The documented `specgate` extension field of a response (docs/api.md)."""
        spec = self.spec
        return {
            "model": self.model,
            "method": self.method,
            "engine": self.engine,
            "speculative_method": self.speculative_method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "synthetic": self.synthetic,
            "mean_acceptance_length": self.mean_acceptance_length,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "acceptance_histogram": list(spec.acceptance_histogram) if spec else None,
            "num_draft_tokens": spec.num_draft_tokens if spec else None,
            "num_accepted_draft_tokens": spec.num_accepted_draft_tokens if spec else None,
            "num_spec_steps": spec.num_spec_steps if spec else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            **self.timing.to_dict(),
            "route": self.route.to_dict() if self.route else None,
        }

    def objective_value(self, objective: str) -> float | None:
        """What `auto` maximises: output tokens/s of the whole request (throughput), or
        decode tokens/s, the inverse of the inter-token latency (latency). None when
        the record cannot tell (too short, not timed)."""
        if self.completion_tokens < 2:
            return None
        if objective == "latency":
            return self.timing.decode_tokens_per_s
        e2e = self.timing.e2e_s
        return self.completion_tokens / e2e if e2e else None
