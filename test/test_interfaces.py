"""Our generated ROS 2 interfaces (msg/, srv/): fields and types, serialisation, the installed
definitions being those of the source tree, and a real DDS round trip between two processes."""

import array
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ros

REPO = Path(__file__).resolve().parents[1]

HEADER = "std_msgs/Header"
TIME = "builtin_interfaces/Time"

EXPECTED_MSG_FIELDS = {
    "ActionChunk": {
        "header": HEADER,
        "joint_names": "sequence<string>",
        "horizon": "uint32",
        "action_dim": "uint32",
        "step_duration": "builtin_interfaces/Duration",
        "actions": "sequence<float>",  # float32[]
        "chunk_id": "uint64",
        "source_stamps": f"sequence<{TIME}>",
        "source_topics": "sequence<string>",
        "inference_latency_ms": "float",
        "prefix_reused": "boolean",
        "rtc_held_actions": "uint32",
        "rtc_overlap": "uint32",
    },
    "PipelineStatus": {
        "header": HEADER,
        "stages": "sequence<flashrt_ros/StageStats>",
        "decisions": "uint64",
        "deadline_misses": "uint64",
        "invalid_inputs": "sequence<flashrt_ros/InputCounter>",
        "dropped_inputs": "uint64",
        "prefix_reuses": "uint64",
        "rtc_guided": "uint64",
        "policy": "string",
        "device": "string",
        "precision": "string",
        "enabled": "boolean",
    },
    "StageStats": {
        "name": "string",
        "target_rate_hz": "float",
        "rate_hz": "float",
        "latency_p50_ms": "float",
        "latency_p90_ms": "float",
        "latency_p99_ms": "float",
        "runs": "uint64",
    },
    "InputCounter": {"topic": "string", "reason": "string", "count": "uint64"},
}

RESULT = {"success": "boolean", "message": "string"}
EXPECTED_SRV_FIELDS = {
    "SnapshotCapsule": ({"name": "string"}, RESULT),
    "RestoreCapsule": ({"name": "string"}, RESULT),
    "ForkCapsule": ({"source": "string", "target": "string"}, RESULT),
    "DropCapsule": ({"name": "string"}, RESULT),
    "ListCapsules": (
        {},
        RESULT | {"names": "sequence<string>", "size_bytes": "sequence<uint64>", "created": f"sequence<{TIME}>"},
    ),
}


def test_message_fields_and_types():
    import flashrt_ros.msg as msgs

    for name, fields in EXPECTED_MSG_FIELDS.items():
        assert getattr(msgs, name).get_fields_and_field_types() == fields, name


def test_a_status_says_enabled_unless_told_otherwise():
    """A default of true in the .msg: a PipelineStatus built without the field (by an older node
    or a tool) does not read as a paused policy."""
    from flashrt_ros.msg import PipelineStatus

    assert PipelineStatus().enabled is True and PipelineStatus(enabled=False).enabled is False


def test_service_fields_and_types():
    import flashrt_ros.srv as srvs
    from std_srvs.srv import Trigger  # the reset service

    for name, (request, response) in EXPECTED_SRV_FIELDS.items():
        srv = getattr(srvs, name)
        assert srv.Request.get_fields_and_field_types() == request, name
        assert srv.Response.get_fields_and_field_types() == response, name
    assert Trigger.Response.get_fields_and_field_types() == RESULT


