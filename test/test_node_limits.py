"""Action limits in the node over real DDS: every chunk, trajectory and command stays within the
configured limits, and a limited chunk is counted and logged."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from node_harness import NODE, in_process_node, running_node_and_peer

pytestmark = pytest.mark.ros

# around the peer's joint state [0, 0.1, 0.2, 0.3]; the random-weight policy's actions reach far beyond
LOWER = [-0.05, 0.05, 0.15, 0.25]
UPPER = [0.05, 0.15, 0.22, 0.35]
MAX_STEP = 0.02


@pytest.fixture(scope="module")
def running(ros_env, ros_module_context, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node_limits")
    params = {
        "action_lower_limits": LOWER,
        "action_upper_limits": UPPER,
        "action_max_step": [MAX_STEP],
        "command_rate_hz": 40.0,
    }
    with running_node_and_peer(ros_env, tmp, ros_module_context, **params) as (node, peer):
        from std_msgs.msg import Float64MultiArray

        commands: list = []
        peer.node.create_subscription(Float64MultiArray, f"{peer.namespace}/{NODE}/joint_command", commands.append, 50)
        yield node, peer, commands


def test_every_output_stays_within_the_limits_and_limiting_is_counted(running):
    node, peer, commands = running
    line = node.wait_for_line("action limits: positions within limits on 4 of 4 joints; at most action_max_step")
    assert line.endswith("commands move at most action_max_step per step, chunk switches included"), line
    assert peer.pump(10.0, until=lambda: len(peer.chunks) >= 5 and len(commands) >= 20 and len(peer.trajectories) >= 5)
    low, high = np.array(LOWER), np.array(UPPER)
    state = np.array([0.0, 0.1, 0.2, 0.3])
    for chunk in peer.chunks:  # exactly within, as published (float32), and steps from the joint state on
        rows = np.asarray(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.action_dim).astype(float)
        assert ((rows >= low) & (rows <= high)).all(), rows
        assert (np.abs(np.diff(np.vstack([state, rows]), axis=0)) <= MAX_STEP + 1e-6).all(), rows
    for trajectory in peer.trajectories:
        points = np.array([p.positions for p in trajectory.points])
        assert ((points >= low) & (points <= high)).all()
    data = np.array([msg.data for msg in commands])
    assert ((data >= low) & (data <= high)).all()
    # chunk switches included (commands at 40 Hz, faster than the actions: one step's move at most,
    # to a float32 rounding of the chunks); a tick late past a step's boundary on a loaded machine
    # moves the steps due since the last one (two at most: a longer wait is a gap), so nearly all
    # and not every pair are within one step
    moves = np.abs(np.diff(data, axis=0)).max(axis=1)
    assert (moves <= 2 * MAX_STEP + 1e-6).all(), moves
    assert np.mean(moves <= MAX_STEP + 1e-6) >= 0.9, moves
    # the policy's actions reach far beyond the limits: some values sit at them
    rows = np.concatenate([np.asarray(c.actions) for c in peer.chunks]).reshape(-1, 4)
    assert (np.isclose(rows, low, atol=1e-6) | np.isclose(rows, high, atol=1e-6)).any()
    peer.wait_for_counter("", "action_clamped", above=0)
    line = node.wait_for_line("limited before publishing:")
    assert "[WARN]" in line and re.search(r"values of [1-4] joints changed; the most: j[0-3] ", line), line


def test_a_step_limit_slows_the_chunk_from_the_joint_state(rclpy_context, capfd):
    """In process, on a decision made by hand: action 0 within action_max_step of the joint state
    (for the joints it has), each next action within it of the one before. The start-up log says
    each joint's limit, the actions' joint order, and that it is not joint_names' order."""
    from builtin_interfaces.msg import Time as TimeMsg

    from flashrt_ros.engine.pipeline import Decision
    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, action_max_step=[0.1], action_joint_names=["j1", "j0", "extra", "j3"])
    try:
        err = capfd.readouterr().err
        assert "(j1 step 0.1, j0 step 0.1, extra step 0.1, j3 step 0.1)" in err
        assert "step 0.05 s; joints j1, j0, extra, j3)" in err
        reordered = "action_joint_names orders joints otherwise than joint_names: j1 (action 0, state 1), j0 (action 1"
        assert reordered in err and "trajectory_groups or command_groups, which pick joints by name" in err
        joints = Sample(np.array([0.0, 1.0, 2.0, 3.0], np.float32), TimeMsg(sec=int(time.time())), 0, 0)
        actions = np.full((3, 4), 5.0, np.float32)
        limited = node._limited(Decision(chunk_id=4, actions=actions, timings_ms={}), joints).actions
        # from j1 = 1.0, j0 = 0.0, "extra" (no state: action 0 free), j3 = 3.0, at 0.1 per action
        expected = [[1.1, 0.1, 5.0, 3.1], [1.2, 0.2, 5.0, 3.2], [1.3, 0.3, 5.0, 3.3]]
        np.testing.assert_allclose(limited, expected, rtol=1e-6)
        assert node.invalid[("", "action_clamped")] == 1
        assert node.cfg.action_max_step == [0.1]
    finally:
        node.destroy_node()


