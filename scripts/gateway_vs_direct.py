"""Is the specgate gateway slower than vLLM's own server for the same engine?

One engine of the embedded default config (model `smollm2`, method `--method`:
`none` or `ngram`) is served twice, one server at a time so that the two never
share the CPU:

1. `vllm serve` (`python -m vllm.entrypoints.openai.api_server`) with the
   command-line equivalent of the engine's settings;
2. `specgate serve` with a config that holds only that engine.

Each gets the same specgate bench (same prompts in the same order, streamed chat
completions, temperature 0, 2 unrecorded warm-up requests, closed loop at each
`--concurrency`). Output tok/s, TTFT, ITL and end-to-end latency are compared
per concurrency; "speed-up" in the bench tables is specgate tok/s ÷ vllm serve
tok/s. The gateway counts as "not slower" when its tok/s is at least
(1 - NOISE_TOLERANCE) x vllm serve's: a measurement-noise allowance.

Run it (from the repository root, with nothing else heavy on the machine):

    .venv/bin/python scripts/gateway_vs_direct.py --concurrency 1,8,32 --requests 32 --max-tokens 64

Written to `--out` (default bench-results/gateway-vs-direct-<timestamp>):
comparison.md, the bench's requests.jsonl / summary.csv / summary.md / plots,
specgate.yaml (the gateway's config), vllm-serve.cmd (the vllm serve command)
and both servers' logs. Exit code 0 whatever the verdict, 1 if any request
failed, 2 if a server could not be started or benchmarked.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.logging import RichHandler

from app.bench import report
from app.bench.client import RequestSettings, Target
from app.bench.gateway import ServerProcess, free_port, start_gateway, start_server
from app.bench.records import Load, RequestResult
from app.bench.runner import BenchError, BenchPlan, run_bench
from app.bench.stats import CellSummary, summarize
from app.bench.workloads import Workload, WorkloadError, load_workload
from app.cli import read_config
from app.config import ConfigError, EngineSettings, MethodConfig, ModelConfig, Settings, SpecgateConfig
from app.engines.vllm_command import VLLM_SERVE, as_vllm_serve_runs, serve_args

MODEL = "smollm2"
METHODS = ("none", "ngram")
VLLM_LABEL = "vllm serve"
SPECGATE_LABEL = "specgate"
NOISE_TOLERANCE = 0.03  # specgate tok/s >= (1 - this) x vllm serve tok/s counts as "not slower"
WARMUP = 2
SEED = 0


@dataclass(frozen=True)
class Engine:
    """The one engine both servers serve, as specgate configures it."""

    method: str
    target: str  # the resolved local model folder
    tokenizer: str | None
    engine: EngineSettings  # model settings merged with the method's overrides
    spec: MethodConfig

    @property
    def gateway_model(self) -> str:
        return f"{MODEL}:{self.method}"


# --- the engine, as a specgate config and as a vllm serve command line ----------


def load_engine(method: str, cache_dir: Path | None) -> Engine:
    settings = Settings(config=None) if cache_dir is None else Settings(config=None, cache_dir=cache_dir)
    config = read_config(settings)  # the embedded default, `embedded:smollm2` resolved to its folder
    model: ModelConfig = config.models[MODEL]
    if method not in model.methods:
        raise ConfigError(f"--method: {MODEL} has no method {method!r} (it has {', '.join(model.methods)})")
    settings = as_vllm_serve_runs(model.engine_for(method))
    return Engine(method, model.target, model.tokenizer, settings, model.methods[method])


def specgate_config(engine: Engine) -> dict[str, Any]:
    """A whole specgate config serving only this engine (its settings merged at model level)."""
    method = MethodConfig(speculative_config=engine.spec.speculative_config)
    model = ModelConfig(
        target=engine.target,
        tokenizer=engine.tokenizer,
        engine=engine.engine,
        methods={engine.method: method},
        default_method=engine.method,
    )
    return SpecgateConfig(models={MODEL: model}).model_dump(mode="json", exclude_defaults=True)


def write_specgate_config(engine: Engine, path: Path) -> None:
    header = f"# scripts/gateway_vs_direct.py: the one engine {engine.gateway_model} of the embedded default config.\n"
    path.write_text(header + yaml.safe_dump(specgate_config(engine), sort_keys=False))


def vllm_serve_command(engine: Engine, port: int) -> list[str]:
    model = ModelConfig(
        target=engine.target,
        tokenizer=engine.tokenizer,
        engine=engine.engine,
        methods={engine.method: engine.spec},
        default_method=engine.method,
    )
    return [
        *VLLM_SERVE,
        "--model",
        *serve_args(MODEL, model, engine.method),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


# --- servers, one at a time -----------------------------------------------------


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def reap_group(pgid: int, console: Console, timeout_s: float = 30.0) -> None:
    """Wait for what the server left in its process group (engine processes), then SIGKILL it."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _group_alive(pgid):
        console.log(f"[yellow]process group {pgid} outlived its leader; SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def stop_server(server: ServerProcess, console: Console) -> None:
    """SIGINT, as a user's Ctrl-C (SIGKILL to the process group on timeout); then reap the group."""
    try:
        code: int | str = server.interrupt()
    except subprocess.TimeoutExpired:
        console.log(f"[yellow]{server.name} still running 120s after SIGINT; killed")
        code = "killed"
    reap_group(server.proc.pid, console)
    console.log(f"{server.name} stopped (exit code {code})")


# --- the benchmark ----------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    workload: Workload
    loads: tuple[Load, ...]
    settings: RequestSettings
    out: Path

    @property
    def vllm_target(self) -> str:
        return f"vllm-serve/{MODEL}"

    def specgate_target(self, engine: Engine) -> str:
        return f"specgate/{engine.gateway_model}"


def bench_server(url: str, target: Target, options: Options, console: Console) -> list[RequestResult]:
    plan = BenchPlan(
        url=url,
        targets=(target,),
        baseline=None,
        workloads=(options.workload,),
        loads=options.loads,
        settings=options.settings,
        warmup=WARMUP,
    )
    return run_bench(plan, console)


def relabel(results: Sequence[RequestResult], target: str, method: str) -> list[RequestResult]:
    return [dataclasses.replace(r, target=target, method=method) for r in results]


def run_vllm_serve(engine: Engine, options: Options, console: Console) -> list[RequestResult]:
    port = free_port()
    cmd = vllm_serve_command(engine, port)
    (options.out / "vllm-serve.cmd").write_text(shlex.join(cmd) + "\n")
    log_path = options.out / "vllm-serve.log"
    console.rule(VLLM_LABEL)
    console.log(f"starting: {shlex.join(cmd)}", markup=False, highlight=False)
    console.log(f"log: {log_path}")
    server = start_server(cmd, port, log_path, VLLM_LABEL, "/v1/models")
    try:
        server.wait_ready()
        console.log(f"{VLLM_LABEL} ready at {server.url}")
        target = Target(MODEL, VLLM_LABEL, engine.spec.num_speculative_tokens)
        return relabel(bench_server(server.url, target, options, console), options.vllm_target, VLLM_LABEL)
    finally:
        stop_server(server, console)


def run_specgate(engine: Engine, options: Options, console: Console) -> list[RequestResult]:
    config_path, log_path = options.out / "specgate.yaml", options.out / "specgate.log"
    write_specgate_config(engine, config_path)
    console.rule(SPECGATE_LABEL)
    console.log(f"starting specgate serve --config {config_path} (log: {log_path})")
    gateway = start_gateway(log_path, config_path)
    gateway.name = SPECGATE_LABEL
    try:
        gateway.wait_ready()
        console.log(f"{SPECGATE_LABEL} ready at {gateway.url}")
        target = Target(engine.gateway_model, SPECGATE_LABEL, engine.spec.num_speculative_tokens)
        results = bench_server(gateway.url, target, options, console)
        return relabel(results, options.specgate_target(engine), SPECGATE_LABEL)
    finally:
        stop_server(gateway, console)


# --- the comparison ---------------------------------------------------------------


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def _num(value: float | None, spec: str, scale: float = 1.0) -> str:
    return report.NOT_MEASURED if value is None else f"{value * scale:{spec}}"


Metric = tuple[str, Callable[[CellSummary], float | None], str, float, bool]  # name, value, format, scale, ratio?
METRICS: tuple[Metric, ...] = (
    ("output tok/s", lambda c: c.output_tokens_per_s, ".1f", 1.0, True),
    ("TTFT p50 ms", lambda c: c.ttft.p50, ".0f", 1000.0, True),
    ("TTFT p90 ms", lambda c: c.ttft.p90, ".0f", 1000.0, True),
    ("ITL p50 ms", lambda c: c.itl.p50, ".1f", 1000.0, True),
    ("e2e p50 s", lambda c: c.e2e.p50, ".2f", 1.0, True),
    ("output tokens", lambda c: float(c.output_tokens), ".0f", 1.0, True),  # same prompts, greedy: should match
    ("errors", lambda c: float(c.errors), ".0f", 1.0, False),
)
HEADERS = ["metric", VLLM_LABEL, SPECGATE_LABEL, "specgate ÷ vllm serve"]


def comparison_rows(direct: CellSummary, gateway: CellSummary) -> list[list[str]]:
    rows = []
    for name, get, spec, scale, with_ratio in METRICS:
        ratio = _num(_ratio(get(gateway), get(direct)), ".3f") if with_ratio else ""
        rows.append([name, _num(get(direct), spec, scale), _num(get(gateway), spec, scale), ratio])
    return rows


def verdict(direct: CellSummary, gateway: CellSummary) -> str:
    ratio = _ratio(gateway.output_tokens_per_s, direct.output_tokens_per_s)
    if ratio is None:
        return "no verdict: a server produced no tok/s measurement"
    text = "gateway not slower" if ratio >= 1 - NOISE_TOLERANCE else "gateway SLOWER"
    return f"{text} (specgate = {ratio:.3f} x vllm serve output tok/s)"


def pairs(cells: Sequence[CellSummary], direct: str, gateway: str) -> list[tuple[CellSummary, CellSummary]]:
    """(vllm serve cell, specgate cell) per (workload, load), in order."""
    by_key = {(c.workload, c.load, c.target): c for c in cells}
    keys = dict.fromkeys((c.workload, c.load) for c in cells)
    found = [(by_key.get((w, ld, direct)), by_key.get((w, ld, gateway))) for w, ld in keys]
    return [(d, g) for d, g in found if d is not None and g is not None]


def tolerance_note() -> str:
    return (
        f'Verdict: "gateway not slower" when specgate output tok/s >= {1 - NOISE_TOLERANCE:.2f} x vllm serve\'s '
        f'(a {NOISE_TOLERANCE:.0%} measurement-noise allowance), else "gateway SLOWER". '
        "Latency ratios above 1 mean specgate is slower."
    )


def render_comparison(pairs_: Sequence[tuple[CellSummary, CellSummary]], title: str, preamble: str) -> str:
    parts = [f"# {title}", preamble, tolerance_note()]
    for direct, gateway in pairs_:
        parts.append(f"## {direct.workload}, {direct.load}")
        parts.append(report.markdown_table(HEADERS, comparison_rows(direct, gateway)))
        parts.append(f"**{direct.load}: {verdict(direct, gateway)}**")
    return "\n\n".join(parts) + "\n"


def print_comparison(pairs_: Sequence[tuple[CellSummary, CellSummary]], console: Console) -> None:
    console.rule("gateway vs vllm serve")
    for direct, gateway in pairs_:
        title = f"{direct.workload}, {direct.load}"
        console.print(report.rich_table(HEADERS, comparison_rows(direct, gateway), title=title))
        slower = verdict(direct, gateway).startswith("gateway SLOWER")
        console.print(f"{direct.load}: {verdict(direct, gateway)}", style="bold red" if slower else "bold green")
    console.print(tolerance_note(), style="dim", markup=False, highlight=False)


def preamble(engine: Engine, options: Options) -> str:
    cmd = (options.out / "vllm-serve.cmd").read_text().strip()
    return "\n".join(
        [
            f"Engine: `{engine.gateway_model}` ({engine.target}); workload `{options.workload.name}`, "
            f"{len(options.workload.prompts)} requests per cell, max_tokens {options.settings.max_tokens}, "
            f"temperature {options.settings.temperature:g}, {WARMUP} warm-up requests per server; "
            "servers run one at a time.",
            "",
            f"- vllm serve: `{cmd}`",
            f"- specgate: `{sys.executable} -m app serve --config {options.out / 'specgate.yaml'}`",
        ]
    )


# --- command line -----------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=METHODS, default="none", help="engine of smollm2 (default none)")
    parser.add_argument("--workload", default="chat", help="code, edit, math, chat or a .jsonl file (default chat)")
    parser.add_argument("--concurrency", type=_ints, default=(1, 8, 32), help="closed-loop levels (default 1,8,32)")
    parser.add_argument("--requests", type=int, default=32, help="requests per cell (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    parser.add_argument("--out", type=Path, help="output folder (default bench-results/gateway-vs-direct-<timestamp>)")
    parser.add_argument("--cache-dir", type=Path, help="where the embedded model is converted to")
    # The machine drifts between the two runs (measured: 8% at c=8 one way, 0.5% the other):
    # run both orders and report both.
    parser.add_argument("--specgate-first", action="store_true", help="bench specgate before vllm serve")
    return parser.parse_args(argv)


def make_console() -> Console:
    # Not a terminal (a log file, CI): rich would squeeze the tables into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 200)


def options_from(args: argparse.Namespace) -> Options:
    out: Path = args.out or Path("bench-results") / f"gateway-vs-direct-{time.strftime('%Y%m%d-%H%M%S')}"
    return Options(
        workload=load_workload(args.workload, args.requests, SEED),
        loads=tuple(Load("concurrency", c) for c in args.concurrency),
        settings=RequestSettings(max_tokens=args.max_tokens, temperature=0.0),
        out=out,
    )


def finish(engine: Engine, options: Options, results: list[RequestResult], console: Console) -> None:
    cells = summarize(results, baseline=options.vllm_target)
    title = f"gateway vs vllm serve: {engine.gateway_model}"
    console.rule(title)
    report.print_tables(cells, console)
    for path in report.write_outputs(results, cells, options.out, title):
        console.log(f"wrote {path}")
    matched = pairs(cells, options.vllm_target, options.specgate_target(engine))
    print_comparison(matched, console)
    comparison = options.out / "comparison.md"
    comparison.write_text(render_comparison(matched, title, preamble(engine, options)), encoding="utf-8")
    console.log(f"wrote {comparison}")


def run(args: argparse.Namespace, console: Console) -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"
    options = options_from(args)
    engine = load_engine(args.method, args.cache_dir)
    options.out.mkdir(parents=True, exist_ok=True)
    console.log(f"engine {engine.gateway_model}: {engine.target}; results in {options.out}")
    servers = [run_vllm_serve, run_specgate]
    if args.specgate_first:
        servers.reverse()
    results: list[RequestResult] = []
    for run_server in servers:  # strictly one server after the other
        results += run_server(engine, options, console)
    finish(engine, options, results, console)
    failed = sum(not r.ok for r in results)
    if failed:
        console.log(f"[red]{failed} of {len(results)} requests failed")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = make_console()
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)])
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        return run(args, console)
    except (ConfigError, WorkloadError, BenchError, RuntimeError, TimeoutError) as exc:
        console.log(f"gateway_vs_direct: {exc}", style="red", markup=False, highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
