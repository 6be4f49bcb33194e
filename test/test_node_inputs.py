"""Bad inputs and bad parameters, end to end: for each, the node logs the precise reason,
counts it in ~/status, publishes no chunk from the bad data, and keeps serving good data.

One node process serves the module. A bad message is sent while the other topics keep
getting good data; the held good sample of the affected topic then ages past max_age_s,
so decisions stop (they never fall back to the bad data) and resume once good data is back.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from node_harness import (
    CAMERAS,
    HW,
    JOINT_TOPIC,
    NODE,
    TEST_PARAMS,
    NodeProcess,
    check_wait_after_reset,
    new_namespace,
    running_node_and_peer,
)

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def running(ros_env, ros_module_context, tmp_path_factory):
    with running_node_and_peer(ros_env, tmp_path_factory.mktemp("inputs"), ros_module_context) as node_and_peer:
        yield node_and_peer


def refused(running, relative_topic: str, publish_bad, reason: str, logged: str, seconds: float = 1.0) -> None:
    """Send bad messages on one topic (good ones elsewhere) for ``seconds``, then check the
    log line, the status counter, the chunks, and the recovery."""
    node, peer = running
    topic = peer.topic(relative_topic)
    peer.settle(skip={relative_topic})  # the previous test's last skips counted: a skip now is this test's
    before = peer.latest_counter(topic, reason)
    dropped_before = peer.latest_counter("", "dropped_decision")
    mark = node.mark()
    peer.pump(seconds, skip={relative_topic}, extra=publish_bad)
    line = node.wait_for_line(f"input rejected: [{reason}] {topic}: {logged}", since=mark)
    assert "keeping the previous good message" in line
    peer.wait_for_counter(topic, reason, above=before, skip={relative_topic}, extra=publish_bad)
    # The held good sample went stale meanwhile: decisions were skipped, not made from bad data.
    peer.wait_for_counter("", "dropped_decision", above=dropped_before, skip={relative_topic}, extra=publish_bad)
    peer.assert_chunks_from_good_data()
    recovered(peer, topic)


def recovered(peer, topic: str) -> None:
    """A chunk computed from good data on ``topic`` published from now on arrives."""
    since = peer.node.get_clock().now().nanoseconds
    assert peer.pump(5.0, until=lambda: bool(peer.chunks) and peer.chunk_sources(peer.chunks[-1])[topic] > since), (
        f"no chunk from fresh good data on {topic} within 5 s"
    )
    peer.assert_chunks_from_good_data()


def test_wrong_encoding(running):
    _, peer = running
    refused(
        running,
        CAMERAS[0],
        lambda: peer.publish_camera(0, peer.image(encoding="yuv422"), good=False),
        "bad_encoding",
        "encoding 'yuv422' is not supported; expected one of rgb8, bgr8",
    )


def test_wrong_size(running):
    _, peer = running
    h, w = HW[0] + 8, HW[1]
    refused(
        running,
        CAMERAS[1],
        lambda: peer.publish_camera(1, peer.image(hw=(h, w)), good=False),
        "bad_size",
        f"image is {h}x{w} (HxW); expected {HW[0]}x{HW[1]} from config (image_height x image_width, one size "
        "for every camera: 0 / 0 for cameras of different sizes)",
    )


def test_step_too_small(running):
    _, peer = running
    refused(
        running,
        CAMERAS[0],
        lambda: peer.publish_camera(0, peer.image(step=HW[1] * 3 - 3), good=False),
        "bad_size",
        f"step {HW[1] * 3 - 3} is smaller than width*bytes_per_pixel = {HW[1]}*3 = {HW[1] * 3} for rgb8",
    )


def test_padded_rows_are_good_data(running):
    """step > 3 w (row padding, as some camera drivers send) crosses DDS and is used."""
    _, peer = running
    topic = peer.topic(CAMERAS[1])
    since = peer.now().nanoseconds
    padded = lambda: peer.publish_camera(1, peer.image(pad=16))  # noqa: E731
    fresh = lambda: bool(peer.chunks) and peer.chunk_sources(peer.chunks[-1])[topic] > since  # noqa: E731
    assert peer.pump(5.0, until=fresh, skip={CAMERAS[1]}, extra=padded), "no chunk from padded frames"
    peer.assert_chunks_from_good_data()


def test_truncated_data(running):
    _, peer = running
    short = bytes(HW[0] * HW[1] * 3 - 100)
    refused(
        running,
        CAMERAS[0],
        lambda: peer.publish_camera(0, peer.image(data=short), good=False),
        "truncated_data",
        f"data has {len(short)} bytes; expected step*height = {HW[1] * 3}*{HW[0]}",
    )


def test_nan_and_inf_joints(running):
    _, peer = running
    bad = [0.0, float("nan"), float("inf"), 0.3]
    refused(
        running,
        JOINT_TOPIC,
        lambda: peer.publish_joints(peer.joints(positions=bad), good=False),
        "non_finite_joint",
        "non-finite position: j1=nan, j2=inf; expected finite float32 values",
    )


def test_joint_beyond_float32(running):
    """1e39 is finite in the message's float64 but not in the policy's float32: refused by name,
    not passed on to fail inside the policy as a node-wide error."""
    _, peer = running
    refused(
        running,
        JOINT_TOPIC,
        lambda: peer.publish_joints(peer.joints(positions=[0.0, 0.1, 1e39, 0.3]), good=False),
        "non_finite_joint",
        "non-finite position: j2=1e+39; expected finite float32 values",
    )


def test_joint_state_with_more_positions_than_names(running):
    _, peer = running
    refused(
        running,
        JOINT_TOPIC,
        lambda: peer.publish_joints(peer.joints(positions=[0.0, 0.1, 0.2, 0.3, float("nan")]), good=False),
        "bad_size",
        "5 positions for 4 names ['j0', 'j1', 'j2', 'j3']; expected one position per name",
    )


def test_stamp_with_nanosec_out_of_range(running):
    from builtin_interfaces.msg import Time

    _, peer = running

    def malformed():
        now = peer.now().nanoseconds
        stamp = Time(sec=now // 10**9 - 1, nanosec=now % 10**9 + 1_000_000_000)  # reads as now
        peer.publish_joints(peer.joints(stamp=stamp), good=False)

    refused(running, JOINT_TOPIC, malformed, "unstamped", "header stamp nanosec is 1")


def test_duplicate_joint_names(running):
    _, peer = running
    names, positions = ["j0", "j1", "j2", "j3", "j1"], [0.0, 0.1, 0.2, 0.3, 0.4]
    refused(
        running,
        JOINT_TOPIC,
        lambda: peer.publish_joints(peer.joints(names=names, positions=positions), good=False),
        "duplicate_joint",
        f"joints ['j1'] appear more than once in {names}; expected once",
    )


def test_future_stamp(running):
    from rclpy.time import Time

    _, peer = running

    def ahead():
        stamp = Time(nanoseconds=peer.now().nanoseconds + 3_000_000_000)
        peer.publish_camera(0, peer.image(stamp=stamp.to_msg()), good=False)

    node, _ = running
    mark = node.mark()
    refused(running, CAMERAS[0], ahead, "future_stamp", "stamp is ", seconds=1.0)
    pattern = r"stamp is [23]\.\d{3} s ahead of the node clock; expected at most 0\.4 s \(clocks disagree"
    node.wait_for_line(pattern, since=mark, regex=True)


def test_missing_joint_names(running):
    _, peer = running
    refused(
        running,
        JOINT_TOPIC,
        lambda: peer.publish_joints(peer.joints(names=["j0", "j1", "gripper"], positions=[0, 0, 0]), good=False),
        "missing_joint",
        "joints ['j2', 'j3'] are not in the message; it has ['j0', 'j1', 'gripper']",
    )


def test_stale_message(running):
    from rclpy.time import Time

    _, peer = running

    def old():
        stamp = Time(nanoseconds=peer.now().nanoseconds - 2_000_000_000)
        peer.publish_joints(peer.joints(stamp=stamp), good=False)

    refused(running, JOINT_TOPIC, old, "stale", "data is 2.", seconds=1.0)  # 2.0xx: the delivery adds to it


def test_unstamped_message(running):
    _, peer = running
    from builtin_interfaces.msg import Time as TimeMsg

    refused(
        running,
        CAMERAS[1],
        lambda: peer.publish_camera(1, peer.image(stamp=TimeMsg()), good=False),
        "unstamped",
        "header stamp is 0; expected the capture time",
    )


def test_camera_that_stops(running):
    """A camera that stops publishing: its last frame ages out, decisions stop with [stale]."""
    node, peer = running
    topic = peer.topic(CAMERAS[1])
    peer.settle()
    before = peer.latest_counter(topic, "stale")
    mark = node.mark()
    start = len(peer.chunks)
    peer.pump(1.2, skip={CAMERAS[1]})
    node.wait_for_line(f"decision skipped: [stale] {topic}: data is", since=mark)
    peer.wait_for_counter(topic, "stale", above=before, skip={CAMERAS[1]})
    last_frame = peer.last_good[topic]
    late = [c for c in peer.chunks[start:] if c.header.stamp.sec * 10**9 + c.header.stamp.nanosec > last_frame + 0.6e9]
    assert not late, f"{len(late)} chunks were published with a {topic} frame older than max_age_s"
    recovered(peer, topic)


def test_absent_camera(running):
    """After a reset (held inputs cleared) one camera never publishes: no decision, [absent]."""
    from std_srvs.srv import Trigger

    node, peer = running
    topic = peer.topic(CAMERAS[0])
    assert peer.call(Trigger, f"{peer.namespace}/flashrt_node/reset", Trigger.Request()).success
    mark = node.mark()
    start = len(peer.chunks)
    peer.pump(1.0, skip={CAMERAS[0]})
    # at first (within max_age_s of the reset) an expected wait, then the graph-based hint
    first = node.wait_for_line(f"decision skipped: [absent] {topic}: no good message since ~/reset", since=mark)
    check_wait_after_reset(first)
    warning = rf"\[WARN\].*decision skipped: \[absent\] {re.escape(topic)}: no good message since"
    line = node.wait_for_line(warning, since=mark, regex=True)
    assert "from its 1 publisher(s); is it publishing" in line, line
    peer.wait_for_counter(topic, "absent", above=0, skip={CAMERAS[0]})
    fresh = [c for c in peer.chunks[start:] if c.chunk_id == 1]
    assert not fresh, "a chunk was published without the absent camera"
    recovered(peer, topic)


def test_use_sim_time_of_the_wrong_type_is_logged_and_counted(running):
    """rclpy itself refuses use_sim_time set to a string (its type is fixed), before the node's
    own check: the node still logs and counts it like any refused set, and keeps serving."""
    node, peer = running
    peer.settle()
    before = peer.latest_counter("", "invalid_parameter")
    mark = node.mark()
    (result,) = peer.set_parameters(use_sim_time="yes")
    assert not result.successful and "Wrong parameter type" in result.reason, result
    node.wait_for_line("parameter change refused: use_sim_time must be a bool, got string 'yes'", since=mark)
    assert peer.wait_for_counter("", "invalid_parameter", above=before) == before + 1
    assert peer.get_parameters("use_sim_time") == [False]
    recovered(peer, peer.topic(JOINT_TOPIC))


def exit_output(node: NodeProcess, timeout: float = 60.0) -> tuple[int, str]:
    """Wait for a node that must exit by itself; its exit code and output (stopped if it hangs)."""
    try:
        code = node.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the node did not exit within {timeout} s\n{node.tail()}") from None
    finally:
        node.stop()
    return code, "\n".join(node.lines)


def test_invalid_parameter_at_start_exits_with_the_reasons(ros_env, tmp_path):
    params = {**TEST_PARAMS, "rate_hz": -5.0, "camera_transports": ["raw", "mjpeg"]}
    node = NodeProcess(ros_env, tmp_path, new_namespace(), params, extra_args=["-p", "joint_names:=[a, a]"])
    code, output = exit_output(node)
    assert code == 2, output
    assert "not starting: invalid parameters:" in output
    for reason in (
        "rate_hz must be >= 0.01 and <= 1000, got -5.0",
        "camera_transports ['mjpeg'] not understood; expected each to be raw or compressed",
        "joint_names lists ['a'] more than once; expected each joint once",
    ):
        assert reason in output, f"missing reason {reason!r} in:\n{output}"


@pytest.mark.parametrize("module", ["node", "lifecycle_node", "synthetic_sensors"])
def test_a_use_sim_time_of_the_wrong_type_at_start_exits_2_with_the_reason(ros_env, tmp_path, module):
    """rclpy's Node constructor declares use_sim_time (a bool) itself: a robot-wide file's
    `use_sim_time: "true"` raised inside it (a traceback, exit 1: "the policy could not be built")."""
    import sys

    shared = tmp_path / "robot.yaml"
    shared.write_text('/**:\n  ros__parameters:\n    use_sim_time: "true"\n')
    cmd = [sys.executable, "-m", f"flashrt_ros.ros.{module}", "--ros-args", "--params-file", str(shared)]
    done = subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "not starting: invalid parameters:" in done.stderr, done.stderr
    assert "use_sim_time must be true or false, got string 'true' (rclpy's own parameter)" in done.stderr


def test_tiny_rates_and_topics_that_resolve_alike_exit_2_with_the_reasons(ros_env, tmp_path):
    """Rates whose timer period overflows rcl's int64 and a step of 0 ns crashed (or published
    all trajectory points at time 0); one camera spelled relative and absolute in the node's
    namespace fed two views; a token starting with a digit crashed in resolve_topic_name."""
    ns = new_namespace()
    params = {
        **TEST_PARAMS,
        "rate_hz": 1e-10,
        "status_rate_hz": 1e-10,
        "step_duration_s": 1e-10,
        "camera_topics": [CAMERAS[0], f"{ns}/{CAMERAS[0]}"],
        "joint_state_topic": "robot/1joints",
    }
    code, output = exit_output(NodeProcess(ros_env, tmp_path, ns, params))
    assert code == 2 and "Traceback" not in output, output
    for reason in (
        "rate_hz must be >= 0.01 and <= 1000, got 1e-10",
        "status_rate_hz must be >= 0.01 and <= 1000, got 1e-10",
        "step_duration_s must be >= 1e-06 and <= 60, got 1e-10",
        f"camera_topics[0] '{CAMERAS[0]}' and camera_topics[1] '{ns}/{CAMERAS[0]}' both resolve to "
        f"{ns}/{CAMERAS[0]}; expected each camera on a topic of its own",
        "joint_state_topic: 'robot/1joints' is not a valid ROS topic name: topic name token must not start with a "
        "number",
    ):
        assert reason in output, f"missing reason {reason!r} in:\n{output}"


def test_topics_rcl_refuses_or_of_clashing_types_exit_2_with_the_reasons(ros_env, tmp_path):
    """A tilde not followed by '/', an unmatched brace, and joint states on a camera's topic
    (rcl: "invalid allocator", the type clash buried) crashed at start with a raw RCLError."""
    params = {**TEST_PARAMS, "camera_topics": ["~cam", "cam{", CAMERAS[1]], "joint_state_topic": CAMERAS[1]}
    ns = new_namespace()
    code, output = exit_output(NodeProcess(ros_env, tmp_path, ns, params))
    assert code == 2 and "Traceback" not in output, output
    for reason in (
        "camera_topics: '~cam' is not a valid ROS topic name: topic name must not have a tilde '~' that is not "
        "followed by a forward slash '/'",
        "camera_topics: 'cam{' is not a valid ROS topic name: topic name must not have unmatched (unbalanced) "
        "curly braces '{}'",
        f"camera_topics[2] '{CAMERAS[1]}' and joint_state_topic '{CAMERAS[1]}' both resolve to {ns}/{CAMERAS[1]}, "
        "which cannot carry sensor_msgs/msg/Image and sensor_msgs/msg/JointState at once; "
        "expected a topic of its own for each",
    ):
        assert reason in output, f"missing reason {reason!r} in:\n{output}"


@pytest.mark.parametrize(
    "module,said",
    [
        ("simplejpeg", "whose JPEG frames need the simplejpeg package (strict decoding): pip install simplejpeg"),
        ("PIL", "whose PNG frames need the pillow package: pip install pillow"),
    ],
)
def test_compressed_cameras_without_a_decoder_exit_1_saying_so(ros_env, tmp_path, module, said):
    """JPEG is decoded strictly by simplejpeg only, PNG by pillow: a node without one would refuse
    every such frame, so it says so at start. sitecustomize hides the installed package."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    env = {**ros_env, "PYTHONPATH": f"{hide}:{ros_env.get('PYTHONPATH', '')}"}
    params = {**TEST_PARAMS, "camera_transports": ["raw", "compressed"]}
    code, output = exit_output(NodeProcess(env, tmp_path, new_namespace(), params))
    assert code == 1 and "Traceback" not in output, output
    assert f"not starting: camera_transports has compressed cameras, {said}" in output, output


