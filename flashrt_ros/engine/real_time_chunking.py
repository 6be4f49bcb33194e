"""Real-time chunking on the robot's clock: which actions of the executing chunk the next one must
agree with, and how strongly (the guidance itself: policies/guidance.py).

A chunk's action i is due at ``start + i * step``. A decision for a new chunk starting at
``start'`` lines its actions up with the executing chunk's by the shift ``k = (start' - start) /
step``: new action i is old action ``i + k`` (where k is not whole, the old chunk's trajectory
between two actions, linear), for the ``overlap`` actions the old chunk still has. The new chunk
takes over at ``takeover`` (its publication); its actions before that are never executed, and the
ones the robot executes meanwhile come from the old chunk, so the first
``delay = ceil((takeover - start') / step)`` of them are held to it with full weight, the rest of
the overlap with a weight that decays (`prefix_weights`).

The takeover is not known before the decision ends: it is estimated from the slowest of the last
decisions' latencies (`LatencyWindow`), or fixed by the caller (`delay_steps`).
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..policies.guidance import JACOBIANS, SCHEDULES, prefix_weights


@dataclass(frozen=True)
class RtcSettings:
    """max_guidance: beta, the cap of the guidance weight; schedule: how the hold decays over
    the overlap; jacobian: "identity" (both backends) or "exact" (reference backend only);
    delay_steps: actions held with full weight, or None to estimate them from the latency."""

    max_guidance: float = 5.0
    schedule: str = "exp"
    jacobian: str = "identity"
    delay_steps: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_guidance, bool) or not isinstance(self.max_guidance, numbers.Real):
            raise ValueError(f"rtc max_guidance must be a number, got {self.max_guidance!r}")
        if self.delay_steps is not None and (
            isinstance(self.delay_steps, bool) or not isinstance(self.delay_steps, numbers.Integral)
        ):
            raise ValueError(
                f"rtc delay_steps must be a whole number (or None: from the latency), got {self.delay_steps!r}"
            )
        if not (math.isfinite(self.max_guidance) and self.max_guidance > 0):
            raise ValueError(f"rtc max_guidance must be a positive number, got {self.max_guidance}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"rtc schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.jacobian not in JACOBIANS:
            raise ValueError(f"rtc jacobian must be one of {JACOBIANS}, got {self.jacobian!r}")
        if self.delay_steps is not None and self.delay_steps < 0:
            raise ValueError(f"rtc delay_steps must be >= 0 (or None: from the latency), got {self.delay_steps}")


@dataclass(frozen=True)
class ExecutingChunk:
    """The chunk the robot executes: actions [horizon, dof] in robot units, action 0 due at
    `start_ns`, one every `step_ns`. `origin` [dof]: where the robot was at `start_ns`, from which
    its trajectory runs to action 0 (NaN or None: not known)."""

    actions: np.ndarray
    start_ns: int
    step_ns: int
    origin: np.ndarray | None = None

    def trajectory_at(self, t_ns: int) -> np.ndarray:
        """Where the chunk's trajectory has the joints at `t_ns` [dof]: from `origin` at the start
        to action i at (i + 1) steps, linearly between; before its start, `origin`; past its end,
        its last action (a joint of no known origin: action 0 until one step in)."""
        n, dof = self.actions.shape
        times = self.start_ns + self.step_ns * np.arange(0, n + 1)
        first = self.actions[0].astype(np.float64)
        origin = first if self.origin is None else np.where(np.isfinite(self.origin), self.origin, first)
        path = np.concatenate([origin[None, :], self.actions.astype(np.float64)])  # [n + 1, dof]
        return np.array([np.interp(t_ns, times, path[:, j]) for j in range(dof)])


@dataclass(frozen=True)
class Hold:
    """What the next decision is held to: `target` [horizon, dof] robot units (the executing
    chunk shifted onto the new chunk's time, zeros past its end), `weights` [horizon]; the shift
    in actions, the actions held fully (`delay`) and the overlap (what the ActionChunk reports)."""

    target: np.ndarray
    weights: np.ndarray
    shift: int
    delay: int
    overlap: int


class LatencyWindow:
    """The last `size` decisions' latencies (ns). The slowest gives the takeover for the delay: it
    holds every action the robot executes before the new chunk arrives, unless a decision is
    slower than all of the recent ones. The median gives a chunk stamped at its publication its
    likely start."""

    def __init__(self, size: int = 10):
        self._recent: deque[int] = deque(maxlen=size)

    def add(self, latency_ns: int) -> None:
        self._recent.append(max(0, int(latency_ns)))

    def slowest_ns(self) -> int:
        return max(self._recent) if self._recent else 0

    def typical_ns(self) -> int:
        return int(np.median(self._recent)) if self._recent else 0


def hold(
    executing: ExecutingChunk, start_ns: int, takeover_ns: int, horizon: int, settings: RtcSettings
) -> Hold | None:
    """What a new chunk starting at `start_ns` and taking over at `takeover_ns` is held to, or
    None where it overlaps nothing of `executing` (the old chunk has ended by then, or starts
    after it: a clock that went back), or holds nothing (schedule "zeros" with no delay)."""
    step = executing.step_ns
    if step <= 0:
        raise ValueError(f"step_ns must be > 0, got {step}")
    at = (start_ns - executing.start_ns) / step  # in actions: the stamps need not be whole steps apart
    shift, old = round(at), executing.actions
    at = max(at, 0.0)  # less than half a step before the old chunk (shift 0): from its first action
    overlap = min(horizon, math.floor(old.shape[0] - 1 - at) + 1)
    if shift < 0 or overlap <= 0:
        return None
    if settings.delay_steps is not None:
        delay = settings.delay_steps
    else:
        delay = max(0, math.ceil((takeover_ns - start_ns) / step))
    target = np.zeros((horizon, old.shape[1]), dtype=np.float32)
    target[:overlap] = _along(old, at + np.arange(overlap))
    weights = prefix_weights(min(delay, overlap), overlap, horizon, settings.schedule)
    if not weights.any():
        return None
    return Hold(target, weights, shift, min(delay, overlap), overlap)


def _along(actions: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The chunk's trajectory at fractional action indices (linear between its actions, as a
    trajectory controller follows it): a new chunk stamped a fraction of a step after the old one
    is held to where the old one is at its own times, not to the nearest action (up to half a step
    off, which is a jump at the takeover). Whole indices give the actions exactly."""
    lo = np.floor(at).astype(np.int64)
    hi = np.minimum(lo + 1, actions.shape[0] - 1)
    frac = (at - lo)[:, None]
    return (1.0 - frac) * actions[lo] + frac * actions[hi]
