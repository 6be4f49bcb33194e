"""The node's state changes at their edges, in process (real rclpy, nothing spinning): lifecycle
transitions (autostart with start_enabled false, an activate or a capsule call a stop signal
overtook, a configure that raises tears down what it made, shutdown, the executor-threads warning)
and the services (a pause right after ROS time went back, enabling after a long pause, ~/reset
clears the log throttle, capsule calls logged, an empty list)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from node_harness import JOINTS, in_process_node, past_start, sim_clock
from test_node_lifecycle import counts, in_process_lifecycle_node

pytestmark = pytest.mark.ros


def record(monkeypatch, node) -> list[str]:
    """The node's log lines from here on, as 'level: text'."""
    lines: list[str] = []
    logger = node.get_logger()
    for level in ("info", "warning", "error"):
        monkeypatch.setattr(logger, level, lambda text, *a, _l=level, **k: lines.append(f"{_l}: {text}"))
    return lines


# ---- lifecycle_node.py -------------------------------------------------------------------------


def test_autostart_with_start_enabled_false_says_activation_is_the_operators(rclpy_context, monkeypatch):
    """autostart with start_enabled false: configure's line said "autostart activates it next" (it
    does not) where it should give the operator the activate command."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context, autostart=True, start_enabled=False)
    try:
        lines = record(monkeypatch, node)
        node.autostart()
        assert node._state_machine.current_state[1] == "inactive" and not node.enabled
        configured = [line for line in lines if "configured (inactive)" in line]
        assert configured == [
            f"info: configured (inactive): nothing is decided until activated: "
            f"ros2 lifecycle set {node.get_fully_qualified_name()} activate"
        ], lines
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS and node.enabled
    finally:
        node.destroy_node()


def test_an_activate_that_a_stop_signal_overtook_fails_and_decides_nothing(rclpy_context, monkeypatch):
    """A lifecycle manager's activate arriving with SIGINT: the node must not report itself
    active (the transition fails, the node stays inactive and decides nothing)."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        lines = record(monkeypatch, node)
        node.begin_shutdown()
        assert node.trigger_activate() == TransitionCallbackReturn.FAILURE
        assert node._state_machine.current_state[1] == "inactive" and not node.enabled
        assert "error: activate refused: the node is shutting down" in lines, lines
    finally:
        node.destroy_node()


def test_a_transition_that_raises_tears_down_what_it_made(rclpy_context, monkeypatch):
    """A configure that raises past set-up's own checks (a bug, a driver error) goes through
    on_error back to unconfigured: what it made must go, or the next configure makes a second set
    of timers, topics and GPU buffers beside the first (two decision timers)."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    try:
        before = counts(node)
        create_timers = node._create_timers

        def broken() -> None:
            raise RuntimeError("timer creation failed (simulated)")

        monkeypatch.setattr(node, "_create_timers", broken)
        assert node.trigger_configure() != TransitionCallbackReturn.SUCCESS
        assert node._state_machine.current_state[1] == "unconfigured"
        assert not node.is_set_up and node.state is None and node.capsules is None
        assert counts(node) == before, (counts(node), before)  # its subscriptions and publishers gone
        monkeypatch.setattr(node, "_create_timers", create_timers)
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        made = tuple(a - b for a, b in zip(counts(node), before, strict=True))
        assert made == (3, 3, 4, 0), made  # one set, as in test_cleanup_lets_the_policy_go...
    finally:
        node.destroy_node()


@pytest.mark.parametrize("threads,warned", [(7, False), (6, True)])
def test_more_callback_groups_than_executor_threads_is_warned_at_configure(rclpy_context, monkeypatch, threads, warned):
    """2 cameras, joints, decisions, status, services, default group: 7 threads are enough, 6 not."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    try:
        node.executor_threads = threads
        lines = record(monkeypatch, node)
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.callback_threads == 7
        said = [line for line in lines if "callback groups for" in line]
        assert said == (
            [
                f"warning: 7 callback groups for {threads} executor threads (sized when the process started): "
                "commands and decisions can wait behind camera conversions; restart the process to size it "
                "for these cameras"
            ]
            if warned
            else []
        ), lines
    finally:
        node.destroy_node()


