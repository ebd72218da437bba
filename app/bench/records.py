"""What the benchmark keeps of one request: client-side timings, token counts from
`usage`, and the speculative figures the server reported for it (specgate's
`specgate` record or vLLM's `metrics.speculative_decoding`), or None where the
server reported none. One `RequestResult` is one line of `requests.jsonl`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from app.record import SpecCounts


@dataclass(frozen=True)
class Load:
    """Closed loop (`concurrency` clients, each sends when its last answer ended)
    or open loop (Poisson arrivals at `rate` requests/s)."""

    kind: str  # "concurrency" | "rate"
    value: float

    def __str__(self) -> str:
        # repr only when `g` would round: the string is the JSONL key and must parse back equal.
        value = f"{self.value:g}" if float(f"{self.value:g}") == self.value else repr(self.value)
        return f"c={value}" if self.kind == "concurrency" else f"rate={value}/s"

    @staticmethod
    def parse(text: str) -> Load:
        kind, _, value = text.partition("=")
        return Load("concurrency" if kind == "c" else "rate", float(value.removesuffix("/s")))


@dataclass(frozen=True)
class SpecSample(SpecCounts):
    """One request's speculative counts as the server reported them (the gateway's
    own arithmetic on them: steps, accepted, per position), plus the engine's N."""

    num_speculative_tokens: int

    @staticmethod
    def from_response(body: dict[str, Any]) -> SpecSample | None:
        """From specgate's `specgate` record, else vLLM's `metrics.speculative_decoding`."""
        record = body.get("specgate")
        if isinstance(record, dict) and record.get("acceptance_histogram") is not None:
            return SpecSample(
                tuple(int(c) for c in record["acceptance_histogram"]),
                int(record["num_draft_tokens"]),
                int(record["num_speculative_tokens"]),
            )
        metrics = body.get("metrics")
        vllm = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if isinstance(vllm, dict) and vllm.get("acceptance_histogram") is not None:
            histogram = tuple(int(c) for c in vllm["acceptance_histogram"])
            n = int(vllm.get("num_spec_tokens") or len(histogram) - 1)
            return SpecSample(histogram, int(vllm["num_draft_tokens"]), n)
        return None


def model_root(target: str) -> str:
    """The model of a target: `smollm2` of `smollm2:ngram`."""
    return target.partition(":")[0]


@dataclass(frozen=True)
class RequestResult:
    target: str  # the `model` sent, e.g. "smollm2:ngram"
    method: str  # table label: specgate's method name, else the target
    num_speculative_tokens: int | None  # the engine's N; None for a baseline or when unknown
    workload: str
    load: Load
    prompt_id: str
    start_s: float  # send time, seconds after the cell started
    e2e_s: float
    ttft_s: float | None = None  # to the first non-empty content delta
    itl_s: tuple[float, ...] = ()  # between successive content deltas
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # usage.completion_tokens; never counted from chunks
    spec: SpecSample | None = None
    error: str | None = None
    served_by: str | None = None  # the method that answered, from specgate's record (`auto`/`ab` targets choose)
    route_reason: str | None = None  # why the gateway routed it there (docs/api.md, `route.reason`)
    load_met: float | None = None  # the mean load it met over its life, by specgate's record (`route.load_met`)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        data = asdict(self)
        data["load"] = str(self.load)
        return json.dumps(data, separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> RequestResult:
        data = json.loads(line)
        spec = data.pop("spec")
        data["load"] = Load.parse(data["load"])
        data["itl_s"] = tuple(data["itl_s"])
        if spec is not None:
            spec["acceptance_histogram"] = tuple(spec["acceptance_histogram"])
            data["spec"] = SpecSample(**spec)
        return RequestResult(**data)
