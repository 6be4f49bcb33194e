"""Runtime parameter changes reach every part of the node that reads them (ros/node_parameters.py),
and the outgoing messages carry every field as documented (ros/messages.py). In-process nodes
(real rclpy, nothing spinning) and the pure builders."""

from __future__ import annotations

import numpy as np
import pytest
from node_harness import in_process_node

pytestmark = pytest.mark.ros


def _set(node, **values):
    from rclpy.parameter import Parameter

    results = node.set_parameters([Parameter(n, value=v) for n, v in values.items()])
    assert all(r.successful for r in results), [r.reason for r in results]


def test_a_runtime_log_throttle_reaches_the_throttled_log(rclpy_context):
    node = in_process_node(rclpy_context)
    try:
        _set(node, log_throttle_s=1.5)
        assert node.cfg.log_throttle_s == 1.5
        assert node._throttle.period_s == 1.5
    finally:
        node.destroy_node()


def test_a_runtime_blend_and_interpolation_reach_the_command_stream(rclpy_context):
    node = in_process_node(rclpy_context, command_rate_hz=50.0)
    try:
        _set(node, command_blend_steps=3, command_interpolation="linear")
        assert (node.commands.blend_steps, node.commands.interpolation) == (3, "linear")
    finally:
        node.destroy_node()


def test_a_runtime_command_rate_retimes_the_command_timer_and_the_refill_bound(rclpy_context):
    """command_rate_hz 50 -> 25: the command timer ticks every 40 ms and max_move's refill after a
    gap is bounded by two of those ticks, not the old 20 ms ones."""
    node = in_process_node(rclpy_context, command_rate_hz=50.0)
    try:
        assert node._command_timer.timer_period_ns == 20_000_000 and node.commands.tick_ns == 20_000_000
        _set(node, command_rate_hz=25.0)
        assert node._command_timer.timer_period_ns == 40_000_000
        assert node.commands.tick_ns == 40_000_000
    finally:
        node.destroy_node()


def test_a_runtime_status_and_decision_rate_retime_their_timers(rclpy_context):
    node = in_process_node(rclpy_context)
    try:
        _set(node, status_rate_hz=2.0, rate_hz=20.0)
        assert node._status_timer.timer_period_ns == 500_000_000
        assert node._decision_timer.timer_period_ns == 50_000_000
        assert (node.cfg.status_rate_hz, node.cfg.rate_hz) == (2.0, 20.0)
    finally:
        node.destroy_node()


def test_a_runtime_prefix_trigger_reaches_the_prefix_cache(rclpy_context):
    node = in_process_node(rclpy_context)
    try:
        _set(node, prefix_trigger="period", prefix_period_s=0.7)
        cache = node.state.pipeline.prefix_cache
        assert (cache.trigger, cache.period_s) == ("period", 0.7)
    finally:
        node.destroy_node()


def test_a_runtime_rtc_setting_reaches_the_next_decision(rclpy_context):
    node = in_process_node(rclpy_context, rtc=True)
    try:
        _set(node, rtc_max_guidance=2.5, rtc_delay_steps=2)
        rtc = node.state.pipeline.rtc
        assert rtc is not None and rtc.max_guidance == 2.5 and rtc.delay_steps == 2, rtc
    finally:
        node.destroy_node()


def _snapshot(**kw):
    from flashrt_ros.engine.stats import StageSummary
    from flashrt_ros.ros.messages import StatusSnapshot, time_msg

    stage = StageSummary(name="policy", count=7, rate_hz=9.5, p50_ms=11.0, p90_ms=22.0, p99_ms=33.0)
    base = dict(
        stamp=time_msg(5_000_000_123),
        stages=[stage],
        target_rate_hz=10.0,
        decisions=7,
        deadline_misses=2,
        dropped_decisions=4,
        dropped_inputs=1,
        device="cuda:1",
    )
    return StatusSnapshot(**{**base, **kw})


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

    msg = pipeline_status(_snapshot())
    (st,) = msg.stages
    assert (st.name, st.target_rate_hz, st.rate_hz, st.runs) == ("policy", 10.0, 9.5, 7)
    assert (st.latency_p50_ms, st.latency_p90_ms, st.latency_p99_ms) == (11.0, 22.0, 33.0)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (5, 123)
    assert (msg.decisions, msg.deadline_misses, msg.dropped_inputs) == (7, 2, 1)


def test_diagnostics_keep_the_stamp_hardware_counts_and_extra_values():
    from flashrt_ros.ros.messages import diagnostics

    msg = diagnostics(_snapshot(), name="n", level=b"\x00", message="ok", extra={"inputs": "2 cameras"})
    (status,) = msg.status
    values = {kv.key: kv.value for kv in status.values}
    assert status.hardware_id == "cuda:1"
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (5, 123)
    assert values["deadline misses"] == "2" and values["dropped decisions"] == "4"
    assert values["inputs"] == "2 cameras"


def test_a_runtime_set_to_the_value_in_use_logs_no_change(rclpy_context, monkeypatch):
    """A slider set back to the value in use is no change: "parameters changed" names only what
    changed."""
    node = in_process_node(rclpy_context)
    said = []
    monkeypatch.setattr(node.get_logger(), "info", lambda msg, **_: said.append(msg))
    try:
        _set(node, rate_hz=10.0, log_throttle_s=2.0)
        assert [m for m in said if m.startswith("parameters changed")] == [
            "parameters changed: log_throttle_s 0.5 -> 2.0"
        ]
    finally:
        node.destroy_node()


def test_a_guidance_cap_set_while_rtc_is_off_says_only_that_rtc_is_off(rclpy_context, monkeypatch):
    """rtc false: a guidance weight above the policy's denoise steps changes nothing anyway; the
    only warning is that real-time chunking is off, not a cap that does not apply."""
    node = in_process_node(rclpy_context)
    said = []
    monkeypatch.setattr(node.get_logger(), "warning", lambda msg, **_: said.append(msg))
    try:
        assert node.state.pipeline.rtc is None
        steps = node.state.pipeline.policy.cfg.num_steps
        _set(node, rtc_max_guidance=float(steps))  # at the cap: the next set crosses it
        said.clear()
        _set(node, rtc_max_guidance=float(steps + 50))
        assert said == [
            "rtc_max_guidance changed, but real-time chunking is off (rtc false, read at start): they take effect "
            "once the node restarts with rtc true"
        ], said
    finally:
        node.destroy_node()
