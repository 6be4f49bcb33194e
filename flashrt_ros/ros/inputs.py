"""What the node holds between messages and decisions: the latest good sample per topic,
and a per-(topic, reason) log throttle. No rclpy here beyond the stamp type."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time


@dataclass(frozen=True)
class Sample:
    """One converted, validated input. Times are ``perf_counter_ns`` (monotonic, this
    process); ``stamp`` is the message's header stamp, reported in the chunk."""

    value: np.ndarray
    stamp: Time
    arrived_ns: int  # callback entry
    ready_ns: int  # conversion done


@dataclass
class InputSlot:
    """The latest good sample of one topic, and why newer messages were refused."""

    topic: str  # resolved name
    type_name: str  # e.g. "sensor_msgs/msg/Image", as the ROS graph names it
    latest: Sample | None = None
    used: bool = True  # latest was fed to a decision (replacing an unused one counts as dropped)
    rejected_since_good: Counter = field(default_factory=Counter)
    frame_hw: tuple[int, int] | None = None  # cameras: the size frames have had since the first
    newest_frame_stamp_ns: int = 0  # newest header stamp of a fresh frame checked or taken (restart gaps)
    cleared_at: float | None = None  # when ~/reset emptied it, on the decision timer's clock (s)
    cleared_by: str = "~/reset"  # what emptied it: ~/reset, or ROS time going back
    generation: int = 0  # how many times it was emptied: a message converted across one is dropped

    def clear(self, now_s: float, by: str = "~/reset") -> None:
        self.latest, self.used, self.frame_hw, self.newest_frame_stamp_ns = None, True, None, 0
        self.generation += 1
        self.rejected_since_good.clear()
        self.cleared_at, self.cleared_by = now_s, by


class ThrottledLog:
    """At most one line per key every ``period_s``; the next line says how many were held
    back. rclpy's own throttle is per call site, which would let one noisy camera hide
    another camera's (different) problem.

    Lines go to ``logger`` (the node's rclpy logger, or anything with ``warning`` / ``error``)
    at the level each call names, and each level is logged from a line of its own below: rclpy
    keys a logger's state by the calling line and raises ValueError when one line logs at two
    severities. (One shared ``emit(...)`` line did that: a stale camera's warning followed by a
    policy error killed the node's decision timer.)"""

    LEVELS = ("info", "warning", "error")

    def __init__(self, period_s: float, logger: Any):
        self.period_s = period_s
        self.logger = logger
        self._last: dict[tuple, float] = {}
        self._held: Counter = Counter()
        self._lock = threading.Lock()

    def __call__(self, key: tuple, level: str, text: str | Callable[[], str]) -> None:
        """``level``: "info", "warning" or "error". ``text`` may be a function: it is only called for
        lines that are emitted."""
        if level not in self.LEVELS:
            raise ValueError(f"log level {level!r} for {key}: expected one of {self.LEVELS}")
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period_s:
                self._held[key] += 1
                return
            self._last[key] = now
            held = self._held.pop(key, 0)
        text = text() if callable(text) else text
        line = text + (f" (+{held} more like this in the last {now - last:.1f} s)" if held else "")
        if level == "error":
            self.logger.error(line)
        elif level == "warning":
            self.logger.warning(line)
        else:
            self.logger.info(line)

    def clear(self) -> None:
        with self._lock:
            self._last.clear()
            self._held.clear()

    def forget_held(self, first: str) -> None:
        """The held-back counts of the keys that start with `first`, not their throttle: the next
        line says only what was held after this (a new outage's, not an earlier one's)."""
        with self._lock:
            for key in [k for k in self._held if k and k[0] == first]:
                del self._held[key]