def test_params_file_rcl_cannot_parse_exits_2_without_a_traceback(ros_env, tmp_path):
    """A list mixing strings and numbers: rcl refuses the file inside rclpy.init."""
    params = {**TEST_PARAMS, "camera_topics": ["cam_a", 1]}
    code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
    assert code == 2, output
    assert "not starting: the ROS arguments or a params file are invalid" in output
    assert "Sequence should be of same type" in output and "Traceback" not in output
    assert ".c:" not in output.split("not starting:")[1], output  # rcl's C source locations left out


def test_policy_that_cannot_be_built_exits_non_zero(ros_env, tmp_path):
    params = {**TEST_PARAMS, "checkpoint": str(tmp_path)}  # a folder without model.safetensors
    code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
    assert code == 1, output
    assert "not starting: could not build policy 'pi05_tiny'" in output


def test_an_unwritable_tokenizer_cache_exits_1_naming_it(ros_env, tmp_path):
    """The embedded policy's tokenizer is trained into a cache on first use: a cache that cannot be
    written ended the node with a traceback; now one line naming the folder and FLASHRT_CACHE."""
    env = dict(ros_env, FLASHRT_CACHE=str(tmp_path / "a_file" / "cache"))
    (tmp_path / "a_file").write_text("not a folder")
    code, output = exit_output(NodeProcess(env, tmp_path, new_namespace(), dict(TEST_PARAMS)))
    assert code == 1 and "Traceback" not in output, output
    assert f"not starting: the embedded policy's tokenizer: cannot write the tiny tokenizer to {tmp_path}" in output
    assert "set FLASHRT_CACHE to a folder this user can write" in output


