"""ROS time jumps, a stalled /clock, the process's stop sequence and the synthetic sensors, in
process with real rclpy: messages just ahead of a reset clock are taken, commands stream again
after a jump, each jump counted, a stall counted after 1 s; SIGTERM/SIGHUP while spinning only set
the flag, a stop runs signal -> drain -> hold -> tear-down, a second Ctrl-C cannot cut it short;
the synthetic raw frames are well formed and move, at their configured rates."""

from __future__ import annotations

import numpy as np
import pytest
from node_harness import JOINTS, in_process_node, sim_clock

pytestmark = pytest.mark.ros


def _joints(ns: int):
    from rclpy.time import Time
    from sensor_msgs.msg import JointState

    msg = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
    msg.header.stamp = Time(nanoseconds=ns).to_msg()
    return msg


def test_after_ros_time_went_back_a_message_a_little_ahead_on_the_new_timeline_is_taken(rclpy_context):
    """After a simulator reset, a sensor stamps with the sim time it has seen, which can lead the
    node's /clock by a little: only a stamp ahead by more than half the jump is from the old
    timeline. Refusing every stamp ahead of the clock would starve the node until the clock got
    back to where it jumped from (as long as the jump)."""
    from rclpy.time import Time

    node = in_process_node(rclpy_context)
    try:
        clock = sim_clock(node, 100)
        slot = node.slots[-1]
        node._on_joint_state(slot, _joints(100 * 10**9))
        clock.set_ros_time_override(Time(seconds=99.7))  # back 0.3 s: within max_age_s (0.4 s)
        with node._lock:
            node._settle_jump_inputs()
        assert slot.latest is None
        node._on_joint_state(slot, _joints(99_750_000_000))  # 50 ms ahead: the new timeline
        assert slot.latest is not None, node.invalid
        assert node.invalid[(slot.topic, "stale")] == 0
        node._on_joint_state(slot, _joints(99_950_000_000))  # 0.25 s ahead: from before the jump
        assert node.invalid[(slot.topic, "stale")] == 1
        clock.set_ros_time_override(Time(nanoseconds=99_800_000_000))  # until the clock is back at 100 s
        node._on_joint_state(slot, _joints(99_990_000_000))  # 0.19 s ahead: still the old timeline
        assert node.invalid[(slot.topic, "stale")] == 2
    finally:
        node.destroy_node()


def test_two_jumps_back_before_the_inputs_are_next_used_are_counted_twice(rclpy_context):
    """clock_jumped_back is counted per jump (docs/ros.md), also for two resets between two messages."""
    from rclpy.time import Time

    node = in_process_node(rclpy_context)
    try:
        clock = sim_clock(node)
        for sec in (100, 90, 100, 80):
            clock.set_ros_time_override(Time(seconds=sec))
        with node._lock:
            node._settle_jump_inputs()
        assert node.invalid[("", "clock_jumped_back")] == 2
    finally:
        node.destroy_node()


def test_after_ros_time_went_back_commands_of_a_new_chunk_keep_streaming(rclpy_context):
    """The jump clears the command stream once: a chunk published on the new timeline is then
    streamed tick after tick, not cleared again by every command tick."""
    from types import SimpleNamespace

    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, command_rate_hz=40.0)
    try:
        clock = sim_clock(node, 100)
        clock.set_ros_time_override(Time(seconds=99))  # a simulator reset
        now = clock.now().nanoseconds
        node._publish_command(now)  # the first tick after the jump clears the stream
        decision = SimpleNamespace(
            actions=np.ones((10, len(JOINTS)), np.float32), chunk_id=1, prefix_frames=None, prefix_reused=False
        )
        stamp = clock.now().to_msg()
        samples = [Sample(None, stamp, 0, 0) for _ in node.slots[:-1]] + [Sample(np.zeros(len(JOINTS)), stamp, 0, 0)]
        node._publish(decision, samples, 1.0, node.cfg, epoch=node._time_epoch)
        sent = node.commands_sent
        for i in range(1, 4):
            node._publish_command(now + i * 25_000_000)
        assert node.commands_sent == sent + 3
        assert node._executing is not None
    finally:
        node.destroy_node()


def test_a_stalled_sim_clock_is_counted_once_after_a_second_and_forgotten_on_wall_time(rclpy_context, monkeypatch):
    """The status timer's watch: ROS time (use_sim_time) still for stall_after_s (1 s) of steady
    time is one clock_stalled; with sim time off again the clock is no longer blamed."""

    import flashrt_ros.ros.node_time as node_time

    steady = [1000.0]
    monkeypatch.setattr(node_time.time, "monotonic", lambda: steady[0])
    node = in_process_node(rclpy_context)
    try:
        clock = sim_clock(node, 5)
        for dt in (0.0, 0.5, 1.05, 1.5, 3.0):
            steady[0] = 1000.0 + dt
            node._watch_ros_time()
        assert node._clock_watch.stalled
        assert node.invalid[("", "clock_stalled")] == 1
        clock._set_ros_time_is_active(False)
        node._watch_ros_time()
        assert not node._clock_watch.stalled
    finally:
        node.destroy_node()


