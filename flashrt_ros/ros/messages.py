"""Outgoing messages: ActionChunk, JointTrajectory, joint commands, PipelineStatus and DiagnosticArray.

Pure builders (values in, message out) so the node stays a list of steps and the field
conventions live in one place. Chunks are on the latency path: their float arrays are
filled from raw bytes (``array.array``), which rclpy stores without a per-element check.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from flashrt_ros.engine.stats import StageSummary
from flashrt_ros.msg import ActionChunk, InputCounter, PipelineStatus, StageStats

_NS_PER_S = 1_000_000_000
DROPPED_DECISION = "dropped_decision"
"""Reason of the node-wide counter (topic "") of decisions skipped for bad or missing inputs."""


def _sec_nanosec(ns: int) -> dict[str, int]:
    return {"sec": int(ns // _NS_PER_S), "nanosec": int(ns % _NS_PER_S)}


def time_msg(ns: int) -> Time:
    return Time(**_sec_nanosec(ns))


def duration_msg(ns: int) -> Duration:
    return Duration(**_sec_nanosec(ns))


def joint_command(values: np.ndarray) -> Float64MultiArray:
    """One position per joint, in the controller's order (forward_command_controller's
    ``~/commands``: an empty layout, ``data`` as long as its joints)."""
    return Float64MultiArray(data=array.array("d", np.ascontiguousarray(values, np.float64).tobytes()))


def action_chunk(
    actions: np.ndarray,
    *,
    stamp: Time,
    frame_id: str,
    joint_names: Sequence[str],
    step_ns: int,
    chunk_id: int,
    sources: Sequence[tuple[str, Time]],
    latency_ms: float,
    prefix_reused: bool = False,
    rtc_held: int = 0,
    rtc_overlap: int = 0,
) -> ActionChunk:
    """``actions`` [horizon, dof] float32 -> ActionChunk (row-major); ``sources`` are
    (resolved topic, header stamp) of every observation the chunk was computed from; ``rtc_*``
    the real-time chunking hold it was guided by (0: none)."""
    horizon, dof = actions.shape
    msg = ActionChunk(
        horizon=horizon,
        action_dim=dof,
        chunk_id=chunk_id,
        inference_latency_ms=float(latency_ms),
        prefix_reused=bool(prefix_reused),
        rtc_held_actions=int(rtc_held),
        rtc_overlap=int(rtc_overlap),
    )
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = list(joint_names)
    msg.step_duration = duration_msg(step_ns)
    msg.actions = array.array("f", np.ascontiguousarray(actions, dtype=np.float32).tobytes())
    msg.source_topics = [topic for topic, _ in sources]
    msg.source_stamps = [s for _, s in sources]
    return msg


def joint_trajectory(
    actions: np.ndarray, *, stamp: Time, frame_id: str, joint_names: Sequence[str], step_ns: int
) -> JointTrajectory:
    """One point per action row at ``(i + 1) * step``: the first action is a target one step
    ahead, as joint_trajectory_controller expects (a point at 0 would be "already there")."""
    msg = JointTrajectory(joint_names=list(joint_names))
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    rows = np.ascontiguousarray(actions, dtype=np.float64)
    msg.points = [
        JointTrajectoryPoint(positions=array.array("d", row.tobytes()), time_from_start=duration_msg((i + 1) * step_ns))
        for i, row in enumerate(rows)
    ]
    return msg


@dataclass
class StatusSnapshot:
    """What the node reports about itself, assembled once per status period."""

    stamp: Time
    stages: list[StageSummary]
    target_rate_hz: float
    decisions: int
    deadline_misses: int
    dropped_decisions: int
    dropped_inputs: int
    prefix_reuses: int = 0
    rtc_guided: int = 0
    invalid: dict[tuple[str, str], int] = field(default_factory=dict)
    policy: str = ""
    device: str = ""
    precision: str = ""
    enabled: bool = True


def pipeline_status(s: StatusSnapshot) -> PipelineStatus:
    """``invalid`` holds (topic, reason) counts; dropped decisions are reported as the
    node-wide entry (topic "", reason "dropped_decision")."""
    msg = PipelineStatus(
        decisions=s.decisions,
        deadline_misses=s.deadline_misses,
        dropped_inputs=s.dropped_inputs,
        prefix_reuses=s.prefix_reuses,
        rtc_guided=s.rtc_guided,
        policy=s.policy,
        device=s.device,
        precision=s.precision,
        enabled=s.enabled,
    )
    msg.header.stamp = s.stamp
    msg.stages = [
        StageStats(
            name=st.name,
            target_rate_hz=float(s.target_rate_hz),
            rate_hz=float(st.rate_hz),
            latency_p50_ms=float(st.p50_ms),
            latency_p90_ms=float(st.p90_ms),
            latency_p99_ms=float(st.p99_ms),
            runs=st.count,
        )
        for st in s.stages
    ]
    counters = dict(s.invalid)
    if s.dropped_decisions:
        counters[("", DROPPED_DECISION)] = s.dropped_decisions
    msg.invalid_inputs = [InputCounter(topic=t, reason=r, count=n) for (t, r), n in sorted(counters.items())]
    return msg


def split_counts(
    invalid: dict[tuple[str, str], int], absent: str, inputs: frozenset[str]
) -> tuple[int, int, list[tuple[str, int]]]:
    """(topic, reason) counts as (messages of the `inputs` topics rejected on arrival or at a
    decision, waits for an input with no good message yet (reason `absent`), the node's other
    events as (label, count) in key order: refused parameters, a stalled clock (topic ""; the
    reason alone), refused capsule calls ("reason (service)")), so that neither of the last two reads as a bad input."""
    rejected = sum(n for (topic, reason), n in invalid.items() if topic in inputs and reason != absent)
    waits = sum(n for (topic, reason), n in invalid.items() if topic in inputs and reason == absent)
    # a service's refusals are labelled with it: three services' unknown_capsule apart
    events = [
        (f"{reason} ({topic})" if topic else reason, n)
        for (topic, reason), n in sorted(invalid.items())
        if topic not in inputs
    ]
    return rejected, waits, events


def input_counts(invalid: dict[tuple[str, str], int], absent: str, inputs: frozenset[str]) -> str:
    """The stats line's counts (`split_counts`)."""
    rejected, waits, events = split_counts(invalid, absent, inputs)
    node_wide = ", ".join(f"{reason} x{n}" for reason, n in events)
    line = f"{rejected} input refusals, {waits} waits for absent inputs"
    return line + (f", node: {node_wide}" if node_wide else "")


