"""The `specgate bench` and `specgate tune` command lines: flags → plans → files."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from app.bench import report
from app.bench.args import BenchError
from app.bench.client import RequestSettings, Target
from app.bench.records import Load, RequestResult
from app.bench.runner import BenchPlan, default_baselines, fetch_models, resolve_targets, run_bench
from app.bench.stats import CellSummary, summarize
from app.bench.tune import TunePlan, default_ns, pick_best, run_tune, snippet, summarize_tune
from app.bench.workloads import load_workload
from app.config import ConfigError, MethodConfig, SpecgateConfig


def _default_out(kind: str) -> Path:
    return Path(f"{kind}-results") / time.strftime("%Y%m%d-%H%M%S")


def _settings(args: argparse.Namespace) -> RequestSettings:
    return RequestSettings(max_tokens=args.max_tokens, temperature=args.temperature)


def _finish(
    console: Console, cells: Sequence[CellSummary], results: Sequence[RequestResult], out: Path, title: str
) -> None:
    console.rule(title)
    report.print_tables(cells, console)
    for path in report.write_outputs(results, cells, out, title):
        console.log(f"wrote {path}")


def bench_command(args: argparse.Namespace, console: Console) -> int:
    out = args.out or _default_out("bench")
    if args.replay is not None:
        results = report.read_jsonl(args.replay)
        found = default_baselines([Target(r.target, r.method) for r in results])
        baselines = (args.baseline,) if args.baseline else found
        _finish(console, summarize(results, baselines), results, out, f"bench replay of {args.replay}")
        return 0
    cards = fetch_models(args.url, args.api_key)
    targets = resolve_targets(cards, args.targets, args.model)
    loads = tuple(Load("concurrency", c) for c in (args.concurrency or ((1, 4) if not args.rate else ())))
    plan = BenchPlan(
        url=args.url.rstrip("/"),
        targets=targets,
        baselines=(args.baseline,) if args.baseline else default_baselines(targets),
        workloads=tuple(load_workload(w, args.requests, args.seed) for w in args.workloads),
        loads=loads + tuple(Load("rate", r) for r in args.rate),
        settings=_settings(args),
        duration_s=args.duration,
        warmup=args.warmup,
        api_key=args.api_key,
    )
    results = run_bench(plan, console)
    _finish(console, summarize(results, plan.baselines), results, out, f"specgate bench {plan.url}")
    return 1 if any(not r.ok for r in results) else 0


def tune_plan(args: argparse.Namespace, config: SpecgateConfig) -> TunePlan:
    model_name = args.model or next(iter(config.models))
    if model_name not in config.models:
        raise ConfigError(f"--model: no model {model_name!r} in the config (it has {', '.join(config.models)})")
    model = config.models[model_name]
    if args.speculative_config is not None:
        template = MethodConfig(speculative_config=args.speculative_config)
        method_name = args.method or template.speculative_method
    else:
        method_name = args.method or model.default_method
        if method_name not in model.methods:
            raise ConfigError(f"--method: model {model_name!r} has no method {method_name!r}")
        template = model.methods[method_name]
    if template.speculative_config is None:
        raise ConfigError(f"--method: {method_name!r} does not speculate; there is no N to tune")
    return TunePlan(
        config=config,
        model=model_name,
        method_name=method_name,
        template=template,
        ns=args.n or default_ns(template.speculative_method),
        lookup_max=args.lookup_max if template.speculative_method == "ngram" else (),
        workload=load_workload(args.workload, args.requests, args.seed),
        concurrency=args.concurrency,
        settings=_settings(args),
        out_dir=args.out or _default_out("tune"),
        warmup=args.warmup,
        tie_tolerance=args.tie_tolerance,
        with_baseline=not args.no_baseline,
    )


def tune_command(plan: TunePlan, console: Console) -> int:
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    results = run_tune(plan, console)
    cells = summarize_tune(plan, results)
    _finish(console, cells, results, plan.out_dir, f"specgate tune {plan.model}/{plan.method_name}")
    best = pick_best(cells, plan.tie_tolerance)
    if best is None:
        raise BenchError("no candidate produced a measurement; see the logs in " + str(plan.out_dir / "logs"))
    baseline = next((c for c in cells if c.num_speculative_tokens is None), None)
    text = snippet(plan, best, baseline)
    (plan.out_dir / "tune.yaml").write_text(text)
    console.rule("best N")
    console.print(text, markup=False, highlight=False)
    console.log(f"wrote {plan.out_dir / 'tune.yaml'}")
    return 1 if any(not r.ok for r in results) else 0
