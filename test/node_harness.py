"""Helpers for the node tests (no tests here): the node under test in its own process, started
exactly as on a robot (``python -m flashrt_ros.ros.node --ros-args --params-file ...``), and a
test peer in the pytest process over real DDS - publishers of cameras and joints, subscribers
of every output, service and parameter clients.

Every good input the peer publishes is remembered per topic, so a test can check that a chunk
was computed only from good data: each of its source stamps must be one the peer published
as good on that topic.
"""

from __future__ import annotations

import array
import contextlib
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

NODE = "flashrt_node"
CAMERAS = ["cam0/image_raw", "cam1/image_raw"]
JOINT_TOPIC = "joints"
JOINTS = ["j0", "j1", "j2", "j3"]
HW = (24, 32)

TEST_PARAMS = {
    "camera_topics": CAMERAS,
    "joint_state_topic": JOINT_TOPIC,
    "joint_names": JOINTS,
    "image_height": HW[0],
    "image_width": HW[1],
    "rate_hz": 10.0,
    "max_age_s": 0.4,
    "status_rate_hz": 5,  # an int in the params file: accepted, and kept as a double
    "stats_log_period_s": 0.0,
    "log_throttle_s": 0.5,
    "frame_id": "base_link",
    "step_duration_s": 0.05,
}


def check_wait_after_reset(line: str) -> None:
    """A decision skipped for an input that ~/reset emptied X s ago is an expected wait (INFO,
    "waiting for the next one") while X is below max_age_s, a WARN after. The decision tick that
    logs it can come late on a loaded machine, so the level is judged by the X the line states
    (printed to 0.1 s: around max_age_s either level is right)."""
    found = re.search(r"since ~/reset (\d+\.\d) s ago", line)
    assert found, f"no 'since ~/reset X s ago' in: {line}"
    since, limit = float(found.group(1)), TEST_PARAMS["max_age_s"]
    if since < limit - 0.05:
        assert "[INFO]" in line and "waiting for the next one" in line, line
    elif since > limit + 0.05:
        assert "[WARN]" in line and "waiting for the next one" not in line, line


def new_namespace() -> str:
    return f"/flashrt_test_{uuid.uuid4().hex[:8]}"


def stamp_ns(stamp: Any) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def corrupt_jpeg_scan(jpeg: bytes) -> bytes:
    """Every third byte of a JPEG's entropy-coded scan zeroed (0x00 never makes a marker): the
    file still parses and libjpeg only *warns* about the data, so a lenient decoder (Pillow)
    returns garbage pixels without an error."""
    sos = jpeg.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(jpeg[sos + 2 : sos + 4], "big")
    data = bytearray(jpeg)
    data[scan + 5 : len(data) - 2 : 3] = bytes(len(range(scan + 5, len(data) - 2, 3)))
    return bytes(data)


def jpeg_of(rgb: np.ndarray, quality: int = 90) -> bytes:
    import io

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class NodeProcess:
    """``flashrt_node`` in a subprocess; its merged stdout/stderr lines are collected."""

    def __init__(
        self,
        env: dict[str, str],
        tmp: Path,
        namespace: str,
        params: dict,
        extra_args: list[str] = (),
        module: str = "flashrt_ros.ros.node",
        node: str = NODE,
    ):
        """`node`: the name `params` are addressed to (synthetic_sensors for its module)."""
        params_file = tmp / f"params_{uuid.uuid4().hex[:6]}.yaml"
        params_file.write_text(yaml.safe_dump({f"/**/{node}": {"ros__parameters": params}}))
        env = dict(env, RCUTILS_LOGGING_BUFFERED_STREAM="0", RCUTILS_COLORIZED_OUTPUT="0", PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable,
            "-m",
            module,
            "--ros-args",
            "-r",
            f"__ns:={namespace}",
            "--params-file",
            str(params_file),
            *extra_args,
        ]
        self.namespace = namespace
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def mark(self) -> int:
        with self._cond:
            return len(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 10.0, since: int = 0, regex: bool = False) -> str:
        """The first line (from index ``since``) containing ``pattern`` (or matching it)."""
        match = (lambda s: re.search(pattern, s)) if regex else (lambda s: pattern in s)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[since:]:
                    if match(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"no node log line with {pattern!r} in {timeout} s\n{self.tail()}")
                self._cond.wait(min(left, 0.2))

    def tail(self, n: int = 40) -> str:
        with self._cond:
            return "--- node output (last lines):\n" + "\n".join(self.lines[-n:])

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT, as ros2 launch does
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode


