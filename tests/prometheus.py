"""A real Prometheus (Debian's package) on loopback, scraping a gateway under test."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from dashboards.queries import all_panel_queries
from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


@dataclass
class PrometheusProcess:
    proc: subprocess.Popen[bytes]
    url: str

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        reply = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=30)
        body = reply.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for_target(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.query('up{job="specgate"} == 1'):
                return
            time.sleep(0.5)
        raise TimeoutError("Prometheus never scraped the gateway")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_prometheus(workdir: Path, gateway_port: int) -> PrometheusProcess:
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is required (make test installs it)"
    shutil.copy(RULES, workdir / "rules.yml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [{"job_name": "specgate", "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = PrometheusProcess(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{prom.url}/-/ready", timeout=2).status_code == 200:
                return prom
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    prom.stop()
    raise TimeoutError("Prometheus did not become ready")


def dashboard_queries() -> list[tuple[str, str]]:
    """(dashboard file, PromQL) of every panel of every shipped dashboard."""
    return [
        (path.name, expr)
        for path in sorted((ROOT / "dashboards").glob("*.json"))
        for expr in all_panel_queries(json.loads(path.read_text()))
    ]


def needs_policies(expr: str) -> bool:
    """Panels of the routing-policy row: only a model with `auto`/`ab` and a shadow
    feeds them, so tests/test_auto.py evaluates them, tests/test_metrics.py the rest."""
    return "specgate_shadow_" in expr or 'policy=~"auto|ab"' in expr


def substitute(expr: str, model: str, methods: str = "none|ngram") -> str:
    """A dashboard query as Grafana would send it, its variables filled in."""
    return (
        expr.replace("$__rate_interval", "2m")
        .replace("${model}", model)
        .replace("$model", model)
        .replace("${method}", methods)
        .replace("$method", methods)
    )