def _sensors(context, **params):
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.synthetic_sensors import SyntheticSensors

    overrides = [Parameter(name, value=value) for name, value in params.items()]
    return SyntheticSensors(context=context, parameter_overrides=overrides)


class _Pub:
    def __init__(self) -> None:
        self.msgs: list = []

    def publish(self, msg) -> None:
        self.msgs.append(msg)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8"])
def test_synthetic_raw_frames_are_well_formed_in_their_encoding_and_move(rclpy_context, encoding):
    """rgb8/bgr8 (the default, and what the demo publishes without jpeg): step is 3 bytes a pixel,
    bgr8 is the rgb8 picture with its channels swapped, and the picture scrolls with time."""
    from rclpy.time import Time

    w, h = 64, 16
    rgb = _sensors(rclpy_context, encoding="rgb8", image_width=w, image_height=h)
    node = _sensors(rclpy_context, encoding=encoding, image_width=w, image_height=h)
    try:
        clock = sim_clock(node)
        node._t0 = rgb._t0 = 0
        frames = []
        for sec in (1.0, 2.0):
            clock.set_ros_time_override(Time(seconds=sec))
            pub = _Pub()
            node._publish_camera(node.streams[0], pub, "cam")
            (msg,) = pub.msgs
            assert (msg.encoding, msg.width, msg.height, msg.step) == (encoding, w, h, w * 3)
            assert len(msg.data) == msg.step * h
            frames.append(np.frombuffer(bytes(msg.data), np.uint8).reshape(h, w, 3))
            assert msg.header.stamp.sec == int(sec)
        assert not np.array_equal(frames[0], frames[1]), "the frames do not move"
        want = np.array(rgb.streams[0].raw(2.0), np.uint8).reshape(h, w, 3)
        assert np.array_equal(frames[1], want[..., ::-1] if encoding == "bgr8" else want)
    finally:
        node.destroy_node()
        rgb.destroy_node()


def test_synthetic_streams_run_at_their_configured_rates(rclpy_context):
    """camera_rate_hz drives the cameras' timers, joint_rate_hz the joints'; joint velocities are
    the derivative of the positions."""
    node = _sensors(rclpy_context, camera_topics=["a", "b"], camera_rate_hz=15.0, joint_rate_hz=250.0)
    try:
        periods = sorted(t.timer_period_ns for t in node.timers)
        assert periods == [4_000_000, 66_666_666, 66_666_666], periods
        pub = _Pub()
        node._joint_pub = pub
        node._t0 = 0
        clock = sim_clock(node)
        from rclpy.time import Time

        positions = []
        for ns in (2 * 10**9, 2 * 10**9 + 1_000_000):
            clock.set_ros_time_override(Time(nanoseconds=ns))
            node._publish_joints()
            positions.append(np.array(pub.msgs[-1].position))
        slope = (positions[1] - positions[0]) / 1e-3
        np.testing.assert_allclose(np.array(pub.msgs[0].velocity), slope, rtol=0.01, atol=1e-3)
    finally:
        node.destroy_node()


def test_synthetic_sensors_do_not_warn_of_no_clock_once_one_arrived(rclpy_context, monkeypatch):
    """use_sim_time: the warning that nothing is published is for ROS time never set, not for a
    simulator that is publishing /clock."""
    from rclpy.time import Time

    node = _sensors(rclpy_context, use_sim_time=True)
    try:
        warnings: list[str] = []
        logger = node.get_logger()
        monkeypatch.setattr(logger, "warning", lambda text, **kw: warnings.append(text))
        monkeypatch.setattr(node, "get_logger", lambda: logger)
        node.get_clock().set_ros_time_override(Time(seconds=3))
        node._warn_without_clock()
        assert warnings == []
        node.get_clock().set_ros_time_override(Time(nanoseconds=0))
        node._warn_without_clock()
        assert len(warnings) == 1 and "no /clock arrived" in warnings[0]
    finally:
        node.destroy_node()


class _Executor:
    """An executor's surface as process.py uses it, recording what is done to it."""

    def __init__(self, log: list[str], spin=None) -> None:
        from types import SimpleNamespace

        self.log, self._spin = log, spin
        self.context = SimpleNamespace(ok=lambda: True)
        self._executor = SimpleNamespace(shutdown=lambda wait: log.append("drain"))

    def add_node(self, node) -> None:
        self.log.append("add")

    def spin_once(self, timeout_sec: float) -> None:
        self.log.append("spin")
        if self._spin is not None:
            self._spin()

    def shutdown(self) -> None:
        self.log.append("shutdown")


