"""The per-request record's arithmetic: exact sums, nulls where not measured."""

from __future__ import annotations

import dataclasses

import pytest

from app.record import RequestRecord, SpecCounts, Timing


def record(spec: SpecCounts | None, speculative_method: str = "ngram") -> RequestRecord:
    return RequestRecord(
        model="m",
        method="x",
        engine="m:x",
        speculative_method=speculative_method,
        num_speculative_tokens=4 if spec else None,
        prompt_tokens=3,
        completion_tokens=10,
        finish_reasons=("stop",),
        spec=spec,
        timing=Timing(ttft_s=0.1),
    )


def test_mal_and_rate_follow_vllm_definitions() -> None:
    r = record(SpecCounts((1, 0, 2, 0, 1), num_draft_tokens=16))
    data = r.to_dict()
    assert data["num_spec_steps"] == 4
    assert data["num_accepted_draft_tokens"] == 8
    assert data["mean_acceptance_length"] == pytest.approx(3.0)
    assert data["draft_acceptance_rate"] == pytest.approx(0.5)


def test_no_steps_means_not_measured() -> None:
    data = record(SpecCounts((0, 0, 0, 0, 0), num_draft_tokens=0)).to_dict()
    assert data["mean_acceptance_length"] is None and data["draft_acceptance_rate"] is None
    assert data["num_spec_steps"] == 0


def test_baseline_reports_nulls_not_zeros() -> None:
    data = record(None, speculative_method="none").to_dict()
    for key in (
        "mean_acceptance_length",
        "draft_acceptance_rate",
        "acceptance_histogram",
        "num_draft_tokens",
        "num_accepted_draft_tokens",
        "num_spec_steps",
        "num_speculative_tokens",
    ):
        assert data[key] is None
    assert data["speculative_method"] == "none"


def test_combining_sequences_adds_counts() -> None:
    total = SpecCounts.combine([SpecCounts((1, 2, 0), 6), SpecCounts((0, 0, 3), 6)])
    assert total.acceptance_histogram == (1, 2, 3)
    assert total.num_accepted_draft_tokens == 8 and total.num_draft_tokens == 12


def test_timing_in_the_record_has_every_field() -> None:
    timing = Timing(ttft_s=0.1, queue_s=0.01, decode_tokens_per_s=50.0, e2e_s=1.2)
    assert timing.to_dict() == dataclasses.asdict(timing)