def diagnostics(
    s: StatusSnapshot,
    *,
    name: str,
    level: bytes,
    message: str,
    extra: dict[str, str] | None = None,
    paused: str = "no (~/enable)",
    inputs: frozenset[str] = frozenset(),
) -> DiagnosticArray:
    """One DiagnosticStatus for the node (for rqt_robot_monitor / diagnostic_aggregator).
    `paused`: the value `enabled` takes while paused (what un-pauses this kind of node). The
    counts of the `inputs` topics are keyed "invalid <reason> <topic>"; the node's other events
    (a refused parameter or capsule call, a chunk that ended, a stalled clock, an output's
    incompatible subscriber) "node <reason> [<topic or service>]", as the stats line keeps them
    apart (`split_counts`): none reads as a bad input."""
    values = {
        "policy": s.policy,
        "device": s.device,
        "precision": s.precision,
        "target rate (Hz)": f"{s.target_rate_hz:g}",
        "decisions": str(s.decisions),
        "dropped decisions": str(s.dropped_decisions),
        "deadline misses": str(s.deadline_misses),
        "prefix reuses": str(s.prefix_reuses),
        "rtc guided": str(s.rtc_guided),
        "enabled": "yes" if s.enabled else paused,
    }
    for st in s.stages:
        values[f"{st.name} p50/p99 (ms)"] = f"{st.p50_ms:.2f}/{st.p99_ms:.2f}"
    for (topic, reason), count in sorted(s.invalid.items()):
        kind = "invalid" if topic in inputs else "node"
        values[f"{kind} {reason} {topic}" if topic else f"{kind} {reason}"] = str(count)
    values.update(extra or {})
    status = DiagnosticStatus(level=level, name=name, message=message, hardware_id=s.device)
    status.values = [KeyValue(key=k, value=v) for k, v in values.items()]
    msg = DiagnosticArray(status=[status])
    msg.header.stamp = s.stamp
    return msg
