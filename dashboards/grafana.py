"""Grafana's JSON model and the PromQL in it, as used by both of specgate's boards (build.py).

Every query here is filtered by the variables $model and $method and rates over
$__rate_interval; every panel reads the $datasource variable. Specgate's series are
named in build.py; here only in the queries that fill the $model and $method variables.
Stdlib only, so that build.py runs with any Python >= 3.11.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]

SCHEMA_VERSION = 41
GRID_WIDTH = 24

DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}
FILTER = 'model=~"$model", method=~"$method"'
RATE_INTERVAL = "$__rate_interval"

MODEL_QUERY = "label_values(specgate_engine_info, model)"
METHOD_QUERY = 'label_values(specgate_engine_info{model=~"$model"}, method)'


# --------------------------------------------------------------------------- PromQL


def selector(metric: str, extra: str = "") -> str:
    """`metric{extra, model=~"$model", method=~"$method"}`."""
    matchers = f"{extra}, {FILTER}" if extra else FILTER
    return f"{metric}{{{matchers}}}"


def aggregate(op: str, expr: str, by: str = "model, method") -> str:
    """`op by (by) (expr)`; empty `by`: `op(expr)`, one series over everything."""
    grouping = f" by ({by}) " if by else ""
    return f"{op}{grouping}({expr})"


def rate_sum(metric: str, by: str = "model, method", extra: str = "") -> str:
    """Per-second rate of a counter, summed by `by` (empty: over everything)."""
    return aggregate("sum", f"rate({selector(metric, extra)}[{RATE_INTERVAL}])", by)


def histogram_mean(metric: str) -> str:
    """Request-weighted mean of a histogram over the rate interval."""
    return f"{rate_sum(metric + '_sum')} / {rate_sum(metric + '_count')}"


def histogram_quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, {rate_sum(metric + '_bucket', by='model, method, le')})"


# --------------------------------------------------------------------------- panels


def ref_id(index: int) -> str:
    """Grafana's query letters: 0 -> A, 1 -> B, ..."""
    return chr(ord("A") + index)


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False) -> Json:
    t: Json = {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "instant": instant,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "refId": ref,
    }
    if table:
        t["format"] = "table"
    return t


def range_targets(*queries: tuple[str, str]) -> list[Json]:
    """Range queries given as (expr, legend), lettered A, B, ... in order."""
    return [target(expr, legend, ref_id(i)) for i, (expr, legend) in enumerate(queries)]


def thresholds(*steps: tuple[str, float | None]) -> Json:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


GREEN_ONLY = thresholds(("green", None))


def panel(
    kind: str,
    title: str,
    description: str,
    defaults: Json,
    options: Json,
    targets: Sequence[Json],
    overrides: Sequence[Json] = (),
) -> Json:
    """What every query panel holds; the key order is the one the committed JSON has."""
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "options": options,
        "targets": list(targets),
    }


def field_defaults(
    unit: str, *, decimals: int | None = None, min_: float | None = None, max_: float | None = None
) -> Json:
    defaults: Json = {"unit": unit, "color": {"mode": "palette-classic"}, "thresholds": GREEN_ONLY}
    if decimals is not None:
        defaults["decimals"] = decimals
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return defaults


