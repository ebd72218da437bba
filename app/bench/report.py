"""What `specgate bench` shows and writes: the study's table (tok/s, speed-up, MAL,
AR, per-position acceptance) and latency percentiles, as markdown and as rich
tables; the raw figures as CSV; every request as JSONL; and the plots."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.bench.records import RequestResult
from app.bench.stats import CellSummary, Latency

NOT_MEASURED = "n/m"
NO_N = "-"
# Placeholders that say nothing about whether a column holds numbers.
_BLANKS = frozenset({"", NOT_MEASURED, NO_N})
LEGEND = (
    "n/m = not measured (the server reported no speculative record). "
    "MAL = mean acceptance length, bonus token included; AR = accepted / proposed drafts; "
    "p_i = share of speculative steps that accepted draft position i, unconditional "
    "(p1 + ... + pN = MAL - 1). AR and p_i in %."
)

Rows = tuple[list[str], list[list[str]]]


def _fmt(value: float | None, spec: str, suffix: str = "", scale: float = 1.0) -> str:
    return NOT_MEASURED if value is None else f"{value * scale:{spec}}{suffix}"


def _positions_width(cells: Iterable[CellSummary]) -> int:
    return max((len(cell.per_position) for cell in cells), default=0)


def _positions(cell: CellSummary, k: int) -> list[str]:
    measured = cell.per_position
    # Without figures, the row still owes its N positions a value: "n/m".
    width = len(measured) if measured else (cell.num_speculative_tokens or 0)
    return [(f"{measured[i] * 100:.1f}" if measured else NOT_MEASURED) if i < width else "" for i in range(k)]


def _study_row(cell: CellSummary, k: int) -> list[str]:
    n = cell.num_speculative_tokens
    return [
        cell.workload,
        str(cell.load),
        cell.method,
        NO_N if n is None else str(n),
        str(cell.requests),
        str(cell.errors),
        _fmt(cell.output_tokens_per_s, ".1f"),
        _fmt(cell.speedup, ".2f", "x"),
        _fmt(cell.mean_acceptance_length, ".2f"),
        _fmt(cell.acceptance_rate, ".1f", scale=100),
        *_positions(cell, k),
    ]


def study_rows(cells: Sequence[CellSummary]) -> Rows:
    """The study's table: throughput, speed-up and acceptance, p1..pK for the largest N measured."""
    k = _positions_width(cells)
    headers = ["workload", "load", "method", "N", "requests", "errors", "output tok/s", "speed-up", "MAL", "AR %"]
    headers += [f"p{i}" for i in range(1, k + 1)]
    return headers, [_study_row(cell, k) for cell in cells]


def _quantiles(latency: Latency) -> tuple[float | None, float | None, float | None]:
    return latency.p50, latency.p90, latency.p99


def _latency_cells(latency: Latency, spec: str, scale: float) -> list[str]:
    return [_fmt(value, spec, scale=scale) for value in _quantiles(latency)]


def latency_rows(cells: Sequence[CellSummary]) -> Rows:
    headers = ["workload", "load", "method"]
    for name, unit in (("TTFT", "ms"), ("ITL", "ms"), ("e2e", "s")):
        headers += [f"{name} p{q} {unit}" for q in (50, 90, 99)]
    rows = [
        [
            cell.workload,
            str(cell.load),
            cell.method,
            *_latency_cells(cell.ttft, ".0f", 1000),
            *_latency_cells(cell.itl, ".1f", 1000),
            *_latency_cells(cell.e2e, ".2f", 1),
        ]
        for cell in cells
    ]
    return headers, rows


def _is_number(text: str) -> bool:
    try:
        float(text[:-1] if text.endswith(("x", "%")) else text)
    except ValueError:
        return False
    return True