class Peer:
    """The robot side in the test process: publishes inputs, records the node's outputs."""

    def __init__(self, context: Any, namespace: str, inputs: bool = True, transports: list[str] | None = None):
        """``inputs=False``: no camera/joint publishers (another process publishes them);
        ``transports``: per camera, ``raw`` (sensor_msgs/Image) or ``compressed`` (PNG)."""
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from flashrt_ros.msg import ActionChunk, PipelineStatus
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from trajectory_msgs.msg import JointTrajectory

        self.namespace = namespace
        self.node = rclpy.create_node(f"test_peer_{uuid.uuid4().hex[:6]}", namespace=namespace, context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.transports = list(transports or ["raw"] * len(CAMERAS))
        types = [CompressedImage if t == "compressed" else Image for t in self.transports]
        self.camera_pubs = (
            [self.node.create_publisher(t, topic, 10) for t, topic in zip(types, CAMERAS, strict=True)]
            if inputs
            else []
        )
        self.joint_pub = self.node.create_publisher(JointState, JOINT_TOPIC, 10) if inputs else None
        self.chunks: list = []
        self.trajectories: list = []
        self.statuses: list = []
        self.diagnostics: list = []
        out = f"{namespace}/{NODE}"
        self.node.create_subscription(ActionChunk, f"{out}/action_chunk", self.chunks.append, 50)
        self.node.create_subscription(JointTrajectory, f"{out}/joint_trajectory", self.trajectories.append, 50)
        self.node.create_subscription(PipelineStatus, f"{out}/status", self.statuses.append, 50)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)
        self.good: dict[str, set[int]] = {}  # resolved topic -> stamps published as good
        self.last_good: dict[str, int] = {}
        self._frame = 0

    def _on_diagnostics(self, msg: Any) -> None:
        if any(self.namespace in s.name for s in msg.status):
            self.diagnostics.append(msg)

    def topic(self, relative: str) -> str:
        return f"{self.namespace}/{relative}"

    # ---- messages --------------------------------------------------------------------------
    def now(self) -> Any:
        return self.node.get_clock().now()

    def image(
        self,
        stamp: Any = None,
        hw: tuple[int, int] = HW,
        encoding: str = "rgb8",
        data: bytes | None = None,
        pad: int = 0,
        step: int | None = None,
    ):
        """An rgb8 frame; `pad` bytes of row padding (step = 3 w + pad, as some drivers send),
        or an explicit `step` (with `data`)."""
        from sensor_msgs.msg import Image

        h, w = hw
        self._frame += 1
        if data is None:
            rows = np.full((h, w * 3 + pad), 255, dtype=np.uint8)  # padding bytes 255, pixels not
            rows[:, : w * 3] = self._frame % 255
            data = rows.tobytes()
        step = w * 3 + pad if step is None else step
        msg = Image(height=h, width=w, encoding=encoding, step=step, data=array.array("B", data))
        msg.header.stamp = self._stamp_msg(stamp)
        return msg

    def compressed(self, stamp: Any = None, data: bytes | None = None, fmt: str = "png"):
        """A PNG frame of HW as a sensor_msgs/CompressedImage (or `data` as given)."""
        import io

        from PIL import Image as PILImage
        from sensor_msgs.msg import CompressedImage

        if data is None:
            self._frame += 1
            buf = io.BytesIO()
            PILImage.fromarray(np.full((*HW, 3), self._frame % 256, dtype=np.uint8)).save(buf, format="PNG")
            data = buf.getvalue()
        msg = CompressedImage(format=fmt, data=array.array("B", data))
        msg.header.stamp = self._stamp_msg(stamp)
        return msg

    def joints(self, stamp: Any = None, positions: list[float] | None = None, names: list[str] | None = None):
        from sensor_msgs.msg import JointState

        msg = JointState(name=list(names or JOINTS))
        msg.position = [0.1 * i for i in range(len(msg.name))] if positions is None else list(positions)
        msg.header.stamp = self._stamp_msg(stamp)
        return msg

    def _stamp_msg(self, stamp: Any) -> Any:
        """None = now; a builtin_interfaces/Time as is; an rclpy Time converted."""
        if stamp is None:
            return self.now().to_msg()
        return stamp if hasattr(stamp, "sec") else stamp.to_msg()

    def publish_camera(self, index: int, msg: Any, good: bool = True) -> int:
        self.camera_pubs[index].publish(msg)
        return self._remember(self.topic(CAMERAS[index]), msg, good)

    def publish_joints(self, msg: Any, good: bool = True) -> int:
        self.joint_pub.publish(msg)
        return self._remember(self.topic(JOINT_TOPIC), msg, good)

    def _remember(self, topic: str, msg: Any, good: bool) -> int:
        ns = stamp_ns(msg.header.stamp)
        if good:
            self.good.setdefault(topic, set()).add(ns)
            self.last_good[topic] = ns
        return ns

    def publish_good(self, skip: set[str] = frozenset()) -> None:
        """One good message on every input topic except those in ``skip`` (relative names)."""
        for i, topic in enumerate(CAMERAS):
            if topic not in skip:
                self.publish_camera(i, self.compressed() if self.transports[i] == "compressed" else self.image())
        if JOINT_TOPIC not in skip:
            self.publish_joints(self.joints())

    # ---- spinning --------------------------------------------------------------------------
    def spin(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=max(0.0, min(0.01, deadline - time.monotonic())))

    def pump(
        self,
        seconds: float = 0.0,
        *,
        until: Callable[[], bool] | None = None,
        skip: set[str] = frozenset(),
        extra: Callable[[], Any] | None = None,
        rate_hz: float = 20.0,
        publish: bool = True,
    ) -> bool:
        """Publish good inputs (and ``extra()``) at ``rate_hz`` while spinning, for ``seconds``
        or until ``until()`` is true (then with ``seconds`` as the time limit); returns whether
        ``until`` became true (True when there is none)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if publish:
                self.publish_good(skip)
            if extra is not None:
                extra()
            tick = time.monotonic() + 1.0 / rate_hz
            while time.monotonic() < tick:
                self.executor.spin_once(timeout_sec=0.005)
                if until is not None and until():
                    return True
        return until is None or until()

    # ---- outputs ---------------------------------------------------------------------------
    def chunk_sources(self, chunk: Any) -> dict[str, int]:
        return {t: stamp_ns(s) for t, s in zip(chunk.source_topics, chunk.source_stamps, strict=True)}

    def assert_chunks_from_good_data(self) -> None:
        """Every chunk so far was computed from messages published as good."""
        for chunk in self.chunks:
            for topic, ns in self.chunk_sources(chunk).items():
                assert ns in self.good.get(topic, ()), (
                    f"chunk {chunk.chunk_id} used {topic} stamp {ns}, which was not published as good data"
                )

    def counter(self, status: Any, topic: str, reason: str) -> int:
        return sum(c.count for c in status.invalid_inputs if c.topic == topic and c.reason == reason)

    def latest_counter(self, topic: str, reason: str) -> int:
        return self.counter(self.statuses[-1], topic, reason) if self.statuses else 0

    def settle(self, timeout: float = 10.0, **pump: Any) -> None:
        """Pump until a status assembled from now on arrives: the counters read next include all
        the node did before (an earlier test's last skips and refusals), a baseline to count from."""
        now_ns = self.node.get_clock().now().nanoseconds
        fresh = lambda: bool(self.statuses) and stamp_ns(self.statuses[-1].header.stamp) > now_ns  # noqa: E731
        assert self.pump(timeout, until=fresh, **pump), f"no status assembled after now within {timeout} s"

    def wait_for_counter(self, topic: str, reason: str, above: int, timeout: float = 5.0, **pump: Any) -> int:
        found = self.pump(timeout, until=lambda: self.latest_counter(topic, reason) > above, **pump)
        value = self.latest_counter(topic, reason)
        assert found, f"status counter ({topic}, {reason}) stayed at {value} (expected > {above})"
        return value

    # ---- services and parameters -----------------------------------------------------------
    def call(self, srv_type: Any, name: str, request: Any, timeout: float = 10.0) -> Any:
        return self.call_each(srv_type, name, [request], timeout)[0]

    def call_each(self, srv_type: Any, name: str, requests: list[Any], timeout: float = 10.0) -> list[Any]:
        """The responses to `requests`, in turn, through one client (discovered once)."""
        client = self.node.create_client(srv_type, name)
        try:
            assert client.wait_for_service(timeout_sec=timeout), f"service {name} not available"
            responses = []
            for request in requests:
                future = client.call_async(request)
                self.executor.spin_until_future_complete(future, timeout_sec=timeout)
                assert future.done(), f"no response from {name} in {timeout} s"
                responses.append(future.result())
            return responses
        finally:
            self.node.destroy_client(client)

    def set_parameters(self, **values: Any) -> list[Any]:
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        request = SetParameters.Request(
            parameters=[Parameter(k, value=v).to_parameter_msg() for k, v in values.items()]
        )
        return list(self.call(SetParameters, f"{self.namespace}/{NODE}/set_parameters", request).results)

    def get_parameters(self, *names: str) -> list[Any]:
        from rcl_interfaces.srv import GetParameters
        from rclpy.parameter import parameter_value_to_python

        response = self.call(
            GetParameters, f"{self.namespace}/{NODE}/get_parameters", GetParameters.Request(names=names)
        )
        return [parameter_value_to_python(v) for v in response.values]

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def in_process_node(context: Any, **params: Any) -> Any:
    """A FlashRTNode in this process with TEST_PARAMS (+ params): real rclpy, nothing spinning; its
    callbacks are called directly, to reach states a running node shows only by timing."""
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.node import FlashRTNode

    overrides = [Parameter(name, value=value) for name, value in {**TEST_PARAMS, **params}.items()]
    return FlashRTNode(context=context, parameter_overrides=overrides)


def sim_clock(node: Any, seconds: float | None = None) -> Any:
    """`node`'s clock on simulated ROS time, as use_sim_time with a /clock publisher makes it (set
    from the test: ``set_ros_time_override``); at `seconds` if given."""
    from rclpy.time import Time

    clock = node.get_clock()
    clock._set_ros_time_is_active(True)
    if seconds is not None:
        clock.set_ros_time_override(Time(seconds=seconds))
    return clock


def past_start(node: Any) -> Any:
    """`node` as if started a minute ago: DDS discovery and the wait for first inputs over, so its
    health is judged as a running node's (absent inputs are an outage, not the start's wait)."""
    from flashrt_ros.ros.reasons import DISCOVERY_S

    node._subscribed_at = time.monotonic() - DISCOVERY_S - 60.0
    node._started_at = node._timer_seconds() - 60.0
    return node


def start_node_and_peer(
    env: dict[str, str], tmp: Path, context: Any, first: str = "chunk", **overrides: Any
) -> tuple[NodeProcess, Peer]:
    """A node with TEST_PARAMS (+ overrides) and a peer; returns once the first chunk arrived
    (`first="status"`: the first status, for a node that is not to publish chunks)."""
    namespace = new_namespace()
    node = NodeProcess(env, tmp, namespace, {**TEST_PARAMS, **overrides})
    peer = None
    try:
        peer = Peer(context, namespace, transports=overrides.get("camera_transports"))
        arrived = {"chunk": lambda: bool(peer.chunks), "status": lambda: bool(peer.statuses)}[first]
        if not peer.pump(60.0, until=lambda: arrived() or node.proc.poll() is not None):
            raise AssertionError(f"no {first} from the node within 60 s\n{node.tail()}")
        if node.proc.poll() is not None:
            raise AssertionError(f"node exited with {node.proc.returncode}\n{node.tail()}")
    except BaseException:  # never leave the node process behind
        if peer is not None:
            peer.close()
        node.stop()
        raise
    return node, peer


@contextlib.contextmanager
def running_node_and_peer(env: dict[str, str], tmp: Path, context: Any, first: str = "chunk", **overrides: Any):
    """`start_node_and_peer` for a `with` block (a module fixture's body); on leaving it, the
    peer closes and the node must stop cleanly (exit code 0) and log its final stats line."""
    node, peer = start_node_and_peer(env, tmp, context, first, **overrides)
    try:
        yield node, peer
    finally:
        peer.close()
        code = node.stop()
    assert code == 0, f"node exited with {code}\n{node.tail()}"
    node.wait_for_line("shutting down; stats:")
