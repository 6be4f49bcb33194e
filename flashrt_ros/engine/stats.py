"""Rolling per-stage latency percentiles and rates, for the status topic and the logs."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

RATE_SPAN_S = 10.0
"""Rates are measured over the completions of the last this many seconds (of the stats clock)."""


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
    `clock` (seconds), so a ROS node can rate its stages on the clock its timers run on. Not
    thread-safe on its own: PipelineStats, which owns them, is."""

    def __init__(self, name: str, window: int = 200, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.count = 0
        self._clock = clock
        self._latency_ms: deque[float] = deque(maxlen=window)
        self._done_at: deque[float] = deque(maxlen=window)

    def add(self, latency_ms: float, now: float | None = None) -> None:
        self.count += 1
        self._latency_ms.append(latency_ms)
        now = self._clock() if now is None else now
        if self._done_at and (now < self._done_at[-1] or self._stopped_before(now)):
            # the clock went back (a simulator reset, a bag loop, use_sim_time switched): times
            # from before are on another timeline, and a rate across both would be nonsense; or
            # the stage had stopped (a pause): a rate across the gap would read ~0 Hz for the
            # first decisions after it (2 over a minute's pause), the new rate only from the third
            self._done_at.clear()
        self._done_at.append(now)

    def summary(self, now: float | None = None) -> StageSummary:
        if not self._latency_ms:
            return StageSummary(self.name, 0, 0.0, 0.0, 0.0, 0.0)
        p50, p90, p99 = np.percentile(np.fromiter(self._latency_ms, float), [50, 90, 99])
        return StageSummary(self.name, self.count, self.rate(now), float(p50), float(p90), float(p99))

    def rate(self, now: float | None = None) -> float:
        """Completions per second over the last RATE_SPAN_S seconds of completions (at least
        the last 3 of the window), so that a new rate shows within that span and not only
        after a whole window of decisions (200 at 2 Hz: 100 s). Once the stage stops for
        longer than its mean interval, the span is taken to reach `now`, so the rate falls
        towards 0 instead of showing the last value for ever, and is 0 once nothing completed in
        the last RATE_SPAN_S or three mean intervals, whichever is longer (a stage that runs every
        20 s is not stopped 10 s after each run). A clock behind the last completion went back
        since: no rate until completions on its new timeline."""
        if len(self._done_at) < 2:
            return 0.0
        last = self._done_at[-1]
        now = self._clock() if now is None else now
        recent = self._recent()
        n, span = len(recent) - 1, recent[-1] - recent[0]
        if now < last or span <= 0 or self._stopped_before(now, recent):
            return 0.0
        end = max(last, now - span / n)
        return n / (end - recent[0])

    def _recent(self) -> list[float]:
        """The completions the rate is measured over: those of the last RATE_SPAN_S, or the last 3."""
        last = self._done_at[-1]
        recent = [t for t in self._done_at if t >= last - RATE_SPAN_S]
        return recent if len(recent) >= 3 else list(self._done_at)[-3:]

    def _stopped_before(self, now: float, recent: list[float] | None = None) -> bool:
        """Nothing completed in the last RATE_SPAN_S or three mean intervals, whichever is longer
        (one completion alone has no interval: a stage that runs every 20 s is not stopped).
        `recent`: `_recent()`, where the caller has it."""
        if len(self._done_at) < 2:
            return False
        recent = self._recent() if recent is None else recent
        mean = (recent[-1] - recent[0]) / (len(recent) - 1)
        return now - self._done_at[-1] > max(RATE_SPAN_S, 3 * mean)


class PipelineStats:
    """One StageStats per stage name, created on first use, kept in insertion order. Thread-safe:
    a node adds from its decision thread while its status timer reads from another, and reading
    a deque while it is appended to raises (which would end the node's executor)."""

    def __init__(self, window: int = 200, clock: Callable[[], float] = time.monotonic):
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            # checked here, not at the first add: there it fails a decision that has already run
            raise ValueError(f"stats_window {window!r}: expected an int >= 2 (a rate needs two completions)")
        self.window = window
        self.clock = clock
        self.stages: dict[str, StageStats] = {}
        self._lock = threading.Lock()

    def add(self, timings_ms: dict[str, float], now: float | None = None) -> None:
        with self._lock:
            for name, ms in timings_ms.items():
                self.stages.setdefault(name, StageStats(name, self.window, self.clock)).add(ms, now)

    def summaries(self, now: float | None = None) -> list[StageSummary]:
        with self._lock:
            return [s.summary(now) for s in self.stages.values()]

    def line(self) -> str:
        """One log line: 'prefix 3.1/4.0 ms | denoise 5.2/6.1 ms' (p50/p99)."""
        return " | ".join(f"{s.name} {s.p50_ms:.2f}/{s.p99_ms:.2f} ms" for s in self.summaries())
