"""synthetic_sensors in its own process feeding flashrt_node in another: JPEG cameras through
the node's `compressed` transport, joint states at a robot's rate, moving content, real stamps."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest
from node_harness import CAMERAS, JOINT_TOPIC, JOINTS, TEST_PARAMS, NodeProcess, Peer, new_namespace, stamp_ns

pytestmark = pytest.mark.ros

H, W = 48, 64


def test_synthetic_jpeg_cameras_and_joints_drive_the_node(ros_env, rclpy_context, tmp_path):
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import CompressedImage, JointState

    ns = new_namespace()
    params = {**TEST_PARAMS, "camera_transports": ["compressed"] * 2, "image_height": H, "image_width": W}
    frames: list = []
    joints: list = []
    with contextlib.ExitStack() as cleanup:  # every process stops, whatever fails
        sensors = subprocess.Popen(
            [sys.executable, "-m", "flashrt_ros.ros.synthetic_sensors", "--ros-args", "-r", f"__ns:={ns}",
             "-p", "encoding:=jpeg", "-p", f"image_width:={W}", "-p", f"image_height:={H}",
             "-p", f"camera_topics:=[{', '.join(CAMERAS)}]", "-p", f"joint_state_topic:={JOINT_TOPIC}",
             "-p", f"joint_names:=[{', '.join(JOINTS)}]"],
            env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        cleanup.callback(_stop, sensors)
        node = NodeProcess(ros_env, tmp_path, ns, params)
        cleanup.callback(node.stop)
        peer = Peer(rclpy_context, ns, inputs=False)
        cleanup.callback(peer.close)
        peer.node.create_subscription(CompressedImage, CAMERAS[0], frames.append, qos_profile_sensor_data)
        peer.node.create_subscription(JointState, JOINT_TOPIC, joints.append, qos_profile_sensor_data)
        got = peer.pump(60.0, publish=False, until=lambda: len(peer.chunks) >= 5 or node.proc.poll() is not None)
        assert got and len(peer.chunks) >= 5, f"no chunks from synthetic inputs\n{node.tail()}"
        n_joints, n_frames = len(joints), len(frames)
        peer.pump(1.5, publish=False)
        joint_gaps = np.diff([stamp_ns(j.header.stamp) for j in joints[n_joints:]]) / 1e6
        frame_gaps = np.diff([stamp_ns(f.header.stamp) for f in frames[n_frames:]]) / 1e6
    node_code, sensors_out = node.proc.returncode, sensors.stdout.read() if sensors.stdout else ""
    assert node_code == 0, node.tail()
    assert sensors.returncode == 0, sensors_out

    # The node used them: every chunk names fresh, increasing stamps of the synthetic topics.
    chunk = peer.chunks[-1]
    assert list(chunk.source_topics) == [peer.topic(t) for t in [*CAMERAS, JOINT_TOPIC]]
    firsts = [stamp_ns(s) for s in peer.chunks[0].source_stamps]
    lasts = [stamp_ns(s) for s in chunk.source_stamps]
    assert all(b > a for a, b in zip(firsts, lasts, strict=True))
    assert (chunk.horizon, chunk.action_dim) == (10, len(JOINTS))
    status = peer.statuses[-1]
    # absent before the first message, stale where a loaded machine held one back: not the data's fault
    assert not [c for c in status.invalid_inputs if c.topic and c.reason not in ("absent", "stale")], (
        status.invalid_inputs
    )

    # What synthetic_sensors publishes: JPEG frames of the configured size that move; named joints.
    assert frames and frames[-1].format == "jpeg" and frames[-1].header.frame_id == "cam0"
    from PIL import Image

    assert np.asarray(Image.open(io.BytesIO(bytes(frames[-1].data)))).shape == (H, W, 3)
    # The scroll repeats every 4 s, so the first and last frame may be the same picture: count distinct ones.
    distinct = {bytes(f.data) for f in frames}
    assert len(distinct) > 1, f"synthetic frames do not move: {len(frames)} frames, 1 distinct"
    assert list(joints[-1].name) == JOINTS and len(joints[-1].position) == len(JOINTS)
    assert stamp_ns(joints[-1].header.stamp) > stamp_ns(joints[0].header.stamp) > 0
    # 200 Hz and 30 Hz published: the gaps between the stamps of consecutive messages received.
    # Best-effort DDS on a loaded 2-core machine loses many (it once delivered 12.4 Hz of the
    # joints), which widens some gaps but not the shortest tenth: those still show the timers
    # run at their rates (5 ms, 33 ms), not at the decision rate (100 ms)
    assert len(joint_gaps) >= 5 and len(frame_gaps) >= 5, (len(joint_gaps), len(frame_gaps))
    assert np.percentile(joint_gaps, 10) < 20, np.percentile(joint_gaps, 10)
    assert np.percentile(frame_gaps, 10) < 60, np.percentile(frame_gaps, 10)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(2)  # SIGINT
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_synthetic_sensors_refuse_bad_settings_with_reasons(rclpy_context):
    """A bare string for a list was split into one topic per character, a topic name rcl refuses
    raised a traceback, and a runtime change was accepted and did nothing. Now: reasons at start,
    described parameters, and rclpy refuses every runtime change (the streams are made at start)."""
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.params import ConfigError
    from flashrt_ros.ros.synthetic_sensors import SyntheticSensors

    def problems(**values) -> list[str]:
        overrides = [Parameter(k, value=v) for k, v in values.items()]
        with pytest.raises(ConfigError) as err:
            SyntheticSensors(context=rclpy_context, parameter_overrides=overrides).destroy_node()
        return err.value.problems

    assert problems(camera_topics="cam") == [
        "camera_topics must be a non-empty list of strings, e.g. [a, b], got 'cam': one camera topic each"
    ]
    assert problems(camera_topics=["~cam"], joint_state_topic="robot/1joints") == [
        "camera_topics[0]: '~cam' is not a valid ROS topic name: "
        "topic name must not have a tilde '~' that is not followed by a forward slash '/'",
        "joint_state_topic: 'robot/1joints' is not a valid ROS topic name: "
        "topic name token must not start with a number",
    ]
    assert problems(camera_rate_hz=True, jpeg_quality=True) == [  # Python's True is an int, not a number here
        "camera_rate_hz must be a number in [0.01, 1000], got True",
        "jpeg_quality must be an integer in [1, 100], got True",
    ]
    assert problems(image_width=100_000, image_height=100_000)[0].startswith(
        "image_width/image_height must be integers > 0 of at most 33177600 pixels together"
    )
    # JPEG holds at most 65535 pixels a side: a 70000 x 2 camera passed and died encoding, a traceback
    assert problems(encoding="jpeg", image_width=70_000, image_height=2) == [
        "image_width/image_height must be at most 65500 each for encoding jpeg (the format's limit), got 70000/2"
    ]
    # a period past int64 nanoseconds was a TypeError from rclpy's Timer
    assert problems(joint_rate_hz=1e-12) == ["joint_rate_hz must be a number in [0.01, 1000], got 1e-12"]
    (typo,) = problems(camera_rate=15.0, encodng="jpeg")  # ran on its defaults without a word
    assert typo.startswith(
        "unknown parameters ['camera_rate', 'encodng'] (a typo? did you mean camera_rate_hz for camera_rate, "
        "encoding for encodng?); known: camera_topics, "
    ), typo
    assert problems(camera_topics=["a", "b", "a"], joint_names=["x", "x"]) == [
        "camera_topics has ['a'] more than once; expected each once",
        "joint_names has ['x'] more than once; expected each once",
    ]
    # two names for one topic, a camera's topic for the joints, a number for a topic: accepted (two
    # cameras on /a) or a traceback from create_publisher / rclpy's name resolution
    assert problems(camera_topics=["a", "/a"], joint_state_topic="b", joint_names=["j"]) == [
        "camera_topics[0] 'a' and camera_topics[1] '/a' both resolve to /a; expected each camera on a topic of its own"
    ]
    assert problems(camera_topics=["a"], joint_state_topic="/a") == [
        "camera_topics[0] 'a' and joint_state_topic '/a' both resolve to /a, which cannot carry "
        "sensor_msgs/msg/Image and sensor_msgs/msg/JointState at once; expected a topic of its own for each"
    ]
    assert problems(joint_state_topic=5) == ["joint_state_topic must be a topic name (a string), got 5"]
    sensors = SyntheticSensors(context=rclpy_context, parameter_overrides=[Parameter("camera_rate_hz", value=15.0)])
    try:
        assert sensors.describe_parameter("camera_rate_hz").description.startswith("frames per second per camera")
        result = sensors.set_parameters([Parameter("camera_rate_hz", value=-5.0)])[0]
        assert not result.successful and "read-only" in result.reason, result.reason
        assert sensors.get_parameter("camera_rate_hz").value == 15.0
    finally:
        sensors.destroy_node()


def test_synthetic_sensors_say_when_no_clock_lets_them_publish(ros_env, tmp_path):
    """use_sim_time with nothing publishing /clock: the timers never fire, and the start line had
    said the streams publish (`use_synthetic:=true use_sim_time:=true` without a simulator)."""
    from node_harness import NodeProcess, new_namespace

    module = "flashrt_ros.ros.synthetic_sensors"
    params = {"use_sim_time": True}
    sensors = NodeProcess(ros_env, tmp_path, new_namespace(), params, module=module, node="synthetic_sensors")
    try:
        line = sensors.wait_for_line("no /clock arrived", timeout=30.0)
        assert "use_sim_time is on and no /clock arrived in 3 s: nothing is published until ROS time moves" in line
    finally:
        assert sensors.stop() == 0, sensors.tail()


def test_synthetic_sensors_exit_2_on_a_params_file_rcl_cannot_parse(ros_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("/**:\n  ros__parameters:\n    joint_names: [a, 1]\n")  # rcl refuses mixed lists
    cmd = [sys.executable, "-m", "flashrt_ros.ros.synthetic_sensors", "--ros-args", "--params-file", str(bad)]
    done = subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "[synthetic_sensors] not starting: the ROS arguments or a params file are invalid" in done.stderr
    typo = [*cmd[:-2], "--param-file", str(bad)]  # --params-file misspelt: rclpy's UnknownROSArgsError
    done = subprocess.run(typo, env=ros_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "invalid: unknown ROS arguments ['--param-file'," in done.stderr, done.stderr
    # a file that is not there: rcl said only "Error opening YAML file", naming neither it nor the folder
    missing = [*cmd[:-1], "config/robot.yaml"]
    done = subprocess.run(missing, env=ros_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    want = f"[synthetic_sensors] not starting: no params file config/robot.yaml (relative paths are from {tmp_path})"
    assert want in done.stderr, done.stderr


def test_one_robot_wide_section_for_both_nodes_starts_the_sensors(ros_env, rclpy_context, tmp_path):
    """One `/**` section holding both nodes' parameters: flashrt_node's action_joint_names is close
    to the sensors' joint_names, and was refused as their typo (exit 2); a real typo still is."""
    import yaml

    from flashrt_ros.ros.params import ConfigError
    from flashrt_ros.ros.synthetic_sensors import SyntheticSensors

    def given(extra: dict):
        path = tmp_path / "robot.yaml"
        shared = {"joint_names": ["j0", "j1"], "action_joint_names": ["j0", "j1"], "rate_hz": 10.0, **extra}
        path.write_text(yaml.safe_dump({"/**": {"ros__parameters": shared}}))
        args = ["--ros-args", "--params-file", str(path)]
        return SyntheticSensors(context=rclpy_context, cli_args=args, sources=[("file", str(path))])

    given({}).destroy_node()
    with pytest.raises(ConfigError, match=r"unknown parameters \['joint_name'\] \(a typo\? did you mean joint_names"):
        given({"joint_name": ["j0"]})


def test_synthetic_sensors_refuse_a_params_file_for_another_node_and_name_each_camera_frame(ros_env, rclpy_context):
    """Given flashrt_node's params file (no section for it), it ran its defaults without a word;
    and every camera got the first token of its topic as frame_id (the namespace, for
    /robot/camera/left/image_raw: one frame for all)."""
    from pathlib import Path

    from rclpy.parameter import Parameter

    from flashrt_ros.ros.synthetic_sensors import SyntheticSensors

    config = Path(__file__).resolve().parents[1] / "config" / "flashrt.yaml"
    cmd = [sys.executable, "-m", "flashrt_ros.ros.synthetic_sensors", "--ros-args", "--params-file", str(config)]
    done = subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "has no section for this node /synthetic_sensors" in done.stderr, done.stderr

    topics = ["/robot/camera/left/image_raw", "camera/right/image_raw/compressed", "cam0/image_raw"]
    sensors = SyntheticSensors(
        context=rclpy_context,
        namespace="/robot",
        parameter_overrides=[Parameter("camera_topics", value=topics)],
    )
    try:
        assert [sensors._frame_id(t, i) for i, t in enumerate(topics)] == ["camera_left", "camera_right", "cam0"]
    finally:
        sensors.destroy_node()