@pytest.fixture
def no_process_signals(monkeypatch):
    """process.py's handlers and exit hooks kept out of the pytest process."""
    import flashrt_ros.ros.process as process

    monkeypatch.setattr(process.signal, "signal", lambda *args: None)
    monkeypatch.setattr(process, "_ignore_signals_at_exit", lambda: None)
    monkeypatch.setattr(process.rclpy, "try_shutdown", lambda: None)
    return process


def test_a_stop_runs_on_signal_then_drains_then_on_stop_then_tears_down_and_exits_0(no_process_signals):
    """The node stops publishing (on_signal) before the callbacks in flight are waited for, and the
    final report (on_stop: the hold point, the stats line) comes after them and before teardown."""
    from types import SimpleNamespace

    log: list[str] = []
    node = SimpleNamespace(destroy_node=lambda: log.append("destroy"))
    code = no_process_signals.run_until_signal(
        node,
        _Executor(log),
        on_signal=lambda: log.append("on_signal"),
        on_stop=lambda: log.append("on_stop"),
        done=lambda: True,
    )
    assert code == 0
    assert log == ["add", "on_signal", "drain", "on_stop", "drain", "shutdown", "destroy"], log


def test_spinning_ends_on_done_and_on_an_external_shutdown_and_raises_without_on_error(no_process_signals):
    from rclpy.executors import ExternalShutdownException

    log: list[str] = []

    def endless() -> None:
        assert len(log) < 10, "spinning went on after done() turned true"

    turns = iter([False, False, True])
    no_process_signals.spin_until_signal(_Executor(log, spin=endless), done=lambda: next(turns, True))
    assert log == ["spin", "spin"]

    def shut() -> None:
        raise ExternalShutdownException()

    no_process_signals.spin_until_signal(_Executor(log, spin=shut))  # returns: rclpy was shut down

    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):  # no on_error: it ends spinning, as rclpy's spin does
        no_process_signals.spin_until_signal(_Executor(log, spin=fails))
    seen: list[Exception] = []  # with on_error: each failure reaches it, and spinning goes on
    no_process_signals.spin_until_signal(_Executor(log, spin=fails), done=lambda: len(seen) == 2, on_error=seen.append)
    assert [str(e) for e in seen] == ["boom", "boom"]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_each_stop_signal_while_spinning_ends_the_spin_without_an_interrupt(signame):
    """docker stop and systemd send SIGTERM, a closed terminal SIGHUP: while spinning each only
    sets the flag (raised as KeyboardInterrupt it lands at any bytecode of the executor)."""
    import subprocess
    import sys

    code = f"""
import os, signal
from types import SimpleNamespace
from flashrt_ros.ros.process import interrupt_on_signals, spin_until_signal

class Executor:
    context = SimpleNamespace(ok=lambda: True)
    def spin_once(self, timeout_sec):
        os.kill(os.getpid(), signal.{signame})

interrupt_on_signals()
try:
    spin_until_signal(Executor())
    print("stopped by the flag")
except KeyboardInterrupt:
    print("interrupted")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "stopped by the flag", (done.returncode, done.stdout, done.stderr)


def test_synthetic_sensors_stopped_while_starting_exit_0_with_a_line(ros_env):
    """A Ctrl-C (or ros2 launch's SIGINT) while the sensors are being built is a clean stop: exit
    0 and one line, as flashrt_node's, not a failure for launch to report."""
    import subprocess
    import sys

    code = """
import sys
import flashrt_ros.ros.synthetic_sensors as sensors

def interrupted(**kwargs):
    raise KeyboardInterrupt  # what interrupt_on_signals raises for a signal here

sensors.SyntheticSensors = interrupted
sys.exit(sensors.main(["synthetic_sensors"]))
"""
    done = subprocess.run([sys.executable, "-c", code], env=ros_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "not starting: stopped by a signal while starting" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_second_signal_during_a_stop_begun_by_a_signal_before_spinning_is_a_no_op(ros_env):
    """A signal while the node is built (KeyboardInterrupt) starts the stop; a second Ctrl-C more
    than REPEAT_S later, while the stop holds the arm and writes the stats, must not cut it short."""
    import subprocess
    import sys

    code = """
import os, signal, time
from types import SimpleNamespace
from flashrt_ros.ros.process import REPEAT_S, interrupt_on_signals, run_until_signal

class Executor:
    context = SimpleNamespace(ok=lambda: True)
    def add_node(self, node):
        raise KeyboardInterrupt  # the first signal, before spinning
    def shutdown(self):
        pass

def on_stop():
    time.sleep(REPEAT_S + 0.2)
    os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
    time.sleep(0.1)
    print("stop finished")

interrupt_on_signals()
print("exit", run_until_signal(SimpleNamespace(destroy_node=lambda: None), Executor(), on_stop=on_stop))
"""
    done = subprocess.run([sys.executable, "-c", code], env=ros_env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["stop", "finished", "exit", "0"], (done.stdout, done.stderr)
