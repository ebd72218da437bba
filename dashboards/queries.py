"""Read the PromQL back out of a Grafana dashboard (for tests that evaluate it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _walk(panels: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        # A collapsed row keeps its panels inside it; an open row has none.
        yield from _walk(panel.get("panels") or ())


def all_panel_queries(dashboard: Mapping[str, Any]) -> list[str]:
    """Every target `expr` of every panel, rows' nested panels included, in dashboard order.

    Template-variable queries (`label_values(...)`) are not PromQL and are not included.
    A target without an `expr` yields "" so that callers notice it.
    """
    return [
        str(target.get("expr", ""))
        for panel in _walk(dashboard.get("panels") or ())
        for target in panel.get("targets") or ()
    ]
