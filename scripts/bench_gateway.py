"""Benchmark a running specgate gateway: what each speculative-decoding method buys.

For every (workload, concurrency, method) cell the script sends `--requests`
streamed chat completions to the target `<model>:<method>` under closed-loop
load: `concurrency` workers each take the next prompt of the workload
round-robin and send it as soon as their previous request finished. Every
request is `stream: true`, `temperature: 0`, with `stream_options.include_usage`
so that the final chunk carries `usage` and the gateway's per-request `specgate`
record. Token counts and speculative figures come only from those two fields,
never from counting streamed chunks.

Per cell it reports:

* output tok/s: sum of completion tokens / wall-clock seconds of the cell
  (first send to last finish, warm-up excluded);
* speed-up: that tok/s divided by the baseline method ("none") tok/s for the
  same workload and concurrency;
* client TTFT (time to the first non-empty content delta), mean and p50, in ms;
* MAL, the token-weighted mean acceptance length
  1 + sum(accepted draft tokens) / sum(speculative steps), "n/a" for a method
  that does not speculate.

Workloads: "repeat" (prompts whose answer mostly copies the prompt, where n-gram
drafting shines) and "chat" (open-ended prompts).

Run it against a gateway that is already serving, e.g.:

    .venv/bin/python scripts/bench_gateway.py --url http://127.0.0.1:8000 \\
        --methods none,ngram --concurrency 1,8 --requests 8 --out bench.md

The table is printed with rich, then again as GitHub markdown on stdout (and
written to `--out` if given) for pasting into a README. The script exits
non-zero if the gateway is unreachable or any request fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

BASELINE = "none"
TIMEOUT = httpx.Timeout(600, connect=10)
HEADERS = (
    "workload",
    "concurrency",
    "method",
    "requests",
    "output tok/s",
    "speed-up",
    "TTFT mean ms",
    "TTFT p50 ms",
    "MAL",
)

_FUNCTION = '''def merge_intervals(intervals):
    """Merge overlapping closed intervals."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    result = []
    for start, end in merged:
        result.append((start, end))
    return result'''

_PARAGRAPH = (
    "The cat sat by the window every morning. The cat watched the birds in the garden, "
    "and when the sun grew warm the cat slept on the red cushion. In the evening the cat "
    "waited by the door for the children to come home from school."
)

_CONFIG = """{
  "server": {"host": "0.0.0.0", "port": 8080, "workers": 4},
  "database": {"host": "db.internal", "port": 5432, "name": "orders", "pool_size": 10},
  "cache": {"host": "cache.internal", "port": 6379, "ttl_seconds": 300},
  "logging": {"level": "info", "format": "json", "file": "/var/log/app.log"}
}"""

REPEAT_PROMPTS: tuple[str, ...] = (
    "Repeat this list exactly, one item per line: apple, banana, cherry, grape, lemon, mango, "
    "orange, peach, pear, plum, kiwi, melon, papaya, apricot, fig, lime",
    "Repeat this list exactly, one item per line: lion, tiger, zebra, giraffe, elephant, monkey, "
    "rabbit, horse, sheep, goat, wolf, fox, bear, deer, otter, eagle",
    "Repeat this list exactly, one item per line: Paris, London, Berlin, Madrid, Rome, Vienna, "
    "Prague, Warsaw, Lisbon, Dublin, Oslo, Stockholm, Helsinki, Athens, Budapest, Brussels",
    f"Copy this Python function unchanged:\n\n{_FUNCTION}",
    f"Rewrite this Python function, renaming the variable `merged` to `combined` and changing "
    f"nothing else:\n\n{_FUNCTION}",
    f"Rewrite this paragraph, replacing every 'cat' with 'dog' and changing nothing else:\n\n{_PARAGRAPH}",
    f"Copy this JSON document unchanged:\n\n{_CONFIG}",
    f"Rewrite this JSON document with the port of the server changed to 9090 and everything else "
    f"unchanged:\n\n{_CONFIG}",
)

CHAT_PROMPTS: tuple[str, ...] = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue.",
    "What are three good habits for staying productive when working from home?",
    "Describe how a bicycle works to a ten-year-old.",
    "Write a short poem about autumn leaves.",
    "What is the difference between weather and climate?",
    "Give me some ideas for a birthday party for a friend who loves hiking.",
    "Explain how a computer stores numbers in memory.",
)

WORKLOADS: dict[str, tuple[str, ...]] = {"repeat": REPEAT_PROMPTS, "chat": CHAT_PROMPTS}


class BenchError(Exception):
    """A failure that ends the benchmark with a non-zero exit."""


@dataclass(frozen=True)
class RequestResult:
    ttft_s: float | None
    e2e_s: float
    completion_tokens: int
    record: dict[str, Any]


@dataclass
class CellResult:
    workload: str
    concurrency: int
    method: str
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(r.completion_tokens for r in self.results)
        return tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def ttfts_ms(self) -> list[float]:
        return [r.ttft_s * 1000 for r in self.results if r.ttft_s is not None]

    @property
    def mal(self) -> float | None:
        records = [r.record for r in self.results if r.record.get("num_spec_steps") is not None]
        steps = sum(int(rec["num_spec_steps"]) for rec in records)
        if steps == 0:
            return None
        accepted = sum(int(rec["num_accepted_draft_tokens"]) for rec in records)
        return 1.0 + accepted / steps


@dataclass
class StreamState:
    started: float
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    record: dict[str, Any] | None = None
    done: bool = False


def comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def comma_ints(value: str) -> list[int]:
    try:
        numbers = [int(item) for item in comma_list(value)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {value!r}") from exc
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {value!r}")
    return numbers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    parser.add_argument("--model", default="smollm2", help="model id; targets are <model>:<method>")
    parser.add_argument("--methods", type=comma_list, default="none,ngram", help="comma list of methods")
    parser.add_argument("--concurrency", type=comma_ints, default="1,8", help="comma list of levels")
    parser.add_argument("--requests", type=int, default=8, help="measured requests per cell")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens of every request")
    parser.add_argument("--workloads", type=comma_list, default="repeat,chat", help="repeat and/or chat")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted warm-up requests per cell")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
    if args.requests < 1 or args.max_tokens < 1 or args.warmup < 0:
        parser.error("--requests and --max-tokens must be >= 1, --warmup >= 0")
    return args


def error_text(body: bytes) -> str:
    """The OpenAI error body, compact, or the raw text if it is not JSON."""
    text = body.decode(errors="replace")
    try:
        return json.dumps(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        return text[:500]


async def check_gateway(client: httpx.AsyncClient, targets: Sequence[str]) -> None:
    try:
        resp = await client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise BenchError(f"gateway not reachable at {client.base_url}: {exc!r}") from exc
    if resp.status_code != 200:
        raise BenchError(f"GET /v1/models: HTTP {resp.status_code}: {error_text(resp.content)}")
    served = {m["id"] for m in resp.json().get("data", [])}
    missing = [t for t in targets if t not in served]
    if missing:
        raise BenchError(f"gateway does not serve {missing}; it serves {sorted(served)}")


def request_body(target: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": target,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": max_tokens,
    }


def handle_event(state: StreamState, payload: str, target: str) -> None:
    if payload == "[DONE]":
        state.done = True
        return
    try:
        chunk = json.loads(payload)
    except ValueError as exc:
        raise BenchError(f"{target}: malformed SSE event: {payload[:200]!r}") from exc
    if "error" in chunk:
        raise BenchError(f"{target}: error event in stream: {json.dumps(chunk['error'])}")
    if state.ttft_s is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
        state.ttft_s = time.perf_counter() - state.started
    if chunk.get("usage") is not None:
        state.usage = chunk["usage"]
    if chunk.get("specgate") is not None:
        state.record = chunk["specgate"]


def finish(state: StreamState, target: str) -> RequestResult:
    if not state.done:
        raise BenchError(f"{target}: stream ended without data: [DONE]")
    if state.usage is None or state.record is None:
        raise BenchError(f"{target}: final chunk lacks usage or the specgate record")
    e2e = time.perf_counter() - state.started
    return RequestResult(state.ttft_s, e2e, int(state.usage["completion_tokens"]), state.record)


async def send(client: httpx.AsyncClient, target: str, prompt: str, max_tokens: int) -> RequestResult:
    state = StreamState(started=time.perf_counter())
    body = request_body(target, prompt, max_tokens)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                text = error_text(await resp.aread())
                raise BenchError(f"{target}: HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if line.startswith("data:") and not state.done:
                    handle_event(state, line[len("data:") :].strip(), target)
    except httpx.HTTPError as exc:
        raise BenchError(f"{target}: request failed: {exc!r}") from exc
    return finish(state, target)


@dataclass
class PlanState:
    """The shared request counter of one cell, plus what its workers need."""

    model: str
    max_tokens: int
    total: int
    progress: Progress
    task: TaskID
    sent: int = 0

    def take(self) -> int | None:
        if self.sent >= self.total:
            return None
        self.sent += 1
        return self.sent - 1

    def advance(self) -> None:
        self.progress.advance(self.task)


async def worker(client: httpx.AsyncClient, cell: CellResult, prompts: Sequence[str], plan: PlanState) -> None:
    while (index := plan.take()) is not None:
        target = f"{plan.model}:{cell.method}"
        cell.results.append(await send(client, target, prompts[index % len(prompts)], plan.max_tokens))
        plan.advance()


async def warm_up(client: httpx.AsyncClient, args: argparse.Namespace, method: str, prompts: Sequence[str]) -> None:
    for i in range(args.warmup):
        await send(client, f"{args.model}:{method}", prompts[i % len(prompts)], args.max_tokens)


async def run_cell(
    client: httpx.AsyncClient, args: argparse.Namespace, cell: CellResult, plan: PlanState
) -> CellResult:
    prompts = WORKLOADS[cell.workload]
    await warm_up(client, args, cell.method, prompts)
    started = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(cell.concurrency):
                group.create_task(worker(client, cell, prompts, plan))
    except BaseExceptionGroup as group_error:
        raise first_error(group_error) from None
    cell.wall_s = time.perf_counter() - started
    return cell


def first_error(group_error: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first failure of a task group (BenchError, usually), not the group."""
    exc = group_error.exceptions[0]
    return first_error(exc) if isinstance(exc, BaseExceptionGroup) else exc


def make_progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


async def run_all(args: argparse.Namespace) -> list[CellResult]:
    cells = [
        CellResult(workload, concurrency, method)
        for workload in args.workloads
        for concurrency in args.concurrency
        for method in args.methods
    ]
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    async with httpx.AsyncClient(base_url=args.url, timeout=TIMEOUT, limits=limits) as client:
        await check_gateway(client, [f"{args.model}:{m}" for m in args.methods])
        with make_progress() as progress:
            for cell in cells:
                label = f"{cell.workload} c={cell.concurrency} {cell.method}"
                task = progress.add_task(label, total=args.requests)
                plan = PlanState(args.model, args.max_tokens, args.requests, progress, task)
                await run_cell(client, args, cell, plan)
    return cells


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def speed_up(cell: CellResult, cells: Sequence[CellResult]) -> float | None:
    for base in cells:
        if (base.method, base.workload, base.concurrency) == (BASELINE, cell.workload, cell.concurrency):
            return cell.tokens_per_s / base.tokens_per_s if base.tokens_per_s > 0 else None
    return None


def table_rows(cells: Sequence[CellResult]) -> list[list[str]]:
    rows = []
    for cell in cells:
        ttfts = cell.ttfts_ms
        rows.append(
            [
                cell.workload,
                str(cell.concurrency),
                cell.method,
                str(len(cell.results)),
                fmt(cell.tokens_per_s),
                "n/a" if (s := speed_up(cell, cells)) is None else f"{s:.2f}x",
                fmt(statistics.fmean(ttfts) if ttfts else None, 0),
                fmt(statistics.median(ttfts) if ttfts else None, 0),
                fmt(cell.mal, 2),
            ]
        )
    return rows


def rich_table(rows: Sequence[Sequence[str]], title: str) -> Table:
    table = Table(title=title)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i in (0, 2) else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    right = "---:"
    aligns = [":---" if i in (0, 2) else right for i in range(len(HEADERS))]
    lines = ["| " + " | ".join(HEADERS) + " |", "| " + " | ".join(aligns) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace, cells: Sequence[CellResult]) -> None:
    rows = table_rows(cells)
    title = f"specgate {args.url} model={args.model} max_tokens={args.max_tokens} temperature=0"
    # Not a terminal (piped, CI log): do not squeeze the table into 80 columns.
    Console(width=None if sys.stdout.isatty() else 140).print(rich_table(rows, title))
    markdown = markdown_table(rows)
    if args.out is not None:
        args.out.write_text(markdown)
    print()
    print(markdown, end="")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cells = asyncio.run(run_all(args))
    except BenchError as exc:
        Console(stderr=True).print(f"bench failed: {exc}", style="bold red", markup=False, highlight=False)
        return 1
    report(args, cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