def test_action_chunk_holds_a_row_major_float32_matrix():
    from flashrt_ros.msg import ActionChunk

    actions = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    msg = ActionChunk(horizon=4, action_dim=3, joint_names=["a", "b", "c"])
    msg.actions = actions.ravel()
    back = np.asarray(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
    np.testing.assert_array_equal(back, actions)
    assert msg.actions.typecode == "f"  # stored as array.array("f"): np.frombuffer() reads it in place
    # Fast path for large chunks: an array.array built from the bytes is stored as is.
    msg.actions = array.array("f", actions.tobytes())
    np.testing.assert_array_equal(np.frombuffer(msg.actions, dtype=np.float32), actions.ravel())
    # With field checks on (ROS_PYTHON_CHECK_FIELDS=1 or check_fields=True), setters validate.
    with pytest.raises(AssertionError, match="'horizon' field must be an unsigned integer"):
        ActionChunk(check_fields=True, horizon=-1)
    with pytest.raises(AssertionError, match="'joint_names' field must be"):
        ActionChunk(check_fields=True, joint_names="abc")


def test_serialisation_roundtrip_through_typesupport():
    from builtin_interfaces.msg import Time
    from flashrt_ros.msg import ActionChunk, InputCounter, PipelineStatus, StageStats
    from flashrt_ros.srv import ListCapsules
    from rclpy.serialization import deserialize_message, serialize_message

    chunk = ActionChunk(
        horizon=2,
        action_dim=2,
        actions=[1.0, -2.0, 3.5, 1e-3],
        chunk_id=2**63 + 5,
        source_stamps=[Time(sec=7, nanosec=9)],
        source_topics=["/cam0/image_raw"],
        inference_latency_ms=12.5,
    )
    chunk.step_duration.nanosec = 20_000_000
    assert deserialize_message(serialize_message(chunk), ActionChunk) == chunk

    status = PipelineStatus(
        stages=[
            StageStats(name="vision", rate_hz=9.5, latency_p50_ms=1.0, latency_p90_ms=2.0, latency_p99_ms=3.0, runs=11)
        ],
        invalid_inputs=[InputCounter(topic="/joint_states", reason="nan_joint", count=3)],
        decisions=10,
        deadline_misses=1,
        dropped_inputs=4,
        policy="pi05",
        device="cpu",
        precision="fp32",
    )
    assert deserialize_message(serialize_message(status), PipelineStatus) == status

    listing = ListCapsules.Response(names=["warm"], size_bytes=[2**40], created=[Time(sec=1)])
    assert deserialize_message(serialize_message(listing), ListCapsules.Response) == listing


def test_installed_definitions_are_the_source_tree_ones(monkeypatch):
    """Catches a stale build (msg/ or srv/ edited without re-running scripts/setup_env.sh, or a
    definition missing from CMakeLists.txt)."""
    from ament_index_python.packages import get_package_share_directory

    monkeypatch.setenv("AMENT_PREFIX_PATH", os.environ.get("AMENT_PREFIX_PATH") or sys.prefix)
    share = Path(get_package_share_directory("flashrt_ros"))
    for kind in ("msg", "srv"):
        source = {p.name: p.read_text() for p in (REPO / kind).glob(f"*.{kind}")}
        installed = {p.name: p.read_text() for p in (share / kind).glob(f"*.{kind}")}
        assert sorted(installed) == sorted(source), f"{kind}: rebuild with scripts/setup_env.sh"
        for name, text in source.items():
            assert installed[name] == text, f"{kind}/{name} changed: rebuild with scripts/setup_env.sh"


# A peer in its own process: publishes ActionChunks and serves ListCapsules; exits by itself.
PEER = r"""
import sys, time
import rclpy
from builtin_interfaces.msg import Time
from rclpy.executors import ExternalShutdownException
from flashrt_ros.msg import ActionChunk
from flashrt_ros.srv import ListCapsules

topic, service = sys.argv[1], sys.argv[2]
rclpy.init()
node = rclpy.create_node("interfaces_test_peer")
pub = node.create_publisher(ActionChunk, topic, 10)

def list_capsules(request, response):
    response.names = ["warm", "after_grasp"]
    response.size_bytes = [1024, 2**40]
    response.created = [Time(sec=1, nanosec=2), Time(sec=3, nanosec=4)]
    return response

node.create_service(ListCapsules, service, list_capsules)
count = 0

def publish():
    global count
    msg = ActionChunk(horizon=50, action_dim=7, chunk_id=count, inference_latency_ms=4.25)
    msg.header.stamp = node.get_clock().now().to_msg()
    msg.header.frame_id = "peer"
    msg.joint_names = [f"joint_{j}" for j in range(7)]
    msg.step_duration.nanosec = 20_000_000
    msg.actions = [float(count + 0.5 * i) for i in range(50 * 7)]
    msg.source_stamps = [Time(sec=100 + count, nanosec=1), Time(sec=200 + count, nanosec=2)]
    msg.source_topics = ["/cam0/image_raw", "/joint_states"]
    pub.publish(msg)
    count += 1

node.create_timer(0.05, publish)
deadline = time.monotonic() + 60
try:
    while rclpy.ok() and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.1)
except (KeyboardInterrupt, ExternalShutdownException):  # SIGINT / SIGTERM from the test
    pass
rclpy.try_shutdown()
"""


def test_pubsub_and_service_between_processes(rclpy_context, ros_env):
    from flashrt_ros.msg import ActionChunk
    from flashrt_ros.srv import ListCapsules
    from rclpy.executors import SingleThreadedExecutor

    assert ros_env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    suffix = uuid.uuid4().hex[:8]
    topic, service = f"/flashrt_test/chunks_{suffix}", f"/flashrt_test/list_capsules_{suffix}"
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, topic, service],
        env=ros_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    node = None
    try:
        import rclpy

        node = rclpy.create_node("interfaces_test", context=rclpy_context)
        executor = SingleThreadedExecutor(context=rclpy_context)
        executor.add_node(node)
        received = []
        node.create_subscription(ActionChunk, topic, received.append, 10)

        deadline = time.monotonic() + 30
        while not received and time.monotonic() < deadline and peer.poll() is None:
            executor.spin_once(timeout_sec=0.1)
        assert received, "no ActionChunk from the peer process within 30 s"

        msg = received[0]
        n = msg.chunk_id
        assert msg.header.frame_id == "peer"
        assert list(msg.joint_names) == [f"joint_{j}" for j in range(7)]
        assert (msg.horizon, msg.action_dim) == (50, 7)
        assert (msg.step_duration.sec, msg.step_duration.nanosec) == (0, 20_000_000)
        actions = np.asarray(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
        np.testing.assert_array_equal(actions.ravel(), n + 0.5 * np.arange(350, dtype=np.float32))
        assert [(t.sec, t.nanosec) for t in msg.source_stamps] == [(100 + n, 1), (200 + n, 2)]
        assert list(msg.source_topics) == ["/cam0/image_raw", "/joint_states"]
        assert msg.inference_latency_ms == 4.25

        client = node.create_client(ListCapsules, service)
        assert client.wait_for_service(timeout_sec=20), "ListCapsules service of the peer not found"
        future = client.call_async(ListCapsules.Request())
        executor.spin_until_future_complete(future, timeout_sec=20)
        response = future.result()
        assert response is not None, "no ListCapsules response within 20 s"
        assert list(response.names) == ["warm", "after_grasp"]
        assert list(response.size_bytes) == [1024, 2**40]
        assert [(t.sec, t.nanosec) for t in response.created] == [(1, 2), (3, 4)]
        executor.shutdown()
    except AssertionError as exc:
        peer.kill()
        output = peer.communicate(timeout=10)[0]
        raise AssertionError(f"{exc}\n--- peer process (exit code {peer.returncode}) output:\n{output}") from None
    finally:
        if node is not None:
            node.destroy_node()
        if peer.poll() is None:
            peer.terminate()
            try:
                peer.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.communicate()
