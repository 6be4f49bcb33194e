"""Rolling per-stage latency percentiles and rates, for the status topic and the logs."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StageSummary:
    name: str
    count: int
    rate_hz: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


class StageStats:
    """Keeps the last `window` latencies and completion times of one stage. Times are read from
    `clock` (seconds), so a ROS node can rate its stages on the clock its timers run on."""

    def __init__(self, name: str, window: int = 200, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.count = 0
        self._clock = clock
        self._latency_ms: deque[float] = deque(maxlen=window)
        self._done_at: deque[float] = deque(maxlen=window)

    def add(self, latency_ms: float, now: float | None = None) -> None:
        self.count += 1
        self._latency_ms.append(latency_ms)
        self._done_at.append(self._clock() if now is None else now)

    def summary(self, now: float | None = None) -> StageSummary:
        if not self._latency_ms:
            return StageSummary(self.name, 0, 0.0, 0.0, 0.0, 0.0)
        p50, p90, p99 = np.percentile(np.fromiter(self._latency_ms, float), [50, 90, 99])
        return StageSummary(self.name, self.count, self.rate(now), float(p50), float(p90), float(p99))

    def rate(self, now: float | None = None) -> float:
        """Completions per second over the window. Once the stage stops for longer than its
        mean interval, the window is taken to reach `now`, so the rate falls towards 0
        instead of showing the last value for ever."""
        n = len(self._done_at) - 1
        span = self._done_at[-1] - self._done_at[0]
        if n < 1 or span <= 0:
            return 0.0
        now = self._clock() if now is None else now
        end = max(self._done_at[-1], now - span / n)
        return n / (end - self._done_at[0])


class PipelineStats:
    """One StageStats per stage name, created on first use, kept in insertion order."""

    def __init__(self, window: int = 200, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.clock = clock
        self.stages: dict[str, StageStats] = {}

    def add(self, timings_ms: dict[str, float], now: float | None = None) -> None:
        for name, ms in timings_ms.items():
            self.stages.setdefault(name, StageStats(name, self.window, self.clock)).add(ms, now)

    def summaries(self, now: float | None = None) -> list[StageSummary]:
        return [s.summary(now) for s in self.stages.values()]

    def line(self) -> str:
        """One log line: 'prefix 3.1/4.0 ms | denoise 5.2/6.1 ms' (p50/p99)."""
        return " | ".join(f"{s.name} {s.p50_ms:.2f}/{s.p99_ms:.2f} ms" for s in self.summaries())
