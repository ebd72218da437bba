"""The observability files, without a gateway: Prometheus config and rules (checked and
unit-tested with promtool), the generated Grafana dashboards, and their agreement with
the metric contract in docs/metrics.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.queries import all_panel_queries

REPO = Path(__file__).resolve().parent.parent
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
GRAFANA_DIR = REPO / "deploy" / "grafana" / "provisioning"
DASHBOARD_DIR = REPO / "dashboards"
METRICS_DOC = REPO / "docs" / "metrics.md"

DASHBOARDS = {"specgate-methods.json": "specgate-methods", "specgate-overview.json": "specgate-overview"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"row", "timeseries", "stat", "table"}
# Variables a panel query may use; $datasource appears only in datasource fields.
QUERY_VARIABLES = {"model", "method", "__rate_interval"}
MODEL_QUERY = "label_values(specgate_engine_info, model)"
METHOD_QUERY = 'label_values(specgate_engine_info{model=~"$model"}, method)'
RECORDING_RULES = {
    "specgate:output_tokens:rate1m",
    "specgate:decode_tokens_per_second:mean1m",
    "specgate:speedup_over_baseline:1m",
    "specgate:acceptance_length:mean1m",
}
ALERTS = {"SpecgateAcceptanceCollapsed", "SpecgateSlowerThanBaseline", "SpecgateEngineDown", "SpecgateHighErrorRate"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

METRIC_RE = re.compile(r"\bspecgate_[A-Za-z0-9_]+")
RECORDED_RE = re.compile(r"\bspecgate:[A-Za-z0-9_:]+")
SELECTOR_RE = re.compile(r"\b(specgate[_:][A-Za-z0-9_:]*)(\{[^}]*\})?")
VARIABLE_RE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
LABEL_LIST_RE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHER_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")


# --------------------------------------------------------------------------- helpers


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not on PATH: install Debian's `prometheus` package (apt-get install prometheus)")
    return path


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


def assert_promtool(*args: str | Path) -> None:
    proc = run_promtool(*args)
    assert proc.returncode == 0, f"promtool {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}"


def load_dashboard(name: str) -> dict[str, Any]:
    board: dict[str, Any] = json.loads((DASHBOARD_DIR / name).read_text("utf-8"))
    return board


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels") or [])


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text("utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def documented_metrics() -> dict[str, str]:
    """Metric name -> type, from the table in docs/metrics.md."""
    found = {}
    for line in METRICS_DOC.read_text("utf-8").splitlines():
        m = re.match(r"^\|\s*`(specgate_[a-z0-9_]+)(?:\{[^}]*\})?`\s*\|\s*(\w+)\s*\|", line)
        if m:
            found[m.group(1)] = m.group(2)
    assert found, f"no metric table found in {METRICS_DOC}"
    return found


def documented_labels() -> set[str]:
    labels = {"model", "method", "le"}  # every specgate series; `le` of every histogram
    for line in METRICS_DOC.read_text("utf-8").splitlines():
        m = re.match(r"^\|\s*`specgate_[a-z0-9_]+\{([^}]*)\}`", line)
        if m:
            labels.update(label.strip() for label in m.group(1).split(","))
    return labels


def all_dashboard_exprs() -> list[tuple[str, str]]:
    return [(name, expr) for name in DASHBOARDS for expr in all_panel_queries(load_dashboard(name))]


def all_rule_exprs() -> list[str]:
    return [str(rule["expr"]) for rule in rules()]


# --------------------------------------------------------------------------- promtool


def test_prometheus_config_is_valid() -> None:
    assert_promtool("check", "config", PROMETHEUS_DIR / "prometheus.yml")


def test_prometheus_config_scrapes_specgate() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text("utf-8"))
    assert config["rule_files"] == ["rules.yml"]
    assert config["global"]["evaluation_interval"] == "5s"
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "specgate"]
    assert job["scrape_interval"] == "5s"
    assert job["static_configs"] == [{"targets": ["specgate:8000"]}]


def test_rules_are_valid() -> None:
    assert_promtool("check", "rules", PROMETHEUS_DIR / "rules.yml")


def test_rules_unit_tests_pass() -> None:
    assert_promtool("test", "rules", PROMETHEUS_DIR / "rules.test.yml")


def test_rules_names_and_alert_metadata() -> None:
    doc = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text("utf-8"))
    groups = {group["name"]: group["rules"] for group in doc["groups"]}
    assert {rule["record"] for rule in groups["specgate-recording"]} == RECORDING_RULES
    alerts = {rule["alert"]: rule for rule in groups["specgate-alerts"]}
    assert set(alerts) == ALERTS
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        for key in ("summary", "description"):
            text = alert["annotations"][key]
            assert "$labels.model" in text and "$labels.method" in text, f"{name} {key} must name model and method"
    tested = (PROMETHEUS_DIR / "rules.test.yml").read_text("utf-8")
    for name in ALERTS:
        assert f"alertname: {name}" in tested, f"{name} has no promtool unit test"
    assert "expr: specgate:speedup_over_baseline:1m" in tested


# --------------------------------------------------------------------------- dashboards


def test_dashboards_are_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(DASHBOARD_DIR / "build.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"dashboards/build.py --check failed:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_model(name: str) -> None:
    board = load_dashboard(name)
    assert board["schemaVersion"] == 41
    assert board["uid"] == DASHBOARDS[name]
    found = variables(board)
    assert set(found) >= {"datasource", "model", "method"}
    assert found["datasource"]["type"] == "datasource"
    assert found["datasource"]["query"] == "prometheus"
    assert variable_query(found["model"]) == MODEL_QUERY
    assert variable_query(found["method"]) == METHOD_QUERY
    assert found["method"]["multi"] is True and found["method"]["includeAll"] is True
    for var in ("model", "method"):
        assert found[var]["datasource"] == DATASOURCE

    panels = list(walk_panels(board["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, f"{name}: {panel['title']}: type {panel['type']}"
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, f"{name}: {panel['title']}"
        assert panel["targets"], f"{name}: {panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, f"{name}: {panel['title']}"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{name}: {panel['title']} is off the grid"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_queries_use_only_allowed_variables_and_filter(name: str) -> None:
    exprs = all_panel_queries(load_dashboard(name))
    assert len(exprs) >= 5
    for expr in exprs:
        assert expr.strip(), f"{name}: empty query"
        used = {a or b for a, b in VARIABLE_RE.findall(expr)}
        assert used <= QUERY_VARIABLES, f"{name}: {expr} uses {used - QUERY_VARIABLES}"
        selectors = SELECTOR_RE.findall(expr)
        assert selectors, f"{name}: {expr} reads no specgate series"
        for metric, matchers in selectors:
            assert 'model=~"$model"' in matchers and 'method=~"$method"' in matchers, (
                f"{name}: {metric} is not filtered by $model and $method in {expr}"
            )


def test_metric_names_are_documented() -> None:
    documented = documented_metrics()
    sources = [f"{name}: {expr}" for name, expr in all_dashboard_exprs()]
    sources += [
        f"{name} variable: {variable_query(v)}"
        for name in DASHBOARDS
        for v in variables(load_dashboard(name)).values()
        if v["type"] == "query"
    ]
    sources += [f"rules.yml: {expr}" for expr in all_rule_exprs()]
    unknown = []
    for source in sources:
        for metric in METRIC_RE.findall(source.split(": ", 1)[1]):
            base = next((metric.removesuffix(s) for s in HISTOGRAM_SUFFIXES if metric.endswith(s)), None)
            if metric in documented or (base is not None and documented.get(base) == "histogram"):
                continue
            unknown.append(f"{metric} ({source})")
    assert not unknown, "metrics not in docs/metrics.md:\n" + "\n".join(unknown)


def test_label_names_are_documented() -> None:
    allowed = documented_labels()
    exprs = [expr for _, expr in all_dashboard_exprs()] + all_rule_exprs()
    for expr in exprs:
        used = {label.strip() for group in LABEL_LIST_RE.findall(expr) for label in group.split(",") if label.strip()}
        used |= set(MATCHER_RE.findall(expr))
        assert used <= allowed, f"{expr} uses undocumented labels {used - allowed}"


def test_recording_rules_used_by_dashboards_exist() -> None:
    used = {name for _, expr in all_dashboard_exprs() for name in RECORDED_RE.findall(expr)}
    assert used, "the speed-up panels should use specgate:speedup_over_baseline:1m"
    assert used <= RECORDING_RULES


def test_all_panel_queries_includes_rows_and_their_panels() -> None:
    board = {
        "panels": [
            {"type": "timeseries", "targets": [{"expr": "a"}, {"expr": "b"}]},
            {"type": "row", "collapsed": True, "panels": [{"type": "stat", "targets": [{"expr": "c"}]}]},
            {"type": "row", "collapsed": False, "panels": []},
            {"type": "text"},
            {"type": "table", "targets": [{"refId": "A"}]},
        ]
    }
    assert all_panel_queries(board) == ["a", "b", "c", ""]


# --------------------------------------------------------------------------- do the queries return data?
#
# A gateway that served a baseline ("none") and an n-gram engine, as docs/metrics.md
# describes it: spec series only for the speculating engine. Every dashboard query,
# with the variables substituted, becomes `absent(...)` in an alerting rule, so promtool
# both parses it and fails the test if it returns no series.

MODEL = "smollm2"
STEPS = 200  # samples every 5s: 16m40s of traffic
EVAL_TIME = "15m"


def series(metric: str, labels: dict[str, str], increment: float) -> dict[str, str]:
    text = ", ".join(f'{k}="{v}"' for k, v in {"job": "specgate", "instance": "specgate:8000", **labels}.items())
    values = f"0+{increment}x{STEPS}" if increment else f"0x{STEPS}"
    return {"series": f"{metric}{{{text}}}", "values": values}


def gauge(metric: str, labels: dict[str, str], value: float) -> dict[str, str]:
    item = series(metric, labels, 0)
    item["values"] = f"{value}x{STEPS}"
    return item


def histogram(metric: str, labels: dict[str, str], observed: float, bounds: tuple[float, ...]) -> list[dict[str, str]]:
    """One observation of `observed` per scrape interval."""
    out = [series(f"{metric}_bucket", labels | {"le": str(le)}, 1 if observed <= le else 0) for le in bounds]
    out.append(series(f"{metric}_bucket", labels | {"le": "+Inf"}, 1))
    out.append(series(f"{metric}_sum", labels, observed))
    out.append(series(f"{metric}_count", labels, 1))
    return out


def gateway_like_series() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    engines = {
        "none": {"speculative_method": "none"},
        "ngram": {"speculative_method": "ngram", "num_speculative_tokens": "4"},
    }
    decode_rate = {"none": 20.0, "ngram": 50.0}
    for method, info in engines.items():
        lab = {"model": MODEL, "method": method}
        out.append(gauge("specgate_engine_info", lab | info, 1))
        out.append(gauge("specgate_engine_up", lab, 1))
        out.append(gauge("specgate_requests_in_flight", lab, 0))
        out.append(gauge("specgate_requests_queued", lab, 0))
        out.append(gauge("specgate_engine_running_requests", lab, 0))
        out.append(gauge("specgate_engine_waiting_requests", lab, 0))
        out.append(gauge("specgate_engine_kv_cache_usage_ratio", lab, 0.05))
        out.append(series("specgate_requests_total", lab | {"outcome": "stop"}, 1))
        out.append(series("specgate_requests_total", lab | {"outcome": "length"}, 1))
        out.append(series("specgate_prompt_tokens_total", lab, 30))
        out.append(series("specgate_output_tokens_total", lab, 64))
        out += histogram("specgate_request_decode_tokens_per_second", lab, decode_rate[method], (10.0, 30.0, 100.0))
        out += histogram("specgate_request_time_per_output_token_seconds", lab, 1 / decode_rate[method], (0.01, 0.1))
        out += histogram("specgate_request_ttft_seconds", lab, 0.2, (0.1, 0.5, 1.0))
        out += histogram("specgate_request_e2e_seconds", lab, 2.0, (1.0, 5.0))
        out += histogram("specgate_request_output_tokens", lab, 32, (16, 64))
    for method, policy, reason in (
        ("none", "auto", "best_estimate"),
        ("ngram", "auto", "exploration"),
        ("ngram", "explicit", "requested"),
    ):
        labels = {"model": MODEL, "method": method, "policy": policy, "reason": reason}
        out.append(series("specgate_route_decisions_total", labels, 1))
    lab = {"model": MODEL, "method": "ngram"}
    out.append(series("specgate_shadow_requests_total", lab | {"outcome": "length"}, 1))
    out.append(series("specgate_shadow_dropped_total", lab | {"reason": "shadow_limit"}, 1))
    out += histogram("specgate_shadow_request_decode_tokens_per_second", lab, 40.0, (10.0, 30.0, 100.0))
    lab = {"model": MODEL, "method": "ngram"}
    out.append(series("specgate_spec_steps_total", lab, 10))
    out.append(series("specgate_spec_draft_tokens_total", lab, 40))
    out.append(series("specgate_spec_accepted_tokens_total", lab, 15))
    for position, accepted in enumerate((7, 4, 3, 1), start=1):
        out.append(
            series("specgate_spec_accepted_tokens_by_position_total", lab | {"position": str(position)}, accepted)
        )
    out += histogram("specgate_request_acceptance_length", lab, 2.5, (1.0, 2.0, 3.0, 5.0))
    out += histogram("specgate_request_draft_acceptance_ratio", lab, 0.375, (0.2, 0.5, 1.0))
    return out


def substitute(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("${model}", MODEL)
        .replace("$model", MODEL)
        .replace("${method}", "none|ngram")
        .replace("$method", "none|ngram")
    )


def check_queries_return_data(exprs: list[tuple[str, str]], workdir: Path) -> subprocess.CompletedProcess[str]:
    shutil.copy(PROMETHEUS_DIR / "rules.yml", workdir / "rules.yml")
    alerts = [
        {
            "alert": "DashboardQueryEmpty",
            "expr": f"absent({substitute(expr)})",
            "labels": {"query": f"{i}"},
            "annotations": {"where": where, "expr": expr},
        }
        for i, (where, expr) in enumerate(exprs)
    ]
    (workdir / "dashboard-queries.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "interval": "5s", "rules": alerts}]}, width=10_000)
    )
    test = {
        "rule_files": ["rules.yml", "dashboard-queries.yml"],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": gateway_like_series(),
                "alert_rule_test": [{"eval_time": EVAL_TIME, "alertname": "DashboardQueryEmpty", "exp_alerts": []}],
            }
        ],
    }
    (workdir / "dashboard-queries.test.yml").write_text(yaml.safe_dump(test, width=10_000))
    return run_promtool("test", "rules", workdir / "dashboard-queries.test.yml")


def test_dashboard_queries_return_data_for_baseline_and_ngram(tmp_path: Path) -> None:
    exprs = all_dashboard_exprs()
    proc = check_queries_return_data(exprs, tmp_path)
    assert proc.returncode == 0, f"dashboard queries invalid or without data:\n{proc.stdout}\n{proc.stderr}"


def test_empty_query_check_is_not_vacuous(tmp_path: Path) -> None:
    only_with_errors = 'sum by (model, method) (rate(specgate_requests_total{outcome="error"}[$__rate_interval]))'
    proc = check_queries_return_data([("probe", only_with_errors)], tmp_path)
    assert proc.returncode != 0
    assert "DashboardQueryEmpty" in proc.stdout + proc.stderr
