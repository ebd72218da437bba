"""Translation from vLLM's output objects to the engine-neutral types and the
per-request record. Kept apart from the engine so the figures' provenance is
in one place: speculative counts from `CompletionOutput.spec_decode_metrics`,
timing from `RequestOutput.metrics` (engine timestamps), never from chunks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics, RequestStateStats

from app.engines.base import ChoiceDelta, EngineInfo, TokenLogprob, TopLogprob
from app.metrics import RequestRecord, SpecCounts, Timing


def choice_delta(output: CompletionOutput, top_k: int | None) -> ChoiceDelta:
    return ChoiceDelta(
        index=output.index,
        text=output.text,
        num_tokens=len(output.token_ids),
        logprobs=_logprobs(output, top_k) if top_k is not None else None,
        finish_reason=output.finish_reason,
    )


def _logprobs(output: CompletionOutput, top_k: int) -> tuple[TokenLogprob, ...]:
    if output.logprobs is None:
        return ()
    result = []
    for token_id, position in zip(output.token_ids, output.logprobs, strict=False):
        result.append(_token_logprob(token_id, position or {}, top_k))
    return tuple(result)


def _token_logprob(token_id: int, position: Mapping[int, Logprob], top_k: int) -> TokenLogprob:
    # vLLM returns the sampled token plus the top-k; the sampled one may rank lower.
    chosen = position.get(token_id)
    ranked = sorted(position.values(), key=lambda lp: lp.rank if lp.rank is not None else 0)
    top = tuple(
        TopLogprob(token=lp.decoded_token or "", logprob=_finite(lp.logprob))
        for lp in ranked[:top_k]
    )
    return TokenLogprob(
        token=(chosen.decoded_token or "") if chosen else "",
        logprob=_finite(chosen.logprob) if chosen else -9999.0,
        top=top,
    )


def _finite(value: float) -> float:
    # JSON has no -inf; OpenAI uses -9999.0 for "impossible".
    return max(value, -9999.0)


def spec_counts(metrics: RequestSpecDecodeMetrics) -> SpecCounts:
    return SpecCounts(tuple(metrics.histogram), metrics.num_draft_tokens)


def build_record(
    info: EngineInfo,
    final: RequestOutput,
    spec_parts: Sequence[SpecCounts],
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
        prompt_tokens=len(final.prompt_token_ids or ()),
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
        queue_s=(
            stats.scheduled_ts - stats.queued_ts
            if stats.scheduled_ts > 0 and stats.queued_ts > 0
            else None
        ),
        # The first token belongs to prefill: decode rate counts the rest.
        decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else None,
        # arrival_time is the frontend's wall clock, so compare with wall clock.
        e2e_s=time.time() - stats.arrival_time if stats.arrival_time > 0 else None,
    )