def test_checkpoint_that_does_not_fit_the_parameters_exits_with_the_reasons(ros_env, tmp_path):
    """A pi0 checkpoint where `policy` says pi0.5, with statistics for 2 joints where the robot
    has 4: the node names both mismatches instead of running the wrong model or passing joints
    through un-normalised."""
    import numpy as np
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model
    from flashrt_ros.policies.normalize import Normalizer, Stats

    folder = save_model(tiny_model("pi0", num_views=len(CAMERAS)), tmp_path / "ckpt", layout="openpi")
    stats = Stats(q01=-np.ones(2), q99=np.ones(2))
    Normalizer("quantile", state=stats, actions=stats).save(folder / "norm_stats.json")
    params = {**TEST_PARAMS, "checkpoint": str(folder)}
    code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
    assert code == 1, output
    for reason in (
        f"policy 'pi05_tiny' is a pi05 policy but checkpoint {folder} holds a pi0 one",
        f"joint_names has 4 joints but the normalisation statistics of checkpoint {folder} cover 2",
        "action_joint_names (or joint_names) has 4 joints",
    ):
        assert reason in output, f"missing reason {reason!r} in:\n{output}"


def test_sim_time_without_clock_is_reported_and_the_node_still_stops(ros_env, rclpy_context, tmp_path):
    """use_sim_time with nothing on /clock: decisions (ROS time) wait, but ~/status and
    /diagnostics keep coming (steady clock) and say why, the stall is counted once, SIGINT stops
    the node cleanly - and once /clock runs, chunks follow; with sim time off again, the clock is
    no longer blamed."""
    import time

    from builtin_interfaces.msg import Time
    from node_harness import Peer
    from rosgraph_msgs.msg import Clock

    node = NodeProcess(ros_env, tmp_path, new_namespace(), {**TEST_PARAMS, "use_sim_time": True})
    peer = Peer(rclpy_context, node.namespace)
    try:
        assert peer.pump(30.0, until=lambda: peer.latest_counter("", "clock_stalled") > 0), node.tail()
        node.wait_for_line("ROS time (use_sim_time) has not advanced for")
        assert "is anything publishing /clock?" in node.wait_for_line("has not advanced")
        assert not peer.chunks
        peer.pump(1.0)
        messages = [s.message for d in peer.diagnostics for s in d.status]
        assert any("no decision for" in m and "is anything publishing /clock?" in m for m in messages), messages
        assert peer.latest_counter("", "clock_stalled") == 1  # once per stall, not per status
        clock_pub = peer.node.create_publisher(Clock, "/clock", 10)

        def tick() -> None:
            ns = peer.now().nanoseconds  # the peer's wall time as simulated time: its stamps stay fresh
            clock_pub.publish(Clock(clock=Time(sec=ns // 10**9, nanosec=ns % 10**9)))

        assert peer.pump(10.0, until=lambda: bool(peer.chunks), extra=tick), node.tail()
        peer.assert_chunks_from_good_data()
        # /clock stops (a paused simulator): a second stall, then sim time off: not blamed any more
        assert peer.pump(10.0, until=lambda: peer.latest_counter("", "clock_stalled") == 2), node.tail()
        node.wait_for_line("s: simulator paused or /clock stopped?; decisions wait for it")
        # paused now: the held samples stopped ageing with the clock, so "ready" would be false
        from std_srvs.srv import SetBool

        assert peer.call(SetBool, f"{peer.namespace}/{NODE}/enable", SetBool.Request(data=False)).success
        seen = len(peer.diagnostics)

        def paused_status() -> str:
            return peer.diagnostics[-1].status[0].message if len(peer.diagnostics) > seen else ""

        assert peer.pump(10.0, publish=False, until=lambda: "paused" in paused_status()), paused_status()
        assert "not ready (" in paused_status() and "ROS time (use_sim_time) has not advanced" in paused_status()
        assert peer.call(SetBool, f"{peer.namespace}/{NODE}/enable", SetBool.Request(data=True)).success
        assert peer.set_parameters(use_sim_time=False)[0].successful
        peer.pump(0.5, publish=False)
        seen = len(peer.diagnostics)

        def idle_on_wall_time() -> bool:  # no inputs now: an ERROR once the idle limit passes
            latest = peer.diagnostics[-1].status[0].message if len(peer.diagnostics) > seen else ""
            return "no decision for" in latest

        # the window is wide: the idle limit is twice the slowest recent decision, which a loaded
        # CI machine has made seconds long; and it once delivered fewer than three statuses in 3 s
        found = peer.pump(20.0, publish=False, until=idle_on_wall_time)
        latest = peer.diagnostics[-1].status[0].message
        assert found, f"{len(peer.diagnostics) - seen} diagnostics after use_sim_time off, the last {latest!r}"
        assert "ROS time" not in latest, latest
        start = time.monotonic()
    finally:
        peer.close()
        code = node.stop()
    # a node that waited on the stopped sim clock would not stop at all; the exit with torch
    # loaded takes seconds on a loaded machine
    assert code == 0 and time.monotonic() - start < 8.0, node.tail()
    node.wait_for_line("shutting down; stats:")


def test_a_clock_message_rclpy_cannot_take_is_counted_and_the_node_goes_on(ros_env, rclpy_context, tmp_path):
    """A /clock message with a negative time (an int32 any bridge or bag can carry) raised in
    rclpy's own /clock callback and ended the node's process (exit 1, a traceback, no hold point
    for the controllers). It is counted as node_error, named, and decisions go on."""
    from builtin_interfaces.msg import Time
    from node_harness import Peer
    from rosgraph_msgs.msg import Clock

    node = NodeProcess(ros_env, tmp_path, new_namespace(), {**TEST_PARAMS, "use_sim_time": True})
    peer = Peer(rclpy_context, node.namespace)
    try:
        clock_pub = peer.node.create_publisher(Clock, "/clock", 10)

        def tick() -> None:
            ns = peer.now().nanoseconds
            clock_pub.publish(Clock(clock=Time(sec=ns // 10**9, nanosec=ns % 10**9)))

        assert peer.pump(60.0, until=lambda: bool(peer.chunks), extra=tick), node.tail()
        mark = node.mark()
        clock_pub.publish(Clock(clock=Time(sec=-5)))
        line = node.wait_for_line("[node_error] a callback raised in clock_callback (time_source.py:", since=mark)
        assert "ValueError" in line and "its message is dropped and the node goes on" in line, line
        assert peer.pump(10.0, until=lambda: peer.latest_counter("", "node_error") > 0, extra=tick), node.tail()
        start = len(peer.chunks)
        assert peer.pump(10.0, until=lambda: len(peer.chunks) > start + 2, extra=tick), node.tail()
        peer.assert_chunks_from_good_data()
    finally:
        peer.close()
        code = node.stop()
    assert code == 0, node.tail()
    node.wait_for_line("shutting down; stats:")


def test_camera_that_changes_size_or_sends_a_sliver(ros_env, rclpy_context, tmp_path):
    """No image size configured (the shipped default): each camera keeps the size it has been
    sending - a change mid-stream is refused; after a gap longer than max_age_s (a camera
    restart) or a ~/reset a new size is taken - and a frame too thin to resize into the model's
    input is refused rather than failing inside the policy."""
    from node_harness import running_node_and_peer
    from std_srvs.srv import Trigger

    with running_node_and_peer(ros_env, tmp_path, rclpy_context, image_height=0, image_width=0) as running:
        node, peer = running
        h, w = HW[0] * 2, HW[1] * 2
        refused(
            running,
            CAMERAS[1],
            lambda: peer.publish_camera(1, peer.image(hw=(h, w)), good=False),
            "bad_size",
            f"image is {h}x{w} (HxW); this topic's frames were {HW[0]}x{HW[1]} until now; expected the same size",
        )
        peer.pump(1.0, skip={CAMERAS[0]})  # a pause: any size may come next, but not a sliver
        refused(
            running,
            CAMERAS[0],
            lambda: peer.publish_camera(0, peer.image(hw=(1, 120)), good=False),
            "bad_size",
            "image is 1x120 (HxW): resized into the model's",
        )
        topic = peer.topic(CAMERAS[1])

        def used_from_now_on(hw: tuple[int, int]) -> None:
            since = peer.now().nanoseconds
            frames = lambda: peer.publish_camera(1, peer.image(hw=hw))  # noqa: E731
            fresh = lambda: bool(peer.chunks) and peer.chunk_sources(peer.chunks[-1])[topic] > since  # noqa: E731
            assert peer.pump(10.0, until=fresh, skip={CAMERAS[1]}, extra=frames), node.tail()
            peer.assert_chunks_from_good_data()

        mark = node.mark()
        peer.pump(1.0, skip={CAMERAS[1]})  # the camera restarts: stamps 1 s apart (max_age_s 0.4)
        cut = peer.image(hw=(h, w))  # and its first frame comes cut short (as USB cameras' often do):
        cut.data = bytes(cut.data)[: 3 * h * w // 2]  # refused, it must not close the gap (its next
        truncated = f"input rejected: [truncated_data] {topic}: "  # frames were refused as bad_size until a ~/reset)
        said = lambda: any(truncated in line for line in node.lines[mark:])  # noqa: E731
        cut_again = lambda: peer.publish_camera(1, cut, good=False)  # noqa: E731  (best effort: one may be lost)
        assert peer.pump(10.0, skip={CAMERAS[1]}, extra=cut_again, until=said), node.tail()
        used_from_now_on((h, w))
        line = node.wait_for_line(f"{topic}: frames are now {h}x{w} (were {HW[0]}x{HW[1]}), stamped ", since=mark)
        # 1 s and more: the pump above, and the wait for the refusal on a loaded machine
        assert re.search(r"stamped [1-9][0-9.]* s after its previous frame: taken as a camera restart$", line), line
        assert peer.call(Trigger, f"{node.namespace}/flashrt_node/reset", Trigger.Request()).success
        used_from_now_on(HW)  # no gap, but the reset let the size go


@pytest.fixture(scope="module")
def any_size(ros_env, ros_module_context, tmp_path_factory):
    """A node with no image size configured (the shipped default), cam0 compressed (PNG), cam1 raw:
    each camera keeps the size it has been sending."""
    run = running_node_and_peer(
        ros_env,
        tmp_path_factory.mktemp("any_size"),
        ros_module_context,
        image_height=0,
        image_width=0,
        camera_transports=["compressed", "raw"],
    )
    with run as node_and_peer:
        yield node_and_peer


def _wrong_size_after_an_arrival_gap(any_size, behind_s: float) -> None:
    """cam1 (raw): a good frame stamped 0.3 s ahead (within max_age_s 0.4), 0.6 s without cam1
    frames (longer than max_age_s), then a frame of twice the size stamped `behind_s` before now.
    By the stamps there was no pause (the frames are at most 0.3 s apart), so this is no camera
    restart: the frame is refused as bad_size, the size stays, and the camera's frames go on
    being used."""
    from rclpy.duration import Duration

    node, peer = any_size
    topic, (h, w) = peer.topic(CAMERAS[1]), (HW[0] * 2, HW[1] * 2)
    peer.pump(0.5)
    ahead = peer.now() + Duration(seconds=0.3)
    peer.publish_camera(1, peer.image(stamp=ahead))
    peer.pump(0.6, skip={CAMERAS[1]})
    mark = node.mark()
    # stamped from the good frame's stamp, not the clock: 0.3 s apart whatever the pause really
    # lasted (a stall of 0.1 s on a loaded machine would make it a real restart gap)
    stamp = ahead + Duration(seconds=0.3 - behind_s)
    peer.publish_camera(1, peer.image(stamp=stamp, hw=(h, w)), good=False)
    recovered(peer, topic)
    line = node.wait_for_line(f"input rejected: [bad_size] {topic}: image is {h}x{w} (HxW); ", since=mark)
    assert f"this topic's frames were {HW[0]}x{HW[1]} until now" in line, line
    assert not [ln for ln in node.lines[mark:] if "taken as a camera restart" in ln], node.tail()


def test_camera_restart_is_judged_by_stamps_not_by_arrival(any_size):
    """Arrivals paused (as when the node itself is slow, decoding a big frame) while the
    camera's stamps show none: a wrong-size frame was taken as a camera restart, and the
    camera's real frames were refused from then on."""
    _wrong_size_after_an_arrival_gap(any_size, behind_s=0.0)


def test_frame_stamped_in_the_past_opens_no_restart_gap(any_size):
    """The gap is measured from the newest stamp the camera sent: a frame stamped 0.35 s before
    it (refused: older than the one held) and then one of another size stamped 0.2 s after it
    are 0.55 s apart, but the camera never paused - the wrong size is refused."""
    from rclpy.time import Time

    node, peer = any_size
    topic, (h, w) = peer.topic(CAMERAS[1]), (HW[0] * 2, HW[1] * 2)
    peer.pump(0.5)
    mark = node.mark()
    # from the camera's newest good stamp, not the clock: a stall here must not open a real gap
    newest, clock_type = peer.last_good[topic], peer.now().clock_type
    past = Time(nanoseconds=newest - 350_000_000, clock_type=clock_type)
    peer.publish_camera(1, peer.image(stamp=past), good=False)
    after = Time(nanoseconds=newest + 200_000_000, clock_type=clock_type)
    peer.publish_camera(1, peer.image(stamp=after, hw=(h, w)), good=False)
    recovered(peer, topic)
    line = node.wait_for_line(f"input rejected: [bad_size] {topic}: image is {h}x{w} (HxW); ", since=mark)
    assert f"this topic's frames were {HW[0]}x{HW[1]} until now" in line, line


def test_frame_stamped_a_little_ahead_keeps_the_cameras_size(any_size):
    """A frame stamped 0.3 s ahead (within max_age_s 0.4: a camera clock running early) is the
    camera's newest stamp, not a clock that went back: the frames of another size after it,
    stamped now, are still refused (they were taken as a camera restart once)."""
    from rclpy.time import Time

    node, peer = any_size
    topic, (h, w) = peer.topic(CAMERAS[1]), (HW[0] * 2, HW[1] * 2)
    peer.pump(0.5)
    mark, before = node.mark(), peer.latest_counter(topic, "bad_size")
    # 0.3 s after the camera's newest good stamp, not after the clock: the gap stays below
    # max_age_s (no restart) however long the pump above over-ran on a loaded machine
    ahead = Time(nanoseconds=peer.last_good[topic] + 300_000_000, clock_type=peer.now().clock_type)
    peer.publish_camera(1, peer.image(stamp=ahead, hw=(h, w)), good=False)
    for _ in range(3):
        peer.pump(0.05, skip={CAMERAS[1]})
        peer.publish_camera(1, peer.image(stamp=peer.now(), hw=(h, w)), good=False)
    recovered(peer, topic)
    node.wait_for_line(f"input rejected: [bad_size] {topic}: image is {h}x{w} (HxW); ", since=mark)
    assert not [ln for ln in node.lines[mark:] if "taken as a camera restart" in ln], node.tail()
    peer.wait_for_counter(topic, "bad_size", above=before + 2, skip={CAMERAS[1]})  # one may be lost or stale


def _png_claiming(h: int, w: int) -> bytes:
    """A PNG of HW whose IHDR (CRC kept valid) says h x w: undecodable, so any decode attempt
    would end in decode_failed - after allocating h*w*3 bytes."""
    import io
    import zlib

    import numpy as np
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(np.zeros((*HW, 3), np.uint8)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = w.to_bytes(4, "big") + h.to_bytes(4, "big")
    data[29:33] = zlib.crc32(data[12:29]).to_bytes(4, "big")
    return bytes(data)


def test_oversized_compressed_frames_are_refused_from_the_header(any_size):
    """No size configured: a compressed frame of another size than the camera's is refused from
    its header, not decoded (an 8000x8000 PNG at 10 Hz cut decisions 5x); after a gap in the
    camera's stamps (a restart, any size taken) the header is still held to 8K's pixels."""
    _, peer = any_size
    big = _png_claiming(8000, 8000)
    bad = lambda: peer.publish_camera(0, peer.compressed(data=big), good=False)  # noqa: E731
    refused(
        any_size,
        CAMERAS[0],
        bad,
        "bad_size",
        f"image is 8000x8000 (HxW); this topic's frames were {HW[0]}x{HW[1]} until now; expected the same size",
    )
    peer.pump(1.0, skip={CAMERAS[0]})  # the camera pauses: longer than max_age_s, any size may come
    refused(
        any_size,
        CAMERAS[0],
        bad,
        "bad_size",
        "image is 8000x8000 (HxW), 64.0 Mpx; expected at most 33.2 Mpx (7680x4320, 8K), the largest frame",
    )


def _checkpoint_with_stats(folder, stats: dict, model=None):
    """A tiny pi0.5 checkpoint (2 views; `model`'s weights if given) with `stats` written as its
    norm_stats.json as given (the Normalizer would refuse to save bad ones)."""
    import json

    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model

    folder = save_model(model or tiny_model("pi05", num_views=len(CAMERAS)), folder, layout="openpi")
    (folder / "norm_stats.json").write_text(json.dumps({"norm_stats": stats, "mode": "quantile"}))
    return folder


def test_checkpoint_with_nan_statistics_exits_naming_them(ros_env, tmp_path):
    """A NaN bound would turn every state into NaN, which pi0.5 bins silently into its prompt."""
    bad = {"q01": [-1.0] * 4, "q99": [1.0, float("nan"), 1.0, 1.0]}
    good = {"q01": [-1.0] * 4, "q99": [1.0] * 4}
    folder = _checkpoint_with_stats(tmp_path / "ckpt", {"state": bad, "actions": good})
    params = {**TEST_PARAMS, "checkpoint": str(folder)}
    code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
    assert code == 1, output
    assert "not starting: could not build policy" in output
    assert f"{folder / 'norm_stats.json'}: state statistic 'q99' is not finite at index 1" in output, output


def test_state_beyond_its_statistics_is_a_counted_policy_error(ros_env, rclpy_context, tmp_path):
    """A finite joint value that the checkpoint's (narrow) statistics normalise to inf: no chunk
    from it, the policy_error counter and a precise log line, and the node decides again once
    the joints are back in range."""
    from node_harness import running_node_and_peer

    stats = {"q01": [0.0] * 5, "q99": [1e-3] * 5}  # 5 dims for 4 joints: a warning at start
    folder = _checkpoint_with_stats(tmp_path / "ckpt", {"state": stats, "actions": stats})
    with running_node_and_peer(ros_env, tmp_path, rclpy_context, checkpoint=str(folder)) as (node, peer):
        node.wait_for_line("joint_names has 4 joints, the checkpoint's normalisation statistics cover 5: only the")
        mark, before = node.mark(), peer.latest_counter("", "policy_error")
        huge = lambda: peer.publish_joints(peer.joints(positions=[0.0, 3e38, 0.0, 0.0]), good=False)  # noqa: E731
        peer.wait_for_counter("", "policy_error", above=before, skip={JOINT_TOPIC}, extra=huge)
        node.wait_for_line(
            "policy failed, no chunk published: ValueError('normalised state is not finite at index 1", since=mark
        )
        peer.assert_chunks_from_good_data()
        recovered(peer, peer.topic(JOINT_TOPIC))


def test_checkpoint_whose_actions_overflow_publishes_nothing_and_keeps_serving(ros_env, rclpy_context, tmp_path):
    """A diverged checkpoint: finite weights (NaN ones are refused at load), but its action
    projection is so large that every chunk overflows to inf / NaN. No chunk is ever published;
    each decision is counted as non_finite_action and logged, and the node keeps serving its
    status and services, and stops cleanly. A refused input is logged (a warning) after those
    errors: rclpy once raised when the node's throttled lines changed severity, and the node died."""
    import torch
    from policy_fixtures import tiny_model
    from std_srvs.srv import Trigger

    model = tiny_model("pi05", num_views=len(CAMERAS))
    with torch.no_grad():
        model.action_out_proj.weight.fill_(1e38)  # finite in fp32; x @ W.T is not
    good = {"q01": [-1.0] * 4, "q99": [1.0] * 4}
    folder = _checkpoint_with_stats(tmp_path / "ckpt", {"state": good, "actions": good}, model)
    run = running_node_and_peer(ros_env, tmp_path, rclpy_context, first="status", checkpoint=str(folder))
    with run as (node, peer):
        counted = peer.wait_for_counter("", "non_finite_action", above=1, timeout=15.0)
        line = node.wait_for_line("no chunk published: [non_finite_action] ")
        assert "actions are NaN or inf" in line and "expected finite actions" in line, line
        mark = node.mark()
        peer.publish_joints(peer.joints(positions=[0.0, float("nan"), 0.2, 0.3]), good=False)
        node.wait_for_line("input rejected: [non_finite_joint]", since=mark)
        assert peer.call(Trigger, f"{node.namespace}/flashrt_node/reset", Trigger.Request()).success
        statuses = len(peer.statuses)
        peer.pump(1.0)
        assert len(peer.statuses) > statuses, "the status stopped after the refusals"
        assert peer.chunks == [] and peer.trajectories == [], f"{len(peer.chunks)} chunks from a diverged policy"
        assert counted >= 2 and peer.statuses[-1].decisions == 0  # `decisions` counts published chunks


def test_compressed_camera_refusals(ros_env, rclpy_context, tmp_path):
    """camera_transports compressed (sensor_msgs/CompressedImage over DDS): data the decoder
    rejects and a codec the node does not decode are refused by name; PNG frames are used."""
    import numpy as np
    from node_harness import corrupt_jpeg_scan, jpeg_of, running_node_and_peer

    transports = ["compressed", "raw"]
    with running_node_and_peer(ros_env, tmp_path, rclpy_context, camera_transports=transports) as running:
        node, peer = running
        assert node.wait_for_line(f"{peer.topic(CAMERAS[0])} (compressed)")
        refused(
            running,
            CAMERAS[0],
            lambda: peer.publish_camera(0, peer.compressed(data=b"not an image at all"), good=False),
            "decode_failed",
            "data (format='png') starts with 6e 6f 74 20 61 6e 20 69, neither a JPEG (ff d8) nor a PNG signature",
        )
        # libjpeg only warns about corrupt scan data (Pillow decoded it to garbage): refused too
        yy, xx = np.mgrid[0 : HW[0], 0 : HW[1]]
        gradient = np.stack([xx * 8, yy * 10, (xx + yy) * 4], -1).clip(0, 255).astype(np.uint8)
        corrupt = corrupt_jpeg_scan(jpeg_of(gradient))
        refused(
            running,
            CAMERAS[0],
            lambda: peer.publish_camera(0, peer.compressed(data=corrupt, fmt="jpeg"), good=False),
            "decode_failed",
            f"could not decode {len(corrupt)} bytes labelled format='jpeg' as JPEG or PNG: "
            "ValueError: Corrupt JPEG data",
        )
        refused(
            running,
            CAMERAS[0],
            lambda: peer.publish_camera(0, peer.compressed(fmt="tiff"), good=False),
            "bad_encoding",
            "compressed format 'tiff' is not supported; expected one naming jpeg or png",
        )


def test_sigint_is_handled_promptly_with_ros_time_stopped_and_a_slow_status(ros_env, tmp_path):
    """Nothing wakes the executor when ROS time stops (use_sim_time, no /clock), no input arrives
    and the status runs at 0.1 Hz - but the main loop waits at most process.POLL_S at a time and
    the signal handler only sets a flag: SIGINT still stops it at once."""
    import time

    params = {**TEST_PARAMS, "use_sim_time": True, "status_rate_hz": 0.1}
    node = NodeProcess(ros_env, tmp_path, new_namespace(), params)
    node.wait_for_line("deciding at 10 Hz", timeout=30.0)
    time.sleep(1.0)  # the executor is waiting now
    start = time.monotonic()
    code = node.stop()
    # the bug this guards against waits for the 10 s status period; the interpreter's exit with
    # torch loaded takes seconds on a loaded machine
    assert code == 0 and time.monotonic() - start < 6.0, (time.monotonic() - start, node.tail())
    node.wait_for_line("shutting down; stats:")


def test_a_stop_signal_while_the_pipeline_is_built_stops_the_node_cleanly(ros_env, tmp_path):
    """SIGINT while the pipeline is built (a checkpoint load and graph capture take minutes on a
    robot): exit 0 without a traceback, also for a node started with SIGINT ignored (a script's
    background job), which used to drop the signal until it spun."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the node's process
    try:  # a warm-up 20 s longer: the signal surely lands while the pipeline is built
        env = dict(ros_env, SLOW_WARM_UP_S="20", SLOW_DECIDE_S="0")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
        node = NodeProcess(env, tmp_path, new_namespace(), dict(TEST_PARAMS), module="slow_policy_node")
    finally:
        signal.signal(signal.SIGINT, previous)
    node.wait_for_line("no checkpoint given", timeout=60)  # logged while the policy is built
    code = node.stop(timeout=15)  # not the 20 s the warm-up would take: the signal cut it short
    output = "\n".join(node.lines)
    assert code == 0 and "Traceback" not in output, node.tail()
    assert "stopped by a signal while the pipeline was being built" in output, node.tail()
    assert "shutting down; stats:" not in output, node.tail()  # it never started serving


def _two_signals(proc, first: int) -> None:
    """`first`, then SIGINT 20 ms later: a terminal's Ctrl-C and a script's kill, or a double Ctrl-C."""
    import signal
    import time

    proc.send_signal(first)
    time.sleep(0.02)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)


def test_a_second_signal_does_not_break_the_stop(ros_env, tmp_path):
    """A second signal landed in the first one's clean-up: a KeyboardInterrupt traceback while the
    node was built, and the synthetic sensors, already stopping, died of the SIGINT (exit -2:
    Python's exit puts its handlers back to the default action). Both must still exit 0."""
    import signal
    import sys

    node = NodeProcess(ros_env, tmp_path, new_namespace(), dict(TEST_PARAMS))
    node.wait_for_line("no checkpoint given", timeout=60)  # logged while the policy is built
    _two_signals(node.proc, signal.SIGINT)
    code = node.stop(timeout=30)
    assert code == 0 and "Traceback" not in "\n".join(node.lines), node.tail()

    env = dict(ros_env, PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0")
    cmd = [sys.executable, "-m", "flashrt_ros.ros.synthetic_sensors", "--ros-args", "-r", f"__ns:={new_namespace()}"]
    sensors = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in sensors.stdout:
        if "publishing 3 cameras" in line:
            break
    _two_signals(sensors, signal.SIGTERM)
    output, _ = sensors.communicate(timeout=30)
    assert sensors.returncode == 0 and "Traceback" not in output, output


def test_checkpoint_with_an_empty_camera_runs_on_the_cameras_it_has(ros_env, rclpy_context, tmp_path):
    """LeRobot's `empty_cameras`: a view the checkpoint was trained with blank. The node takes one
    topic per real camera (not one that would never publish) and runs the empty view as absent."""
    from node_harness import running_node_and_peer
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model
    from flashrt_ros.policies.normalize import Normalizer

    model = tiny_model("pi05", num_views=2, empty_cameras=1)
    folder = save_model(model, tmp_path / "ckpt", layout="lerobot", camera_names=["top"])
    Normalizer("identity").save(folder / "norm_stats.json")
    params = {**TEST_PARAMS, "checkpoint": str(folder)}
    code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
    assert code == 1, output
    assert (
        "the policy takes 1 camera views (and 1 empty camera view(s) of its own, which no topic feeds); "
        "camera_topics has 2" in output
    ), output
    overrides = {"checkpoint": str(folder), "camera_topics": CAMERAS[:1]}
    with running_node_and_peer(ros_env, tmp_path, rclpy_context, **overrides) as (node, peer):
        node.wait_for_line(f"loaded pi05 lerobot checkpoint {folder}")  # the line a refusal must come before
        node.wait_for_line(" as observation.images.top], ")  # the topic that feeds the checkpoint's camera
        assert peer.pump(10.0, until=lambda: len(peer.chunks) >= 3), node.tail()
        peer.assert_chunks_from_good_data()
        assert all(len(c.source_stamps) == 2 for c in peer.chunks)  # the one camera and the joints


def test_more_joints_than_the_model_takes_exits_before_loading_its_weights(ros_env, tmp_path):
    """Identity statistics cover any joint count, but the model's padded state and action dims do
    not: named at start, from the files, instead of after the weights' load."""
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model
    from flashrt_ros.policies.normalize import Normalizer

    folder = save_model(tiny_model("pi05", num_views=len(CAMERAS), state_dim=3, action_dim=3), tmp_path / "ckpt")
    Normalizer("identity").save(folder / "norm_stats.json")
    code, output = exit_output(
        NodeProcess(ros_env, tmp_path, new_namespace(), {**TEST_PARAMS, "checkpoint": str(folder)})
    )
    assert code == 1 and "Traceback" not in output, output
    for name in ("joint_names", "action_joint_names (or joint_names)"):
        assert f"{name} has 4 joints but the model takes at most 3; expected at most 3" in output, output
    assert "loaded pi05" not in output, output  # refused from the files: no weight was read


def test_checkpoint_action_space_is_logged_or_refused_for_the_robot(ros_env, tmp_path):
    """A checkpoint's delta actions are named at start, by joint; its ALOHA conversion needs ALOHA's
    14 joints and a delta mask needs its joints, so a 4-joint robot is refused from the files,
    before the weights load."""
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model
    from flashrt_ros.policies.normalize import Normalizer

    def checkpoint(name: str, **space) -> str:
        folder = save_model(tiny_model("pi05", num_views=len(CAMERAS), **space), tmp_path / name)
        Normalizer("identity").save(folder / "norm_stats.json")
        return str(folder)

    refusals = {
        "aloha": (
            {"aloha_adapt_to_pi": True},
            "ALOHA's joint conversion (aloha_adapt_to_pi) needs 14 state and 14 action joints "
            "(per arm 6 joints and a gripper); the robot has 4 and 4",
        ),
        "libero": (
            {"delta_action_mask": [6, -1]},
            "the actions are deltas over the first 7 dims (delta_action_mask), so the robot needs at least 7 "
            "state and 7 action joints (each delta is added to its own joint's state); it has 4 and 4",
        ),
    }
    refusals["reordered"] = (  # j1 and j0 swapped: each delta would be added to the other's state
        {"delta_action_mask": [2, -1, 1]},
        "the actions are deltas added to the state of the same index (delta_action_mask), but action_joint_names "
        "puts j1 (action dim 0, state dim 1), j0 (action dim 1, state dim 0) elsewhere than joint_names",
    )
    for name, (space, reason) in refusals.items():
        folder = checkpoint(name, **space)
        params = {**TEST_PARAMS, "checkpoint": folder}
        if name == "reordered":
            params["action_joint_names"] = ["j1", "j0", "j2", "j3"]
        code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
        assert code == 1 and "Traceback" not in output, output
        assert f"checkpoint {folder}: {reason}" in output, output
        assert "loaded pi05" not in output, output  # refused from the files: no weight was read
    delta = checkpoint("delta", delta_action_mask=[2, -1, 1])
    node = NodeProcess(ros_env, tmp_path, new_namespace(), {**TEST_PARAMS, "checkpoint": delta})
    try:
        line = node.wait_for_line("/diagnostics; actions ", timeout=60.0)
        assert line.endswith("actions deltas on j0, j1, j3 added to the joint state"), line
    finally:
        node.stop()


def test_configured_frame_size_the_policy_cannot_use_exits_naming_it(ros_env, tmp_path):
    """A 1 x 1000 frame keeps no row in the model's square input: every frame would be refused,
    so the node says so at start instead of running without ever deciding."""
    params = {**TEST_PARAMS, "image_height": 1, "image_width": 1000}
    code, output = exit_output(NodeProcess(ros_env, tmp_path, new_namespace(), params))
    assert code == 1 and "Traceback" not in output, output
    assert (
        "not starting: image_height x image_width 1x1000: resized into the model's 56x56 input it keeps no row"
        in output
    ), output


def test_a_params_file_with_no_section_for_the_node_stops_the_start(ros_env, tmp_path):
    """rcl ignores a params file whose sections miss the node (`flashrt_node:` is /flashrt_node,
    not /robot1/flashrt_node): the node would run its defaults, random weights, on the robot.
    It stops instead, naming the file, its sections and the key that would reach it; a typo among
    the parameters is named before the other problems, which it often causes."""
    stray = tmp_path / "robot.yaml"
    stray.write_text("flashrt_node:\n  ros__parameters:\n    rate_hz: 5.0\n")
    ns = new_namespace()
    params = {**TEST_PARAMS, "rate_hz": -5.0, "rate_h": 5.0}
    code, output = exit_output(NodeProcess(ros_env, tmp_path, ns, params, extra_args=["--params-file", str(stray)]))
    assert code == 2, output
    expected = (
        f"params file {stray} has no section for this node {ns}/flashrt_node (its sections: 'flashrt_node'), "
        f"so none of its parameters apply; expected a section keyed '/**/flashrt_node' or '{ns}/flashrt_node'"
    )
    assert expected in output, output
    assert "rate_hz must be >= 0.01 and <= 1000, got -5.0" in output
    typo, refusal = output.index("ignoring unknown parameters ['rate_h']"), output.index("not starting")
    assert typo < refusal, output


def test_inputs_absent_just_after_start_are_an_expected_wait_then_a_warning(ros_env, tmp_path):
    """The first decision ticks come before any sensor message can: logged at INFO as a wait, not
    as a fault. Once the wait is over (max_age_s, and at least DISCOVERY_S, 3 s, after the start:
    DDS may not have found the publishers), an input still absent is warned about with the reason
    (here: nothing publishes on the topic). The wait's INFO line does not hold the warning back
    for a throttle period (30 s here)."""
    ns = new_namespace()
    node = NodeProcess(ros_env, tmp_path, ns, TEST_PARAMS | {"log_throttle_s": 30.0})
    try:
        first = node.wait_for_line("decision skipped: [absent]", timeout=60.0)
        assert "[INFO]" in first and "no good message received yet; waiting for the first one" in first, first
        line = node.wait_for_line(r"\[WARN\].*decision skipped: \[absent\]", regex=True, timeout=15.0)
        assert "no good message received yet; no publisher on this topic" in line, line
        # from the start-up log's first line, said just after the subscriptions were made (the first
        # tick can come later on a loaded machine)
        subscribed = node.wait_for_line("]: policy ")
        waited = _log_seconds(line) - _log_seconds(subscribed)
        assert waited >= 2.5, f"warned {waited:.2f} s after the subscriptions: within DDS discovery"
    finally:
        node.stop()


def _log_seconds(line: str) -> float:
    """The time an rclpy log line was stamped with ('[INFO] [1796637880.822102451] [...]')."""
    return float(re.search(r"\] \[(\d+\.\d+)\]", line).group(1))


@pytest.mark.parametrize("script", ["flashrt_node", "flashrt_lifecycle_node"])
def test_a_stop_signal_while_python_imports_the_node_exits_cleanly(ros_env, script):
    """SIGTERM in the process's first second, while rclpy, torch and the node's modules load
    (what `ros2 run` runs: the entry script): it ended with status 143 and no word. Sent once the
    script's own handler is in place (/proc says it catches SIGTERM), long before main() runs."""
    import signal
    import sys
    import time
    from pathlib import Path

    entry = Path(__file__).resolve().parents[1] / "scripts" / "ros" / script
    env = dict(ros_env, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, str(entry)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def catches_sigterm() -> bool:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return bool(caught & (1 << (signal.SIGTERM - 1)))

    deadline = time.monotonic() + 10.0
    while not catches_sigterm() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in output, output
    # the entry script's line, or main()'s where the machine was slow enough for main() to have begun
    assert "not starting: stopped by" in output, output


# ---- ~/reset and what it clears --------------------------------------------------------------


def _joint_sample(node):
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    stamp = Time(nanoseconds=node.get_clock().now().nanoseconds).to_msg()
    return Sample(np.zeros(14, np.float32), stamp, 0, 0)


def test_the_first_sample_after_a_reset_is_not_counted_as_a_dropped_input(rclpy_context):
    """a reset leaves nothing held: the next sample replaces nothing, drops nothing."""
    from node_harness import in_process_node
    from std_srvs.srv import Trigger

    node = in_process_node(rclpy_context)
    try:
        assert node.enabled
        slot = node.slots[-1]
        node._accept(slot, _joint_sample(node))  # held, not used by a decision yet
        assert node._on_reset(Trigger.Request(), Trigger.Response()).success
        assert node.dropped_inputs == 0
        node._accept(slot, _joint_sample(node))
        assert node.dropped_inputs == 0, "a reset-emptied slot's first sample was counted as dropped"
    finally:
        node.destroy_node()


def test_a_reset_forgets_the_refusals_before_it(rclpy_context):
    """after ~/reset the absent input's line says it waits for the next message, not the
    refusals of before the reset (whose counters the reset zeroed)."""
    from collections import Counter

    from node_harness import in_process_node
    from std_srvs.srv import Trigger

    from flashrt_ros.ros.input_error import InputError

    node = in_process_node(rclpy_context)
    try:
        slot = node.slots[-1]
        node._reject(slot, InputError("stale", slot.topic, "too old"))
        assert slot.rejected_since_good
        assert node._on_reset(Trigger.Request(), Trigger.Response()).success
        assert not slot.rejected_since_good
        detail = node._absent_detail(slot, Counter(slot.rejected_since_good))
        assert detail.endswith("; waiting for the next one"), detail
    finally:
        node.destroy_node()


def test_clear_forgets_the_camera_size_and_its_stamp_history():
    """~/reset says it clears 'the camera sizes they fixed'; else the first frame after it
    logs 'frames are now ... (were ...), stamped inf s after its previous frame'."""
    from collections import Counter

    from builtin_interfaces.msg import Time

    from flashrt_ros.ros.inputs import InputSlot, Sample

    slot = InputSlot(
        "/cam",
        "sensor_msgs/msg/Image",
        Sample(np.zeros(1), Time(sec=5), 0, 0),
        False,
        Counter(stale=2),
        (24, 32),
        5_000_000_000,
    )
    slot.clear(7.0, by="ROS time went back")
    assert (slot.latest, slot.used, slot.frame_hw, slot.newest_frame_stamp_ns) == (None, True, None, 0)
    assert (slot.generation, slot.rejected_since_good, slot.cleared_at, slot.cleared_by) == (
        1,
        Counter(),
        7.0,
        "ROS time went back",
    )
