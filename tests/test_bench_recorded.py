"""The statistics on a recorded request log (a real `specgate bench` run against
the embedded default, tests/data/bench-requests.jsonl), checked against the same
figures worked out independently from the raw JSON lines."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from app.bench.report import read_jsonl, render_markdown
from app.bench.stats import percentile, summarize

LOG = Path(__file__).parent / "data" / "bench-requests.jsonl"


def raw_cells() -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for line in LOG.read_text().splitlines():
        row = json.loads(line)
        cells[(row["workload"], row["load"], row["method"])].append(row)
    return cells


def test_recorded_log_summary_matches_an_independent_computation() -> None:
    raw = raw_cells()
    cells = {(c.workload, str(c.load), c.method): c for c in summarize(read_jsonl(LOG), "smollm2:none")}
    assert cells.keys() == raw.keys()
    for key, rows in raw.items():
        cell = cells[key]
        span = max(r["start_s"] + r["e2e_s"] for r in rows) - min(r["start_s"] for r in rows)
        rate = sum(r["output_tokens"] for r in rows) / span
        assert cell.output_tokens_per_s == pytest.approx(rate)
        base = raw[(key[0], key[1], "none")]
        base_span = max(r["start_s"] + r["e2e_s"] for r in base) - min(r["start_s"] for r in base)
        assert cell.speedup == pytest.approx(rate / (sum(r["output_tokens"] for r in base) / base_span))
        assert cell.e2e.p50 == pytest.approx(statistics.median(r["e2e_s"] for r in rows))
        if key[2] == "none":
            assert cell.acceptance is None
            continue
        hist = [sum(col) for col in zip(*(r["spec"]["acceptance_histogram"] for r in rows), strict=True)]
        steps, accepted = sum(hist), sum(j * c for j, c in enumerate(hist))
        drafts = sum(r["spec"]["num_draft_tokens"] for r in rows)
        assert cell.mean_acceptance_length == pytest.approx(1 + accepted / steps)
        assert cell.acceptance_rate == pytest.approx(accepted / drafts)
        # Unconditional per-position rates: steps that accepted at least i drafts, over all steps.
        assert cell.per_position == pytest.approx([sum(hist[i:]) / steps for i in range(1, len(hist))])


def test_recorded_log_itl_pools_every_gap() -> None:
    rows = raw_cells()[("edit", "c=1", "ngram")]
    gaps = [g for r in rows for g in r["itl_s"]]
    cells = summarize(read_jsonl(LOG), None)
    cell = next(c for c in cells if (c.workload, str(c.load), c.method) == ("edit", "c=1", "ngram"))
    assert cell.itl.p90 == pytest.approx(percentile(gaps, 90))
    assert cell.speedup is None  # no baseline named: not measured, not 1.0


def test_recorded_log_renders_the_study_table() -> None:
    cells = summarize(read_jsonl(LOG), "smollm2:none")
    text = render_markdown(cells)
    assert text.count("### ") == 2
    for cell in cells:
        keys = (f"| {cell.workload} ", f"| {cell.load} ", f"| {cell.method} ")
        row = next(line for line in text.splitlines() if all(k in line for k in keys))
        assert f"{cell.output_tokens_per_s:.1f}" in row and f"{cell.speedup:.2f}x" in row
        mal = cell.mean_acceptance_length
        assert (f"{mal:.2f}" if mal is not None else "n/m") in row
