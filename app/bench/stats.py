"""From request results to the study's figures, one `CellSummary` per
(workload, load, target).

Definitions (vLLM's and the study's):
- output tok/s = sum of `usage.completion_tokens` of the cell's successful
  requests / wall time from its first send to its last answer;
- speed-up = tok/s / the baseline target's tok/s in the same workload and load;
- MAL = 1 + accepted drafts / speculative steps (bonus token included);
- AR = accepted drafts / proposed drafts;
- p_i = steps that accepted draft position i / steps (unconditional: they sum to MAL - 1).
Speculative figures are sums over requests (token-weighted, like vLLM's counters),
and None when no request of the cell reported them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.bench.records import Load, RequestResult, SpecSample, model_root
from app.record import SpecCounts

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Latency:
    """p50/p90/p99 of one latency, seconds; None where nothing was measured."""

    p50: float | None
    p90: float | None
    p99: float | None

    @staticmethod
    def of(values: Sequence[float]) -> Latency:
        return Latency(*(percentile(values, q) for q in PERCENTILES))


@dataclass(frozen=True)
class Acceptance(SpecSample):
    """Summed speculative counts of a cell, and the study's figures on them."""

    @property
    def mean_acceptance_length(self) -> float | None:
        steps = self.num_spec_steps
        return 1 + self.num_accepted_draft_tokens / steps if steps else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_draft_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """p1..pN as fractions of all steps (unconditional)."""
        steps = self.num_spec_steps
        return tuple(accepted / steps for accepted in self.accepted_by_position()) if steps else ()

    @staticmethod
    def of(results: Iterable[RequestResult]) -> Acceptance | None:
        samples = [r.spec for r in results if r.spec is not None]
        if not samples:
            return None
        total = SpecCounts.combine(samples)
        n = max(s.num_speculative_tokens for s in samples)
        return Acceptance(total.acceptance_histogram, total.num_draft_tokens, n)


@dataclass(frozen=True)
class CellSummary:
    workload: str
    load: Load
    target: str
    method: str
    num_speculative_tokens: int | None
    requests: int
    errors: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float | None
    speedup: float | None  # None: no baseline cell to compare with
    acceptance: Acceptance | None  # None: the server reported no speculative figures
    ttft: Latency
    itl: Latency
    e2e: Latency

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.acceptance.mean_acceptance_length if self.acceptance else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.acceptance.acceptance_rate if self.acceptance else None

    @property
    def per_position(self) -> tuple[float, ...]:
        return self.acceptance.per_position if self.acceptance else ()


def _cell(results: Sequence[RequestResult], speedup_base: float | None) -> CellSummary:
    first = results[0]
    ok = [r for r in results if r.ok]
    counted = [r.output_tokens for r in ok if r.output_tokens is not None]
    tokens = sum(counted)
    duration = max((r.start_s + r.e2e_s for r in results), default=0.0) - min(r.start_s for r in results)
    # Failed requests stay in the wall time, as in vLLM's bench: a timeout costs the cell.
    rate = tokens / duration if counted and duration > 0 else None
    acceptance = Acceptance.of(ok)
    n = first.num_speculative_tokens
    return CellSummary(
        workload=first.workload,
        load=first.load,
        target=first.target,
        method=first.method,
        # A plain vLLM server's target does not say its N; its per-request metrics do.
        num_speculative_tokens=n if n is not None or acceptance is None else acceptance.num_speculative_tokens,
        requests=len(results),
        errors=len(results) - len(ok),
        output_tokens=tokens,
        duration_s=duration,
        output_tokens_per_s=rate,
        speedup=rate / speedup_base if rate is not None and speedup_base else None,
        acceptance=acceptance,
        ttft=Latency.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl=Latency.of([itl for r in ok for itl in r.itl_s]),
        e2e=Latency.of([r.e2e_s for r in ok]),
    )


def summarize(results: Sequence[RequestResult], baseline: str | Sequence[str] | None) -> list[CellSummary]:
    """One summary per (workload, load, target), in first-seen order; speed-up
    against a baseline target's cell of the same workload and load: the one of the
    same model (`model:none`), else the only one given."""
    baselines = (baseline,) if isinstance(baseline, str) else tuple(baseline or ())
    cells: dict[tuple[str, Load, str], list[RequestResult]] = {}
    for result in results:
        cells.setdefault((result.workload, result.load, result.target), []).append(result)
    base_rates = {
        (workload, load, target): _cell(group, None).output_tokens_per_s
        for (workload, load, target), group in cells.items()
        if target in baselines
    }

    def base_rate(workload: str, load: Load, target: str) -> float | None:
        same = [b for b in baselines if model_root(b) == model_root(target)]
        base = same[0] if same else (baselines[0] if len(baselines) == 1 else None)
        return base_rates.get((workload, load, base)) if base is not None else None

    return [_cell(group, base_rate(*key)) for key, group in cells.items()]
