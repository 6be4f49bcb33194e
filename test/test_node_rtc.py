"""Real-time chunking (``rtc``) over real DDS: with it on, each chunk's first actions (those the robot
executes before it can take over) are the executing chunk's, shifted onto the new chunk's time, and
the chunk says how many were held; a reset starts unheld; the delay can be fixed at runtime."""

from __future__ import annotations

import math

import numpy as np
import pytest
from node_harness import JOINTS, NODE, TEST_PARAMS, in_process_node, running_node_and_peer, sim_clock, stamp_ns
from test_node_commands import rows_of

pytestmark = pytest.mark.ros

STEP_NS = round(TEST_PARAMS["step_duration_s"] * 1e9)


@pytest.fixture(scope="module")
def running(ros_env, ros_module_context, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node_rtc")
    with running_node_and_peer(ros_env, tmp, ros_module_context, rtc=True) as (node, peer):
        yield node, peer


def guided_pairs(chunks) -> list[tuple[object, object]]:
    """(executing chunk, guided chunk) for each chunk that says it was held, with the one before it."""
    return [(a, b) for a, b in zip(chunks, chunks[1:], strict=False) if b.rtc_overlap and b.chunk_id == a.chunk_id + 1]


def test_each_chunk_starts_where_the_executing_one_goes(running):
    node, peer = running
    node.wait_for_line("real-time chunking on: each chunk guided towards the executing one")
    assert peer.pump(10.0, until=lambda: len(guided_pairs(peer.chunks)) >= 5)
    for a, b in guided_pairs(peer.chunks)[:5]:
        at = (stamp_ns(b.header.stamp) - stamp_ns(a.header.stamp)) / STEP_NS  # stamps: not whole steps apart
        held, overlap = b.rtc_held_actions, b.rtc_overlap
        assert overlap == math.floor(a.horizon - 1 - at) + 1 and 1 <= held <= overlap, (at, held, overlap)
        old, new = rows_of(a), rows_of(b)
        lo = np.floor(at + np.arange(held)).astype(int)  # the old trajectory at the new chunk's times
        frac = (at + np.arange(held) - lo)[:, None]
        target = (1 - frac) * old[lo] + frac * old[np.minimum(lo + 1, a.horizon - 1)]
        # the random tiny policy's independent chunks differ by ~1-3 here; held ones by < 0.01
        gap = np.abs(new[:held] - target).max()
        assert gap < 0.05, f"chunk {b.chunk_id}: its {held} held actions are {gap:.3f} from chunk {a.chunk_id}'s"
    peer.assert_chunks_from_good_data()


def test_status_counts_the_guided_decisions(running):
    node, peer = running
    assert peer.pump(5.0, until=lambda: bool(peer.statuses) and peer.statuses[-1].rtc_guided >= 3)
    last = peer.statuses[-1]
    assert 0 < last.rtc_guided <= last.decisions


def test_a_fixed_delay_applies_from_the_next_decision(running):
    node, peer = running
    assert all(r.successful for r in peer.set_parameters(rtc_delay_steps=3))
    node.wait_for_line("parameters changed: rtc_delay_steps -1 -> 3")
    seen = len(peer.chunks)
    assert peer.pump(5.0, until=lambda: len(guided_pairs(peer.chunks[seen + 1 :])) >= 2)
    for _, b in guided_pairs(peer.chunks[seen + 1 :]):
        assert b.rtc_held_actions == min(3, b.rtc_overlap)
    refused = peer.set_parameters(rtc_delay_steps=-5)[0]
    assert not refused.successful and "rtc_delay_steps" in refused.reason
    assert all(r.successful for r in peer.set_parameters(rtc_delay_steps=-1))


def test_after_a_pause_the_first_chunk_is_held_to_nothing(running):
    """A pause stops the robot where it is: the chunk after engaging again continues nothing."""
    from std_srvs.srv import SetBool

    node, peer = running
    enable = f"{peer.namespace}/{NODE}/enable"
    assert peer.call(SetBool, enable, SetBool.Request(data=False)).success
    paused_ns = peer.now().nanoseconds  # chunks from now on decided on joint states after the pause
    peer.pump(0.3)
    assert peer.call(SetBool, enable, SetBool.Request(data=True)).success
    after = lambda: [c for c in peer.chunks if stamp_ns(c.header.stamp) > paused_ns]  # noqa: E731
    assert peer.pump(5.0, until=lambda: len(after()) >= 2)  # by stamp: a chunk from before may arrive late
    first, second = after()[:2]
    assert (first.rtc_held_actions, first.rtc_overlap) == (0, 0)
    assert second.rtc_overlap > 0 and second.chunk_id == first.chunk_id + 1


def test_after_a_reset_the_first_chunk_is_held_to_nothing(running):
    from std_srvs.srv import Trigger

    node, peer = running
    assert peer.call(Trigger, f"{peer.namespace}/{NODE}/reset", Trigger.Request()).success
    assert peer.pump(5.0, until=lambda: any(c.chunk_id == 2 for c in peer.chunks[-5:]))
    after = [c for c in peer.chunks if c.chunk_id <= 2][-2:]  # ids restart at 1 after the reset
    assert [c.chunk_id for c in after] == [1, 2]
    assert after[0].rtc_overlap == 0 and after[0].rtc_held_actions == 0
    assert after[1].rtc_overlap > 0


@pytest.mark.parametrize("blend", [0, 3])
def test_a_blend_beside_rtc_is_warned_at_start(rclpy_context, capfd, blend):
    """The chunks already continue each other: a command blend would only delay each new one."""
    node = in_process_node(rclpy_context, rtc=True, command_rate_hz=50.0, command_blend_steps=blend)
    try:
        err = capfd.readouterr().err
        assert "real-time chunking on" in err
        warned = "rtc with command_blend_steps 3: the chunks already continue each other" in err
        assert warned == (blend == 3)
        from rclpy.parameter import Parameter

        assert node.set_parameters([Parameter("command_blend_steps", value=4)])[0].successful
        # at a runtime change only as it turns on: a slider over the blend said it at every step
        assert ("rtc with command_blend_steps 4" in capfd.readouterr().err) == (blend == 0)
    finally:
        node.destroy_node()


def test_a_guidance_cap_above_the_policy_s_steps_is_said_as_it_acts(rclpy_context, capfd):
    """The weight is capped at the number of denoise steps too: 50 acted as 4 (the tiny policy's
    steps) while the start-up line said 50, and a runtime change to it changed nothing, silently."""
    from rclpy.parameter import Parameter

    node = in_process_node(rclpy_context, rtc=True, rtc_max_guidance=50.0)
    try:
        steps = node.state.pipeline.policy.cfg.num_steps
        capped = f"at most {steps} (rtc_max_guidance 50 is capped at the policy's {steps} denoise steps)"
        assert capped in capfd.readouterr().err
        assert node.set_parameters([Parameter("rtc_max_guidance", value=2.0)])[0].successful
        assert node.set_parameters([Parameter("rtc_max_guidance", value=60.0)])[0].successful
        err = capfd.readouterr().err
        assert f"guidance weight at most {steps} (rtc_max_guidance 60 is capped" in err and "at most 2" not in err
        assert node.set_parameters([Parameter("rtc_max_guidance", value=70.0)])[0].successful
        assert "guidance weight at most" not in capfd.readouterr().err  # said as it turned on, not per step
    finally:
        node.destroy_node()


def test_a_forward_jump_of_ros_time_is_no_decision_latency(rclpy_context, monkeypatch):
    """Sim time jumps forward during a decision (a /clock source that resynced): that decision has
    no length on ROS time. Taken as one, the jump would be the slowest recent decision, and the next
    ten chunks would be held fully over their whole overlap; and it would count as a deadline miss.
    One whose jump left its inputs older than max_age_s is not published at all."""
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample
    from flashrt_ros.ros.node import MIN_JUMP_FORWARD_S

    node = in_process_node(rclpy_context, rtc=True)
    try:
        clock = sim_clock(node)
        now = [100.0]
        clock.set_ros_time_override(Time(seconds=now[0]))
        jump = [0.0]
        decide = node.state.decide

        def timed_decide(obs, hold=None, **kwargs):  # 30 ms of ROS time, plus the jump if any
            out = decide(obs, hold=hold, **kwargs)
            now[0] += 0.03 + jump[0]
            clock.set_ros_time_override(Time(seconds=now[0]))
            return out

        def one_decision() -> None:
            stamp = Time(nanoseconds=round(now[0] * 1e9)).to_msg()
            for cam in node.slots[:-1]:
                cam.latest = Sample(np.zeros((24, 32, 3), np.uint8), stamp, 0, 0)
            node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)
            node._decide()
            now[0] += 0.07
            clock.set_ros_time_override(Time(seconds=now[0]))

        monkeypatch.setattr(node.state, "decide", timed_decide)
        for _ in range(3):
            one_decision()
        assert node.decisions == 3 and node._latency.slowest_ns() == pytest.approx(30e6, abs=1e6)
        misses = node.deadline_misses
        for size in (2 * MIN_JUMP_FORWARD_S, 1.0):  # (a smaller step soon after a bigger one: a tick)
            jump[0] = size
            one_decision()
            jump[0] = 0.0
            assert node._latency.slowest_ns() == pytest.approx(30e6, abs=1e6), size
        # the 1 s jump left its inputs (1.03 s old) past max_age_s: that decision is not published
        assert node.decisions == 4 and node.dropped_decisions == 1 and node.deadline_misses == misses
        jump[0] = 0.1 / node.cfg.rate_hz  # slower than the rest, no jump: it counts
        one_decision()
        assert node._latency.slowest_ns() == pytest.approx(30e6 + 1e8 / node.cfg.rate_hz, abs=1e6)
    finally:
        node.destroy_node()


