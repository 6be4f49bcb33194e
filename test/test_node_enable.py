"""``~/enable`` over real DDS: a node started paused (start_enabled false) takes its inputs but
publishes nothing; enabled, it decides; paused again, nothing decided after the reply is
published (no chunk on a later joint state, no command), and its status and diagnostics say so
without calling the pause an error."""

from __future__ import annotations

import time

import numpy as np
import pytest
from node_harness import CAMERAS, JOINTS, NODE, running_node_and_peer, stamp_ns

from flashrt_ros.engine.real_time_chunking import ExecutingChunk

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def paused_at_start(ros_env, ros_module_context, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node_enable")
    params = {"start_enabled": False, "command_rate_hz": 40.0}
    with running_node_and_peer(ros_env, tmp, ros_module_context, first="status", **params) as (node, peer):
        from std_msgs.msg import Float64MultiArray

        commands: list = []
        peer.node.create_subscription(Float64MultiArray, f"{peer.namespace}/{NODE}/joint_command", commands.append, 100)
        yield node, peer, commands


def enable(peer, data: bool):
    from std_srvs.srv import SetBool

    return peer.call(SetBool, f"{peer.namespace}/{NODE}/enable", SetBool.Request(data=data))


def chunks_after(peer, ns: int) -> list:
    """Chunks decided on a joint state stamped after ``ns`` (a decision reads its inputs when it begins)."""
    return [c for c in peer.chunks if stamp_ns(c.header.stamp) > ns]


def diagnostic_since(peer, start: int, text: str) -> list:
    return [d.status[0] for d in peer.diagnostics[start:] if text in d.status[0].message]


def test_enable_pause_and_enable_again(paused_at_start):
    from diagnostic_msgs.msg import DiagnosticStatus

    node, peer, commands = paused_at_start
    line = node.wait_for_line("paused (start_enabled false)")
    assert "[WARN]" in line and f"ros2 service call {peer.namespace}/{NODE}/enable std_srvs/srv/SetBool" in line
    # paused: inputs taken, nothing published, and the status says why (not an idle ERROR) and
    # whether a decision could run now
    start = len(peer.diagnostics)
    ready = "paused by ~/enable (no decisions): ready"
    assert peer.pump(10.0, until=lambda: bool(diagnostic_since(peer, start, ready)))
    peer.pump(1.0)
    assert not peer.chunks and not commands and not peer.trajectories
    start = len(peer.diagnostics)
    assert peer.pump(10.0, skip={CAMERAS[0]}, until=lambda: bool(diagnostic_since(peer, start, "not ready (stale ")))
    (status,) = diagnostic_since(peer, start, "not ready (stale ")[:1]
    assert status.level == DiagnosticStatus.WARN and f"stale {peer.topic(CAMERAS[0])})" in status.message, status
    assert peer.statuses[-1].dropped_inputs == 0  # nothing is there to take them while paused
    assert peer.statuses[-1].enabled is False and peer.statuses[-1].decisions == 0
    assert all(d.status[0].level != DiagnosticStatus.ERROR for d in peer.diagnostics[start:]), [
        d.status[0].message for d in peer.diagnostics[start:]
    ]
    assert enable(peer, False).message == "already paused: nothing changed"

    mark = node.mark()
    reply = enable(peer, True)
    assert reply.success and reply.message.startswith("enabled: deciding at 10 Hz"), reply.message
    node.wait_for_line("~/enable: enabled", since=mark)
    assert peer.pump(10.0, until=lambda: len(peer.chunks) >= 3 and len(commands) >= 5)
    assert peer.pump(5.0, until=lambda: peer.statuses[-1].enabled is True)
    peer.assert_chunks_from_good_data()

    trajectories = len(peer.trajectories)
    reply = enable(peer, False)
    paused_ns = peer.now().nanoseconds
    assert reply.success and "paused: no decision, chunk, trajectory or command until ~/enable true" in reply.message
    assert "the command controllers hold their last command" in reply.message, reply.message
    assert "one point, one step ahead, where the last chunk has them now" in reply.message, reply.message
    peer.pump(0.5)  # what was published before the reply arrives
    sent = len(commands)
    peer.pump(1.5)
    assert not chunks_after(peer, paused_ns), "a chunk decided after the pause's reply was published"
    assert len(commands) == sent, f"{len(commands) - sent} commands after the pause"
    # the trajectory controller is stopped, not left to play the last chunk: one point, starting
    # now, within the range of the last chunk's trajectory
    hold = peer.trajectories[-1]
    assert len(peer.trajectories) > trajectories and len(hold.points) == 1, hold
    assert stamp_ns(hold.header.stamp) == 0 and list(hold.joint_names) == JOINTS
    last = peer.trajectories[-2]
    rows = np.array([p.positions for p in last.points])
    point = np.array(hold.points[0].positions)
    assert (rows.min(axis=0) - 1e-9 <= point).all() and (point <= rows.max(axis=0) + 1e-9).all(), (point, rows)
    assert peer.pump(5.0, until=lambda: peer.statuses[-1].enabled is False)

    enabled_ns = peer.now().nanoseconds
    assert enable(peer, True).success
    assert peer.pump(10.0, until=lambda: len(chunks_after(peer, enabled_ns)) >= 2), "no chunk after enabling again"
    assert enable(peer, True).message == "already enabled: nothing changed"


def test_a_pause_holds_the_last_chunk_once(rclpy_context):
    """In process, nothing spinning: a pause with no chunk published has nothing to stop; after a
    chunk it sends the hold point once, and a second pause with no chunk since sends none (that
    chunk's end point would be a place the arm, held at the first pause, is not)."""
    from node_harness import in_process_node
    from std_srvs.srv import SetBool

    node = in_process_node(rclpy_context)
    try:

        def pause() -> str:
            node._on_enable(SetBool.Request(data=True), SetBool.Response())
            return node._on_enable(SetBool.Request(data=False), SetBool.Response()).message

        assert "none to stop" in pause()
        horizon, dof, step_ns = 10, len(JOINTS), 50_000_000
        now_ns = node.get_clock().now().nanoseconds
        actions = np.arange(horizon * dof, dtype=np.float64).reshape(horizon, dof)
        node._last_trajectory = ExecutingChunk(actions, now_ns, step_ns)
        assert "one point, one step ahead, where the last chunk has them now" in pause()
        assert "none to stop" in pause()
        node._ended_since_hold = True  # a chunk published since, refused by the controllers (chunk_ended)
        assert "had all ended on arrival (chunk_ended): none to stop" in pause()
        assert pause().startswith("paused") and "no trajectory published since" in pause()
    finally:
        node.destroy_node()


def test_a_pause_in_a_chunks_first_step_holds_the_arm_near_where_it_started(rclpy_context, monkeypatch):
    """In a chunk's first step the controller moves the joints from where they were to action 0:
    the hold point is on that way (it was action 0 itself, a whole step's move away)."""
    from node_harness import in_process_node
    from std_srvs.srv import SetBool

    node = in_process_node(rclpy_context)
    try:
        sent = []
        monkeypatch.setattr(node._traj_pub, "publish", sent.append)
        dof, step_ns = len(JOINTS), 10**9  # a long step: the pause comes early in it
        actions = np.ones((10, dof)) + np.arange(10)[:, None]
        origin = np.array([0.0] * (dof - 1) + [np.nan])  # the last joint is not in the joint state
        node._last_trajectory = ExecutingChunk(actions, node.get_clock().now().nanoseconds, step_ns, origin=origin)
        node._on_enable(SetBool.Request(data=False), SetBool.Response())
        (point,) = sent[0].points
        held = np.array(point.positions)
        assert (0.0 < held[:-1]).all() and (held[:-1] < 0.1).all(), held  # near the start, towards action 0 (1.0)
        assert held[-1] == 1.0  # no known start: action 0, as before
    finally:
        node.destroy_node()


@pytest.mark.parametrize("signame", ["SIGINT", "SIGHUP"])
def test_a_stop_signal_holds_the_trajectory_controllers_as_a_pause_does(ros_env, rclpy_context, tmp_path, signame):
    """SIGINT (ros2 launch's stop) while chunks play: the node sent nothing more, and the trajectory
    controller played the rest of the last chunk (up to a chunk's length of motion with no policy
    running). Now it gets one point where the last chunk has the arm, as on a pause, and then the
    node stops; the final stats line comes last. A hang-up (a closed terminal, a dropped ssh
    session) killed the node without any of it (status 129)."""
    import signal

    with running_node_and_peer(ros_env, tmp_path, rclpy_context) as (node, peer):
        assert peer.pump(10.0, until=lambda: len(peer.trajectories) >= 2)
        node.proc.send_signal(getattr(signal, signame))
        assert peer.pump(15.0, until=lambda: node.proc.poll() is not None), node.tail()
        peer.pump(0.5)  # what the node wrote before it went
        assert node.proc.returncode == 0, node.tail()
        hold = peer.trajectories[-1]
        assert len(hold.points) == 1 and stamp_ns(hold.header.stamp) == 0, hold
        rows = np.array([p.positions for p in peer.trajectories[-2].points])
        point = np.array(hold.points[0].positions)
        assert (rows.min(axis=0) - 1e-9 <= point).all() and (point <= rows.max(axis=0) + 1e-9).all(), (point, rows)
        stopping = node.wait_for_line("stopping: the trajectory controllers are sent one point")
        assert node.lines.index(stopping) < node.lines.index(node.wait_for_line("shutting down; stats")), node.tail()


def test_a_pause_that_the_stop_signal_cut_short_still_holds_the_arm(rclpy_context, monkeypatch):
    """A pause waits for the decision in flight; a signal meanwhile makes it return without its
    hold point. The stop then held nothing either (it looked only at an enabled node): the trajectory
    controllers played the last chunk out. Now the stop sends the hold point the pause did not."""
    import threading

    from node_harness import in_process_node
    from std_srvs.srv import SetBool

    node = in_process_node(rclpy_context)
    try:
        sent = []
        monkeypatch.setattr(node._traj_pub, "publish", sent.append)
        actions = np.arange(10.0 * len(JOINTS)).reshape(10, len(JOINTS))
        node._last_trajectory = ExecutingChunk(actions, node.get_clock().now().nanoseconds, 50_000_000)
        node._state_lock.acquire()  # a decision in flight
        replies = []
        pausing = threading.Thread(
            target=lambda: replies.append(node._on_enable(SetBool.Request(data=False), SetBool.Response()))
        )
        pausing.start()
        while node.enabled:  # the pause has begun, and waits for the decision
            time.sleep(0.01)
        node.begin_shutdown()
        node._state_lock.release()
        pausing.join(5.0)
        assert sent == [], "the pause sent its hold point after all"
        # the reply says what happened: the node was paused (it said "nothing was changed")
        (reply,) = replies
        assert reply.success and reply.message.startswith("paused and the commands stopped; the node is shutting down")
        node.hold_at_stop()
        assert len(sent) == 1 and len(sent[0].points) == 1, sent
        node.hold_at_stop()  # nothing newer since: nothing more
        assert len(sent) == 1
    finally:
        node.destroy_node()


def test_a_pause_acts_at_once_also_behind_a_reset_waiting_for_the_decision(ros_env, rclpy_context, tmp_path):
    """A reset waits for the decision in flight (1 s here) and held the services' one slot while
    it did: a pause sent meanwhile did not start, the chunk in flight was published and the
    commands went on for that decision. ~/enable has its own slot: the commands stop at once and
    the chunk in flight is not published."""
    import os
    from pathlib import Path

    from flashrt_ros.msg import ActionChunk
    from node_harness import TEST_PARAMS, NodeProcess, Peer, new_namespace
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import SetBool, Trigger

    env = dict(ros_env, SLOW_DECIDE_S="1.0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    params = TEST_PARAMS | {"command_rate_hz": 50.0, "max_age_s": 3.0, "step_duration_s": 0.5}
    ns = new_namespace()
    node = NodeProcess(env, tmp_path, ns, params, module="slow_policy_node")
    peer = Peer(rclpy_context, ns)
    try:
        chunks, commands = [], []
        sub = peer.node.create_subscription
        sub(ActionChunk, f"{ns}/{NODE}/action_chunk", lambda m: chunks.append((time.monotonic(), m.chunk_id)), 50)
        sub(Float64MultiArray, f"{ns}/{NODE}/joint_command", lambda m: commands.append(time.monotonic()), 500)
        assert peer.pump(90.0, until=lambda: len(chunks) >= 2), node.tail()  # decisions back to back from here
        reset = peer.node.create_client(Trigger, f"{ns}/{NODE}/reset")
        pause = peer.node.create_client(SetBool, f"{ns}/{NODE}/enable")
        assert reset.wait_for_service(timeout_sec=10.0) and pause.wait_for_service(timeout_sec=10.0)
        seen = len(chunks)  # from a chunk's arrival: the next decision has ~1 s to go
        assert peer.pump(10.0, until=lambda: len(chunks) > seen), node.tail()
        resetting = reset.call_async(Trigger.Request())
        peer.pump(0.1)  # the reset is in, waiting for the decision in flight
        asked = time.monotonic()
        pausing = pause.call_async(SetBool.Request(data=False))
        assert peer.pump(10.0, until=lambda: resetting.done() and pausing.done()), node.tail()
        peer.pump(1.0)
        assert pausing.result().success and resetting.result().success
        assert [c for c in chunks if c[0] > asked] == [], (chunks, node.tail())
        late = [t - asked for t in commands if t > asked + 0.3]  # one in flight may still land
        assert late == [], f"commands {late} s after the pause was asked"
    finally:
        peer.close()
        assert node.stop() == 0, node.tail()