def timeseries(
    title: str,
    description: str,
    targets: Sequence[Json],
    unit: str,
    *,
    decimals: int | None = None,
    min_: float | None = None,
    max_: float | None = None,
    threshold_line: float | None = None,
    stacking: str = "none",
) -> Json:
    defaults = field_defaults(unit, decimals=decimals, min_=min_, max_=max_)
    custom: Json = {
        "drawStyle": "line",
        "fillOpacity": 10,
        "lineInterpolation": "linear",
        "lineWidth": 1,
        "pointSize": 4,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"group": "A", "mode": stacking},
        "thresholdsStyle": {"mode": "off"},
    }
    if threshold_line is not None:
        # A dashed line at the threshold (e.g. speed-up 1 = as fast as the baseline).
        custom["thresholdsStyle"] = {"mode": "dashed"}
        defaults["thresholds"] = thresholds(("red", None), ("green", threshold_line))
    defaults["custom"] = custom
    options: Json = {
        "legend": {"calcs": ["lastNotNull", "mean"], "displayMode": "table", "placement": "bottom", "showLegend": True},
        "tooltip": {"hideZeros": False, "mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, description, defaults, options, targets)


def stat(
    title: str,
    description: str,
    targets: Sequence[Json],
    unit: str,
    *,
    decimals: int | None = None,
    steps: Json = GREEN_ONLY,
    mappings: Sequence[Json] = (),
) -> Json:
    defaults = field_defaults(unit, decimals=decimals)
    defaults["color"] = {"mode": "thresholds"}
    defaults["thresholds"] = steps
    defaults["mappings"] = list(mappings)
    options: Json = {
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "percentChangeColorMode": "standard",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showPercentChange": False,
        "textMode": "auto",
        "wideLayout": True,
    }
    return panel("stat", title, description, defaults, options, targets)


@dataclass(frozen=True)
class Column:
    header: str
    expr: str
    unit: str
    decimals: int


def table(title: str, description: str, columns: Sequence[Column]) -> Json:
    """One row per (model, method); one instant query per value column, merged on the labels."""
    refs = [ref_id(i) for i in range(len(columns))]
    rename = {f"Value #{ref}": col.header for ref, col in zip(refs, columns, strict=True)}
    order = {"model": 0, "method": 1} | {f"Value #{ref}": 2 + i for i, ref in enumerate(refs)}
    overrides = [
        {
            "matcher": {"id": "byName", "options": col.header},
            "properties": [{"id": "unit", "value": col.unit}, {"id": "decimals", "value": col.decimals}],
        }
        for col in columns
    ]
    defaults: Json = {
        "color": {"mode": "thresholds"},
        "custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False},
        "thresholds": GREEN_ONLY,
        "unit": "none",
    }
    options: Json = {
        "cellHeight": "sm",
        "footer": {"countRows": False, "fields": "", "reducer": ["sum"], "show": False},
        "showHeader": True,
        "sortBy": [{"desc": False, "displayName": "model"}],
    }
    targets = [target(col.expr, ref=ref, instant=True, table=True) for ref, col in zip(refs, columns, strict=True)]
    transformations = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": order, "renameByName": rename}},
    ]
    return panel("table", title, description, defaults, options, targets, overrides) | {
        "transformations": transformations
    }


@dataclass
class Layout:
    """Places panels left to right on Grafana's 24-column grid and numbers them."""

    panels: list[Json] = field(default_factory=list)
    x: int = 0
    y: int = 0
    line_height: int = 0

    def _newline(self) -> None:
        self.y += self.line_height
        self.x = 0
        self.line_height = 0

    def row(self, title: str) -> None:
        if self.x:
            self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self.y},
                "id": len(self.panels) + 1,
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel: Json, w: int = 12, h: int = 8) -> None:
        if self.x + w > GRID_WIDTH:
            self._newline()
        panel = {"id": len(self.panels) + 1, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}} | panel
        self.panels.append(panel)
        self.x += w
        self.line_height = max(self.line_height, h)


# --------------------------------------------------------------------------- dashboards


def datasource_variable() -> Json:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
        "type": "datasource",
    }


def query_variable(name: str, label: str, query: str, *, multi: bool, include_all: bool) -> Json:
    variable: Json = {
        "current": {},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": include_all,
        "label": label,
        "multi": multi,
        "name": name,
        "options": [],
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }
    if include_all:
        # Matches values that appear after the page was loaded, too.
        variable["allValue"] = ".*"
    return variable


def dashboard(uid: str, title: str, description: str, panels: list[Json], *, all_models: bool) -> Json:
    """A specgate board: tagged and linked to the others, with the $datasource, $model and $method variables."""
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": True,
                "keepTime": True,
                "tags": ["specgate"],
                "targetBlank": False,
                "title": "specgate",
                "tooltip": "",
                "type": "dashboards",
                "url": "",
            }
        ],
        "panels": panels,
        "refresh": "10s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["specgate", "vllm", "speculative-decoding"],
        "templating": {
            "list": [
                datasource_variable(),
                query_variable("model", "Model", MODEL_QUERY, multi=all_models, include_all=all_models),
                query_variable("method", "Method", METHOD_QUERY, multi=True, include_all=True),
            ]
        },
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }
