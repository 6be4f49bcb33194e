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
    line = node.wait_for_line("action limits: positions within limits on 4 joints; at most action_max_step")
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
    # to a float32 rounding of the chunks)
    assert (np.abs(np.diff(data, axis=0)) <= MAX_STEP + 1e-6).all()
    # the policy's actions reach far beyond the limits: some values sit at them
    rows = np.concatenate([np.asarray(c.actions) for c in peer.chunks]).reshape(-1, 4)
    assert (np.isclose(rows, low, atol=1e-6) | np.isclose(rows, high, atol=1e-6)).any()
    peer.wait_for_counter("", "action_clamped", above=0)
    line = node.wait_for_line("limited before publishing:")
    assert "[WARN]" in line and re.search(r"values of [1-4] joints changed; the most: j[0-3] ", line), line


def test_a_step_limit_slows_the_chunk_from_the_joint_state(rclpy_context):
    """In process, on a decision made by hand: action 0 within action_max_step of the joint state
    (for the joints it has), each next action within it of the one before."""
    from builtin_interfaces.msg import Time as TimeMsg

    from flashrt_ros.engine.pipeline import Decision
    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, action_max_step=[0.1], action_joint_names=["j1", "j0", "extra", "j3"])
    try:
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