def test_deactivate_says_what_engages_the_node_again(rclpy_context, monkeypatch):
    """The deactivate line names activate (this node has no ~/enable), not "from now on"."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    try:
        assert node.trigger_configure() == node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        lines = record(monkeypatch, node)
        assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
        (line,) = [line for line in lines if "deactivated:" in line]
        assert line.startswith(
            "warning: deactivated: paused: no decision, chunk, trajectory or command until activated; "
        ), line
    finally:
        node.destroy_node()


def test_a_shutdown_transition_tears_the_pipeline_down(rclpy_context):
    """shutdown is cleanup then exit: nothing of the pipeline publishes during the reply's grace."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    try:
        before = counts(node)
        assert node.trigger_configure() == node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_shutdown() == TransitionCallbackReturn.SUCCESS
        assert node.finalized.is_set() and not node.is_set_up and node.state is None
        assert counts(node) == before
    finally:
        node.destroy_node()


# ---- node_services.py --------------------------------------------------------------------------


def test_an_enable_that_the_stop_signal_overtook_says_why_it_was_refused(rclpy_context):
    """~/enable true waiting for the decision in flight when SIGINT came: refused with the reason
    (the reply had success false and an empty message)."""
    from std_srvs.srv import SetBool

    node = in_process_node(rclpy_context, start_enabled=False)
    try:
        replies = []
        node._state_lock.acquire()  # a decision in flight
        waiting = threading.Thread(
            target=lambda: replies.append(node._on_enable(SetBool.Request(data=True), SetBool.Response()))
        )
        waiting.start()
        time.sleep(0.2)  # past its first check, waiting for the lock
        node.begin_shutdown()
        node._state_lock.release()
        waiting.join(5.0)
        (reply,) = replies
        assert (reply.success, reply.message) == (False, "the node is shutting down: nothing was changed")
        assert not node.enabled
    finally:
        node.destroy_node()


def test_a_capsule_call_that_waited_for_a_decision_is_refused_once_the_stop_signal_came(rclpy_context):
    """As ~/reset: a restore (or snapshot) waiting for the decision in flight when SIGINT came must
    not change the policy's state after the node said it is shutting down."""
    from flashrt_ros.srv import RestoreCapsule, SnapshotCapsule

    node = in_process_node(rclpy_context)
    try:
        assert node._on_snapshot(SnapshotCapsule.Request(name="a"), SnapshotCapsule.Response()).success
        node.state.pipeline.next_chunk_id = 42
        replies = []
        node._state_lock.acquire()
        calls = [
            lambda: replies.append(node._on_restore(RestoreCapsule.Request(name="a"), RestoreCapsule.Response())),
            lambda: replies.append(node._on_snapshot(SnapshotCapsule.Request(name="b"), SnapshotCapsule.Response())),
        ]
        threads = [threading.Thread(target=call) for call in calls]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        node.begin_shutdown()
        node._state_lock.release()
        for thread in threads:
            thread.join(5.0)
        assert [(r.success, r.message) for r in replies] == [
            (False, "the node is shutting down: nothing was changed")
        ] * 2
        assert node.state.pipeline.next_chunk_id == 42 and [c.name for c in node.capsules.list()] == ["a"]
    finally:
        node.destroy_node()


def test_reset_lets_the_next_throttled_line_through(rclpy_context, monkeypatch):
    """After ~/reset the first occurrence of a problem is logged at once, not held back by a line
    of the same kind from before the reset (log_throttle_s, 5 s by default)."""
    from std_srvs.srv import Trigger

    node = in_process_node(rclpy_context, log_throttle_s=60.0)
    try:
        lines = record(monkeypatch, node)
        node._throttle(("skipped", "/cam", "stale", "warning"), "warning", "before")
        node._throttle(("skipped", "/cam", "stale", "warning"), "warning", "held back")
        assert node._on_reset(Trigger.Request(), Trigger.Response()).success
        node._throttle(("skipped", "/cam", "stale", "warning"), "warning", "after")
        assert [line for line in lines if line.startswith("warning")] == ["warning: before", "warning: after"], lines
    finally:
        node.destroy_node()


@pytest.mark.parametrize("command_rate_hz", [0.0, 40.0])
def test_the_reset_reply_says_the_commands_stop_only_where_there_are_commands(rclpy_context, command_rate_hz):
    from std_srvs.srv import Trigger

    node = in_process_node(rclpy_context, command_rate_hz=command_rate_hz)
    try:
        reply = node._on_reset(Trigger.Request(), Trigger.Response())
        assert reply.success and reply.message.endswith(
            "capsules kept" if not command_rate_hz else "no command until the next chunk"
        )
    finally:
        node.destroy_node()


