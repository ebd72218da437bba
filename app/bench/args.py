"""The arguments of `specgate bench` and `specgate tune`, apart from the commands
themselves, so that the CLI's parser does not import the bench package (rich,
httpx, the workloads) on every `specgate serve`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


class BenchError(RuntimeError):
    """The benchmark cannot run: endpoint unreachable, unknown target, nothing to send."""


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _add_request_args(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--requests", type=int, default=8, help="prompts per cell (default 8)")
    cmd.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request (default 128)")
    cmd.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy, the same text on every method")
    cmd.add_argument("--warmup", type=int, default=2, help="unrecorded requests per target first (default 2)")
    cmd.add_argument("--seed", type=int, default=0, help="prompt selection and Poisson arrivals")
    cmd.add_argument("--out", type=Path, help="output folder (default ./<command>-results/<timestamp>)")


def add_bench_args(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway, or any OpenAI-compatible server")
    cmd.add_argument("--model", help="bench every engine of this gateway model (default: every engine listed)")
    cmd.add_argument("--targets", type=_names, default=(), help="comma-separated `model` values, e.g. smollm2:ngram")
    cmd.add_argument("--baseline", help="target that counts as 1.00x (default: each model's `none` engine)")
    cmd.add_argument("--workloads", type=_names, default=("edit", "chat"), help="code, edit, math, chat or .jsonl")
    cmd.add_argument("--concurrency", type=_ints, default=None, help="closed loop levels, e.g. 1,4,16 (default 1,4)")
    cmd.add_argument("--rate", type=_floats, default=(), help="open loop: Poisson request rates per second")
    cmd.add_argument("--duration", type=float, help="seconds per cell instead of one pass over --requests prompts")
    cmd.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (env OPENAI_API_KEY)")
    cmd.add_argument("--replay", type=Path, help="re-summarize a requests.jsonl instead of sending requests")
    _add_request_args(cmd)


def add_tune_args(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--model", help="model of the config to tune (default: its first)")
    cmd.add_argument("--method", help="method of that model whose N is swept (default: its default method)")
    cmd.add_argument("--speculative-config", type=json.loads, help="JSON template instead of a configured method")
    cmd.add_argument("--n", type=_ints, help="N values (default 1..7; dflash/dspark 3,7,11,15)")
    cmd.add_argument("--lookup-max", type=_ints, default=(), help="n-gram: prompt_lookup_max values to sweep too")
    cmd.add_argument("--workload", default="edit", help="code, edit, math, chat or a .jsonl file (default edit)")
    cmd.add_argument("--concurrency", type=int, default=1, help="closed-loop concurrency (default 1)")
    cmd.add_argument("--tie-tolerance", type=float, default=0.01, help="tok/s within this fraction of the best tie")
    cmd.add_argument("--no-baseline", action="store_true", help="skip the baseline engine (no speed-up column)")
    _add_request_args(cmd)
