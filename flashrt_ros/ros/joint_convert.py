"""``sensor_msgs/JointState`` -> the policy's state vector, and header-stamp freshness.

A policy's state vector has a fixed joint order (the one it was trained with), while a
robot's ``joint_states`` lists joints in whatever order its drivers merged them, often
with extra joints (grippers, wheels, passive joints). So joints are picked *by name* in
the configured order, and a joint that is missing or not finite refuses the whole
message: feeding a policy a zero or NaN for a joint it controls is worse than skipping a
decision. Stamps are checked so the policy never acts on old observations.

Only attributes are read, so real rclpy messages and plain objects both work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flashrt_ros.ros.input_error import (
    BAD_SIZE,
    DUPLICATE_JOINT,
    FUTURE_STAMP,
    MISSING_JOINT,
    NON_FINITE_JOINT,
    STALE,
    TRUNCATED_DATA,
    UNSTAMPED,
    InputError,
)

__all__ = ["joint_state_to_vector", "stamp_to_ns", "check_fresh"]

_NS_PER_S = 1_000_000_000


def joint_state_to_vector(msg: Any, joint_names: Sequence[str], source: str = "joint_states") -> np.ndarray:
    """Positions of ``joint_names``, in that order, as float32 ``[len(joint_names)]``.

    The message may order its joints differently and carry extra ones. Raises
    :class:`InputError`: ``missing_joint`` (every absent name, and what the message
    had), ``duplicate_joint`` (a wanted name listed twice: which value is meant is
    unknowable), ``truncated_data`` (fewer positions than names), ``non_finite_joint``
    (NaN/inf in a wanted joint, naming each).
    """
    names = [str(n) for n in msg.name]
    positions = msg.position
    if len(positions) != len(names):  # sensor_msgs/JointState: one position per name
        raise InputError(
            TRUNCATED_DATA if len(positions) < len(names) else BAD_SIZE,
            source,
            f"{len(positions)} positions for {len(names)} names {names}; expected one position per name",
        )
    index = _indices(names, joint_names, source)
    values = np.asarray(positions, dtype=np.float64)[index]
    with np.errstate(over="ignore"):
        single = values.astype(np.float32)  # checked after the cast: 1e39 is finite only in float64
    _check_finite(single, values, joint_names, source)
    return single


def _indices(names: list[str], joint_names: Sequence[str], source: str) -> list[int]:
    """Index of each wanted joint in the message's name list."""
    first: dict[str, int] = {}
    repeated: set[str] = set()
    for i, name in enumerate(names):
        if name in first:
            repeated.add(name)
        else:
            first[name] = i
    missing = [n for n in joint_names if n not in first]
    if missing:
        raise InputError(
            MISSING_JOINT,
            source,
            f"joints {missing} are not in the message; it has {names}; expected all of {list(joint_names)} "
            "in each message (joints published apart: merge them onto one topic, as joint_state_publisher's "
            "source_list does)",
        )
    duplicated = [n for n in joint_names if n in repeated]
    if duplicated:
        raise InputError(
            DUPLICATE_JOINT, source, f"joints {duplicated} appear more than once in {names}; expected once"
        )
    return [first[n] for n in joint_names]


def _check_finite(single: np.ndarray, given: np.ndarray, joint_names: Sequence[str], source: str) -> None:
    bad = ~np.isfinite(single)
    if bad.any():
        listed = ", ".join(f"{joint_names[i]}={given[i]}" for i in np.flatnonzero(bad))
        raise InputError(NON_FINITE_JOINT, source, f"non-finite position: {listed}; expected finite float32 values")


def stamp_to_ns(stamp: Any) -> int:
    """A ``builtin_interfaces/Time`` (``sec``, ``nanosec``) or an ``rclpy.time.Time``
    (``nanoseconds``) as integer nanoseconds; integers avoid float rounding of epoch
    times (a float64 of ~1.7e18 ns is only exact to ~256 ns)."""
    if hasattr(stamp, "nanoseconds"):
        return int(stamp.nanoseconds)
    return int(stamp.sec) * _NS_PER_S + int(stamp.nanosec)


CLOCKS_APART_S = 86400.0
"""A message stamped more than a day before it arrived is on another time base (sim time against
wall time), not from a clock that drifted or a transport that held it."""


def check_fresh(stamp: Any, now_ns: int, max_age_s: float, source: str, on_arrival: bool = False) -> float:
    """Refuse data whose header stamp is zero, older than ``max_age_s``, or more than
    ``max_age_s`` ahead of ``now_ns``; return the age in seconds (for the status topic).

    ``now_ns`` comes from the node's clock, so sim time works. A stamp far in the future
    means the publisher and the node disagree about the clock (``use_sim_time`` set on
    one side only, unsynchronised machines); accepting it would hide that forever, so it
    is refused as ``future_stamp``. Pass ``math.inf`` to check only for a stamp. ``on_arrival``:
    the message has just come in, so an old stamp is a clock behind the node's or a delay on the
    way, not a sensor that stopped (which a held sample's age at a decision means).
    """
    if max_age_s <= 0:
        raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
    nanosec = getattr(stamp, "nanosec", 0)
    if nanosec >= _NS_PER_S:
        raise InputError(UNSTAMPED, source, f"header stamp nanosec is {nanosec}; expected below 1e9")
    stamp_ns = stamp_to_ns(stamp)
    if stamp_ns == 0:
        raise InputError(UNSTAMPED, source, "header stamp is 0; expected the capture time")
    age_s = (int(now_ns) - stamp_ns) / _NS_PER_S
    if age_s > max_age_s:
        why = ""
        if on_arrival and age_s > CLOCKS_APART_S:  # no drift or delay is that long: another time base
            why = " (clocks disagree: use_sim_time on one side only?)"
        elif on_arrival:
            why = (
                " (stamped that long before it arrived: the sender's clock behind this node's, NTP / chrony?, "
                "or a transport that held it)"
            )
        raise InputError(STALE, source, f"data is {age_s:.3f} s old; expected at most {max_age_s:g} s{why}")
    if age_s < -max_age_s:
        raise InputError(
            FUTURE_STAMP,
            source,
            f"stamp is {-age_s:.3f} s ahead of the node clock; expected at most {max_age_s:g} s "
            "(clocks disagree: use_sim_time on one side only?)",
        )
    return age_s
