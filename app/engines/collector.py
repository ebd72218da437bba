"""Engine gauges, read at scrape time from each engine's `stats()` (fed by the
small vLLM stat logger attached to every engine), plus an info series naming
each engine's speculative method so queries can find a model's baseline."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.engines.base import Engine

LABELS = ["model", "method"]


class EngineCollector(Collector):
    def __init__(self, engines: Iterable[Engine]) -> None:
        self._engines = list(engines)

    def describe(self) -> list[Metric]:
        return []  # collected lazily: nothing to read before the engines exist

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("specgate_engine_up", "1 when the engine is running.", labels=LABELS)
        running = GaugeMetricFamily("specgate_engine_running_requests", "Requests the engine runs.", labels=LABELS)
        waiting = GaugeMetricFamily("specgate_engine_waiting_requests", "Requests queued in the engine.", labels=LABELS)
        kv = GaugeMetricFamily("specgate_engine_kv_cache_usage_ratio", "KV-cache use (0-1).", labels=LABELS)
        restarts = CounterMetricFamily("specgate_engine_restarts", "Restarts after the engine died.", labels=LABELS)
        info = GaugeMetricFamily(
            "specgate_engine_info",
            "Always 1: the engine's speculative method and N; "
            'synthetic="true": drafts accepted at set rates, output not the target\'s.',
            labels=[*LABELS, "speculative_method", "num_speculative_tokens", "synthetic"],
        )
        for engine in self._engines:
            labels = [engine.id.model, engine.id.method]
            stats = engine.stats()
            up.add_metric(labels, 1.0 if stats.up else 0.0)
            if stats.running_requests is not None:
                running.add_metric(labels, stats.running_requests)
            if stats.waiting_requests is not None:
                waiting.add_metric(labels, stats.waiting_requests)
            if stats.kv_cache_usage is not None:
                kv.add_metric(labels, stats.kv_cache_usage)
            restarts.add_metric(labels, stats.restarts)
            n = engine.info.num_speculative_tokens
            synthetic = str(engine.info.synthetic).lower()
            info.add_metric([*labels, engine.info.speculative_method, "" if n is None else str(n), synthetic], 1.0)
        yield from (up, running, waiting, kv, restarts, info)
