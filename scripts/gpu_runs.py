"""The GPU runs of docs/benchmarks.md, "On a GPU": each run a subcommand, every table
printed from the files the runs leave (and written beside them as markdown).

    python3 scripts/gpu_runs.py overhead --out OUT/overhead   # specgate against `vllm serve`, same engine
    python3 scripts/gpu_runs.py engines --out OUT/engines     # every method's engine, speed-up, saturation
    python3 scripts/gpu_runs.py scale --out OUT/scale         # three engines through N API processes
    python3 scripts/gpu_runs.py tables OUT                    # every table again, from the files

Run on the GPU host after scripts/gpu_install.py (its environment file sourced).

`overhead` is scripts/overhead.py with the GPU engine below: ngram N=4, concurrency
1, 16, 64 and 256, two interleaved passes, one py-spy profile of each API process.

`engines` starts, all at once on the one GPU (torch.compile and CUDA graphs on,
a fixed KV budget each so that concurrent starts need no memory profiling):
- one gateway per group of generated drafters (EAGLE-3, DFlash, draft model, DSpark,
  MiMo native MTP; random weights and constant-token probes) and checks each engine's
  greedy answers against the baseline's, token for token, and each probe's accepted
  drafts against what the baseline's answer predicts (app/drafters/common.py);
- a gateway of `none`, `ngram` and `suffix`, and one `vllm serve` for each of them.
Then `specgate bench` (edit, code, chat at concurrency 1, 8, 32) on that gateway:
speed-up, MAL and speed-up / MAL; last, the three engines under load at once, once
through the gateway and once through the three `vllm serve`: total tok/s and the
cores each front-end process used.

`scale` (issue 20) puts that load on one gateway with N API processes for each N of
`--api-processes`, then on three `vllm serve`: a warm-up pass, then the measured one
(and with `--profile` one more under py-spy), sampling the cores of every front-end
process and every EngineCore. `scale.json` grows as each front end ends, so the run
can be split over several device calls.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.bench.gateway import ServerProcess, core_starts, free_port, start_gateway, start_server  # noqa: E402
from app.cli import read_config  # noqa: E402
from app.config import Settings  # noqa: E402
from app.drafters.common import probe_accepts, probe_token  # noqa: E402
from app.engines.vllm_command import VLLM_SERVE, serve_args  # noqa: E402
from scripts.overhead import bench_argv, profiled  # noqa: E402

MODEL = "smollm2"
GiB = 2**30
# The measured engine: the embedded model in bf16, compiled, CUDA graphs on.
GPU_ENGINE: dict[str, Any] = {
    "dtype": "bfloat16",
    "enforce_eager": False,
    "max_num_seqs": 256,
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.1,
    "kv_cache_memory_bytes": 4 * GiB,
}
# The engines that are only checked: fewer sequences, fewer CUDA graphs to capture.
CHECK_ENGINE: dict[str, Any] = {
    **GPU_ENGINE,
    "max_num_seqs": 32,
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.05,
    "kv_cache_memory_bytes": 2 * GiB,
}
SERVED = ("none", "ngram", "suffix")  # the speed-up and saturation engines
SUFFIX_N = 8
PROMPTS = [
    "Describe the history of the city of Rome in a few sentences.",
    "List the names of the planets of the solar system.",
    "What is the capital of France, and what is it famous for?",
]
MAX_TOKENS = 64
SATURATION_C = 128  # clients per engine
# `--quick`: a smoke run of this script on a CPU machine (tiny loads, the CPU engine settings).
QUICK_ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_num_seqs": 8,
    "max_model_len": 2048,
    "kv_cache_memory_bytes": GiB // 4,
}
BENCH = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
keep = ("completed", "failed", "total_output_tokens", "output_throughput", "mean_tpot_ms", "duration")
print("RESULT " + json.dumps({k: result[k] for k in keep if k in result}))
"""


@dataclass(frozen=True)
class Checked:
    """One speculative engine checked against a baseline engine (both `model:method`)."""

    group: str
    engine: str
    method: str  # vLLM's speculative method
    kind: str | None  # the generated drafter (or, for native MTP, the generated target)
    n: int
    baseline: str
    baseline_group: str

    @property
    def probe(self) -> bool:
        return bool(self.kind and self.kind.endswith("-probe"))


