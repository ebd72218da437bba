"""What several API processes cost `auto` (issue 20): each process learns only from the
records it serves, so each has about 1/N of the evidence. The `auto` evaluation of
docs/auto.md (none, ngram, then auto per cell, on docs/auto/sweep.yaml), run once per
N through `specgate serve --api-processes N`, and `auto` against the best fixed method
per cell (app/bench/policy_eval.py) for each N.

    .venv/bin/python scripts/auto_processes.py --api-processes 1,2 --out docs/auto/processes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from app.bench.gateway import start_gateway

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "docs" / "auto" / "sweep.yaml"


def run(count: int, out: Path, bench: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(SWEEP.read_text())
    config["server"] = {"api_processes": count}
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    gateway = start_gateway(out / "gateway.log", path)
    try:
        gateway.wait_ready()
        cmd = [sys.executable, "-m", "app", "bench", "--url", gateway.url, *bench, "--out", str(out)]
        subprocess.run(cmd, cwd=REPO, check=True)
    finally:
        gateway.interrupt()
    subprocess.run([sys.executable, "-m", "app.bench.policy_eval", str(out)], cwd=REPO, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-processes", default="1,2", help="the values of N, comma-separated")
    parser.add_argument("--out", type=Path, required=True, help="one folder per N under it: n1, n2, ...")
    parser.add_argument("--workloads", default="edit,chat")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--duration", default="20", help="seconds per target and cell")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bench = ["--targets", "smollm2:none,smollm2:ngram,smollm2:auto", "--workloads", args.workloads]
    bench += ["--concurrency", args.concurrency, "--duration", args.duration, "--max-tokens", "48", "--warmup", "2"]
    for count in (int(n) for n in args.api_processes.split(",")):
        run(count, args.out / f"n{count}", bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
