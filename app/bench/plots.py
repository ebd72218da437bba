"""The bench's figures: throughput against load, speed-up against N, and the
per-position acceptance heatmap of the study's appendix. Each figure is its own
`Figure` on an Agg canvas, so nothing touches pyplot's global state or needs a display."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from app.bench.stats import CellSummary

DPI = 120
LOAD_AXIS = {"concurrency": "concurrency (clients)", "rate": "request rate (requests/s)"}
# `specgate tune` names its candidate engines `<method>-n<N>` or `<method>-n<N>-l<lookup>`.
# tune names its engines `<method>-n<N>[-l<lookup max>]`: one line per method and lookup max
_TUNE_SUFFIX = re.compile(r"-n\d+(?=(-l\d+)?$)")
_PANELS_PER_ROW = 3

Point = tuple[float, float]


def method_family(method: str) -> str:
    return _TUNE_SUFFIX.sub("", method)


def method_label(cell: CellSummary) -> str:
    n = cell.num_speculative_tokens
    return cell.method if n is None else f"{cell.method} (N={n})"


def new_figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _plot_series(ax: Axes, points: list[Point], label: str) -> None:
    xs, ys = zip(*sorted(points), strict=True)
    ax.plot(xs, ys, marker="o", label=label)


def _throughput_panel(ax: Axes, title: str, kind: str, cells: list[CellSummary]) -> None:
    series: dict[str, tuple[str, list[Point]]] = {}
    for cell in cells:
        assert cell.output_tokens_per_s is not None
        _, points = series.setdefault(cell.target, (method_label(cell), []))
        points.append((cell.load.value, cell.output_tokens_per_s))
    for label, points in series.values():
        _plot_series(ax, points, label)
    values = sorted({cell.load.value for cell in cells})
    if values[0] > 0 and values[-1] / values[0] >= 8:
        # Concurrency sweeps double (1, 4, 16, 32): a linear axis crams the low end into one corner.
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.set(title=title, xlabel=LOAD_AXIS.get(kind, kind), ylabel="output tok/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def throughput(cells: Sequence[CellSummary]) -> Figure | None:
    """One panel per workload (and per load kind, since concurrency and rate share no axis)."""
    panels: dict[tuple[str, str], list[CellSummary]] = {}
    for cell in cells:
        if cell.output_tokens_per_s is not None:
            panels.setdefault((cell.workload, cell.load.kind), []).append(cell)
    if not panels:
        return None
    columns = min(len(panels), _PANELS_PER_ROW)
    rows = math.ceil(len(panels) / columns)
    figure = new_figure(5.0 * columns, 3.8 * rows)
    axes = figure.subplots(rows, columns, squeeze=False).flat
    kinds = {kind for _, kind in panels}
    for ax, ((workload, kind), group) in zip(axes, panels.items(), strict=False):
        _throughput_panel(ax, workload if len(kinds) == 1 else f"{workload} ({kind})", kind, group)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return figure


def speedup_vs_n(cells: Sequence[CellSummary]) -> Figure | None:
    """One line per (workload, load, method family): what each extra draft position bought."""
    series: dict[str, list[Point]] = {}
    for cell in cells:
        n = cell.num_speculative_tokens
        if n is not None and cell.speedup is not None:
            label = f"{cell.workload} · {cell.load} · {method_family(cell.method)}"
            series.setdefault(label, []).append((n, cell.speedup))
    if not series:
        return None
    figure = new_figure(8.0, 4.5)
    ax = figure.add_subplot()
    if len(series) > 10:
        # The default cycle has 10 colours: beyond them, lines would share one.
        ax.set_prop_cycle(color=[colormaps["tab20"](i) for i in range(20)])
    ax.axhline(1.0, linestyle="--", color="grey", linewidth=1, label="baseline")
    for label, points in series.items():
        _plot_series(ax, points, label)
    ax.set(xlabel="N (num_speculative_tokens)", ylabel="speed-up over baseline")
    ns = sorted({n for points in series.values() for n, _ in points})
    ax.set_xticks(ns)
    ax.set_xlim(ns[0] - 0.5, ns[-1] + 0.5)
    ax.grid(alpha=0.3)
    # Outside the axes: with several workloads and loads the legend would cover the lines.
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def _heatmap_label(cell: CellSummary) -> str:
    n = cell.num_speculative_tokens
    return f"{cell.workload} · {cell.load} · {cell.method}" + ("" if n is None else f" N={n}")


def acceptance_heatmap(cells: Sequence[CellSummary]) -> Figure | None:
    """Rows = cells with acceptance, columns = draft positions, value = p_i in %; blank past a row's N."""
    rows = [cell for cell in cells if cell.per_position]
    if not rows:
        return None
    k = max(len(cell.per_position) for cell in rows)
    values = np.full((len(rows), k), np.nan)
    for i, cell in enumerate(rows):
        values[i, : len(cell.per_position)] = [100 * p for p in cell.per_position]
    labels = [_heatmap_label(cell) for cell in rows]
    figure = new_figure(2.5 + 0.065 * max(map(len, labels)) + 0.6 * k, 1.3 + 0.35 * len(rows))
    ax = figure.add_subplot()
    # imshow masks NaN itself; the colour map's "bad" colour paints the blanks.
    image = ax.imshow(
        values,
        cmap=colormaps["viridis"].with_extremes(bad="white"),
        vmin=0,
        vmax=100,
        aspect="auto",
    )
    ax.set_xticks(range(k), [f"p{i}" for i in range(1, k + 1)])
    ax.set_yticks(range(len(rows)), labels, fontsize="small")
    ax.set_xlabel("draft position")
    for (i, j), value in np.ndenumerate(values):
        if not math.isnan(value):
            # viridis is dark below ~60 %: white text there, black above.
            ax.text(
                j, i, f"{value:.1f}", ha="center", va="center", fontsize=7, color="white" if value < 60 else "black"
            )
    figure.colorbar(image, ax=ax, label="accepted at position (% of steps)")
    return figure


PLOTS: dict[str, Callable[[Sequence[CellSummary]], Figure | None]] = {
    "throughput.png": throughput,
    "speedup_vs_n.png": speedup_vs_n,
    "acceptance_heatmap.png": acceptance_heatmap,
}


def write_plots(cells: Sequence[CellSummary], out_dir: Path) -> list[Path]:
    """The figures that have data, as PNGs in `out_dir`; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in PLOTS.items():
        figure = draw(cells)
        if figure is not None:
            path = out_dir / name
            figure.savefig(path)
            written.append(path)
    return written
