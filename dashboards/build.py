#!/usr/bin/env python3
"""The one source of specgate's Grafana dashboards.

    python dashboards/build.py          rewrite specgate-methods.json and specgate-overview.json
    python dashboards/build.py --check  exit 1 if the files on disk differ from what would be written

Edit this file (the boards) or grafana.py (the Grafana JSON and PromQL helpers), never
the JSON. The metrics are specified in docs/metrics.md, the recording rules used here
(`specgate:...`) in deploy/prometheus/rules.yml. Every query uses only the variables
$datasource, $model, $method and $__rate_interval. Stdlib only, so it runs with any
Python >= 3.11.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
# `python dashboards/build.py` puts dashboards/ on the path, not the repo: add the repo so
# that the helpers import as `dashboards.grafana`, the name pytest and mypy know them by.
sys.path.insert(0, str(HERE.parent))

from dashboards.grafana import (  # noqa: E402
    Column,
    Json,
    Layout,
    aggregate,
    dashboard,
    histogram_mean,
    histogram_quantile,
    range_targets,
    rate_sum,
    selector,
    stat,
    table,
    target,
    thresholds,
    timeseries,
)

ERROR = 'outcome="error"'
# Legends: the methods board shows one model, the overview every model.
BY_METHOD = "{{method}}"
BY_ENGINE = "{{model}}/{{method}}"
# Red below 1, green from 1: a speed-up under the baseline, an engine down.
RED_BELOW_ONE = thresholds(("red", None), ("green", 1))


# --------------------------------------------------------------------------- queries


def output_tokens_rate(by: str = "model, method") -> str:
    return rate_sum("specgate_output_tokens_total", by=by)


def decode_rate_mean() -> str:
    """Request-weighted mean of each request's decode tokens/s."""
    return histogram_mean("specgate_request_decode_tokens_per_second")


def speedup() -> str:
    """The recording rule of deploy/prometheus/rules.yml: each method's decode speed over its baseline's."""
    return selector("specgate:speedup_over_baseline:1m")


def token_weighted_mal() -> str:
    return f"1 + {rate_sum('specgate_spec_accepted_tokens_total')} / {rate_sum('specgate_spec_steps_total')}"


def draft_acceptance_rate() -> str:
    return f"{rate_sum('specgate_spec_accepted_tokens_total')} / {rate_sum('specgate_spec_draft_tokens_total')}"


def error_rate() -> str:
    # `or ... * 0`: one series per (model, method) with traffic even when nothing has failed yet.
    return f"{rate_sum('specgate_requests_total', extra=ERROR)} or {rate_sum('specgate_requests_total')} * 0"


def error_ratio() -> str:
    """Failed / finished requests over everything selected; `or vector(0)`: 0 before the first failure."""
    return (
        f"({rate_sum('specgate_requests_total', by='', extra=ERROR)} or vector(0))"
        f" / {rate_sum('specgate_requests_total', by='')}"
    )


# --------------------------------------------------------------------------- panels


def percentile_targets(metric: str, *percentiles: int) -> list[Json]:
    """One quantile of a histogram per percentile, legend `p50 <method>`."""
    return range_targets(*((histogram_quantile(p / 100, metric), f"p{p} {BY_METHOD}") for p in percentiles))


def output_tokens_panel(title: str, description: str, legend: str) -> Json:
    """On both boards; the overview's names the model too, as it shows every model."""
    return timeseries(title, description, [target(output_tokens_rate(), legend)], "suffix: tok/s", min_=0)


# --------------------------------------------------------------------------- the boards