def test_a_coarse_clocks_ticks_are_no_jumps(rclpy_context, monkeypatch):
    """A /clock of 10 Hz (a bag played with --clock 10, a coarse simulator) steps ROS time by
    MIN_JUMP_FORWARD_S at every tick: regular steps of one size are ticks, and decisions spanning
    them keep their length on ROS time (for rtc's takeover and for deadline misses)."""
    from rclpy.time import Time

    from flashrt_ros.ros import node_time
    from flashrt_ros.ros.inputs import Sample
    from flashrt_ros.ros.node import MIN_JUMP_FORWARD_S

    # steps count as a coarse clock's ticks within TICK_REPEAT_S of steady time: a CPU decision a
    # loaded machine slowed past 1 s made the next tick a jump (latency 0); the rule is tested here
    monkeypatch.setattr(node_time, "TICK_REPEAT_S", 60.0)
    node = in_process_node(rclpy_context, rtc=True)
    try:
        clock = sim_clock(node)
        now = [100.0]

        def tick() -> None:
            now[0] += MIN_JUMP_FORWARD_S
            clock.set_ros_time_override(Time(seconds=now[0]))

        tick()
        decide = node.state.decide

        def three_ticks(obs, hold=None, **kwargs):
            out = decide(obs, hold=hold, **kwargs)
            for _ in range(3):
                tick()
            return out

        monkeypatch.setattr(node.state, "decide", three_ticks)
        for _ in range(4):
            stamp = Time(nanoseconds=round(now[0] * 1e9)).to_msg()
            for cam in node.slots[:-1]:
                cam.latest = Sample(np.zeros((24, 32, 3), np.uint8), stamp, 0, 0)
            node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)
            node._decide()
            tick()
        assert node.decisions == 4
        assert node._latency.slowest_ns() == pytest.approx(3e8, abs=1e6)  # three ticks per decision
        assert node.deadline_misses >= 3  # 0.3 s against rate_hz's 0.1 s period (the first tick ever: a jump)
    finally:
        node.destroy_node()
