"""Bench figures and outputs from hand-built results with known answers: percentiles,
cell summaries (tok/s, speed-up, MAL, AR, p_i), tables, CSV, JSONL and plots (no gateway)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from app.bench.plots import acceptance_heatmap, method_family, speedup_vs_n, write_plots
from app.bench.records import Load, RequestResult, SpecSample
from app.bench.report import (
    LEGEND,
    latency_rows,
    markdown_table,
    print_tables,
    read_jsonl,
    render_markdown,
    study_rows,
    summary_csv_rows,
    write_csv,
    write_jsonl,
    write_outputs,
)
from app.bench.stats import CellSummary, percentile, summarize

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
C2 = Load("concurrency", 2)
BASELINE = "m:none"


def result(
    target: str,
    start: float,
    e2e: float,
    tokens: int | None,
    *,
    n: int | None = None,
    histogram: tuple[int, ...] | None = None,
    workload: str = "code",
    load: Load = C2,
    error: str | None = None,
) -> RequestResult:
    spec = None if histogram is None else SpecSample(histogram, (n or 0) * sum(histogram), n or 0)
    return RequestResult(
        target=target,
        method=target.split(":")[1],
        num_speculative_tokens=n,
        workload=workload,
        load=load,
        prompt_id=f"p{start}",
        start_s=start,
        e2e_s=e2e,
        ttft_s=e2e / 10,
        itl_s=(0.01, 0.02, 0.03),
        prompt_tokens=20,
        output_tokens=tokens,
        spec=spec,
        error=error,
    )


def sample_results() -> list[RequestResult]:
    return [
        # Baseline: 150 tokens over 0.0 -> 3.0 s = 50 tok/s.
        result(BASELINE, 0.0, 2.0, 100),
        result(BASELINE, 0.5, 2.5, 50),
        # ngram N=3: 150 tokens over 0.0 -> 1.5 s = 100 tok/s; histograms sum to (3, 2, 1, 8).
        result("m:ngram", 0.0, 1.0, 100, n=3, histogram=(2, 1, 1, 6)),
        result("m:ngram", 0.5, 1.0, 50, n=3, histogram=(1, 1, 0, 2)),
        # An error inside the span: its tokens and figures must not count.
        result("m:ngram", 0.2, 0.3, 999, n=3, histogram=(0, 0, 0, 50), error="boom"),
        # eagle N=2 without any speculative record: 60 tokens over 1.2 s = 50 tok/s.
        result("m:eagle", 0.0, 1.2, 60, n=2),
        # A workload without a baseline.
        result("m:ngram", 0.0, 2.0, 80, n=3, histogram=(1, 1), workload="chat"),
    ]


@pytest.fixture
def cells() -> list[CellSummary]:
    return summarize(sample_results(), BASELINE)


def cell_of(cells: list[CellSummary], workload: str, target: str) -> CellSummary:
    return next(c for c in cells if c.workload == workload and c.target == target)


# --- percentile -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 90, 3.7),  # rank 2.7: 3 + 0.7 * (4 - 3)
        ([4.0, 1.0, 3.0, 2.0], 99, 3.97),  # rank 2.97
        ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
        ([10.0, 20.0], 99, 19.9),
        ([5.0], 50, 5.0),
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0], 0, 1.0),
        ([1.0, 2.0, 3.0], 100, 3.0),
    ],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_empty() -> None:
    assert percentile([], 50) is None


# --- summarize ------------------------------------------------------------------------------------------------


def test_summarize_cells_in_first_seen_order(cells: list[CellSummary]) -> None:
    assert [(c.workload, c.target) for c in cells] == [
        ("code", BASELINE),
        ("code", "m:ngram"),
        ("code", "m:eagle"),
        ("chat", "m:ngram"),
    ]


def test_throughput_from_usage_over_wall_span(cells: list[CellSummary]) -> None:
    base = cell_of(cells, "code", BASELINE)
    assert (base.output_tokens, base.duration_s) == (150, 3.0)
    assert base.output_tokens_per_s == pytest.approx(50.0)
    assert base.speedup == pytest.approx(1.0)


def test_errors_excluded_from_tokens_and_acceptance(cells: list[CellSummary]) -> None:
    ngram = cell_of(cells, "code", "m:ngram")
    assert (ngram.requests, ngram.errors, ngram.output_tokens) == (3, 1, 150)
    assert ngram.duration_s == pytest.approx(1.5)
    assert ngram.output_tokens_per_s == pytest.approx(100.0)
    assert ngram.acceptance is not None
    assert ngram.acceptance.acceptance_histogram == (3, 2, 1, 8)


def test_speedup_against_baseline_of_same_workload_and_load(cells: list[CellSummary]) -> None:
    assert cell_of(cells, "code", "m:ngram").speedup == pytest.approx(2.0)
    assert cell_of(cells, "code", "m:eagle").speedup == pytest.approx(1.0)
    assert cell_of(cells, "chat", "m:ngram").speedup is None  # no baseline ran on chat


def test_speedup_none_without_baseline() -> None:
    assert all(cell.speedup is None for cell in summarize(sample_results(), None))


def test_baseline_compared_per_load() -> None:
    rate = Load("rate", 4)
    results = [
        result(BASELINE, 0.0, 1.0, 10),
        result("m:ngram", 0.0, 1.0, 30, n=3),
        result(BASELINE, 0.0, 1.0, 20, load=rate),
        result("m:ngram", 0.0, 1.0, 30, n=3, load=rate),
    ]
    speedups = {(c.load, c.target): c.speedup for c in summarize(results, BASELINE)}
    assert speedups[(C2, "m:ngram")] == pytest.approx(3.0)
    assert speedups[(rate, "m:ngram")] == pytest.approx(1.5)


def test_acceptance_sums_over_requests(cells: list[CellSummary]) -> None:
    acceptance = cell_of(cells, "code", "m:ngram").acceptance
    assert acceptance is not None
    # (3, 2, 1, 8): 14 steps, 0*3 + 1*2 + 2*1 + 3*8 = 28 accepted, 3 * 14 = 42 drafts.
    counts = (acceptance.num_spec_steps, acceptance.num_accepted_draft_tokens, acceptance.num_draft_tokens)
    assert counts == (14, 28, 42)
    mal, ar = acceptance.mean_acceptance_length, acceptance.acceptance_rate
    assert mal == pytest.approx(3.0)
    assert ar == pytest.approx(28 / 42)
    assert acceptance.per_position == pytest.approx((11 / 14, 9 / 14, 8 / 14))
    assert sum(acceptance.per_position) == pytest.approx(mal - 1)
    # Every step proposed N drafts, so MAL = 1 + N * AR.
    assert mal == pytest.approx(1 + acceptance.num_speculative_tokens * ar)


def test_no_spec_samples_no_acceptance(cells: list[CellSummary]) -> None:
    eagle = cell_of(cells, "code", "m:eagle")
    assert eagle.acceptance is None
    assert (eagle.mean_acceptance_length, eagle.acceptance_rate, eagle.per_position) == (None, None, ())


def test_latency_percentiles_from_successful_requests(cells: list[CellSummary]) -> None:
    ngram = cell_of(cells, "code", "m:ngram")
    assert ngram.e2e.p50 == pytest.approx(1.0)
    assert ngram.ttft.p50 == pytest.approx(0.1)
    assert ngram.itl.p50 == pytest.approx(0.02)


# --- tables ---------------------------------------------------------------------------------------------------


def test_study_rows(cells: list[CellSummary]) -> None:
    headers, rows = study_rows([c for c in cells if c.workload == "code"])
    assert headers == [
        *("workload", "load", "method", "N", "requests", "errors", "output tok/s", "speed-up", "MAL", "AR %"),
        *("p1", "p2", "p3"),
    ]
    assert rows == [
        ["code", "c=2", "none", "-", "2", "0", "50.0", "1.00x", "n/m", "n/m", "", "", ""],
        ["code", "c=2", "ngram", "3", "3", "1", "100.0", "2.00x", "3.00", "66.7", "78.6", "64.3", "57.1"],
        ["code", "c=2", "eagle", "2", "1", "0", "50.0", "1.00x", "n/m", "n/m", "n/m", "n/m", ""],
    ]


def test_study_rows_position_columns_follow_largest_measured_n(cells: list[CellSummary]) -> None:
    headers, rows = study_rows([cell_of(cells, "chat", "m:ngram")])
    # The chat server reported a 1-position histogram: one p column, speed-up not measured.
    assert headers[-2:] == ["AR %", "p1"]
    assert rows[0][7:] == ["n/m", "1.50", "16.7", "50.0"]


def test_latency_rows(cells: list[CellSummary]) -> None:
    headers, rows = latency_rows([cell_of(cells, "code", "m:ngram")])
    assert headers[:6] == ["workload", "load", "method", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms"]
    assert headers[-1] == "e2e p99 s"
    assert len(headers) == 12
    assert rows[0][:4] == ["code", "c=2", "ngram", "100"]
    assert rows[0][6:9] == ["20.0", "30.0", "30.0"]  # ITL p50/p90/p99 of (10, 10, 20, 20, 30, 30) ms
    assert rows[0][9] == "1.00"


def test_latency_rows_not_measured() -> None:
    only_error = summarize([result("m:ngram", 0.0, 1.0, 10, error="boom")], None)
    _, rows = latency_rows(only_error)
    assert rows[0][3:] == ["n/m"] * 9


def test_markdown_table_alignment() -> None:
    table = markdown_table(
        ["name", "N", "speed", "ratio", "blank"],
        [["a|b", "-", "2.05x", "n/m", ""], ["c", "3", "n/m", "45.0%", ""], ["x", "4", "1.00x", "12", "n/m"]],
    )
    lines = table.splitlines()
    assert lines[0] == "| name |   N | speed | ratio | blank |"
    assert lines[1] == "|------|----:|------:|------:|------:|"
    assert lines[2] == "| a\\|b |   - | 2.05x |   n/m |       |"
    assert all(line.count("|") - line.count("\\|") == 6 for line in lines)


def test_markdown_text_column_with_numbers_stays_left() -> None:
    table = markdown_table(["id"], [["1"], ["abc"]])
    assert table.splitlines()[1] == "|-----|"


def test_render_markdown(cells: list[CellSummary]) -> None:
    text = render_markdown(cells, title="smollm2")
    assert text.startswith("## smollm2\n\n### code\n\n| workload")
    assert text.index("### code") < text.index("### chat")
    assert text.count("| requests | errors | output tok/s | speed-up |") == 2
    assert text.count("TTFT p50 ms") == 2
    assert LEGEND in text
    code = text.split("### chat")[0]
    assert " p3 |" in code
    assert " p4 |" not in code
    assert "n/m" in code


def test_render_markdown_without_title(cells: list[CellSummary]) -> None:
    assert render_markdown(cells).startswith("### code")


def test_print_tables(cells: list[CellSummary]) -> None:
    out = io.StringIO()
    print_tables(cells, Console(file=out, width=250, color_system=None))
    text = out.getvalue()
    assert "code" in text
    assert "chat: latency" in text
    assert "2.00x" in text
    assert "n/m" in text
    assert "MAL" in text


# --- files ----------------------------------------------------------------------------------------------------


def test_summary_csv_rows_raw_values(cells: list[CellSummary]) -> None:
    rows = summary_csv_rows(cells)
    assert [row["target"] for row in rows] == [BASELINE, "m:ngram", "m:eagle", "m:ngram"]
    ngram = rows[1]
    assert ngram["N"] == 3
    assert ngram["mal"] == pytest.approx(3.0)
    assert ngram["ar"] == pytest.approx(2 / 3)
    assert (ngram["num_spec_steps"], ngram["num_draft_tokens"], ngram["num_accepted"]) == (14, 42, 28)
    assert (ngram["p1"], ngram["p2"], ngram["p3"]) == (11 / 14, 9 / 14, 8 / 14)
    assert ngram["itl_p90_s"] == pytest.approx(0.03)
    assert rows[0]["N"] is None
    assert rows[0]["mal"] is None
    assert rows[3]["p2"] is None
    assert list(rows[0])[-9:] == [f"{name}_p{q}_s" for name in ("ttft", "itl", "e2e") for q in (50, 90, 99)]


def test_write_csv(cells: list[CellSummary], tmp_path: Path) -> None:
    path = tmp_path / "summary.csv"
    write_csv(cells, path)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    base, ngram = rows[0], rows[1]
    assert base["load"] == "c=2"
    assert base["N"] == base["mal"] == base["p1"] == ""
    assert float(base["speedup"]) == 1.0
    assert float(ngram["output_tokens_per_s"]) == pytest.approx(100.0)
    assert float(ngram["p1"]) == 11 / 14  # repr round-trips: no rounding on the way
    assert int(ngram["output_tokens"]) == 150


def test_write_csv_no_cells(tmp_path: Path) -> None:
    path = tmp_path / "summary.csv"
    write_csv([], path)
    assert path.read_text() == ""


def test_jsonl_round_trip(tmp_path: Path) -> None:
    results = [*sample_results(), result("m:ngram", 0.1, 0.4, None, load=Load("rate", 2.5))]
    path = tmp_path / "requests.jsonl"
    write_jsonl(results, path)
    assert len(path.read_text().splitlines()) == len(results)
    assert read_jsonl(path) == results


def test_write_outputs(cells: list[CellSummary], tmp_path: Path) -> None:
    out = tmp_path / "run"
    paths = write_outputs(sample_results(), cells, out, "smollm2")
    assert [p.name for p in paths] == [
        *("requests.jsonl", "summary.csv", "summary.md"),
        *("throughput.png", "speedup_vs_n.png", "acceptance_heatmap.png"),
    ]
    assert all(p.parent == out and p.stat().st_size > 0 for p in paths)
    assert (out / "summary.md").read_text().startswith("## smollm2")
    assert read_jsonl(out / "requests.jsonl") == sample_results()


# --- plots ----------------------------------------------------------------------------------------------------


def test_write_plots_valid_pngs(cells: list[CellSummary], tmp_path: Path) -> None:
    rate = Load("rate", 1.5)
    extra = summarize(
        [result(BASELINE, 0.0, 1.0, 10, load=rate), result("m:ngram", 0.0, 1.0, 20, n=3, load=rate)], BASELINE
    )
    paths = write_plots([*cells, *extra], tmp_path)
    assert {p.name for p in paths} == {"throughput.png", "speedup_vs_n.png", "acceptance_heatmap.png"}
    for path in paths:
        assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_write_plots_skips_figures_without_data(tmp_path: Path) -> None:
    assert write_plots([], tmp_path) == []
    # Throughput only: no baseline (no speed-up), no speculative records (no acceptance).
    cells = summarize([result("m:ngram", 0.0, 1.0, 10, n=3)], None)
    paths = write_plots(cells, tmp_path)
    assert [p.name for p in paths] == ["throughput.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.png"]


def test_method_family() -> None:
    assert method_family("ngram-n3") == "ngram"
    assert method_family("ngram-n3-l4") == "ngram-l4"
    assert method_family("eagle3") == "eagle3"
    assert method_family("ngram-n3-x") == "ngram-n3-x"


def test_speedup_vs_n_one_line_per_family() -> None:
    results = [
        result(BASELINE, 0.0, 1.0, 10),
        result("m:ngram-n4", 0.0, 1.0, 25, n=4),
        result("m:ngram-n2", 0.0, 1.0, 20, n=2),
        result("m:eagle-n2", 0.0, 1.0, 15, n=2),
    ]
    figure = speedup_vs_n(summarize(results, BASELINE))
    assert figure is not None
    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["baseline", "code · c=2 · ngram", "code · c=2 · eagle"]
    assert list(lines[1].get_xdata()) == [2, 4]
    assert list(lines[1].get_ydata()) == pytest.approx([2.0, 2.5])


def test_acceptance_heatmap_blank_past_n() -> None:
    results = [
        result("m:ngram", 0.0, 1.0, 10, n=3, histogram=(1, 1, 1, 1)),
        result("m:eagle", 0.0, 1.0, 10, n=1, histogram=(1, 3)),
        result("m:none", 0.0, 1.0, 10),
    ]
    figure = acceptance_heatmap(summarize(results, None))
    assert figure is not None
    values = np.ma.masked_invalid(figure.axes[0].images[0].get_array())
    assert values.shape == (2, 3)  # the cell without acceptance has no row
    assert values.mask.tolist() == [[False, False, False], [False, True, True]]
    assert values[0].tolist() == pytest.approx([75.0, 50.0, 25.0])
    assert values[1, 0] == pytest.approx(75.0)
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert texts == ["75.0", "50.0", "25.0", "75.0"]
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["code · c=2 · ngram N=3", "code · c=2 · eagle N=1"]
    assert not math.isnan(values[0, 2])