def numeric_columns(rows: Sequence[Sequence[str]], width: int) -> list[bool]:
    """Per column: every cell that is not a placeholder reads as a number (after a trailing x or %)."""
    return [all(_is_number(row[i]) for row in rows if row[i] not in _BLANKS) for i in range(width)]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """GitHub markdown, numeric columns right-aligned, cells padded so the source reads as a table too."""
    numeric = numeric_columns(rows, len(headers))
    body = [[_md_cell(c) for c in row] for row in [headers, *rows]]
    widths = [max(3, *(len(row[i]) for row in body)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = (c.rjust(w) if right else c.ljust(w) for c, w, right in zip(cells, widths, numeric, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        ("-" * (w + 1) + ":") if right else "-" * (w + 2) for w, right in zip(widths, numeric, strict=True)
    )
    return "\n".join([line(body[0]), rule + "|", *(line(row) for row in body[1:])])


def by_workload(cells: Iterable[CellSummary]) -> dict[str, list[CellSummary]]:
    """Cells grouped by workload, in first-seen order."""
    groups: dict[str, list[CellSummary]] = {}
    for cell in cells:
        groups.setdefault(cell.workload, []).append(cell)
    return groups


def render_markdown(cells: Sequence[CellSummary], title: str | None = None) -> str:
    parts = [f"## {title}"] if title else []
    for workload, group in by_workload(cells).items():
        parts += [f"### {workload}", markdown_table(*study_rows(group)), markdown_table(*latency_rows(group))]
    parts.append(f"_{LEGEND}_")
    return "\n\n".join(parts) + "\n"


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> Table:
    table = Table(title=title)
    for header, right in zip(headers, numeric_columns(rows, len(headers)), strict=True):
        table.add_column(header, justify="right" if right else "left")
    for row in rows:
        # Text, not str: rich would read brackets in a method or workload name as markup.
        table.add_row(*(Text(cell) for cell in row))
    return table


def print_tables(cells: Sequence[CellSummary], console: Console) -> None:
    for workload, group in by_workload(cells).items():
        console.print(rich_table(*study_rows(group), title=workload))
        console.print(rich_table(*latency_rows(group), title=f"{workload}: latency"))
    console.print(LEGEND, style="dim", markup=False, highlight=False)


def _csv_row(cell: CellSummary, k: int) -> dict[str, object]:
    acceptance = cell.acceptance
    row: dict[str, object] = {
        "workload": cell.workload,
        "load": str(cell.load),
        "target": cell.target,
        "method": cell.method,
        "N": cell.num_speculative_tokens,
        "requests": cell.requests,
        "errors": cell.errors,
        "output_tokens": cell.output_tokens,
        "duration_s": cell.duration_s,
        "output_tokens_per_s": cell.output_tokens_per_s,
        "speedup": cell.speedup,
        "mal": cell.mean_acceptance_length,
        "ar": cell.acceptance_rate,
        "num_spec_steps": acceptance.num_spec_steps if acceptance else None,
        "num_draft_tokens": acceptance.num_draft_tokens if acceptance else None,
        "num_accepted": acceptance.num_accepted_draft_tokens if acceptance else None,
    }
    positions = cell.per_position
    row.update({f"p{i + 1}": positions[i] if i < len(positions) else None for i in range(k)})
    for name, latency in (("ttft", cell.ttft), ("itl", cell.itl), ("e2e", cell.e2e)):
        row.update({f"{name}_p{q}_s": v for q, v in zip((50, 90, 99), _quantiles(latency), strict=True)})
    return row


def summary_csv_rows(cells: Sequence[CellSummary]) -> list[dict[str, object]]:
    """One row per cell, raw values (fractions, seconds), None where not measured."""
    k = _positions_width(cells)
    return [_csv_row(cell, k) for cell in cells]


def write_csv(cells: Sequence[CellSummary], path: Path) -> None:
    rows = summary_csv_rows(cells)
    with path.open("w", newline="", encoding="utf-8") as f:
        if rows:
            # DictWriter writes None as an empty cell, which is what "not measured" should read as.
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def write_jsonl(results: Iterable[RequestResult], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for result in results:
            f.write(result.to_json() + "\n")


def read_jsonl(path: Path) -> list[RequestResult]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [RequestResult.from_json(line) for line in lines if line.strip()]


def write_outputs(
    results: Iterable[RequestResult], cells: Sequence[CellSummary], out_dir: Path, title: str | None
) -> list[Path]:
    """requests.jsonl, summary.csv, summary.md and the plots that have data; the paths written."""
    # Imported here: matplotlib costs a noticeable start-up time to commands that only print tables.
    from app.bench import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl, summary_csv, summary_md = out_dir / "requests.jsonl", out_dir / "summary.csv", out_dir / "summary.md"
    write_jsonl(results, jsonl)
    write_csv(cells, summary_csv)
    summary_md.write_text(render_markdown(cells, title), encoding="utf-8")
    return [jsonl, summary_csv, summary_md, *plots.write_plots(cells, out_dir)]
