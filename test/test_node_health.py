"""The node's health as ~/status and /diagnostics say it, judged on in-process nodes with their
inputs and timings set by hand (ros/node_status.py): the idle and hang limits, a paused node,
deadline misses, a twin publisher, unheard outputs, and the stats line."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.ros


def _health(node):
    return node._health(*node._snapshot_with_baseline(advance=True))


def _fresh_inputs(node):
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    stamp = Time(nanoseconds=node.get_clock().now().nanoseconds).to_msg()
    for slot in node.slots[:-1]:
        slot.latest = Sample(np.zeros((24, 32, 3), np.uint8), stamp, 0, 0)
    node.slots[-1].latest = Sample(np.zeros(14, np.float32), stamp, 0, 0)


def test_the_idle_error_waits_two_decision_periods_at_a_slow_rate(rclpy_context):
    """rate_hz 1, status 5 Hz: the idle limit is two periods (2 s): 1.5 s idle is no ERROR."""
    import time

    from diagnostic_msgs.msg import DiagnosticStatus
    from node_harness import in_process_node, past_start

    node = in_process_node(rclpy_context, rate_hz=1.0)
    try:
        assert node._idle_limit_s() == pytest.approx(2.0)
        past_start(node)
        _fresh_inputs(node)
        node._last_decision_at = time.monotonic() - 1.5
        level, message = _health(node)
        assert level != DiagnosticStatus.ERROR, message
    finally:
        node.destroy_node()


def test_hung_is_judged_by_the_slowest_recent_decision_not_the_fastest(rclpy_context):
    """one 0.5 s decision among 0.05 s ones: hung after 10 x 0.5 s, and the WARN names 0.50 s."""
    from node_harness import in_process_node

    node = in_process_node(rclpy_context)
    try:
        node._decision_s.extend([0.05] * 7 + [0.5])
        assert node._hung_after_s() == pytest.approx(5.0)
        assert node._yardstick() == (0.5, "the slowest of the last ones")
    finally:
        node.destroy_node()


def test_a_new_miss_is_counted_not_also_said_as_ongoing(rclpy_context):
    """misses in this status are its count; the 'last decision missed' note is for a status
    that saw none."""
    from node_harness import in_process_node, past_start

    node = past_start(in_process_node(rclpy_context))
    try:
        _fresh_inputs(node)
        node._last_missed = 0.3
        node.deadline_misses += 1
        level, message = _health(node)
        assert "1 deadline misses since the last status" in message, message
        assert "the last decision missed" not in message, message
    finally:
        node.destroy_node()


def test_stats_log_period_0_logs_nothing(rclpy_context, capfd):
    """stats_log_period_s 0 = never (TEST_PARAMS sets 0)."""
    from node_harness import in_process_node

    node = in_process_node(rclpy_context)
    try:
        assert node.cfg.stats_log_period_s == 0.0
        capfd.readouterr()
        node._maybe_log_stats(node.snapshot())
        assert "stats:" not in capfd.readouterr().err
    finally:
        node.destroy_node()


def test_a_twin_is_logged_once(rclpy_context, capfd):
    """the twin publisher's warning is logged once, said in every status."""
    from node_harness import in_process_node

    node = in_process_node(rclpy_context)
    try:
        node.count_publishers = lambda topic: 2
        capfd.readouterr()
        assert "1 other publisher(s)" in node._twin() and "1 other publisher(s)" in node._twin()
        assert capfd.readouterr().err.count("Both take this name's parameters") == 1
    finally:
        node.destroy_node()


def test_a_command_stream_heard_on_any_of_its_topics_is_heard(rclpy_context):
    """the command stream is heard when any one of its topics has a subscriber."""
    from node_harness import in_process_node

    node = in_process_node(rclpy_context)
    saved = node._group_pubs, node._command_pubs
    try:
        pub = lambda name, n: (SimpleNamespace(topic_name=name, get_subscription_count=lambda: n), None, None)  # noqa: E731
        node._group_pubs, node._command_pubs = [], [pub("/a/cmd", 1), pub("/b/cmd", 0)]
        assert node._unheard_outputs() == []
        node._command_pubs = [pub("/a/cmd", 0), pub("/b/cmd", 0)]
        assert node._unheard_outputs() == ["/a/cmd or /b/cmd"]
    finally:
        node._group_pubs, node._command_pubs = saved
        node.destroy_node()


def test_the_stats_line_of_a_paused_node_says_paused_not_a_rate(rclpy_context):
    from node_harness import in_process_node

    node = in_process_node(rclpy_context)
    try:
        node.enabled = False
        line = node.stats_line()
        assert line.startswith("stats: PAUSED (~/enable), 0 decisions (paused), "), line
    finally:
        node.destroy_node()


def test_the_stats_line_rate_is_the_node_overheads(rclpy_context):
    """the decisions' rate is node_overhead's, not the first stage's (a prefix stage under
    prefix_trigger period runs less often)."""
    import dataclasses

    from node_harness import in_process_node

    from flashrt_ros.engine.stats import StageSummary

    node = in_process_node(rclpy_context)
    try:
        stages = [StageSummary("prefix", 1, 2.0, 1.0, 1.0, 1.0), StageSummary("node_overhead", 10, 10.0, 1.0, 1.0, 1.0)]
        snap = dataclasses.replace(node.snapshot(), stages=stages, enabled=True)
        assert " decisions (10.0 Hz over the last " in node.stats_line(snap), node.stats_line(snap)
    finally:
        node.destroy_node()


# ---- a paused node (~/enable false) ----------------------------------------------------------


@pytest.fixture
def paused(rclpy_context):
    """A node past its start, its inputs fresh, paused by ~/enable; what a test replaces on it is
    put back before it goes (its tear-down destroys the command publishers)."""
    from node_harness import in_process_node, past_start

    node = past_start(in_process_node(rclpy_context))
    kept = {name: getattr(node, name) for name in ("_command_pubs", "_clock_watch")}
    _fresh_inputs(node)
    node.enabled = False
    try:
        yield node
    finally:
        for name, value in kept.items():
            setattr(node, name, value)
        node.destroy_node()


PAUSED_READY = "paused by ~/enable (no decisions): ready"


def test_a_paused_node_does_not_say_its_last_decision_missed(paused):
    """No decision is owed: the last miss of before the pause is not an ongoing WARN."""
    from diagnostic_msgs.msg import DiagnosticStatus

    paused._last_missed = 0.3
    assert _health(paused) == (DiagnosticStatus.OK, PAUSED_READY)


def test_a_paused_ready_node_with_an_unheard_output_is_ok(paused):
    """Paused, the outputs' subscribers are not judged."""
    from diagnostic_msgs.msg import DiagnosticStatus

    paused._command_pubs = [(SimpleNamespace(topic_name="/cmd", get_subscription_count=lambda: 0), None, None)]
    assert _health(paused) == (DiagnosticStatus.OK, PAUSED_READY)


def test_a_paused_node_on_a_stalled_clock_is_not_ready(paused):
    """Held samples do not age on a stalled clock, and the decision timer would not fire."""
    from diagnostic_msgs.msg import DiagnosticStatus

    paused._clock_watch = SimpleNamespace(stalled=True, describe=lambda now: "clock_stalled: no /clock for 3.0 s")
    expected = "paused by ~/enable (no decisions): not ready (clock_stalled: no /clock for 3.0 s)"
    assert _health(paused) == (DiagnosticStatus.WARN, expected)
