"""The policy-against-fixed-methods evaluation of a bench sweep (docs/auto.md), from
hand-built results with known answers (no gateway)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.bench.policy_eval import main, policy_cells, render, totals
from app.bench.records import RequestResult
from app.bench.report import write_jsonl
from app.bench.stats import summarize
from tests.test_bench_report import PNG_SIGNATURE, result


def sweep() -> list[RequestResult]:
    return [
        # code: none 50 tok/s, ngram 100, auto 96 (served by ngram): 0.96x the best.
        result("m:none", 0.0, 2.0, 100, workload="code"),
        result("m:ngram", 0.0, 1.0, 100, workload="code"),
        replace(result("m:auto", 0.0, 1.0, 96, workload="code"), served_by="ngram", route_reason="best_estimate"),
        # prose: none 50, ngram 40, auto 45 (one request each way): 0.90x the best.
        result("m:none", 0.0, 2.0, 100, workload="prose"),
        result("m:ngram", 0.0, 2.0, 80, workload="prose"),
        replace(result("m:auto", 0.0, 2.0, 50, workload="prose"), served_by="none"),
        replace(result("m:auto", 0.0, 1.0, 40, workload="prose"), served_by="ngram"),
        replace(result("m:auto", 0.5, 0.5, 0, workload="prose"), served_by=None, error="boom"),  # not counted
    ]


def test_cells_compare_the_policy_with_the_best_fixed_method() -> None:
    results = sweep()
    cells = policy_cells(results, summarize(results, baseline=None), "auto")
    assert [(c.workload, c.best, c.fixed, c.policy) for c in cells] == [
        ("code", "ngram", {"none": 50.0, "ngram": 100.0}, 96.0),
        ("prose", "none", {"none": 50.0, "ngram": 40.0}, 45.0),
    ]
    assert [c.ratio for c in cells] == pytest.approx([0.96, 0.9])
    assert [dict(c.served) for c in cells] == [{"ngram": 1}, {"none": 1, "ngram": 1}]


def test_totals_over_the_sweep() -> None:
    results = sweep()
    summaries = summarize(results, baseline=None)
    cells = policy_cells(results, summaries, "auto")
    total = totals(summaries, cells, "auto")
    assert total.tokens_per_s == pytest.approx({"none": 50.0, "ngram": 60.0, "auto": 186 / 3})
    assert total.geomean_ratio == pytest.approx(
        {"none": math.sqrt(96 / 50 * 45 / 50), "ngram": math.sqrt(0.96 * 45 / 40)}
    )
    text = render(cells, total, "auto")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()[2:4]]
    assert rows == [
        ["code", "c=2", "50.0", "100.0", "96.0", "ngram", "0.96x", "yes", "ngram 1"],
        ["prose", "c=2", "50.0", "40.0", "45.0", "none", "0.90x", "no", "none 1, ngram 1"],
    ]
    assert "auto reached 0.95x the best fixed method in 1 of 2 cells." in text


def test_main_writes_the_table_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(sweep(), tmp_path / "requests.jsonl")
    assert main([str(tmp_path)]) == 0
    assert "1 of 2 cells" in capsys.readouterr().out
    assert "1 of 2 cells" in (tmp_path / "auto_vs_fixed.md").read_text()
    assert (tmp_path / "auto_vs_fixed.png").read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--policy", "ab"])
