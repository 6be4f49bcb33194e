"""``synthetic_sensors``: cameras and joint states at a robot's rates and sizes, for demos,
tests and the overhead benchmark - so the node can be exercised with nothing attached.

Defaults match ``config/flashrt.yaml``: three 640x480 ``rgb8`` cameras at 30 Hz and the 14
ALOHA-style joints at 200 Hz, stamped with the node clock at publication. Frames scroll
(the content moves, as a real scene would, so nothing downstream can cache a constant
image); joints follow slow sinusoids. ``encoding`` picks ``rgb8``, ``bgr8`` or ``jpeg``
(``sensor_msgs/CompressedImage`` on the same topics; frames are encoded once at start
and cycled, so publishing stays cheap).
"""

from __future__ import annotations

import array
import io
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import rclpy
from rclpy.clock import Clock, ClockType
from rclpy.executors import SingleThreadedExecutor
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState

from flashrt_ros.ros.image_convert import MAX_DECODED_PIXELS
from flashrt_ros.ros.params import (
    ALOHA_JOINTS,
    DEFAULT_CAMERAS,
    INPUT_TYPES,
    PARAMETERS,
    ConfigError,
    clash_sentence,
    did_you_mean,
    files_of,
    given_values,
    invalid_topic,
    lost_values,
    node_resolver,
    param_sources,
    rclpy_parameter_refusals,
    resolve_topics,
    unaddressed_params_files,
    unknown_given,
)
from flashrt_ros.ros.process import init_rclpy, interrupt_on_signals, run_until_signal, signals_held, stopping
from flashrt_ros.ros.usage import command_line, usage

NODE_NAME = "synthetic_sensors"
MIN_RATE_HZ = 0.01  # as flashrt_node's rates: a period of 100 s
ENCODINGS = ("rgb8", "bgr8", "jpeg")
JPEG_FRAMES = 30  # distinct pre-encoded frames per camera (one scroll cycle)
CLOCK_WAIT_S = 3.0  # under use_sim_time, how long without a /clock before saying nothing is published
MAX_JPEG_SIDE = 65500  # the most Pillow's JPEG encoder takes per side (the format: 65535)


@dataclass(frozen=True)
class SensorConfig:
    camera_topics: list[str] = field(default_factory=lambda: list(DEFAULT_CAMERAS))
    encoding: str = "rgb8"
    image_width: int = 640
    image_height: int = 480
    camera_rate_hz: float = 30.0
    joint_state_topic: str = "joint_states"
    joint_names: list[str] = field(default_factory=lambda: list(ALOHA_JOINTS))
    joint_rate_hz: float = 200.0
    jpeg_quality: int = 90

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> SensorConfig:
        known = cls.__dataclass_fields__
        kwargs = {
            k: (float(v) if known[k].type == "float" and _integer(v) else v) for k, v in values.items() if k in known
        }
        for key in ("camera_topics", "joint_names"):
            if key in kwargs and not isinstance(kwargs[key], str):  # a string stays one, for validate
                kwargs[key] = list(kwargs[key] or [])
        return cls(**kwargs)

    def validate(self) -> list[str]:
        problems = []
        for name, what in (("camera_topics", "camera topic"), ("joint_names", "joint name")):
            value = getattr(self, name)
            if not (isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value)):
                problems.append(
                    f"{name} must be a non-empty list of strings, e.g. [a, b], got {value!r}: one {what} each"
                )
        if self.encoding not in ENCODINGS:
            problems.append(f"encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}")
        width, height = self.image_width, self.image_height
        if not (_integer(width) and _integer(height) and width > 0 and height > 0 and width * height <= MAX_PIXELS):
            problems.append(
                f"image_width/image_height must be integers > 0 of at most {MAX_PIXELS} pixels together "
                f"(7680x4320, 8K), got {width!r}/{height!r}"
            )
        if not isinstance(self.joint_state_topic, str):
            problems.append(f"joint_state_topic must be a topic name (a string), got {self.joint_state_topic!r}")
        for name in ("camera_rate_hz", "joint_rate_hz"):  # a timer's period in int64 ns: not below 0.01 Hz
            value = getattr(self, name)
            if not (isinstance(value, float) and MIN_RATE_HZ <= value <= 1000):
                problems.append(f"{name} must be a number in [{MIN_RATE_HZ}, 1000], got {value!r}")
        if self.encoding == "jpeg" and _integer(width) and _integer(height) and max(width, height) > MAX_JPEG_SIDE:
            problems.append(
                f"image_width/image_height must be at most {MAX_JPEG_SIDE} each for encoding jpeg (the format's "
                f"limit), got {width!r}/{height!r}"
            )
        if not (_integer(self.jpeg_quality) and 1 <= self.jpeg_quality <= 100):
            problems.append(f"jpeg_quality must be an integer in [1, 100], got {self.jpeg_quality!r}")
        for name in ("camera_topics", "joint_names"):
            value = getattr(self, name)
            repeated = sorted({v for v in value if value.count(v) > 1}) if isinstance(value, list) else []
            if repeated:
                problems.append(f"{name} has {repeated} more than once; expected each once")
        return problems