CHECKED = [
    Checked("eagle3", f"{MODEL}:eagle3", "eagle3", "eagle3", 3, f"{MODEL}:none", "eagle3"),
    Checked("eagle3", f"{MODEL}:eagle3_probe", "eagle3", "eagle3-probe", 3, f"{MODEL}:none", "eagle3"),
    Checked("dflash", f"{MODEL}:dflash", "dflash", "dflash", 3, f"{MODEL}:none", "eagle3"),
    Checked("dflash", f"{MODEL}:dflash_probe", "dflash", "dflash-probe", 3, f"{MODEL}:none", "eagle3"),
    Checked("draft", f"{MODEL}:draft_model", "draft_model", "draft-model", 3, f"{MODEL}:none", "eagle3"),
    Checked("draft", f"{MODEL}:draft_model_probe", "draft_model", "draft-model-probe", 3, f"{MODEL}:none", "eagle3"),
    Checked("dspark", f"{MODEL}:dspark", "dspark", "dspark", 3, f"{MODEL}:none", "eagle3"),
    Checked("mtp", "mimo:mtp", "mtp", "mimo-mtp-probe", 1, "mimo:none", "mtp"),
    Checked("mtp_random", "mimo_random:mtp", "mtp", "mimo-mtp", 1, "mimo:none", "mtp"),
    Checked("served", f"{MODEL}:ngram", "ngram", None, 4, f"{MODEL}:none", "served"),
    Checked("served", f"{MODEL}:suffix", "suffix", None, SUFFIX_N, f"{MODEL}:none", "served"),
]


def speculative(check: Checked) -> dict[str, Any]:
    config: dict[str, Any] = {"method": check.method, "num_speculative_tokens": check.n}
    if check.method == "ngram":
        config.update(prompt_lookup_min=2, prompt_lookup_max=4)
    elif check.kind and check.method != "mtp":  # native MTP: the drafter is the target's own layer
        config["model"] = f"generated:{check.kind}"
    return {"speculative_config": config}


def target_of(check: Checked) -> str:
    return f"generated:{check.kind}" if check.method == "mtp" else f"embedded:{MODEL}"


def group_configs(quick: bool) -> dict[str, dict[str, Any]]:
    """group -> the gateway config's `models`."""
    groups: dict[str, dict[str, Any]] = {}
    for check in CHECKED:
        model, _, method = check.engine.partition(":")
        engine = QUICK_ENGINE if quick else GPU_ENGINE if check.group == "served" else CHECK_ENGINE
        models = groups.setdefault(check.group, {})
        block = models.setdefault(model, {"target": target_of(check), "engine": engine, "methods": {}})
        block["methods"][method] = speculative(check)
        block.setdefault("default_method", method)
    for check in CHECKED:
        model = groups[check.baseline_group][check.baseline.partition(":")[0]]
        model["methods"] = {"none": {}, **model["methods"]}
        model["default_method"] = "none"
    return groups


# ---- servers ----


@dataclass
class Started:
    name: str
    server: ServerProcess
    started: float
    ready_s: float | None = None
    error: str | None = None

    def failed(self, error: Exception) -> None:
        """The first line of the error and the log's last error lines (vLLM's reason)."""
        lines = [line for line in self.server.log().splitlines() if "rror" in line or "specgate:" in line]
        self.error = (str(error).splitlines()[0][:300] + " | " + " / ".join(lines[-3:]))[:900]


def start_all(out: Path, groups: dict[str, dict[str, Any]]) -> dict[str, Started]:
    """Every gateway, and one `vllm serve` per served engine, at once."""
    servers: dict[str, Started] = {}
    for group, models in groups.items():
        config = out / f"{group}.yaml"
        config.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
        log = out / f"{group}.log"
        try:
            servers[group] = Started(group, start_gateway(log, config), time.monotonic())
        except RuntimeError as error:  # exited before it listened: vLLM refused the config
            servers[group] = Started(group, ServerProcess(subprocess.Popen(["true"]), 0, log, group), time.monotonic())
            servers[group].failed(error)
    if "served" in groups:
        servers.update(start_vllm_serves(out, out / "served.yaml"))
    return servers


