"""`specgate bench`: which targets, which loads, in which order; progress; results.

Cells run one at a time (workload → load → target), so targets that share a
machine never compete and every target sees the same prompts in the same order.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from app.bench.args import BenchError
from app.bench.client import TIMEOUT, RequestSettings, Target, run_load
from app.bench.records import Load, RequestResult, model_root
from app.bench.workloads import Workload

BASELINE_METHODS = frozenset({"none"})


@dataclass(frozen=True)
class BenchPlan:
    url: str
    targets: tuple[Target, ...]
    baselines: tuple[str, ...]  # targets whose tok/s is 1.00x: one per model (summarize)
    workloads: tuple[Workload, ...]
    loads: tuple[Load, ...]
    settings: RequestSettings = field(default_factory=RequestSettings)
    duration_s: float | None = None  # per cell; None = send every prompt of the workload once
    warmup: int = 2  # requests per target before its first cell, not recorded
    api_key: str | None = None


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch_models(url: str, api_key: str | None = None) -> list[dict[str, Any]]:
    try:
        response = httpx.get(f"{url}/v1/models", headers=_headers(api_key), timeout=10)
        response.raise_for_status()
        return list(response.json()["data"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise BenchError(f"cannot list models at {url}/v1/models: {exc}") from None


def resolve_targets(
    cards: Sequence[dict[str, Any]], targets: Sequence[str] = (), model: str | None = None
) -> tuple[Target, ...]:
    """Explicit targets, else every engine of `model` (a specgate gateway lists its
    engines as `model:method` cards), else every model a plain server lists. Rows
    are named by method, or by the whole target when the targets span models."""
    return _labelled(_resolve(cards, targets, model))


def _labelled(targets: tuple[Target, ...]) -> tuple[Target, ...]:
    if len({model_root(t.model) for t in targets}) <= 1:
        return targets
    return tuple(replace(t, method=t.model) for t in targets)


def _resolve(cards: Sequence[dict[str, Any]], targets: Sequence[str], model: str | None) -> tuple[Target, ...]:
    by_id = {str(card["id"]): card for card in cards}
    if targets:
        unknown = [t for t in targets if t not in by_id]
        if unknown and by_id:
            raise BenchError(f"unknown target(s) {', '.join(unknown)}; the server lists: {', '.join(by_id)}")
        return tuple(_target(t, by_id.get(t, {})) for t in targets)
    engines = [c for c in cards if "method" in c and (model is None or c.get("root") == model)]
    if engines:
        return tuple(_target(str(c["id"]), c) for c in engines)
    if model is not None and by_id:
        raise BenchError(f"no engines of model {model!r} at this server; it lists: {', '.join(by_id)}")
    if not by_id:
        raise BenchError("the server lists no models; pass --targets")
    return tuple(_target(model_id, card) for model_id, card in by_id.items())


def _target(model_id: str, card: dict[str, Any]) -> Target:
    n = card.get("num_speculative_tokens")
    method = card.get("method") or card.get("policy") or model_id  # policy cards: `model:auto`, `model:ab`
    return Target(model_id, str(method), int(n) if n is not None else None)


def default_baselines(targets: Sequence[Target]) -> tuple[str, ...]:
    """The first baseline engine (`none`) of each model among the targets."""
    found: dict[str, str] = {}
    for t in targets:
        if t.method.rpartition(":")[2] in BASELINE_METHODS:
            found.setdefault(model_root(t.model), t.model)
    return tuple(found.values())


async def _run(plan: BenchPlan, console: Console) -> list[RequestResult]:
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(
        base_url=plan.url, timeout=TIMEOUT, limits=limits, headers=_headers(plan.api_key)
    ) as client:
        await _warm_up(client, plan, console)
        with _progress(console) as progress:
            for workload in plan.workloads:
                for load in plan.loads:
                    for target in plan.targets:
                        total = None if plan.duration_s else len(workload.prompts)
                        task = progress.add_task(f"{workload.name} {load} {target.model}", total=total)
                        advance = functools.partial(_advance, progress, task)
                        cell = await run_load(
                            client, target, workload.prompts, plan.settings, load, advance, plan.duration_s
                        )
                        results.extend(cell)
                        _report_errors(cell, console)
    return results


def _advance(progress: Progress, task: TaskID, _result: RequestResult) -> None:
    progress.advance(task)


async def _warm_up(client: httpx.AsyncClient, plan: BenchPlan, console: Console) -> None:
    if plan.warmup <= 0:
        return
    prompts = plan.workloads[0].prompts[: plan.warmup]
    for target in plan.targets:
        warm = await run_load(client, target, prompts, plan.settings, Load("concurrency", 1), lambda _r: None)
        failed = [r for r in warm if not r.ok]
        if failed:
            raise BenchError(f"warm-up request to {target.model} failed: {failed[0].error}")
    console.log(f"warmed up {len(plan.targets)} target(s) with {len(prompts)} request(s) each")


def _report_errors(cell: Sequence[RequestResult], console: Console) -> None:
    failed = [r for r in cell if not r.ok]
    if failed:
        console.log(f"[yellow]{len(failed)} of {len(cell)} requests failed; first: {failed[0].error}")


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def run_bench(plan: BenchPlan, console: Console) -> list[RequestResult]:
    if not plan.targets:
        raise BenchError("no targets to benchmark")
    return asyncio.run(_run(plan, console))