def _samples_at(node: object, joints: np.ndarray, stamp_ns: int) -> list:
    """One held sample per input (the cameras' black frames, then `joints`), all stamped at `stamp_ns`."""
    from flashrt_ros.ros.inputs import Sample
    from flashrt_ros.ros.messages import time_msg

    frame = np.zeros((*node.cfg.expected_hw, 3), np.uint8)
    cameras = [Sample(frame, time_msg(stamp_ns), 0, 0) for _ in node.cfg.camera_topics]
    return [*cameras, Sample(joints.astype(np.float32), time_msg(stamp_ns), 0, 0)]


def test_the_first_command_moves_at_most_a_step_from_the_joint_state(rclpy_context, monkeypatch):
    """A chunk stamped at its observation, here 4 steps old when published, is due at its action 4
    by the first command tick: after a start (or a pause, reset or clock jump) the command went
    straight there, 5 x action_max_step from the arm. Now it moves action_max_step from the joint
    state the chunk was decided on, then action_max_step per step."""
    from flashrt_ros.engine.pipeline import Decision

    node = in_process_node(rclpy_context, action_max_step=[0.1], command_rate_hz=100.0)
    try:
        sent = []
        for pub, _, _ in node._command_pubs:
            monkeypatch.setattr(pub, "publish", sent.append)
        step_ns = round(node.cfg.step_duration_s * 1e9)
        now = node.get_clock().now().nanoseconds
        state = np.array([0.0, 1.0, 2.0, 3.0])
        actions = state + 0.1 * np.arange(1, 11)[:, None]  # within action_max_step from the state on
        decision = Decision(chunk_id=1, actions=actions.astype(np.float32), timings_ms={})
        node._publish(decision, _samples_at(node, state, now - 4 * step_ns), 1.0, node.cfg)
        for tick in range(6):  # the command timer's 100 Hz, over one step
            node._publish_command(now + tick * step_ns // 5)
        first, second = np.array(sent[0].data), np.array(sent[-1].data)
        np.testing.assert_allclose(first, state + 0.1, rtol=1e-6)  # not action 4's state + 0.5
        np.testing.assert_allclose(second, state + 0.2, rtol=1e-6)
        assert node.invalid[("", "command_limited")] == 1
    finally:
        node.destroy_node()


def test_a_decision_across_a_time_jump_publishes_nothing(rclpy_context, monkeypatch):
    """ROS time went back after the decision took its inputs and checked the jump count: its chunk
    and trajectories are on the old timeline. They were published (only the commands and rtc's
    executing chunk were kept from it); now nothing is."""
    from flashrt_ros.engine.pipeline import Decision

    node = in_process_node(rclpy_context)
    try:
        published = []
        for pub in (node._chunk_pub, node._traj_pub):
            monkeypatch.setattr(pub, "publish", published.append)
        epoch = node._time_epoch
        node._time_epoch += 1  # what _on_time_jump leaves, between the decision's check and _publish
        decision = Decision(chunk_id=1, actions=np.zeros((10, 4), np.float32), timings_ms={})
        stamp_ns = node.get_clock().now().nanoseconds
        assert not node._publish(decision, _samples_at(node, np.zeros(4), stamp_ns), 1.0, node.cfg, epoch=epoch)
        assert published == [] and node._executing is None  # and, returning False, not counted as a decision
        assert node._publish(
            decision,
            _samples_at(node, np.zeros(4), node.get_clock().now().nanoseconds),
            1.0,
            node.cfg,
            epoch=node._time_epoch,
        )
        assert len(published) == 2  # the same decision on the current timeline: the chunk and the trajectory
    finally:
        node.destroy_node()


def test_alohas_grippers_are_not_stepped_from_the_joint_state() -> None:
    """Under aloha_adapt_to_pi a gripper's state is the finger position and its action the gripper
    joint (README): a gripper held still read as a step of ~0.11 between them, was rate-limited
    and counted action_clamped. Those columns have nothing to step from; the others keep theirs."""
    from flashrt_ros.policies.robot_space import ALOHA_GRIPPERS
    from flashrt_ros.ros.node import action_state_columns

    names = [f"j{i}" for i in range(14)]
    state = list(reversed(names))
    plain = action_state_columns(names, state)
    assert plain == [13 - i for i in range(14)]
    aloha = action_state_columns(names, state, ALOHA_GRIPPERS)
    assert aloha == [None if i in (6, 13) else 13 - i for i in range(14)]
    assert action_state_columns(["a", "x"], ["a"]) == [0, None]  # a joint the state lacks