def start_vllm_serves(out: Path, config_file: Path) -> dict[str, Started]:
    """One `vllm serve` per served engine of `config_file`, from `specgate vllm-command`'s line."""
    servers = {}
    model = read_config(Settings(config=config_file)).models[MODEL]
    for method in SERVED:
        port = free_port()
        line = [*VLLM_SERVE, "--model", *serve_args(MODEL, model, method), "--host", "127.0.0.1", "--port", str(port)]
        (out / f"vllm-serve-{method}.cmd").write_text(" ".join(line) + "\n")
        name = f"vllm-serve-{method}"
        servers[name] = Started(
            name, start_server(line, port, out / f"{name}.log", name, "/v1/models"), time.monotonic()
        )
    return servers


def wait_all(servers: dict[str, Started], deadline: float) -> None:
    for s in servers.values():
        try:
            if s.error is None:
                s.server.wait_ready(max(deadline - time.monotonic(), 1))
                s.ready_s = time.monotonic() - s.started
        except (RuntimeError, TimeoutError) as error:
            s.failed(error)
        state = f"ready in {s.ready_s:.0f} s" if s.ready_s else s.error
        print(f"{s.name}: {state}", flush=True)


def stop(servers: list[Started]) -> None:
    for s in servers:
        if s.server.proc.poll() is None:
            s.server.proc.send_signal(2)
    for s in servers:
        try:
            s.server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            s.server.proc.kill()


# ---- every method's engine ----