def methods_dashboard() -> Json:
    board = Layout()

    board.row("Throughput and speed-up")
    board.add(
        output_tokens_panel(
            "Output tokens/s", "Generated tokens per second of finished requests, per method.", BY_METHOD
        )
    )
    board.add(
        timeseries(
            "Speed-up over baseline",
            "Mean per-request decode speed of each method divided by its model's baseline (the engine with "
            "speculative_method=none), over 1m (recording rule specgate:speedup_over_baseline:1m). "
            "Below the dashed line at 1 the method is slower than not speculating.",
            [target(speedup(), BY_METHOD)],
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
            [target(decode_rate_mean(), BY_METHOD)],
            "suffix: tok/s",
            min_=0,
        )
    )
    board.add(
        stat(
            "Speed-up now",
            "Latest speed-up over the baseline per method (1m window).",
            [target(speedup(), BY_METHOD)],
            "suffix:x",
            decimals=2,
            steps=RED_BELOW_ONE,
        )
    )

    board.row("Speculation (speculating engines only)")
    board.add(
        timeseries(
            "Mean acceptance length p50 / p90 (request-weighted)",
            "Quantiles over requests of each request's mean acceptance length (bonus token included).",
            percentile_targets("specgate_request_acceptance_length", 50, 90),
            "none",
            decimals=2,
            min_=1,
        )
    )
    board.add(
        timeseries(
            "Mean acceptance length (token-weighted)",
            "1 + accepted draft tokens / verification steps carrying drafts.",
            [target(token_weighted_mal(), BY_METHOD)],
            "none",
            decimals=2,
            min_=1,
        )
    )
    board.add(
        timeseries(
            "Draft acceptance rate",
            "Accepted draft tokens / proposed draft tokens.",
            [target(draft_acceptance_rate(), BY_METHOD)],
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
            percentile_targets("specgate_request_ttft_seconds", 50, 99),
            "s",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Time per output token p50 / p99",
            "Quantiles over requests of decode time / (generated - 1): the mean inter-token latency of a request.",
            percentile_targets("specgate_request_time_per_output_token_seconds", 50, 99),
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
            [target(error_rate(), BY_METHOD)],
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
            range_targets(
                (aggregate("sum", selector("specgate_requests_in_flight")), "in flight {{method}}"),
                (aggregate("sum", selector("specgate_engine_running_requests")), "running {{method}}"),
                (aggregate("sum", selector("specgate_engine_waiting_requests")), "waiting {{method}}"),
                (aggregate("sum", selector("specgate_requests_queued")), "queued {{method}}"),
            ),
            "none",
            decimals=0,
            min_=0,
        )
    )
    board.add(
        timeseries(
            "KV-cache usage",
            "Fraction of each engine's KV cache in use.",
            [target(aggregate("max", selector("specgate_engine_kv_cache_usage_ratio")), BY_METHOD)],
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
            [target(rate_sum("specgate_route_decisions_total", extra='policy=~"auto|ab"'), BY_METHOD)],
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
            range_targets(
                (rate_sum("specgate_shadow_requests_total"), "shadow {{method}}"),
                (
                    rate_sum("specgate_shadow_dropped_total", by="model, method, reason"),
                    "dropped {{method}} {{reason}}",
                ),
            ),
            "reqps",
            min_=0,
        )
    )
    board.add(
        timeseries(
            "Shadow vs primary decode tokens/s",
            "Request-weighted mean decode rate of each method's shadow requests next to its primary ones.",
            range_targets(
                (decode_rate_mean(), "primary {{method}}"),
                (histogram_mean("specgate_shadow_request_decode_tokens_per_second"), "shadow {{method}}"),
            ),
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
            [target(output_tokens_rate(by=""))],
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
            range_targets(
                (aggregate("sum", selector("specgate_engine_up"), by=""), "up"),
                (aggregate("count", selector("specgate_engine_up"), by=""), "engines"),
            ),
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
            [target(error_ratio())],
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
            [target(aggregate("max", selector("specgate_engine_up")), BY_ENGINE)],
            "none",
            steps=RED_BELOW_ONE,
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
                Column("decode tok/s (mean)", decode_rate_mean(), "none", 1),
                Column("MAL (token-weighted)", token_weighted_mal(), "none", 2),
                Column("output tok/s", output_tokens_rate(), "none", 1),
                Column("speed-up (1m)", speedup(), "none", 2),
            ],
        ),
        w=24,
        h=8,
    )
    board.add(
        timeseries(
            "Requests/s by method",
            "Finished requests per second.",
            [target(rate_sum("specgate_requests_total"), BY_ENGINE)],
            "reqps",
            min_=0,
        )
    )
    board.add(
        output_tokens_panel("Output tokens/s by method", "Generated tokens per second of finished requests.", BY_ENGINE)
    )

    return dashboard(
        "specgate-overview",
        "specgate: overview",
        "Gateway-wide traffic, throughput, engine health and errors, with a per-method summary.",
        board.panels,
        all_models=True,
    )


# --------------------------------------------------------------------------- files


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
