"""How a routing policy (`auto`, `ab`) did against the fixed methods it chooses
from, in a `specgate bench` sweep that ran them all (docs/auto.md, "Evaluation").

    python -m app.bench.policy_eval docs/auto/sweep

reads the sweep's requests.jsonl, prints a markdown table (per workload and load:
tok/s of every fixed method and of the policy, the policy's ratio to the best
fixed method, which methods served the policy's requests) and the sweep totals,
and writes policy_vs_fixed.md and policy_vs_fixed.png next to it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from app.bench.plots import new_figure
from app.bench.records import Load, RequestResult
from app.bench.report import markdown_table, read_jsonl
from app.bench.stats import CellSummary, summarize
from app.config import POLICY_ROUTES

GOAL = 0.95  # the policy should reach this share of the best fixed method in every cell


@dataclass(frozen=True)
class PolicyCell:
    workload: str
    load: Load
    fixed: dict[str, float]  # fixed method -> output tok/s
    policy: float
    served: Counter[str]  # which methods answered the policy's requests

    @property
    def best(self) -> str:
        return max(self.fixed, key=lambda m: self.fixed[m])

    @property
    def ratio(self) -> float:
        return self.policy / self.fixed[self.best]


@dataclass(frozen=True)
class Totals:
    tokens_per_s: dict[str, float]  # over the whole sweep: all output tokens / all cell time
    geomean_ratio: dict[str, float]  # fixed method -> geometric mean over cells of policy / method


def policy_cells(results: Sequence[RequestResult], summaries: Sequence[CellSummary], policy: str) -> list[PolicyCell]:
    """`summaries`: `summarize(results, baseline=None)`."""
    served: dict[tuple[str, Load], Counter[str]] = {}
    for r in results:
        if r.method == policy and r.ok:
            served.setdefault((r.workload, r.load), Counter())[r.served_by or "unknown"] += 1
    cells = []
    for (workload, load), group in _by_cell(summaries).items():
        rates = {c.method: c.output_tokens_per_s for c in group if c.output_tokens_per_s is not None}
        own = rates.pop(policy, None)
        fixed = {m: v for m, v in rates.items() if m not in POLICY_ROUTES}
        if own is not None and fixed:
            cells.append(PolicyCell(workload, load, fixed, own, served.get((workload, load), Counter())))
    return cells


def _by_cell(summaries: Sequence[CellSummary]) -> dict[tuple[str, Load], list[CellSummary]]:
    grouped: dict[tuple[str, Load], list[CellSummary]] = {}
    for cell in summaries:
        grouped.setdefault((cell.workload, cell.load), []).append(cell)
    return grouped


def totals(summaries: Sequence[CellSummary], cells: Sequence[PolicyCell], policy: str) -> Totals:
    tokens: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    for cell in summaries:
        tokens[cell.method] += cell.output_tokens
        seconds[cell.method] += cell.duration_s
    methods = _fixed_methods(cells)
    return Totals(
        tokens_per_s={m: tokens[m] / seconds[m] for m in [*methods, policy] if seconds.get(m)},
        geomean_ratio={
            m: math.exp(sum(math.log(c.policy / c.fixed[m]) for c in cells) / len(cells))
            for m in methods
            if all(m in c.fixed for c in cells)
        },
    )


def _fixed_methods(cells: Sequence[PolicyCell]) -> list[str]:
    return list(dict.fromkeys(m for c in cells for m in c.fixed))  # in the sweep's order


def render(cells: Sequence[PolicyCell], total: Totals, policy: str) -> str:
    methods = _fixed_methods(cells)
    headers = [
        "workload",
        "load",
        *[f"{m} tok/s" for m in methods],
        f"{policy} tok/s",
        "best fixed",
        f"{policy} / best",
        f">= {GOAL}x",
        f"{policy} served by",
    ]
    rows = [
        [
            c.workload,
            str(c.load),
            *[f"{c.fixed[m]:.1f}" if m in c.fixed else "-" for m in methods],
            f"{c.policy:.1f}",
            c.best,
            f"{c.ratio:.2f}x",
            "yes" if c.ratio >= GOAL else "no",
            ", ".join(f"{m} {n}" for m, n in c.served.most_common()),
        ]
        for c in cells
    ]
    met = sum(c.ratio >= GOAL for c in cells)
    sweep = ", ".join(f"{m} {v:.1f}" for m, v in total.tokens_per_s.items())
    ratios = ", ".join(f"vs {m} {v:.2f}x" for m, v in total.geomean_ratio.items())
    return (
        markdown_table(headers, rows) + "\n\n"
        f"{policy} reached {GOAL}x the best fixed method in {met} of {len(cells)} cells.\n"
        f"Whole sweep, output tokens / cell time: {sweep} tok/s.\n"
        f"Geometric mean over the cells of {policy} / fixed: {ratios}.\n"
    )


def plot(cells: Sequence[PolicyCell], policy: str) -> Figure:
    methods = _fixed_methods(cells)
    fig = new_figure(max(6.0, 0.9 * len(cells)), 4.0)
    ax = fig.add_subplot()
    series = [*methods, policy]
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        values = [c.policy if name == policy else c.fixed.get(name, 0.0) for c in cells]
        ax.bar([x + i * width for x in range(len(cells))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cells))])
    ax.set_xticklabels([f"{c.workload}\n{c.load}" for c in cells])
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{policy} against the fixed methods (label: {policy} / best fixed)")
    for x, c in enumerate(cells):
        ax.annotate(
            f"{c.ratio:.2f}x",
            (x + 0.4 - width / 2, max(c.policy, *c.fixed.values())),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.legend()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a `specgate bench --out` directory")
    parser.add_argument("--policy", default="auto", choices=POLICY_ROUTES)
    args = parser.parse_args(argv)
    results = read_jsonl(args.sweep / "requests.jsonl")
    summaries = summarize(results, baseline=None)
    cells = policy_cells(results, summaries, args.policy)
    if not cells:
        parser.error(f"{args.sweep} has no cell with both '{args.policy}' and a fixed method")
    text = render(cells, totals(summaries, cells, args.policy), args.policy)
    sys.stdout.write(text)
    (args.sweep / f"{args.policy}_vs_fixed.md").write_text(text)
    plot(cells, args.policy).savefig(args.sweep / f"{args.policy}_vs_fixed.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