def test_enabling_after_a_long_pause_judges_idleness_from_the_enable(rclpy_context):
    """A node paused for 30 s (a dead-man switch released): the first ticks after ~/enable true
    are judged from the enable (idle ~0 s, the wait for inputs expected), not 30 s idle and an
    ERROR, nor an outage carried over from before the pause."""
    from diagnostic_msgs.msg import DiagnosticStatus

    node = past_start(in_process_node(rclpy_context, start_enabled=False))
    try:
        node._last_decision_at = time.monotonic() - 30.0
        node._dropped_streak, node._outage = 300, True  # an outage before the pause
        assert node.set_enabled(True, None).startswith("enabled")
        assert node._idle_s() < 1.0
        node._on_decision()  # no input held: skipped, within the expected wait from the enable
        assert node.dropped_decisions == 1 and node._dropped_streak == 1 and not node._outage
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level != DiagnosticStatus.ERROR, message
    finally:
        node.destroy_node()


def test_enabling_under_sim_time_judges_idleness_from_the_enable(rclpy_context):

    node = past_start(in_process_node(rclpy_context, start_enabled=False))
    try:
        sim_clock(node, 100)
        node._last_decision_ros_ns = 10 * 10**9  # 90 s of sim time paused
        assert node.set_enabled(True, None).startswith("enabled")
        assert node._idle_s() == pytest.approx(0.0)
    finally:
        node.destroy_node()


def test_list_with_no_capsules_succeeds(rclpy_context):
    from flashrt_ros.srv import ListCapsules

    node = in_process_node(rclpy_context)
    try:
        reply = node._on_list(ListCapsules.Request(), ListCapsules.Response())
        assert (reply.success, reply.message, list(reply.names)) == (True, "0 capsule(s)", [])
    finally:
        node.destroy_node()


def test_a_capsule_call_is_logged(rclpy_context, monkeypatch):
    from flashrt_ros.srv import DropCapsule, SnapshotCapsule

    node = in_process_node(rclpy_context)
    try:
        lines = record(monkeypatch, node)
        reply = node._on_snapshot(SnapshotCapsule.Request(name="a"), SnapshotCapsule.Response())
        assert f"info: ~/capsule/snapshot: {reply.message}" in lines, lines
        node._on_drop(DropCapsule.Request(name="zz"), DropCapsule.Response())
        assert "warning: ~/capsule/drop refused: no capsule named 'zz' (have: 'a')" in lines, lines
    finally:
        node.destroy_node()


def test_autostart_activates_and_says_nothing_failed(rclpy_context, monkeypatch):
    """autostart configures and activates: active, deciding, and no error line (an inverted check
    logged "autostart: activate failed, staying inactive" on the success)."""
    node = in_process_lifecycle_node(rclpy_context, autostart=True)
    try:
        lines = record(monkeypatch, node)
        node.autostart()
        assert node._state_machine.current_state[1] == "active" and node.enabled
        assert [line for line in lines if line.startswith("error")] == [], lines
        assert "info: configured (inactive): autostart activates it next" in lines, lines
        assert any(line.startswith("warning: activated: enabled: deciding at 10 Hz") for line in lines), lines
    finally:
        node.destroy_node()


def test_a_pause_right_after_ros_time_went_back_holds_no_pose_from_before(rclpy_context, monkeypatch):
    """A simulator reset (ROS time back) and a pause before any decision or command tick settled
    it: the pause must not send the arm towards the last chunk from before the reset."""
    from rclpy.time import Time

    from flashrt_ros.engine.real_time_chunking import ExecutingChunk

    node = in_process_node(rclpy_context, use_sim_time=True)
    try:
        clock = sim_clock(node, 100)
        sent = []
        monkeypatch.setattr(node._traj_pub, "publish", sent.append)
        node._last_trajectory = ExecutingChunk(np.ones((10, len(JOINTS))), 100 * 10**9, 50_000_000)
        clock.set_ros_time_override(Time(seconds=1))  # the simulator reset
        message = node.set_enabled(False, "~/enable true")
        assert sent == [] and "none to stop" in message, message
    finally:
        node.destroy_node()
