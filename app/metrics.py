"""The per-request record: what one finished request cost and what speculation
bought it. The same record is put into the response (the `specgate` field) and,
later, into Prometheus, so the two can never disagree.

Speculative figures come only from vLLM's per-request metrics; a figure that was
not measured is None (null in JSON), never a made-up zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SpecCounts:
    """One sequence's speculative counts, as vLLM's RequestSpecDecodeMetrics has them."""

    acceptance_histogram: tuple[int, ...]
    num_draft_tokens: int

    @property
    def num_spec_steps(self) -> int:
        return sum(self.acceptance_histogram)

    @property
    def num_accepted_draft_tokens(self) -> int:
        return sum(j * count for j, count in enumerate(self.acceptance_histogram))

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
            "mean_acceptance_length": self.mean_acceptance_length,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "acceptance_histogram": list(spec.acceptance_histogram) if spec else None,
            "num_draft_tokens": spec.num_draft_tokens if spec else None,
            "num_accepted_draft_tokens": spec.num_accepted_draft_tokens if spec else None,
            "num_spec_steps": spec.num_spec_steps if spec else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            **asdict(self.timing),
        }
