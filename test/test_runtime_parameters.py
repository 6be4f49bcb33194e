"""Runtime parameter changes reach every part of the node that reads them (ros/node_parameters.py):
the throttle, the command stream and its refill bound, the timers, the prefix cache, rtc; a value
set back to the one in use is no change. In-process nodes (real rclpy, nothing spinning)."""

from __future__ import annotations

import pytest
from node_harness import in_process_node

pytestmark = pytest.mark.ros


@pytest.fixture
def make_node(rclpy_context):
    """in_process_node(rclpy_context, **params), each destroyed after the test."""
    made = []

    def make(**params):
        made.append(in_process_node(rclpy_context, **params))
        return made[-1]

    yield make
    for node in made:
        node.destroy_node()


def _set(node, **values):
    from rclpy.parameter import Parameter

    results = node.set_parameters([Parameter(n, value=v) for n, v in values.items()])
    assert all(r.successful for r in results), [r.reason for r in results]


def test_a_runtime_log_throttle_reaches_the_throttled_log(make_node):
    node = make_node()
    _set(node, log_throttle_s=1.5)
    assert node.cfg.log_throttle_s == 1.5
    assert node._throttle.period_s == 1.5


def test_a_runtime_blend_and_interpolation_reach_the_command_stream(make_node):
    node = make_node(command_rate_hz=50.0)
    _set(node, command_blend_steps=3, command_interpolation="linear")
    assert (node.commands.blend_steps, node.commands.interpolation) == (3, "linear")


def test_a_runtime_command_rate_retimes_the_command_timer_and_the_refill_bound(make_node):
    """command_rate_hz 50 -> 25: the command timer ticks every 40 ms and max_move's refill after a
    gap is bounded by two of those ticks, not the old 20 ms ones."""
    node = make_node(command_rate_hz=50.0)
    assert node._command_timer.timer_period_ns == 20_000_000 and node.commands.tick_ns == 20_000_000
    _set(node, command_rate_hz=25.0)
    assert node._command_timer.timer_period_ns == 40_000_000
    assert node.commands.tick_ns == 40_000_000


def test_a_runtime_status_and_decision_rate_retime_their_timers(make_node):
    node = make_node()
    _set(node, status_rate_hz=2.0, rate_hz=20.0)
    assert node._status_timer.timer_period_ns == 500_000_000
    assert node._decision_timer.timer_period_ns == 50_000_000
    assert (node.cfg.status_rate_hz, node.cfg.rate_hz) == (2.0, 20.0)


def test_a_runtime_prefix_trigger_reaches_the_prefix_cache(make_node):
    node = make_node()
    _set(node, prefix_trigger="period", prefix_period_s=0.7)
    cache = node.state.pipeline.prefix_cache
    assert (cache.trigger, cache.period_s) == ("period", 0.7)


def test_a_runtime_rtc_setting_reaches_the_next_decision(make_node):
    node = make_node(rtc=True)
    _set(node, rtc_max_guidance=2.5, rtc_delay_steps=2)
    rtc = node.state.pipeline.rtc
    assert rtc is not None and rtc.max_guidance == 2.5 and rtc.delay_steps == 2, rtc


def test_a_runtime_set_to_the_value_in_use_logs_no_change(make_node, monkeypatch):
    """A slider set back to the value in use is no change: "parameters changed" names only what
    changed."""
    node = make_node()
    said = []
    monkeypatch.setattr(node.get_logger(), "info", lambda msg, **_: said.append(msg))
    _set(node, rate_hz=10.0, log_throttle_s=2.0)
    assert [m for m in said if m.startswith("parameters changed")] == ["parameters changed: log_throttle_s 0.5 -> 2.0"]


def test_a_guidance_cap_set_while_rtc_is_off_says_only_that_rtc_is_off(make_node, monkeypatch):
    """rtc false: a guidance weight above the policy's denoise steps changes nothing anyway; the
    only warning is that real-time chunking is off, not a cap that does not apply."""
    node = make_node()
    said = []
    monkeypatch.setattr(node.get_logger(), "warning", lambda msg, **_: said.append(msg))
    assert node.state.pipeline.rtc is None
    steps = node.state.pipeline.policy.cfg.num_steps
    _set(node, rtc_max_guidance=float(steps))  # at the cap: the next set crosses it
    said.clear()
    _set(node, rtc_max_guidance=float(steps + 50))
    assert said == [
        "rtc_max_guidance changed, but real-time chunking is off (rtc false, read at start): they take effect "
        "once the node restarts with rtc true"
    ], said
