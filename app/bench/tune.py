"""`specgate tune`: the study's N sweep for one model and one method, automated.

Each candidate (the baseline, then every N, and for n-gram every
prompt_lookup_max) gets its own `specgate serve` process with that one engine,
so only one engine holds memory at a time. The same workload runs against each
at one concurrency; the N with the highest end-to-end output tok/s wins (within
`tie_tolerance`, the lower N: less drafting work for the same speed), not the
one with the highest acceptance.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from app.bench.client import RequestSettings, Target
from app.bench.gateway import start_gateway
from app.bench.records import Load, RequestResult
from app.bench.runner import BenchPlan, run_bench
from app.bench.stats import CellSummary, summarize
from app.bench.workloads import Workload
from app.config import BASELINE_METHOD, MethodConfig, SpecgateConfig

PARALLEL_METHODS = frozenset({"dflash", "dspark"})  # block drafters: N capped by block size (study: 3, 7, 11, 15)


def default_ns(speculative_method: str) -> tuple[int, ...]:
    return (3, 7, 11, 15) if speculative_method in PARALLEL_METHODS else tuple(range(1, 8))


@dataclass(frozen=True)
class Candidate:
    name: str  # the engine's method name in its generated config
    method: MethodConfig
    n: int | None
    lookup_max: int | None = None

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.n or 0, self.lookup_max or 0)


@dataclass(frozen=True)
class TunePlan:
    config: SpecgateConfig  # embedded targets already resolved
    model: str
    method_name: str
    template: MethodConfig  # the method whose N is swept
    ns: tuple[int, ...]
    lookup_max: tuple[int, ...]  # n-gram only; empty = keep the template's
    workload: Workload
    concurrency: int
    settings: RequestSettings
    out_dir: Path
    warmup: int = 1
    tie_tolerance: float = 0.01
    with_baseline: bool = True


def candidates(plan: TunePlan) -> list[Candidate]:
    found = [Candidate(BASELINE_METHOD, MethodConfig(), None)] if plan.with_baseline else []
    for n in plan.ns:
        for lookup in plan.lookup_max or (None,):
            found.append(_candidate(plan, n, lookup))
    return found


def _candidate(plan: TunePlan, n: int, lookup_max: int | None) -> Candidate:
    spec: dict[str, Any] = copy.deepcopy(plan.template.speculative_config or {})
    spec["num_speculative_tokens"] = n
    name = f"{plan.method_name}-n{n}"
    if lookup_max is not None:
        spec["prompt_lookup_max"] = lookup_max
        spec["prompt_lookup_min"] = min(int(spec.get("prompt_lookup_min", lookup_max)), lookup_max)
        name += f"-l{lookup_max}"
    method = plan.template.model_copy(update={"speculative_config": spec})
    return Candidate(name, method, n, lookup_max)


def candidate_config(plan: TunePlan, candidate: Candidate) -> dict[str, Any]:
    """A whole specgate config serving only this candidate's engine."""
    model = plan.config.models[plan.model].model_copy(
        update={"methods": {candidate.name: candidate.method}, "default_method": candidate.name}
    )
    return SpecgateConfig(models={plan.model: model}).model_dump(mode="json", exclude_defaults=True)


def _run_candidate(plan: TunePlan, candidate: Candidate, console: Console) -> list[RequestResult]:
    config_path = plan.out_dir / "configs" / f"{candidate.name}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(candidate_config(plan, candidate), sort_keys=False))
    log_path = plan.out_dir / "logs" / f"{candidate.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    console.log(f"starting engine {plan.model}:{candidate.name} (log: {log_path})")
    gateway = start_gateway(log_path, config_path)
    try:
        gateway.wait_ready()
        bench = BenchPlan(
            url=gateway.url,
            targets=(Target(f"{plan.model}:{candidate.name}", candidate.name, candidate.n),),
            baselines=(),
            workloads=(plan.workload,),
            loads=(Load("concurrency", plan.concurrency),),
            settings=plan.settings,
            warmup=plan.warmup,
        )
        return run_bench(bench, console)
    finally:
        code = gateway.interrupt()
        if code != 0:
            console.log(f"[yellow]engine {candidate.name} exited with {code}; see {log_path}")


def run_tune(plan: TunePlan, console: Console) -> list[RequestResult]:
    results: list[RequestResult] = []
    for candidate in candidates(plan):
        results.extend(_run_candidate(plan, candidate, console))
    return results


def pick_best(cells: Sequence[CellSummary], tie_tolerance: float) -> CellSummary | None:
    """Highest output tok/s among the speculative cells; within `tie_tolerance`
    (a fraction of the best), the lowest N."""
    ranked = [c for c in cells if c.num_speculative_tokens is not None and c.output_tokens_per_s is not None]
    if not ranked:
        return None
    top = max(c.output_tokens_per_s or 0.0 for c in ranked)
    close = [c for c in ranked if (c.output_tokens_per_s or 0.0) >= top * (1 - tie_tolerance)]
    return min(close, key=lambda c: (c.num_speculative_tokens or 0, c.method))


def baseline_target(plan: TunePlan) -> str | None:
    return f"{plan.model}:{BASELINE_METHOD}" if plan.with_baseline else None


def summarize_tune(plan: TunePlan, results: Sequence[RequestResult]) -> list[CellSummary]:
    return summarize(results, baseline_target(plan))


def snippet(plan: TunePlan, best: CellSummary, baseline: CellSummary | None) -> str:
    """The config block to paste under `models:`, with what it was measured on."""
    chosen = next(c for c in candidates(plan) if c.name == best.method)
    speed = f"{best.output_tokens_per_s:.1f} tok/s"
    if best.speedup is not None:
        speed += f", {best.speedup:.2f}x the baseline"
    if best.mean_acceptance_length is not None:
        speed += f", MAL {best.mean_acceptance_length:.2f}"
    lines = [
        f"# specgate tune: {plan.model}/{plan.method_name}, workload {plan.workload.name}, "
        f"concurrency {plan.concurrency}, max_tokens {plan.settings.max_tokens}",
        f"# best: N={best.num_speculative_tokens} ({speed})",
    ]
    if baseline is not None and best.speedup is not None and best.speedup < 1:
        lines.append("# every N was slower than the baseline: on this workload and load, serve without speculation")
    method = {"speculative_config": chosen.method.speculative_config}
    block: dict[str, Any] = {"models": {plan.model: {"methods": {plan.method_name: method}}}}
    priors = _priors(plan, best, baseline)
    if priors:
        lines.append("# auto.priors: per-request tok/s measured here, the `auto` policy's cold start")
        block["models"][plan.model]["auto"] = {"priors": priors}
    return "\n".join(lines) + "\n" + yaml.safe_dump(block, sort_keys=False)


def _priors(plan: TunePlan, best: CellSummary, baseline: CellSummary | None) -> dict[str, float]:
    """Per-request tokens/s (the cell's rate shared by its concurrent requests)."""
    priors = {}
    for method, cell in ((plan.method_name, best), (BASELINE_METHOD, baseline)):
        if cell is not None and cell.output_tokens_per_s:
            priors[method] = round(cell.output_tokens_per_s / plan.concurrency, 2)
    return priors
