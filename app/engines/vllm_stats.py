"""Stat loggers attached to every in-process vLLM engine.

vLLM's own Prometheus logger unregisters all `vllm:*` collectors whenever an
engine starts, so with several engines in one process only the last survives.
Passing a PrometheusStatLogger subclass stops vLLM from adding its own; ours
registers nothing. A second, per-engine logger keeps the latest scheduler
snapshot (running, waiting, KV-cache use) for the engine's `stats()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats


class SilentPrometheusStatLogger(PrometheusStatLogger):  # type: ignore[misc]
    """Takes the place of vLLM's Prometheus logger and records nothing."""

    def __init__(self, vllm_config: VllmConfig, engine_indexes: list[int] | None = None):
        # Deliberately no super().__init__: it would unregister every vllm:* metric.
        self.engine_indexes = engine_indexes or [0]

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        return None

    def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None


@dataclass
class SchedulerSnapshot:
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None


class SnapshotStatLogger(StatLoggerBase):  # type: ignore[misc]
    """Copies the last SchedulerStats of one engine into a shared snapshot."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0, snapshot: SchedulerSnapshot | None = None):
        self.snapshot = snapshot if snapshot is not None else SchedulerSnapshot()

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is None:
            return
        self.snapshot.running = scheduler_stats.num_running_reqs
        self.snapshot.waiting = scheduler_stats.num_waiting_reqs
        self.snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage

    def log_engine_initialized(self) -> None:
        return None
