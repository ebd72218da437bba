#!/usr/bin/env python3
"""The one source of specgate's Grafana dashboards.

    python dashboards/build.py          rewrite specgate-methods.json and specgate-overview.json
    python dashboards/build.py --check  exit 1 if the files on disk differ from what would be written

Edit this file, never the JSON. The metrics are specified in docs/metrics.md, the
recording rules used here (`specgate:...`) in deploy/prometheus/rules.yml. Every
query uses only the variables $datasource, $model, $method and $__rate_interval.
Stdlib only, so it runs with any Python >= 3.11.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Json = dict[str, Any]

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 41
GRID_WIDTH = 24

DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}
FILTER = 'model=~"$model", method=~"$method"'
RATE_INTERVAL = "$__rate_interval"
ERROR = 'outcome="error"'

MODEL_QUERY = "label_values(specgate_engine_info, model)"
METHOD_QUERY = 'label_values(specgate_engine_info{model=~"$model"}, method)'


# --------------------------------------------------------------------------- PromQL


def selector(metric: str, extra: str = "") -> str:
    """`metric{extra, model=~"$model", method=~"$method"}`."""
    matchers = f"{extra}, {FILTER}" if extra else FILTER
    return f"{metric}{{{matchers}}}"


def rate_sum(metric: str, by: str = "model, method", extra: str = "") -> str:
    """Per-second rate of a counter, summed by `by` (empty: over everything)."""
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({selector(metric, extra)}[{RATE_INTERVAL}]))"


def histogram_mean(metric: str) -> str:
    """Request-weighted mean of a histogram over the rate interval."""
    return f"{rate_sum(metric + '_sum')} / {rate_sum(metric + '_count')}"


def histogram_quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, {rate_sum(metric + '_bucket', by='model, method, le')})"


def token_weighted_mal() -> str:
    return f"1 + {rate_sum('specgate_spec_accepted_tokens_total')} / {rate_sum('specgate_spec_steps_total')}"


def draft_acceptance_rate() -> str:
    return f"{rate_sum('specgate_spec_accepted_tokens_total')} / {rate_sum('specgate_spec_draft_tokens_total')}"


def error_rate() -> str:
    # `or ... * 0`: one series per (model, method) with traffic even when nothing has failed yet.
    return f"{rate_sum('specgate_requests_total', extra=ERROR)} or {rate_sum('specgate_requests_total')} * 0"


def recorded(rule: str) -> str:
    return selector(rule)


# --------------------------------------------------------------------------- panels


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


def thresholds(*steps: tuple[str, float | None]) -> Json:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


GREEN_ONLY = thresholds(("green", None))


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
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "calcs": ["lastNotNull", "mean"],
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"hideZeros": False, "mode": "multi", "sort": "desc"},
        },
        "targets": list(targets),
    }


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
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "percentChangeColorMode": "standard",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        },
        "targets": list(targets),
    }


@dataclass(frozen=True)
class Column:
    header: str
    expr: str
    unit: str
    decimals: int


def table(title: str, description: str, columns: Sequence[Column]) -> Json:
    """One row per (model, method); one instant query per value column, merged on the labels."""
    refs = [chr(ord("A") + i) for i in range(len(columns))]
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
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": {
            "cellHeight": "sm",
            "footer": {"countRows": False, "fields": "", "reducer": ["sum"], "show": False},
            "showHeader": True,
            "sortBy": [{"desc": False, "displayName": "model"}],
        },
        "targets": [
            target(col.expr, ref=ref, instant=True, table=True) for ref, col in zip(refs, columns, strict=True)
        ],
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "indexByName": order, "renameByName": rename},
            },
        ],
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


def methods_dashboard() -> Json:
    board = Layout()
    by_method = "{{method}}"

    board.row("Throughput and speed-up")
    board.add(
        timeseries(
            "Output tokens/s",
            "Generated tokens per second of finished requests, per method.",
            [target(rate_sum("specgate_output_tokens_total"), by_method)],
            "suffix: tok/s",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Speed-up over baseline",
            "Mean per-request decode speed of each method divided by its model's baseline (the engine with "
            "speculative_method=none), over 1m (recording rule specgate:speedup_over_baseline:1m). "
            "Below the dashed line at 1 the method is slower than not speculating.",
            [target(recorded("specgate:speedup_over_baseline:1m"), by_method)],
            "suffix:x",
            decimals=2,
            min_=0,
            threshold_line=1,
        )
    )
    board.add(
        timeseries(
            "Decode tokens/s per request (mean)",
            "Request-weighted mean of (generated - 1) / decode time.",
            [target(histogram_mean("specgate_request_decode_tokens_per_second"), by_method)],
            "suffix: tok/s",
            min_=0,
        )
    )
    board.add(
        stat(
            "Speed-up now",
            "Latest speed-up over the baseline per method (1m window).",
            [target(recorded("specgate:speedup_over_baseline:1m"), by_method)],
            "suffix:x",
            decimals=2,
            steps=thresholds(("red", None), ("green", 1)),
        )
    )

    board.row("Speculation (speculating engines only)")
    board.add(
        timeseries(
            "Mean acceptance length p50 / p90 (request-weighted)",
            "Quantiles over requests of each request's mean acceptance length (bonus token included).",
            [
                target(histogram_quantile(0.5, "specgate_request_acceptance_length"), "p50 {{method}}", "A"),
                target(histogram_quantile(0.9, "specgate_request_acceptance_length"), "p90 {{method}}", "B"),
            ],
            "none",
            decimals=2,
            min_=1,
        )
    )
    board.add(
        timeseries(
            "Mean acceptance length (token-weighted)",
            "1 + accepted draft tokens / verification steps carrying drafts.",
            [target(token_weighted_mal(), by_method)],
            "none",
            decimals=2,
            min_=1,
        )
    )
    board.add(
        timeseries(
            "Draft acceptance rate",
            "Accepted draft tokens / proposed draft tokens.",
            [target(draft_acceptance_rate(), by_method)],
            "percentunit",
            min_=0,
            max_=1,
        )
    )
    board.add(
        timeseries(
            "Acceptance by draft position",
            "Share of verification steps whose draft at position p was accepted (a draft at p is accepted "
            "iff the step accepted at least p drafts).",
            [
                target(
                    f"{rate_sum('specgate_spec_accepted_tokens_by_position_total', by='model, method, position')}"
                    f" / on (model, method) group_left () {rate_sum('specgate_spec_steps_total')}",
                    "{{method}} pos {{position}}",
                )
            ],
            "percentunit",
            min_=0,
            max_=1,
        )
    )

    board.row("Latency")
    board.add(
        timeseries(
            "Time to first token p50 / p99",
            "Quantiles over requests of the time to first token.",
            [
                target(histogram_quantile(0.5, "specgate_request_ttft_seconds"), "p50 {{method}}", "A"),
                target(histogram_quantile(0.99, "specgate_request_ttft_seconds"), "p99 {{method}}", "B"),
            ],
            "s",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Time per output token p50 / p99",
            "Quantiles over requests of decode time / (generated - 1): the mean inter-token latency of a request.",
            [
                target(
                    histogram_quantile(0.5, "specgate_request_time_per_output_token_seconds"), "p50 {{method}}", "A"
                ),
                target(
                    histogram_quantile(0.99, "specgate_request_time_per_output_token_seconds"), "p99 {{method}}", "B"
                ),
            ],
            "s",
            min_=0,
        )
    )

    board.row("Requests")
    board.add(
        timeseries(
            "Requests/s by outcome",
            "Finished requests per second by outcome (finish reason, error or cancelled).",
            [target(rate_sum("specgate_requests_total", by="model, method, outcome"), "{{method}} {{outcome}}")],
            "reqps",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Errors/s",
            'Requests that ended with outcome="error" (engine failure mid-request), per second.',
            [target(error_rate(), by_method)],
            "reqps",
            min_=0,
        )
    )

    board.row("Engines")
    board.add(
        timeseries(
            "Requests in flight / running / waiting / queued",
            "Admitted by the gateway and not finished; running and waiting in each engine's scheduler; "
            "queued at the gateway for a place (limits.max_queued).",
            [
                target(
                    f"sum by (model, method) ({selector('specgate_requests_in_flight')})", "in flight {{method}}", "A"
                ),
                target(
                    f"sum by (model, method) ({selector('specgate_engine_running_requests')})",
                    "running {{method}}",
                    "B",
                ),
                target(
                    f"sum by (model, method) ({selector('specgate_engine_waiting_requests')})",
                    "waiting {{method}}",
                    "C",
                ),
                target(f"sum by (model, method) ({selector('specgate_requests_queued')})", "queued {{method}}", "D"),
            ],
            "none",
            decimals=0,
            min_=0,
        )
    )
    board.add(
        timeseries(
            "KV-cache usage",
            "Fraction of each engine's KV cache in use.",
            [target(f"max by (model, method) ({selector('specgate_engine_kv_cache_usage_ratio')})", by_method)],
            "percentunit",
            min_=0,
            max_=1,
        )
    )

    board.row("Routing policies (auto, ab, shadow)")
    board.add(
        timeseries(
            "Policy split: share of decisions per method",
            "Which method the `auto` and `ab` policies sent requests to, as a share of their decisions "
            "(docs/auto.md). Explicit `model:method` requests are not counted here.",
            [
                target(
                    rate_sum("specgate_route_decisions_total", by="model, method", extra='policy=~"auto|ab"'),
                    "{{method}}",
                )
            ],
            "reqps",
            min_=0,
            stacking="percent",
        )
    )
    board.add(
        timeseries(
            "Decisions/s by policy and reason",
            "Every routing decision: explicit, header, default, or the policy's reason "
            "(best_estimate, running, exploration, prior, cold_start, weight, reweighted).",
            [target(rate_sum("specgate_route_decisions_total", by="model, policy, reason"), "{{policy}} {{reason}}")],
            "reqps",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Shadow requests/s and drops/s",
            "Mirrored requests that finished, and mirrors dropped (shadow_limit, engine_busy, engine_down). "
            "Shadows never count in the other panels.",
            [
                target(rate_sum("specgate_shadow_requests_total"), "shadow {{method}}", "A"),
                target(
                    rate_sum("specgate_shadow_dropped_total", by="model, method, reason"),
                    "dropped {{method}} {{reason}}",
                    "B",
                ),
            ],
            "reqps",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Shadow vs primary decode tokens/s",
            "Request-weighted mean decode rate of each method's shadow requests next to its primary ones.",
            [
                target(histogram_mean("specgate_request_decode_tokens_per_second"), "primary {{method}}", "A"),
                target(histogram_mean("specgate_shadow_request_decode_tokens_per_second"), "shadow {{method}}", "B"),
            ],
            "suffix: tok/s",
            min_=0,
        )
    )

    return dashboard(
        "specgate-methods",
        "specgate: speculative-decoding methods",
        "One model, every speculative-decoding method side by side: throughput, speed-up over the baseline, "
        "acceptance, latency, errors and engine load.",
        board.panels,
        all_models=False,
    )


def overview_dashboard() -> Json:
    board = Layout()
    engine = "{{model}}/{{method}}"

    board.add(
        stat(
            "Requests/s",
            "Finished requests per second, all selected models and methods.",
            [target(rate_sum("specgate_requests_total", by=""))],
            "reqps",
            decimals=2,
        ),
        w=6,
        h=4,
    )
    board.add(
        stat(
            "Output tokens/s",
            "Generated tokens per second of finished requests.",
            [target(rate_sum("specgate_output_tokens_total", by=""))],
            "suffix: tok/s",
            decimals=1,
        ),
        w=6,
        h=4,
    )
    board.add(
        stat(
            "Engines up",
            "Engines running, of all engines.",
            [
                target(f"sum({selector('specgate_engine_up')})", "up", "A"),
                target(f"count({selector('specgate_engine_up')})", "engines", "B"),
            ],
            "none",
            decimals=0,
        ),
        w=6,
        h=4,
    )
    board.add(
        stat(
            "Error ratio",
            'Share of finished requests with outcome="error".',
            [
                target(
                    f"({rate_sum('specgate_requests_total', by='', extra=ERROR)} or vector(0))"
                    f" / {rate_sum('specgate_requests_total', by='')}"
                )
            ],
            "percentunit",
            decimals=2,
            steps=thresholds(("green", None), ("orange", 0.01), ("red", 0.05)),
        ),
        w=6,
        h=4,
    )
    board.add(
        stat(
            "Engine status",
            "specgate_engine_up per engine.",
            [target(f"max by (model, method) ({selector('specgate_engine_up')})", engine)],
            "none",
            steps=thresholds(("red", None), ("green", 1)),
            mappings=[
                {
                    "options": {
                        "0": {"color": "red", "index": 0, "text": "DOWN"},
                        "1": {"color": "green", "index": 1, "text": "UP"},
                    },
                    "type": "value",
                }
            ],
        ),
        w=24,
        h=4,
    )
    board.add(
        table(
            "Methods",
            "Per model and method, over the rate interval: mean per-request decode speed, token-weighted mean "
            "acceptance length (empty for a baseline: it has no drafts), output tokens/s and the 1m speed-up "
            "over the model's baseline.",
            [
                Column("decode tok/s (mean)", histogram_mean("specgate_request_decode_tokens_per_second"), "none", 1),
                Column("MAL (token-weighted)", token_weighted_mal(), "none", 2),
                Column("output tok/s", rate_sum("specgate_output_tokens_total"), "none", 1),
                Column("speed-up (1m)", recorded("specgate:speedup_over_baseline:1m"), "none", 2),
            ],
        ),
        w=24,
        h=8,
    )
    board.add(
        timeseries(
            "Requests/s by method",
            "Finished requests per second.",
            [target(rate_sum("specgate_requests_total"), engine)],
            "reqps",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Output tokens/s by method",
            "Generated tokens per second of finished requests.",
            [target(rate_sum("specgate_output_tokens_total"), engine)],
            "suffix: tok/s",
            min_=0,
        )
    )

    return dashboard(
        "specgate-overview",
        "specgate: overview",
        "Gateway-wide traffic, throughput, engine health and errors, with a per-method summary.",
        board.panels,
        all_models=True,
    )


def render() -> dict[Path, str]:
    """File path -> exact file contents."""
    boards = {"specgate-methods.json": methods_dashboard(), "specgate-overview.json": overview_dashboard()}
    return {HERE / name: json.dumps(board, indent=2, ensure_ascii=False) + "\n" for name, board in boards.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a dashboard file is missing or out of date")
    args = parser.parse_args(argv)
    files = render()
    if args.check:
        stale = [path for path, text in files.items() if not path.exists() or path.read_text("utf-8") != text]
        for path in stale:
            sys.stderr.write(f"{path.name} is out of date: run python dashboards/build.py\n")
        return 1 if stale else 0
    for path, text in files.items():
        path.write_text(text, "utf-8", newline="\n")
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
