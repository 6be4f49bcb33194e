"""The outgoing messages' builders (flashrt_ros.ros.messages) without DDS: stamps, trajectory
times, the status and diagnostics counters, a chunk's sources. The node tests see them only
through whole decisions over DDS."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.ros  # the built flashrt_ros message types


def _snapshot(**kw):
    from flashrt_ros.ros.messages import StatusSnapshot, time_msg

    base = dict(
        stamp=time_msg(0),
        stages=[],
        target_rate_hz=10.0,
        decisions=3,
        deadline_misses=0,
        dropped_decisions=0,
        dropped_inputs=0,
    )
    return StatusSnapshot(**{**base, **kw})


def test_time_keeps_its_nanoseconds():
    from flashrt_ros.ros.messages import duration_msg, time_msg

    t = time_msg(1_234_567_890_123)
    assert (t.sec, t.nanosec) == (1234, 567_890_123)
    assert duration_msg(20_000_000).nanosec == 20_000_000


def test_trajectory_points_start_one_step_ahead():
    from flashrt_ros.ros.messages import joint_trajectory, time_msg

    msg = joint_trajectory(
        np.zeros((3, 2), np.float32), stamp=time_msg(0), frame_id="", joint_names=["a", "b"], step_ns=20_000_000
    )
    assert [p.time_from_start.nanosec for p in msg.points] == [20_000_000, 40_000_000, 60_000_000]


def test_the_stats_line_tells_waits_from_refusals_and_labels_services():
    from flashrt_ros.ros.messages import input_counts

    invalid = {("/cam", "absent"): 2, ("/cam", "bad_encoding"): 1, ("/flashrt_node/load", "unknown_capsule"): 4}
    line = input_counts(invalid, "absent", frozenset({"/cam"}))
    assert line == "1 input refusals, 2 waits for absent inputs, node: unknown_capsule (/flashrt_node/load) x4"


def test_status_counts_dropped_decisions_node_wide():
    from flashrt_ros.ros.messages import pipeline_status

    msg = pipeline_status(_snapshot(dropped_decisions=5, invalid={("/cam", "absent"): 1}))
    got = [(c.topic, c.reason, c.count) for c in msg.invalid_inputs]
    assert got == [("", "dropped_decision", 5), ("/cam", "absent", 1)]


def test_diagnostics_keys_inputs_apart_from_node_events_and_says_how_to_unpause():
    from flashrt_ros.ros.messages import diagnostics

    s = _snapshot(invalid={("/cam", "absent"): 1, ("/flashrt_node/rate_hz", "invalid_parameter"): 2}, enabled=False)
    msg = diagnostics(s, name="n", level=b"\x00", message="", paused="no (activate)", inputs=frozenset({"/cam"}))
    values = {kv.key: kv.value for kv in msg.status[0].values}
    assert values["invalid absent /cam"] == "1"
    assert values["node invalid_parameter /flashrt_node/rate_hz"] == "2"
    assert values["enabled"] == "no (activate)"


def test_a_chunk_names_every_source_stamp():
    from flashrt_ros.ros.messages import action_chunk, time_msg

    msg = action_chunk(
        np.zeros((2, 1), np.float32),
        stamp=time_msg(0),
        frame_id="",
        joint_names=["a"],
        step_ns=1,
        chunk_id=1,
        sources=[("/a", time_msg(1)), ("/b", time_msg(2))],
        latency_ms=1.0,
    )
    assert list(msg.source_topics) == ["/a", "/b"] and [s.nanosec for s in msg.source_stamps] == [1, 2]


def _snapshot_of_a_stage():
    """A status with one stage and every count different, on device cuda:1."""
    from flashrt_ros.engine.stats import StageSummary
    from flashrt_ros.ros.messages import time_msg

    stage = StageSummary(name="policy", count=7, rate_hz=9.5, p50_ms=11.0, p90_ms=22.0, p99_ms=33.0)
    counts = dict(decisions=7, deadline_misses=2, dropped_decisions=4, dropped_inputs=1)
    return _snapshot(stamp=time_msg(5_000_000_123), stages=[stage], device="cuda:1", **counts)


def test_a_chunk_carries_its_shape_latency_and_rtc_hold():
    from flashrt_ros.ros.messages import action_chunk, time_msg

    actions = np.arange(6, dtype=np.float32).reshape(3, 2)
    msg = action_chunk(
        actions,
        stamp=time_msg(1),
        frame_id="base_link",
        joint_names=["a", "b"],
        step_ns=20_000_000,
        chunk_id=9,
        sources=[],
        latency_ms=12.5,
        prefix_reused=True,
        rtc_held=4,
        rtc_overlap=7,
    )
    assert (msg.horizon, msg.action_dim, msg.chunk_id) == (3, 2, 9)
    assert list(msg.actions) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert msg.inference_latency_ms == 12.5
    assert msg.prefix_reused is True
    assert (msg.rtc_held_actions, msg.rtc_overlap) == (4, 7)
    assert msg.header.frame_id == "base_link" and msg.step_duration.nanosec == 20_000_000


def test_a_trajectory_keeps_its_frame_and_rows():
    from flashrt_ros.ros.messages import joint_trajectory, time_msg

    actions = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    msg = joint_trajectory(actions, stamp=time_msg(3), frame_id="base_link", joint_names=["a", "b"], step_ns=10)
    assert msg.header.frame_id == "base_link" and msg.header.stamp.nanosec == 3
    assert [list(p.positions) for p in msg.points] == [[1.0, 2.0], [3.0, 4.0]]


def test_status_stages_carry_target_rate_and_every_percentile():
    from flashrt_ros.ros.messages import pipeline_status

    msg = pipeline_status(_snapshot_of_a_stage())
    (st,) = msg.stages
    assert (st.name, st.target_rate_hz, st.rate_hz, st.runs) == ("policy", 10.0, 9.5, 7)
    assert (st.latency_p50_ms, st.latency_p90_ms, st.latency_p99_ms) == (11.0, 22.0, 33.0)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (5, 123)
    assert (msg.decisions, msg.deadline_misses, msg.dropped_inputs) == (7, 2, 1)


def test_diagnostics_keep_the_stamp_hardware_counts_and_extra_values():
    from flashrt_ros.ros.messages import diagnostics

    msg = diagnostics(_snapshot_of_a_stage(), name="n", level=b"\x00", message="ok", extra={"inputs": "2 cameras"})
    (status,) = msg.status
    values = {kv.key: kv.value for kv in status.values}
    assert status.hardware_id == "cuda:1"
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (5, 123)
    assert values["deadline misses"] == "2" and values["dropped decisions"] == "4"
    assert values["inputs"] == "2 cameras"
