"""A probe for overhead runs (scripts/overhead.py), not part of specgate: on
PYTHONPATH with PROBE_OUT set, each Python process writes `PROBE_OUT/<pid>.json`
with its garbage collections (count and time per generation, from start-up and
since its first detokenized token) and the time of tokenizers' `DecodeStream.step`,
vLLM's incremental detokenizer, per call.

    PYTHONPATH=.:scripts/probe PROBE_OUT=/tmp/probe python scripts/overhead.py ...

PROBE_CALLS=K also profiles the main thread (cProfile) from the K-th detokenized
token on (past the warm-up requests), written to `PROBE_OUT/<pid>.prof` every 512
tokens: calls per function, to compare what each process runs per token.

PROBE_NO_FREEZE=1 makes `gc.freeze` a no-op in the gateway (not in `vllm serve`):
the gateway as it was before it froze its start-up heap, for a before/after run.
"""

import cProfile
import gc
import json
import os
import sys
import time

OUT = os.environ.get("PROBE_OUT")


def _install(out: str) -> None:
    import tokenizers.decoders

    real = tokenizers.decoders.DecodeStream
    path = os.path.join(out, f"{os.getpid()}.json")
    os.makedirs(out, exist_ok=True)
    gcs = {"n": [0, 0, 0], "ms": [0.0, 0.0, 0.0]}
    stats: dict = {"argv": " ".join(sys.orig_argv)[:160], "steps": 0, "step_ns": 0, "gc": gcs, "gc_at_first_step": None}
    started = [0]
    calls = cProfile.Profile() if os.environ.get("PROBE_CALLS") else None
    calls_from = int(os.environ.get("PROBE_CALLS") or 0)

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
            return
        gen = info["generation"]
        gcs["n"][gen] += 1
        gcs["ms"][gen] += (time.perf_counter_ns() - started[0]) / 1e6

    def dump() -> None:
        # gc.get_freeze_count() walks the whole permanent generation (~775k objects
        # after a freeze): every 512 steps it tripled the API process's CPU per token.
        if stats["steps"] % (512 * 256) == 0:
            stats["frozen"] = gc.get_freeze_count()
        stats["threads"] = _thread_cpu()
        if calls is not None and stats["steps"] >= calls_from:
            calls.dump_stats(os.path.join(out, f"{os.getpid()}.prof"))  # stops the profile
            calls.enable()
        with open(path, "w") as f:
            json.dump(stats, f)

    class DecodeStream:  # vLLM looks the class up on the module when it builds a detokenizer
        __slots__ = ("_s",)

        def __init__(self, *args, **kwargs):
            self._s = real(*args, **kwargs)

        def step(self, tokenizer, token_id):
            t = time.perf_counter_ns()
            text = self._s.step(tokenizer, token_id)
            stats["step_ns"] += time.perf_counter_ns() - t
            stats["steps"] += 1
            if stats["steps"] == 1:
                stats["gc_at_first_step"] = json.loads(json.dumps(gcs))
            if calls is not None and stats["steps"] == calls_from:
                stats["calls_from"] = calls_from
                calls.enable()
            if stats["steps"] % 512 == 0:
                dump()
            return text

    tokenizers.decoders.DecodeStream = DecodeStream
    gc.callbacks.append(on_gc)
    if os.environ.get("PROBE_NO_FREEZE") and _is_gateway(sys.orig_argv):
        gc.freeze = lambda: None


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by thread name and id."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            fields = rest.split()
            seconds[f"{head.partition('(')[2]}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return seconds


def _is_gateway(argv: list[str]) -> bool:
    """`python -m app serve ...` (sys.argv is not set yet when this module runs)."""
    return "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == "app"


if OUT:
    _install(OUT)
