"""Where a process spent its time, from py-spy's collapsed stacks (`--format raw`, as
scripts/overhead.py and `scripts/gpu_runs.py scale --profile` write them): the samples,
the share of each area (a frame of that area anywhere in the stack), and the functions
with the most samples of their own.

    python3 scripts/profile_summary.py docs/benchmarks/gpu-h200/scale/profile-*.txt --top 12
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

# A sample's area is that of the innermost frame whose file path holds one of these:
# the code that was running, or the nearest code of ours that called it.
AREAS = {
    "specgate (app/)": "app/",
    "vLLM serving layer (vllm/entrypoints/)": "vllm/entrypoints/",
    "vLLM engine (vllm/v1/engine/: the client in an API process, the busy loop in an EngineCore)": "vllm/v1/engine/",
    "vLLM scheduler (vllm/v1/core/)": "vllm/v1/core/",
    "vLLM speculative proposers (vllm/v1/spec_decode/)": "vllm/v1/spec_decode/",
    "vLLM executor and workers (vllm/v1/executor/, vllm/v1/worker/)": "vllm/v1/",
    "tokenizers and detokenizer": "tokeniz",
    "ZeroMQ": "zmq/",
    "HTTP (uvicorn, starlette)": "uvicorn/",
    "pydantic": "pydantic/",
    "prometheus_client": "prometheus_client/",
    "asyncio": "asyncio/",
}
# Innermost frames that are a wait: an event loop in select, a busy loop yielding.
WAITS = ("Runner.run (", "sched_yield (", "Poller.poll (", "Condition.wait (", "select (", "_run_once (")
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::\d+)?\)$")


def stacks(path: Path) -> Counter[tuple[str, ...]]:
    """Each stack (outermost frame first, line numbers dropped) and its samples."""
    counts: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        frames = []
        for raw in head.split(";"):
            match = FRAME.match(raw)
            frames.append(f"{match['func']} ({match['file']})" if match else raw)
        counts[tuple(frames)] += int(count)
    return counts


def area_of(frames: tuple[str, ...]) -> str:
    if frames[-1].startswith(WAITS):
        return "waiting (event loop in select, busy loop yielding)"
    for frame in reversed(frames):
        for area, marker in AREAS.items():
            if marker in frame.rpartition(" (")[2]:
                return area
    return "other"


def summary(path: Path, top: int) -> str:
    counts = stacks(path)
    total = sum(counts.values())
    if not total:
        return f"## {path.name}\n\nno samples\n"
    areas: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, n in counts.items():
        own[frames[-1]] += n
        areas[area_of(frames)] += n
    lines = [f"## {path.name}", "", f"{total} samples (py-spy leaves out idle threads)", ""]
    lines += ["| area (innermost frame of it) | share of samples |", "|---|---|"]
    lines += [f"| {area} | {100 * n / total:.1f}% |" for area, n in areas.most_common()]
    lines += ["", "| function (own samples) | share |", "|---|---|"]
    lines += [f"| `{frame}` | {100 * n / total:.1f}% |" for frame, n in own.most_common(top)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=10, help="how many functions by their own samples")
    args = parser.parse_args()
    print("\n".join(summary(path, args.top) for path in args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
