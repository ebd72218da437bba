"""Translation from vLLM's output objects to the per-request record, kept in one
place for the figures' provenance: speculative counts from
`CompletionOutput.spec_decode_metrics`, timing from `RequestOutput.metrics` (engine timestamps), never from chunks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from vllm.outputs import RequestOutput
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics, RequestStateStats

from app.engines.base import EngineInfo
from app.record import RequestRecord, SpecCounts, Timing


def spec_counts(metrics: RequestSpecDecodeMetrics) -> SpecCounts:
    return SpecCounts(tuple(metrics.histogram), metrics.num_draft_tokens)


def build_record(
    info: EngineInfo,
    final: RequestOutput,
    spec_parts: Sequence[SpecCounts],
    prompt_tokens: int,
    completion_tokens: int,
    finish_reasons: Sequence[str],
) -> RequestRecord:
    speculating = info.speculative_config is not None
    return RequestRecord(
        model=info.id.model,
        method=info.id.method,
        engine=str(info.id),
        speculative_method=info.speculative_method,
        num_speculative_tokens=info.num_speculative_tokens,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reasons=tuple(finish_reasons),
        spec=SpecCounts.combine(spec_parts) if speculating and spec_parts else None,
        timing=timing(final.metrics),
        synthetic=info.synthetic,
    )


def timing(stats: RequestStateStats | None) -> Timing:
    if stats is None:
        return Timing()
    generated = stats.num_generation_tokens
    decode_s = stats.last_token_ts - stats.first_token_ts
    return Timing(
        ttft_s=stats.first_token_latency if generated > 0 else None,
        queue_s=(stats.scheduled_ts - stats.queued_ts if stats.scheduled_ts > 0 and stats.queued_ts > 0 else None),
        # The first token belongs to prefill: decode rate counts the rest.
        decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else None,
        # arrival_time is the frontend's wall clock, so compare with wall clock.
        e2e_s=time.time() - stats.arrival_time if stats.arrival_time > 0 else None,
    )