def ask(url: str, engine: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": engine,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()
    data = reply.json()
    return {
        "tokens": [t["token"] for t in data["choices"][0]["logprobs"]["content"]],
        "record": data.get("specgate") or {},
    }


def first_difference(a: list[str], b: list[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class CheckResult:
    engine: str
    kind: str | None
    n: int
    ready_s: float | None
    error: str | None = None
    equal: int = 0  # prompts whose greedy answer equals the baseline's, token for token
    first_differences: list[int | None] = field(default_factory=list)
    accepted: int = 0
    predicted: int | None = None
    mal: float | None = None
    acceptance_rate: float | None = None


def check_engines(servers: dict[str, Started], target: Path) -> list[CheckResult]:
    from tokenizers import Tokenizer

    probe = Tokenizer.from_file(str(target / "tokenizer.json")).decode([probe_token(target)])
    results = []
    baselines: dict[tuple[str, str, int], list[str]] = {}

    def baseline(group: str, engine: str, prompt: str, max_tokens: int) -> list[str]:
        key = (engine, prompt, max_tokens)
        if key not in baselines:
            baselines[key] = ask(servers[group].server.url, engine, prompt, max_tokens)["tokens"]
        return baselines[key]

    for check in CHECKED:
        if check.group not in servers or check.baseline_group not in servers:
            continue
        started = servers[check.group]
        result = CheckResult(check.engine, check.kind, check.n, started.ready_s, started.error)
        results.append(result)
        if started.error or servers[check.baseline_group].error:
            result.error = result.error or "the baseline's gateway did not start"
            continue
        steps = drafts = 0
        predicted = 0
        try:
            for prompt in PROMPTS:
                expected = baseline(check.baseline_group, check.baseline, prompt, MAX_TOKENS)
                answer = ask(started.server.url, check.engine, prompt, MAX_TOKENS)
                result.first_differences.append(first_difference(answer["tokens"], expected))
                result.equal += answer["tokens"] == expected
                record = answer["record"]
                result.accepted += record.get("num_accepted_draft_tokens") or 0
                steps += record.get("num_spec_steps") or 0
                drafts += record.get("num_draft_tokens") or 0
                if check.probe:
                    longer = baseline(check.baseline_group, check.baseline, prompt, MAX_TOKENS + check.n)
                    predicted += probe_accepts(longer, probe, check.n, limit=len(expected))
        except httpx.HTTPError as error:
            result.error = f"{type(error).__name__}: {error}"[:300]
        result.predicted = predicted if check.probe else None
        result.mal = 1 + result.accepted / steps if steps else None
        result.acceptance_rate = result.accepted / drafts if drafts else None
    return results


# ---- speed-up ----


def speedup(url: str, out: Path, timeout_s: float, quick: bool) -> None:
    targets = ",".join(f"{MODEL}:{m}" for m in SERVED)
    cmd = [sys.executable, "-m", "app", "bench", "--url", url, "--targets", targets]
    if quick:
        cmd += ["--workloads", "chat", "--concurrency", "1", "--requests", "2", "--max-tokens", "16", "--warmup", "0"]
    else:
        cmd += ["--workloads", "edit,code,chat", "--concurrency", "1,8,32", "--requests", "16", "--max-tokens", "128"]
    cmd += ["--out", str(out)]
    with (out.parent / "speedup.log").open("w") as log:
        subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)


# ---- saturation ----


def bench_client(url: str, model: str, tokenizer: str, concurrency: int, prompts: int) -> subprocess.Popen[str]:
    """One bench client process (several at once must not share one Python process)."""
    args = bench_argv(url, model, tokenizer, concurrency, prompts, input_len=128, output_len=128)
    return subprocess.Popen([sys.executable, "-c", BENCH, *args], stdout=subprocess.PIPE, text=True)


@contextmanager
def cpu_sampler(pids: dict[str, int], interval_s: float = 0.5) -> Iterator[dict[str, list[tuple[float, float]]]]:
    """(time, CPU seconds) of each process every `interval_s`: its core use over any window."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
    procs = {name: psutil.Process(pid) for name, pid in pids.items()}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for name, proc in procs.items():
                times = proc.cpu_times()
                samples[name].append((time.monotonic(), times.user + times.system))
            done.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


def cores(samples: list[tuple[float, float]], window_s: float = 2.0) -> tuple[float, float]:
    """Mean core use over the samples, and the busiest `window_s` window."""
    if len(samples) < 2:
        return 0.0, 0.0
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    step = max(1, round(window_s / ((t1 - t0) / (len(samples) - 1))))
    peak = (
        max(
            (samples[i + step][1] - samples[i][1]) / (samples[i + step][0] - samples[i][0])
            for i in range(len(samples) - step)
        )
        if len(samples) > step
        else (c1 - c0) / (t1 - t0)
    )
    return (c1 - c0) / (t1 - t0), peak


def engine_cores(servers: list[ServerProcess]) -> dict[str, int]:
    """The EngineCore of each speculative method, by the start line it logged: its core use
    says whether the engine or the front end is the ceiling."""
    return {f"core-{spec or 'none'}": pid for s in servers for pid, spec in core_starts(s.log())}


def saturate(
    front: str,
    targets: list[tuple[str, str]],
    pids: dict[str, int],
    tokenizer: str,
    clients_each: int,
    cores_of: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The three engines at once, `clients_each` clients each (vLLM's bench client, one process per engine).
    The mean core use includes the clients' start (they import vLLM); the busiest window is the load's."""
    started = time.monotonic()
    cores_of = cores_of or {}
    with cpu_sampler({**pids, **cores_of}) as samples:
        clients = [bench_client(url, model, tokenizer, clients_each, clients_each * 5) for url, model in targets]
        outputs = [c.communicate(timeout=600)[0] for c in clients]
    results = []
    for out in outputs:
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        results.append(json.loads(line.removeprefix("RESULT ")) if line else {})
    wall = time.monotonic() - started
    use = {name: cores(s) for name, s in samples.items()}
    return {
        "front": front,
        "engines": [m for _, m in targets],
        "per_engine_tok_s": [r.get("output_throughput") for r in results],
        "total_tok_s": sum(r.get("output_throughput") or 0 for r in results),
        "failed": sum(r.get("failed", 0) or 0 for r in results),
        "wall_s": wall,
        "cores": {name: {"mean": u[0], "peak_2s": u[1]} for name, u in use.items() if name not in cores_of},
        "engine_cores": {name: {"mean": u[0], "peak_2s": u[1]} for name, u in use.items() if name in cores_of},
    }


# ---- the run ----


def engines_run(out: Path, budget_s: float, only: set[str] | None, quick: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    deadline = began + budget_s
    groups = {g: c for g, c in group_configs(quick).items() if only is None or g in only}
    servers = start_all(out, groups)
    summary: dict[str, Any] = {}
    try:
        wait_all(servers, began + budget_s * 0.55)
        summary["ready_s"] = {n: s.ready_s for n, s in servers.items()}
        summary["errors"] = {n: s.error for n, s in servers.items() if s.error}
        summary["gpu_memory"] = gpu_memory()
        target = Path(read_config(Settings(config=None)).models[MODEL].target)
        checks = check_engines(servers, target)
        (out / "methods.json").write_text(json.dumps([asdict(c) for c in checks], indent=1))
        print(methods_table(checks), flush=True)
        stop([s for n, s in servers.items() if n not in ("served", *(f"vllm-serve-{m}" for m in SERVED))])
        served = servers.get("served")
        if served is None:
            return 0
        if served.error is None and deadline - time.monotonic() > 120:
            speedup(served.server.url, out / "speedup", max(deadline - time.monotonic() - 90, 30), quick)
            print(speedup_table(out / "speedup"), flush=True)
        runs = []
        vllm_up = all(servers[f"vllm-serve-{m}"].error is None for m in SERVED)
        if served.error is None and vllm_up and deadline - time.monotonic() > 60:
            gateway_pid = {"specgate": served.server.proc.pid}
            targets = [(served.server.url, f"{MODEL}:{m}") for m in SERVED]
            clients = 2 if quick else SATURATION_C
            runs.append(saturate("specgate (one process, 3 engines)", targets, gateway_pid, str(target), clients))
            pids = {f"vllm-serve-{m}": servers[f"vllm-serve-{m}"].server.proc.pid for m in SERVED}
            targets = [(servers[f"vllm-serve-{m}"].server.url, MODEL) for m in SERVED]
            if deadline - time.monotonic() > 45:
                runs.append(saturate("vllm serve (3 processes)", targets, pids, str(target), clients))
            (out / "saturation.json").write_text(json.dumps(runs, indent=1))
            print(saturation_table(runs), flush=True)
    finally:
        (out / "startup.json").write_text(json.dumps(summary, indent=1))
        stop(list(servers.values()))
    return 0


def api_processes(gateway: ServerProcess, count: int, timeout_s: float = 600) -> dict[str, int]:
    """The supervisor and its API processes (every child that is not an EngineCore),
    once each has said its engines are up."""
    lines = [f"API process {i} of {count}: engines up" for i in range(count)]
    deadline = time.monotonic() + timeout_s
    while count > 1 and not all(line in gateway.log() for line in lines):
        if time.monotonic() > deadline or gateway.proc.poll() is not None:
            raise RuntimeError(f"not every API process came up:\n{gateway.log()[-2000:]}")
        time.sleep(1)
    pids = {"supervisor" if count > 1 else "specgate": gateway.proc.pid}
    children = psutil.Process(gateway.proc.pid).children()
    front = [c for c in children if "spawn_main" in " ".join(c.cmdline())]  # not the cores, not the resource tracker
    pids.update({f"api-{i}": c.pid for i, c in enumerate(sorted(front, key=lambda c: c.create_time()))})
    return pids


def scale_run(
    out: Path, counts: list[int], vllm_serve: bool, quick: bool, profile: bool = False, warm_up: bool = True
) -> int:
    """Three engines at once through one gateway with N API processes, for each N,
    then through three `vllm serve` (issue 20: front-end scale-out). Each run is added to
    `scale.json` as it ends, so a run split over several calls (or cut short) keeps what it measured."""
    out.mkdir(parents=True, exist_ok=True)
    models = group_configs(quick)["served"]
    tokenizer = read_config(Settings(config=None)).models[MODEL].target  # the embedded model's folder
    clients = 2 if quick else SATURATION_C
    results = out / "scale.json"
    runs: list[dict[str, Any]] = json.loads(results.read_text()) if results.exists() else []

    def keep(run: dict[str, Any]) -> None:
        runs.append(run)
        results.write_text(json.dumps(runs, indent=1))
        print(saturation_table([run]), flush=True)

    def measure(
        front: str,
        targets: list[tuple[str, str]],
        pids: dict[str, int],
        cores_of: dict[str, int],
        tag: str,
        ready_s: float | None = None,
    ) -> None:
        """The load once, kept (after a warm-up pass, also kept, unless --no-warm-up); with
        --profile, once more with py-spy on every front-end process and EngineCore
        (collapsed stacks, profile-[specgate-N-]<process>.txt): apart from the measured
        pass, since sampling takes some CPU of its own."""
        if warm_up:  # the first load after a start runs slower (2026-12-05, H100: vllm serve 0.79x its second)
            keep(saturate(f"{front} (warm-up pass)", targets, pids, tokenizer, clients, cores_of))
        keep({**saturate(front, targets, pids, tokenizer, clients, cores_of), "ready_s": ready_s})
        if not profile:
            return
        with ExitStack() as stack:
            for name, pid in {**pids, **cores_of}.items():
                if name != "supervisor":
                    stack.enter_context(profiled(pid, out / f"profile-{tag}{name}.txt"))
            keep(saturate(f"{front} (under py-spy)", targets, pids, tokenizer, clients, cores_of))

    for count in counts:
        config = out / f"served-{count}.yaml"
        config.write_text(yaml.safe_dump({"models": models, "server": {"api_processes": count}}, sort_keys=False))
        gateway = Started(f"specgate-{count}", start_gateway(out / f"specgate-{count}.log", config), time.monotonic())
        try:
            wait_all({gateway.name: gateway}, time.monotonic() + 600)
            if gateway.error is not None:
                continue
            pids = api_processes(gateway.server, count)
            targets = [(gateway.server.url, f"{MODEL}:{m}") for m in SERVED]
            front = f"specgate, {count} API process{'es' if count > 1 else ''}"
            measure(front, targets, pids, engine_cores([gateway.server]), f"specgate-{count}-", gateway.ready_s)
        finally:
            stop([gateway])
    if vllm_serve:
        config = out / "served.yaml"
        config.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
        servers = start_vllm_serves(out, config)
        try:
            wait_all(servers, time.monotonic() + 600)
            if all(s.error is None for s in servers.values()):
                pids = {name: s.server.proc.pid for name, s in servers.items()}
                targets = [(servers[f"vllm-serve-{m}"].server.url, MODEL) for m in SERVED]
                cores_of = engine_cores([s.server for s in servers.values()])
                measure("vllm serve (3 processes)", targets, pids, cores_of, "")
        finally:
            stop(list(servers.values()))
    print(saturation_table(runs), flush=True)
    return 0


def gpu_memory() -> str | None:
    """What every process holds on the GPU now (nvidia-smi), or None without one."""
    query = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def overhead_run(out: Path, extra: list[str]) -> int:
    cmd = [sys.executable, str(REPO / "scripts" / "overhead.py"), "--method", "ngram", "--concurrency", "1,16,64,256"]
    cmd += ["--passes", "2", "--input-len", "128", "--output-len", "128", "--prompts-per-client", "6"]
    cmd += ["--min-prompts", "32", "--profile", "16", "--engine", json.dumps(GPU_ENGINE), "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=REPO, check=False).returncode


# ---- tables ----


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def methods_table(checks: list[CheckResult]) -> str:
    rows = []
    for c in checks:
        if c.error and not c.first_differences:
            rows.append(
                [c.engine, c.kind or "-", str(c.n), fmt(c.ready_s, ".0f"), f"did not run: {c.error}", "", "", ""]
            )
            continue
        same = f"{c.equal}/{len(c.first_differences)}"
        differ = [d for d in c.first_differences if d is not None]
        if differ:
            same += f" (first difference at token {', '.join(map(str, differ))})"
        probe = f"{c.accepted} / {c.predicted}" if c.predicted is not None else f"{c.accepted} / -"
        rows.append(
            [c.engine, c.kind or "-", str(c.n), fmt(c.ready_s, ".0f"), same, probe, fmt(c.mal), fmt(c.acceptance_rate)]
        )
    header = ["engine", "generated", "N", "ready s", "greedy = baseline", "accepted / predicted", "MAL", "AR"]
    return markdown(header, rows)


def speedup_table(folder: Path) -> str:
    path = folder / "summary.csv"
    if not path.exists():
        return f"(no {path})"
    with path.open() as f:
        cells = list(csv.DictReader(f))
    rows = []
    for cell in cells:
        speed, mal = cell.get("speedup") or None, cell.get("mal") or None
        ratio = float(speed) / float(mal) if speed and mal else None
        rows.append(
            [
                cell["workload"],
                cell["load"],
                cell["method"],
                fmt(float(cell["output_tokens_per_s"]), ".0f"),
                fmt(float(speed) if speed else None),
                fmt(float(mal) if mal else None),
                fmt(ratio),
            ]
        )
    return markdown(["workload", "load", "method", "tok/s", "speed-up", "MAL", "speed-up / MAL"], rows)


def core_use(use: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{n} {u['mean']:.2f} (peak {u['peak_2s']:.2f})" for n, u in use.items())


def saturation_table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        per = " / ".join(fmt(t, ".0f") for t in r["per_engine_tok_s"])
        use = core_use(r["cores"])
        engines = core_use(r.get("engine_cores", {}))
        rows.append([r["front"], fmt(r["total_tok_s"], ".0f"), per, str(r["failed"]), use, engines or "not sampled"])
    return markdown(
        [
            "front end",
            "total tok/s",
            "tok/s per engine (none / ngram / suffix)",
            "failed",
            "front-end cores: mean (busiest 2 s)",
            "EngineCore cores: mean (busiest 2 s)",
        ],
        rows,
    )


def tables(root: Path) -> int:
    overhead = root / "overhead" / "overhead.md"
    sections: list[tuple[str, Callable[[], str]]] = [
        ("specgate against vllm serve", lambda: overhead.read_text() if overhead.exists() else "(not run)"),
        (
            "every method's engine",
            lambda: methods_table(
                [CheckResult(**c) for c in json.loads((root / "engines" / "methods.json").read_text())]
            ),
        ),
        ("speed-up", lambda: speedup_table(root / "engines" / "speedup")),
        ("saturation", lambda: saturation_table(json.loads((root / "engines" / "saturation.json").read_text()))),
    ]
    for title, table in sections:
        try:
            text = table()
        except FileNotFoundError as error:
            text = f"(not run: {error.filename})"
        print(f"\n## {title}\n\n{text}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="run", required=True)
    over = sub.add_parser("overhead", help="specgate against vllm serve on one engine")
    over.add_argument("--out", type=Path, required=True)
    eng = sub.add_parser("engines", help="every method's engine, speed-up, saturation")
    eng.add_argument("--out", type=Path, required=True)
    eng.add_argument("--budget-s", type=float, default=540, help="stop starting new steps after this long")
    eng.add_argument("--groups", help="only these gateway groups (include the baselines': eagle3, mtp, served)")
    eng.add_argument("--quick", action="store_true", help="a smoke run on a CPU machine: tiny loads")
    scale = sub.add_parser("scale", help="three engines through N API processes, and through three vllm serve")
    scale.add_argument("--out", type=Path, required=True)
    scale.add_argument("--api-processes", dest="counts", default="1,2,4", help="the values of N, comma-separated")
    both = argparse.BooleanOptionalAction
    scale.add_argument("--vllm-serve", action=both, default=True, help="then three vllm serve")
    scale.add_argument("--quick", action="store_true", help="a smoke run on a CPU machine: tiny loads")
    scale.add_argument("--profile", action="store_true", help="then each load again under py-spy")
    scale.add_argument("--warm-up", action=both, default=True, help="a pass before the measured one")
    tab = sub.add_parser("tables", help="print every table from a run's folder")
    tab.add_argument("root", type=Path)
    args, extra = parser.parse_known_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.run == "overhead":
        return overhead_run(args.out, extra)
    if args.run == "engines":
        only = set(args.groups.split(",")) if args.groups else None
        return engines_run(args.out, args.budget_s, only, args.quick)
    if args.run == "scale":
        counts = [int(n) for n in args.counts.split(",") if n]
        return scale_run(args.out, counts, args.vllm_serve, args.quick, args.profile, args.warm_up)
    return tables(args.root)


if __name__ == "__main__":
    sys.exit(main())
