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

Engines that share one device (`shared_device`, the default; always so on CPU)
are not independent servers: a request sent to an idle engine slows every request
of the busy one. So there the load is the model's total, a busy device keeps the
method it is running unless another is `switch_margin` better, and a method
already measured in the request's cell is explored only while the device is idle.

Load means the load a request meets over its life (app/policies/load.py): records
are learnt at the load they met, and a new request is expected to meet at least
what the requests that ended in the last `load_window_s` met.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.config import BASELINE_METHOD, AutoConfig
from app.policies.base import EngineLoad, RouteRequest, eligible
from app.policies.load import Clock, LoadMeter, RecentLoads
from app.record import RequestRecord, RouteDecision

LOAD_BANDS = ((0, "idle"), (1, "low"), (4, "mid"), (16, "high"))  # requests already at the engine

Cell = tuple[str, ...]


def load_band(busy: float) -> str:
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

    def __init__(self, methods: Sequence[str], config: AutoConfig, clock: Clock = time.monotonic) -> None:
        self.methods = list(config.methods or methods)
        self.config = config
        self.estimates = Estimates(config.memory)
        self.meter = LoadMeter(config.shared_device, clock)
        self._recent = {key: RecentLoads(config.load_window_s, clock) for key in {self._load_key(m) for m in methods}}
        self._random = random.Random(config.seed)
        fallback = config.fallback or (BASELINE_METHOD if BASELINE_METHOD in self.methods else self.methods[0])
        self.fallback = fallback

    def choose(self, request: RouteRequest, loads: dict[str, EngineLoad]) -> tuple[str, RouteDecision]:
        bucket = request.features.bucket
        candidates = eligible(self.methods, loads)
        expected = {m: self.expected_load(m, loads) for m in candidates}
        bands = {m: load_band(load) for m, load in expected.items()}
        values = self._values(candidates, bucket, bands)
        method, reason = self._best(candidates, bucket, values, loads)
        explorable = self._explorable([m for m in candidates if m != method], bucket, loads, bands)
        if explorable and self._random.random() < self.config.exploration:
            method, reason = self._least_sampled(explorable, bucket, bands), "exploration"
        decision = RouteDecision(
            policy=self.name,
            reason=reason,
            bucket=bucket,
            load=self.load_of(method, loads),
            expected_load=round(expected[method], 2),
            objective=self.config.objective,
            estimate=_round(values.get(method)),
            estimates=tuple((m, _round(v)) for m, v in values.items()),
        )
        return method, decision

    def load_of(self, method: str, loads: dict[str, EngineLoad]) -> int:
        """The load a request on `method` meets: its engine's, or the shared device's."""
        if self.config.shared_device:
            return sum(load.busy for load in loads.values())
        return loads[method].busy

    def expected_load(self, method: str, loads: dict[str, EngineLoad]) -> float:
        """The load a request on `method` will meet: at least its load now, and at
        least what the requests that ended lately met over their lives."""
        recent = self._recent[self._load_key(method)].mean()
        now = self.load_of(method, loads)
        return now if recent is None else max(now, recent)

    def _load_key(self, method: str) -> str:
        return "*" if self.config.shared_device else method

    def _best(
        self, candidates: list[str], bucket: str, values: dict[str, float | None], loads: dict[str, EngineLoad]
    ) -> tuple[str, str]:
        known = {m: v for m, v in values.items() if v is not None}
        if not known:
            return (self.fallback if self.fallback in candidates else candidates[0]), "cold_start"
        best = max(known, key=lambda m: known[m])
        running = self._running(candidates, loads)
        margin = 1 + self.config.switch_margin
        if running is not None and running != best and running in known and known[running] * margin >= known[best]:
            return running, "running"
        return best, "best_estimate" if self._measured(best, bucket) else "prior"

    def _running(self, candidates: list[str], loads: dict[str, EngineLoad]) -> str | None:
        """On a shared device, the one candidate that holds the most requests now."""
        if not self.config.shared_device:
            return None
        busiest = max(loads[m].busy for m in candidates)
        holders = [m for m in candidates if loads[m].busy == busiest]
        return holders[0] if busiest > 0 and len(holders) == 1 else None

    def _explorable(
        self, others: list[str], bucket: str, loads: dict[str, EngineLoad], bands: dict[str, str]
    ) -> list[str]:
        if not self.config.shared_device or not any(load.busy for load in loads.values()):
            return others
        cell = (bucket, bands[others[0]]) if others else ()
        return [m for m in others if self.estimates.get(m, cell).count < self.config.min_samples]

    def observe(self, record: RequestRecord) -> None:
        route = record.route
        if route is None:
            return
        recent = self._recent.get(self._load_key(record.method))
        if route.load_met is not None and recent is not None:
            recent.add(route.load_met)
        load = route.load_met if route.load_met is not None else route.load
        if route.bucket is None or load is None or record.method not in self.methods:
            return
        sample = record.objective_value(self.config.objective)
        if sample is not None:
            self.estimates.add(record.method, route.bucket, load_band(load), sample)

    def _values(self, candidates: list[str], bucket: str, bands: dict[str, str]) -> dict[str, float | None]:
        """Each candidate's estimate, all at the finest level of detail that every
        measured candidate has enough records for (at its expected load band); the
        prior of the others."""
        enough = self.config.min_samples
        measured = [m for m in candidates if self.estimates.get(m, ()).count >= enough]

        def cell(method: str, level: int) -> Cell:
            return self.estimates.levels(bucket, bands[method])[level]

        level = next(lv for lv in range(3) if all(self.estimates.get(m, cell(m, lv)).count >= enough for m in measured))
        values: dict[str, float | None] = {m: self.config.priors.get(m) for m in candidates}
        for method in measured:
            values[method] = self.estimates.get(method, cell(method, level)).value
        return values

    def _measured(self, method: str, bucket: str) -> bool:
        return self.estimates.get(method, ()).count >= self.config.min_samples

    def _least_sampled(self, methods: list[str], bucket: str, bands: dict[str, str]) -> str:
        def count(m: str) -> int:
            return self.estimates.get(m, (bucket, bands[m])).count

        fewest = min(count(m) for m in methods)
        return self._random.choice([m for m in methods if count(m) == fewest])


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
