"""Limits on the actions before they leave the node.

A policy that diverges, a checkpoint trained on another robot, or normalisation statistics in
other units can ask for a position the arm cannot take, or a jump it cannot make in one step.
The controller may not check either (joint_trajectory_controller does not; a position controller
passes the command through), so the node limits every chunk, in robot units, before publishing:

1. the position limits: each action clamped into ``[lower, upper]``;
2. the step limit: from the joint state to action 0 (for joints the state has) and from each
   action to the next, a joint moves at most ``max_step`` per action (as LeRobot's
   ``max_relative_target`` bounds a command against the present position). A chunk that wants
   more moves at that rate instead, lagging its plan rather than jumping.

In that order the steps are always bounded, and the positions stay within the limits whenever the
joint state is: each limited action lies between the one before and its clamped target. A state
outside the limits (an arm parked beyond them) is stepped back in at ``max_step``, not jumped.
The result is in the chunk's own dtype, with the bounds rounded inwards to it, so no published
value is past a limit by a rounding. A step is bounded in float64, before the cast: in float32 it
may pass max_step by the positions' rounding (~1e-7 near 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Clamped:
    """What limiting changed in one chunk."""

    values: int  # action values changed
    joints: int  # joints with at least one changed value
    worst: str  # the largest violation, in words


@dataclass(frozen=True)
class ActionLimits:
    """Per action joint (``names``' order); None where no limit of that kind is set."""

    names: tuple[str, ...]
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    max_step: np.ndarray | None = None

    @classmethod
    def from_lists(
        cls, names: Sequence[str], lower: Sequence[float], upper: Sequence[float], max_step: Sequence[float]
    ) -> ActionLimits:
        """Each list empty (no limit), one value (every joint) or one per joint (validated before)."""

        def per_joint(values: Sequence[float]) -> np.ndarray | None:
            if len(values) == 0:
                return None
            return np.broadcast_to(np.asarray(values, dtype=np.float64), (len(names),)).copy()

        low, high = per_joint(lower), per_joint(upper)
        # -inf / inf for every joint (continuous joints) bound nothing: off, as [] is
        low = None if low is not None and np.isneginf(low).all() else low
        high = None if high is not None and np.isposinf(high).all() else high
        return cls(tuple(names), low, high, per_joint(max_step))

    @property
    def active(self) -> bool:
        return any(x is not None for x in (self.lower, self.upper, self.max_step))

    def describe(self) -> str:
        """What is on, then each joint's values (what an operator checks before engaging)."""
        parts = []
        if self.lower is not None or self.upper is not None:
            low = np.full(len(self.names), -np.inf) if self.lower is None else self.lower
            high = np.full(len(self.names), np.inf) if self.upper is None else self.upper
            bounded = int((np.isfinite(low) | np.isfinite(high)).sum())  # a continuous joint has none
            parts.append(f"positions within limits on {bounded} of {len(self.names)} joints")
        if self.max_step is not None:
            parts.append("at most action_max_step per action from the joint state")
        if not parts:
            return "none"
        return "; ".join(parts) + " (" + ", ".join(self._joint(i) for i in range(len(self.names))) + ")"

    def _joint(self, i: int) -> str:
        """'elbow [-1.5, 1.5] step 0.05' (only the limits that are on)."""
        text = self.names[i]
        if self.lower is not None or self.upper is not None:
            low = -np.inf if self.lower is None else self.lower[i]
            high = np.inf if self.upper is None else self.upper[i]
            text += f" [{low:g}, {high:g}]"
        return text + ("" if self.max_step is None else f" step {self.max_step[i]:g}")

    def apply(self, actions: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, Clamped | None]:
        """``actions`` [horizon, dof] and the joint state in the same columns (NaN where the state
        has no such joint) -> the limited actions (same dtype) and what changed (None: nothing).
        What changed is described from the policy's own chunk, before any limiting."""
        limited = actions.astype(np.float64)
        if self.lower is not None or self.upper is not None:
            limited = np.clip(limited, self.lower, self.upper)
        if self.max_step is not None:
            limited = self._rate_limited(limited, state)
        limited = self._cast_within_bounds(limited, actions.dtype)
        changed = limited != actions
        if not changed.any():
            return actions, None
        found = self._violations(actions.astype(np.float64), state, changed.any(axis=0))
        worst = max(found, default=(0.0, "values rounded to the limits"))
        return limited, Clamped(int(changed.sum()), int(changed.any(axis=0).sum()), worst[1])

    def _rate_limited(self, targets: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Each action at most max_step from the one before (the state before action 0). A chunk
        whose steps are all within it comes back as it is, to the bit."""
        previous = np.where(np.isnan(state), targets[0], state)  # no state: action 0 is free
        if (np.abs(np.diff(targets, axis=0, prepend=previous[None])) <= self.max_step).all():
            return targets  # the usual case, a chunk within its steps: no loop over the horizon
        out = targets.copy()
        step = self.max_step
        for k in range(len(out)):  # each action within max_step of the limited one before it
            np.clip(out[k], previous - step, previous + step, out=out[k])
            previous = out[k]
        return out

    def _cast_within_bounds(self, limited: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``limited`` in ``dtype``, where a value within a bound that the cast rounded past it
        (a float64 0.05 is 0.0500000007 in float32) is set to the bound rounded inwards."""
        out = limited.astype(dtype)
        for bound, up in ((self.lower, True), (self.upper, False)):
            if bound is None:
                continue
            inward = _rounded(bound, dtype.type, up=up)
            past = (out < bound) & (limited >= bound) if up else (out > bound) & (limited <= bound)
            out = np.where(past, inward, out).astype(dtype, copy=False)
        return out

    def _violations(self, actions: np.ndarray, state: np.ndarray, changed: np.ndarray) -> list[tuple[float, str]]:
        """(how far beyond, in words) for the largest violation of each kind in the policy's chunk;
        `changed`: the joints whose actions the limits changed (a state outside is named for those)."""
        found = []
        for bound, sign, word in ((self.lower, -1.0, "below its lower"), (self.upper, 1.0, "above its upper")):
            if bound is None:
                continue
            beyond = sign * (actions - bound)  # > 0 outside
            k, j = np.unravel_index(int(np.argmax(beyond)), beyond.shape)
            if beyond[k, j] > 0:
                found.append((float(beyond[k, j]), f"{self.names[j]} {actions[k, j]:.4g} {word} limit {bound[j]:.4g}"))
            outside = (sign * (state - bound) > 0) & changed  # NaN (no state) compares False
            if outside.any():
                j = int(np.argmax(np.where(outside, sign * (state - bound), -np.inf)))
                how = "stepped back in" if self.max_step is not None else "its actions clamped to the limit"
                text = f"{self.names[j]}'s joint state {state[j]:.4g} {word} limit {bound[j]:.4g} ({how})"
                found.append((float("inf"), text))  # named first: the robot itself is outside
        if self.max_step is not None:
            before = np.vstack([np.where(np.isnan(state), actions[0], state), actions[:-1]])
            over = np.abs(actions - before) - self.max_step
            k, j = np.unravel_index(int(np.argmax(over)), over.shape)
            if over[k, j] > 0:
                where = "from the joint state to action 0" if k == 0 else f"from action {k - 1} to {k}"
                step, limit = actions[k, j] - before[k, j], f"more than action_max_step {self.max_step[j]:.4g}"
                found.append((float(over[k, j]), f"{self.names[j]} moves {step:+.4g} {where}, {limit}"))
        return found


def _rounded(bound: np.ndarray, dtype: type, up: bool) -> np.ndarray:
    """`bound` in `dtype`, moved to the next representable value inwards where it rounded outwards."""
    with np.errstate(over="ignore"):  # a bound past float32's range (1e300 for no bound) rounds to inf
        rounded = bound.astype(dtype)
    outward = rounded < bound if up else rounded > bound
    return np.where(outward, np.nextafter(rounded, dtype(np.inf if up else -np.inf)), rounded).astype(dtype)
