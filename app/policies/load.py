"""The load a request meets over its life, not only when it arrives.

A request lasts seconds; the count of requests at its engine when it arrives says
little about the load it then runs under. At the start of a burst the first
requests find an idle device and are decided for one, though they run, for all
their seconds, beside the rest of the burst. So `auto` learns each record at the
load it met (the time-average of the busy count over its life, itself left
out), and expects a new request to meet at least what the requests that ended
lately met (`AutoConfig.load_window_s`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


@dataclass(frozen=True)
class LoadMark:
    """The meter when a request arrived."""

    time: float
    areas: dict[str, float]


class LoadMeter:
    """Busy requests per method of one model and their integral over time. On a
    shared device a request meets the model's total; otherwise its engine's."""

    def __init__(self, shared: bool, clock: Clock = time.monotonic) -> None:
        self.shared = shared
        self._clock = clock
        self._busy: dict[str, int] = {}
        self._areas: dict[str, float] = {}
        self._time = clock()

    @property
    def busy(self) -> int:
        return sum(self._busy.values())

    def change(self, method: str, delta: int) -> None:
        self._advance()
        self._busy[method] = self._busy.get(method, 0) + delta

    def mark(self) -> LoadMark:
        self._advance()
        return LoadMark(self._time, dict(self._areas))

    def met_since(self, mark: LoadMark, method: str) -> float | None:
        """The mean number of other requests beside one on `method` since `mark`,
        which it was counted in all along; None over no time."""
        self._advance()
        elapsed = self._time - mark.time
        if elapsed <= 0:
            return None
        methods = list(self._areas) if self.shared else [method]
        area = sum(self._areas.get(m, 0.0) - mark.areas.get(m, 0.0) for m in methods)
        return max(area / elapsed - 1, 0.0)

    def _advance(self) -> None:
        now = self._clock()
        elapsed = now - self._time
        for method, busy in self._busy.items():
            self._areas[method] = self._areas.get(method, 0.0) + busy * elapsed
        self._time = now


class RecentLoads:
    """The loads met by the requests that ended within the last `window_s` (none
    when it is 0)."""

    def __init__(self, window_s: float, clock: Clock = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._ended: deque[tuple[float, float]] = deque()

    def add(self, load_met: float) -> None:
        if self.window_s <= 0:
            return
        self._ended.append((self._clock(), load_met))
        self._expire()

    def mean(self) -> float | None:
        self._expire()
        if not self._ended:
            return None
        return sum(load for _, load in self._ended) / len(self._ended)

    def _expire(self) -> None:
        oldest = self._clock() - self.window_s
        while self._ended and self._ended[0][0] < oldest:
            self._ended.popleft()
