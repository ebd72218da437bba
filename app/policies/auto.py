"""The `auto` policy: for each request, the method with the highest expected
objective (output tokens/s, or decode tokens/s for the latency objective) for
requests like it at the load each engine has now.

Estimates are decayed means over the records of a cell (method, feature bucket,
load band), read at the finest level where every known candidate has enough
records: (bucket, load), then (bucket), then the method overall. A method with no
records yet counts with its prior, if configured; with neither, only exploration
reaches it. A fixed share of requests (`exploration`) goes to the least-sampled
other candidate, so a method that turned slow or fast is noticed; nothing else
explores. Records come from every request of the model (explicit, A/B, shadow),
not only from its own choices.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from app.config import BASELINE_METHOD, AutoConfig
from app.metrics import RequestRecord, RouteDecision
from app.policies.base import EngineLoad, RouteRequest, eligible

LOAD_BANDS = ((0, "idle"), (1, "low"), (4, "mid"), (16, "high"))  # requests already at the engine

Cell = tuple[str, ...]


def load_band(busy: int) -> str:
    band = LOAD_BANDS[0][1]
    for lower, name in LOAD_BANDS:
        if busy >= lower:
            band = name
    return band


@dataclass
class Estimate:
    """A decayed mean: the plain mean for the first `memory` records, then an
    exponential average of weight 1/memory."""

    value: float = 0.0
    count: int = 0

    def add(self, sample: float, memory: int) -> None:
        self.count += 1
        self.value += (sample - self.value) / min(self.count, memory)


class Estimates:
    """Per method, per cell, per level of detail."""

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self._cells: dict[tuple[str, Cell], Estimate] = {}

    @staticmethod
    def levels(bucket: str, band: str) -> tuple[Cell, ...]:
        return (bucket, band), (bucket,), ()

    def add(self, method: str, bucket: str, band: str, sample: float) -> None:
        for cell in self.levels(bucket, band):
            self._cells.setdefault((method, cell), Estimate()).add(sample, self.memory)

    def get(self, method: str, cell: Cell) -> Estimate:
        return self._cells.get((method, cell), Estimate())

    def table(self) -> list[dict[str, object]]:
        """Every cell, for GET /policy."""
        return [
            {"method": method, "cell": "/".join(cell) or "all", "value": round(e.value, 3), "count": e.count}
            for (method, cell), e in sorted(self._cells.items())
        ]


class AutoPolicy:
    name = "auto"

    def __init__(self, methods: Sequence[str], config: AutoConfig) -> None:
        self.methods = list(config.methods or methods)
        self.config = config
        self.estimates = Estimates(config.memory)
        self._random = random.Random(config.seed)
        fallback = config.fallback or (BASELINE_METHOD if BASELINE_METHOD in self.methods else self.methods[0])
        self.fallback = fallback

    def choose(self, request: RouteRequest, loads: dict[str, EngineLoad]) -> tuple[str, RouteDecision]:
        bucket = request.features.bucket
        candidates = eligible(self.methods, loads)
        values = self._values(candidates, bucket, loads)
        known = {m: v for m, v in values.items() if v is not None}
        if not known:
            method = self.fallback if self.fallback in candidates else candidates[0]
            reason = "cold_start"
        else:
            method = max(known, key=lambda m: known[m])
            reason = "best_estimate" if self._measured(method, bucket) else "prior"
        others = [m for m in candidates if m != method]
        if others and self._random.random() < self.config.exploration:
            method, reason = self._least_sampled(others, bucket, loads), "exploration"
        decision = RouteDecision(
            policy=self.name,
            reason=reason,
            bucket=bucket,
            load=loads[method].busy,
            objective=self.config.objective,
            estimate=_round(values.get(method)),
            estimates=tuple((m, _round(v)) for m, v in values.items()),
        )
        return method, decision

    def observe(self, record: RequestRecord) -> None:
        route = record.route
        if route is None or route.bucket is None or route.load is None or record.method not in self.methods:
            return
        sample = record.objective_value(self.config.objective)
        if sample is not None:
            self.estimates.add(record.method, route.bucket, load_band(route.load), sample)

    def _values(self, candidates: list[str], bucket: str, loads: dict[str, EngineLoad]) -> dict[str, float | None]:
        """Each candidate's estimate, all at the finest level of detail that every
        measured candidate has enough records for; the prior of the others."""
        enough = self.config.min_samples
        measured = [m for m in candidates if self.estimates.get(m, ()).count >= enough]

        def cell(method: str, level: int) -> Cell:
            return self.estimates.levels(bucket, load_band(loads[method].busy))[level]

        level = next(lv for lv in range(3) if all(self.estimates.get(m, cell(m, lv)).count >= enough for m in measured))
        values: dict[str, float | None] = {m: self.config.priors.get(m) for m in candidates}
        for method in measured:
            values[method] = self.estimates.get(method, cell(method, level)).value
        return values

    def _measured(self, method: str, bucket: str) -> bool:
        return self.estimates.get(method, ()).count >= self.config.min_samples

    def _least_sampled(self, methods: list[str], bucket: str, loads: dict[str, EngineLoad]) -> str:
        def count(m: str) -> int:
            return self.estimates.get(m, (bucket, load_band(loads[m].busy))).count

        fewest = min(count(m) for m in methods)
        return self._random.choice([m for m in methods if count(m) == fewest])


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