MAX_PIXELS = MAX_DECODED_PIXELS
"""The largest synthetic frame: the node's own limit on a frame of no expected size (8K)."""


def _integer(value: object) -> bool:
    """An int that is not a bool (Python's True is an int; a parameter set to true is no number)."""
    return isinstance(value, int) and not isinstance(value, bool)


def scrolling_pattern(height: int, width: int, camera: int) -> np.ndarray:
    """[H, 2W, 3] uint8: a gradient with bars, tinted per camera, twice as wide as a frame so
    any window of width W is a frame (scrolling = moving the window)."""
    column = np.arange(2 * width) % width  # repeats after W: any W-window wraps seamlessly
    row = np.arange(height)[:, None]
    bars = (column // 32) % 2 * 80
    shape = (height, 2 * width)
    r = np.broadcast_to(column * 255 // max(width - 1, 1), shape)
    g = row * 255 // max(height - 1, 1) + bars
    b = np.broadcast_to((camera * 70 + 40) % 256 + bars // 2, shape)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


class CameraStream:
    """Frames of one camera: a window into its pattern that moves one frame-width per 4 s."""

    def __init__(self, cfg: SensorConfig, index: int):
        self.cfg = cfg
        pattern = scrolling_pattern(cfg.image_height, cfg.image_width, index)
        self.pattern = np.ascontiguousarray(pattern[..., ::-1]) if cfg.encoding == "bgr8" else pattern
        self.buffer = array.array("B", bytes(cfg.image_height * cfg.image_width * 3))
        self.view = np.frombuffer(self.buffer, dtype=np.uint8).reshape(cfg.image_height, cfg.image_width, 3)
        self.jpegs = (
            [self._jpeg(i * cfg.image_width // JPEG_FRAMES) for i in range(JPEG_FRAMES)]
            if cfg.encoding == "jpeg"
            else []
        )

    def offset(self, t: float) -> int:
        return int(t * self.cfg.image_width / 4.0) % self.cfg.image_width

    def raw(self, t: float) -> array.array:
        """The frame at time t, written into this camera's reused buffer (publish copies it)."""
        off = self.offset(t)
        np.copyto(self.view, self.pattern[:, off : off + self.cfg.image_width])
        return self.buffer

    def jpeg(self, t: float) -> bytes:
        return self.jpegs[self.offset(t) * JPEG_FRAMES // self.cfg.image_width]

    def _jpeg(self, off: int) -> bytes:
        from PIL import Image as PILImage

        out = io.BytesIO()
        PILImage.fromarray(self.pattern[:, off : off + self.cfg.image_width]).save(
            out, format="JPEG", quality=self.cfg.jpeg_quality
        )
        return out.getvalue()


class SyntheticSensors(Node):
    def __init__(
        self,
        *,
        sources: Sequence[tuple[str, ...]] = (),
        **node_kwargs: Any,
    ):
        with rclpy_parameter_refusals():
            super().__init__(NODE_NAME, **node_kwargs)
        defaults = SensorConfig()
        for name in SensorConfig.__dataclass_fields__:
            self.declare_parameter(name, getattr(defaults, name), _descriptor(name))
        self.cfg = SensorConfig.from_values({n: self.get_parameter(n).value for n in SensorConfig.__dataclass_fields__})
        # a params file with no section for this node (flashrt.yaml given to it) would run the defaults
        fields = SensorConfig.__dataclass_fields__
        fqn = self.get_fully_qualified_name()
        params_files = files_of(sources)
        problems = unaddressed_params_files(params_files, fqn, fields)
        problems += [sentence for _, sentence in lost_values(sources, fqn, given_values(self))]
        # a typo would run the default (the flashrt_node only warns: it has a robot to serve)
        unknown, _ = unknown_given(self, params_files, fields, siblings=PARAMETERS)
        if unknown:
            problems.append(
                f"unknown parameters {unknown} (a typo?{did_you_mean(unknown, fields)}); known: {', '.join(fields)}"
            )
        problems += self.cfg.validate()
        if isinstance(self.cfg.camera_topics, list) and isinstance(self.cfg.joint_state_topic, str):
            problems += self._topic_problems()  # all at once, with the others
        if problems:
            raise ConfigError(problems)
        self._t0 = self.get_clock().now().nanoseconds
        self._create_cameras()
        self._create_joints()
        cfg = self.cfg
        cameras = [self.resolve_topic_name(t) for t in cfg.camera_topics]
        self.get_logger().info(
            f"publishing {len(cameras)} cameras {cfg.image_width}x{cfg.image_height} {cfg.encoding} at "
            f"{cfg.camera_rate_hz:g} Hz on {cameras} and {len(cfg.joint_names)} joints at "
            f"{cfg.joint_rate_hz:g} Hz on {self.resolve_topic_name(cfg.joint_state_topic)}"
        )
        if self.get_clock().ros_time_is_active:  # use_sim_time: the timers wait for /clock to move
            steady = Clock(clock_type=ClockType.STEADY_TIME)
            self._clock_check = self.create_timer(CLOCK_WAIT_S, self._warn_without_clock, clock=steady)

    def _warn_without_clock(self) -> None:
        """Once: under use_sim_time with no /clock the streams' timers never fire, and the start
        line above said they publish (`use_synthetic:=true use_sim_time:=true` without a simulator)."""
        self._clock_check.cancel()
        if self.get_clock().now().nanoseconds == 0:  # ROS time before any /clock message
            self.get_logger().warning(
                f"use_sim_time is on and no /clock arrived in {CLOCK_WAIT_S:g} s: nothing is published until "
                "ROS time moves (a simulator, or `ros2 bag play --clock`); or set use_sim_time false"
            )

    def _topic_problems(self) -> list[str]:
        """Topic names rcl refuses, with its reason, and names that resolve to one topic (two
        cameras on one, or a camera and the joints: a traceback from create_publisher)."""
        camera = INPUT_TYPES["compressed" if self.cfg.encoding == "jpeg" else "raw"]
        named = [(f"camera_topics[{i}]", t, camera) for i, t in enumerate(self.cfg.camera_topics) if isinstance(t, str)]
        joints = ("joint_state_topic", self.cfg.joint_state_topic, INPUT_TYPES["joints"])
        refused, by_name = resolve_topics([*named, joints], node_resolver(self))
        problems = [invalid_topic(what, topic, exc) for what, topic, exc in refused]
        # a name written twice in camera_topics is validate's ("more than once")
        clashes = {full: users for full, users in by_name.items() if len({(t, kind) for _, t, kind in users}) > 1}
        return problems + [clash_sentence(full, users) for full, users in clashes.items()]

    def _create_cameras(self) -> None:
        cfg = self.cfg
        msg_type = CompressedImage if cfg.encoding == "jpeg" else Image
        # every stream (and its pre-encoded JPEGs) made first, then the timers back to back: the
        # cameras tick together, as a triggered rig (made one after the other, a 640x480 JPEG
        # camera's timer started tens of ms after the one before)
        self.streams = [CameraStream(cfg, i) for i in range(len(cfg.camera_topics))]
        for i, (topic, stream) in enumerate(zip(cfg.camera_topics, self.streams, strict=True)):
            pub = self.create_publisher(msg_type, topic, qos_profile_sensor_data)
            frame_id = self._frame_id(topic, i)
            self.create_timer(1.0 / cfg.camera_rate_hz, partial(self._publish_camera, stream, pub, frame_id))

    def _frame_id(self, topic: str, index: int) -> str:
        """The camera's frame: its topic under the node's namespace, without the image_transport
        suffix (/robot/camera/left/image_raw in /robot: camera_left); one per camera."""
        resolved, namespace = self.resolve_topic_name(topic), self.get_namespace().rstrip("/")
        path = resolved[len(namespace) :] if resolved.startswith(namespace + "/") else resolved
        parts = [p for p in path.strip("/").split("/") if p not in ("image_raw", "compressed", "image")]
        return "_".join(parts) or f"camera{index}"

    def _create_joints(self) -> None:
        cfg = self.cfg
        n = len(cfg.joint_names)
        self._freq = 0.2 + 0.05 * np.arange(n)  # Hz, a different slow sine per joint
        self._phase = np.linspace(0.0, math.pi, n)
        self._joint_pub = self.create_publisher(JointState, cfg.joint_state_topic, qos_profile_sensor_data)
        self.create_timer(1.0 / cfg.joint_rate_hz, self._publish_joints)

    def _seconds(self, now_ns: int) -> float:
        return (now_ns - self._t0) / 1e9

    def _publish_camera(self, stream: CameraStream, pub: Any, frame_id: str) -> None:
        now = self.get_clock().now()
        t = self._seconds(now.nanoseconds)
        cfg = self.cfg
        if cfg.encoding == "jpeg":
            msg = CompressedImage(format="jpeg", data=array.array("B", stream.jpeg(t)))
        else:
            msg = Image(
                height=cfg.image_height,
                width=cfg.image_width,
                encoding=cfg.encoding,
                is_bigendian=0,
                step=cfg.image_width * 3,
                data=stream.raw(t),
            )
        msg.header.stamp = now.to_msg()
        msg.header.frame_id = frame_id
        pub.publish(msg)

    def _publish_joints(self) -> None:
        now = self.get_clock().now()
        t = self._seconds(now.nanoseconds)
        angle = 2 * math.pi * self._freq * t + self._phase
        msg = JointState(name=list(self.cfg.joint_names))
        msg.header.stamp = now.to_msg()
        msg.position = array.array("d", (0.3 * np.sin(angle)).tobytes())
        msg.velocity = array.array("d", (0.3 * 2 * math.pi * self._freq * np.cos(angle)).tobytes())
        self._joint_pub.publish(msg)


def _descriptor(name: str) -> Any:
    """Described, and read-only: the streams are made at start, so a change would do nothing."""
    from rcl_interfaces.msg import ParameterDescriptor

    text = f"{PARAMETER_HELP[name]} [read-only at runtime (restart to change)]"
    return ParameterDescriptor(description=text, dynamic_typing=True, read_only=True)


PARAMETER_HELP = {
    "camera_topics": "sensor_msgs/Image topics to publish (CompressedImage for jpeg, on the topics as named: "
    "add /compressed for image_transport's naming)",
    "encoding": f"one of {', '.join(ENCODINGS)}",
    "image_width": "pixels",
    "image_height": "pixels",
    "camera_rate_hz": "frames per second per camera, 0.01..1000",
    "joint_state_topic": "sensor_msgs/JointState topic",
    "joint_names": "joints published, following slow sinusoids",
    "joint_rate_hz": "joint states per second, 0.01..1000",
    "jpeg_quality": "1..100, for encoding jpeg",
}


def sensors_usage() -> str:
    """`synthetic_sensors --help`: every parameter with its default."""
    defaults = asdict(SensorConfig())
    return usage(
        NODE_NAME,
        "Publishes synthetic cameras and joint states, stamped with the node clock, so that flashrt_node "
        "can run with nothing attached. Do not run it beside a robot's own drivers on the same ROS domain: "
        "it publishes joint states.",
        {name: (defaults[name], text) for name, text in PARAMETER_HELP.items()},
        "ros2 run flashrt_ros synthetic_sensors --ros-args -p camera_rate_hz:=15.0 -p encoding:=jpeg",
    )


def main(args: list[str] | None = None) -> int:
    argv = args if args is not None else sys.argv
    code = command_line(NODE_NAME, argv, sensors_usage)
    if code is not None:
        return code
    interrupt_on_signals()  # until spinning starts (see node.main)
    try:
        if not init_rclpy(argv, NODE_NAME):
            return 2
        node = SyntheticSensors(sources=param_sources(argv))
        with signals_held():
            executor = SingleThreadedExecutor()
    except ConfigError as exc:
        stopping()
        get_logger(NODE_NAME).error(f"not starting: {exc}")
        rclpy.try_shutdown()
        return 2
    except KeyboardInterrupt:
        stopping()
        get_logger(NODE_NAME).info("not starting: stopped by a signal while starting")
        rclpy.try_shutdown()
        return 0

    def on_error(exc: Exception) -> None:  # rclpy's own callbacks (its /clock under use_sim_time)
        node.get_logger().error(f"a callback raised: {exc!r}; going on", throttle_duration_sec=1.0)

    return run_until_signal(node, executor, on_error=on_error)


if __name__ == "__main__":
    sys.exit(main())
