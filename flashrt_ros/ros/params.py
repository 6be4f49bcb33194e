"""The node's parameters: one dataclass, its ROS declaration, and validation with reasons.

A robot is configured by a YAML file edited by hand, often on the robot itself, so every
mistake must come back as a sentence that names the parameter, the bad value and what is
expected - at start (the node exits non-zero) and on ``ros2 param set`` (the change is
refused). All parameters are declared with ``dynamic_typing`` so that this module, not
rclpy, judges types: ``rate_hz: 10`` (an integer in YAML) is accepted as 10.0 instead of
failing with a type error, and a string where a number belongs gets our precise reason.

Only a few parameters change at runtime (:data:`RUNTIME`); the others shape subscriptions,
the model or the device and are refused with "needs a restart".

Nothing here imports rclpy at module level, so YAML files validate without ROS (the
launch test does that).
"""

from __future__ import annotations

import array
import dataclasses
import difflib
import math
import re
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from flashrt_ros.engine.action_stream import INTERPOLATIONS
from flashrt_ros.engine.prefix_cache import PREFIX_TRIGGERS
from flashrt_ros.policies.config import FP8_PARTS, MAX_INTS, RTC_JACOBIANS, RTC_SCHEDULES, PolicyConfig
from flashrt_ros.policies.listing import shown, some
from flashrt_ros.ros.image_convert import MAX_DECODED_PIXELS

NODE_NAME = "flashrt_node"
TINY_PRESETS = ("pi05_tiny", "pi0_tiny")
PRESETS = ("pi05", "pi0", *TINY_PRESETS)
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("float32", "bfloat16")
BACKENDS = ("auto", "fused", "reference")
TRANSPORTS = ("raw", "compressed")
TRAJECTORY_STAMPS = ("observation", "publication", "zero")
PROMPT_DURABILITIES = ("volatile", "transient_local")
MAX_RATE_HZ = 1000.0
MIN_RATE_HZ = 0.01
"""Slowest decision and status rate (one per 100 s): no robot needs less, and rcl timers take
their period as int64 nanoseconds, which a rate like 1e-10 Hz (a 1e19 ns period) overflows."""
MAX_BLEND_STEPS = 1000
"""Longest blend between chunks, in actions: far beyond any chunk (pi0's is 50)."""
MIN_STEP_DURATION_S = 1e-6
RANDOM_WEIGHTS = "random"  # `checkpoint`'s word for random weights, which pi05 / pi0 need said
"""Shortest time between the actions of a chunk: the trajectory's points are then at least 1 us
apart (its time_from_start is in ns), so controllers see strictly increasing times."""

Resolver = Callable[[str], str]
"""A topic name as written -> its fully resolved name; raises ValueError with rcl's reason."""

OUTPUTS = {
    "~/action_chunk": "flashrt_ros/msg/ActionChunk",
    "~/joint_trajectory": "trajectory_msgs/msg/JointTrajectory",
    "~/status": "flashrt_ros/msg/PipelineStatus",
    "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
    "~/joint_command": "std_msgs/msg/Float64MultiArray",
}
"""The node's publishers: an input resolving to one of them would clash in type."""
INPUT_TYPES = {
    "raw": "sensor_msgs/msg/Image",
    "compressed": "sensor_msgs/msg/CompressedImage",
    "joints": "sensor_msgs/msg/JointState",
    "prompt": "std_msgs/msg/String",
}

ALOHA_JOINTS = [
    f"{side}_{joint}"
    for side in ("left", "right")
    for joint in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper")
]
"""Bimanual ALOHA-style joint names (7 per arm): the embedded default's state and actions."""

DEFAULT_CAMERAS = ["cam_high/image_raw", "cam_left_wrist/image_raw", "cam_right_wrist/image_raw"]


class ConfigError(ValueError):
    """Parameters the node cannot start with; ``problems`` has one sentence per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid parameters:\n  - " + "\n  - ".join(self.problems))


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``flashrt_node`` reads from its parameters (defaults = the embedded demo).

    Topic names without a leading ``/`` resolve in the node's namespace, so one YAML file
    serves several namespaced robots. Empty ``camera_transports`` means all ``raw``; empty
    ``action_joint_names`` means the same joints as the state.
    """

    policy: str = "pi05_tiny"
    checkpoint: str = ""
    tokenizer: str = ""
    device: str = "auto"
    precision: str = "float32"
    fp8: str = "none"
    backend: str = "auto"
    seed: int = 0
    camera_topics: list[str] = field(default_factory=lambda: list(DEFAULT_CAMERAS))
    camera_transports: list[str] = field(default_factory=list)
    image_height: int = 0
    image_width: int = 0
    joint_state_topic: str = "joint_states"
    joint_names: list[str] = field(default_factory=lambda: list(ALOHA_JOINTS))
    action_joint_names: list[str] = field(default_factory=list)
    action_lower_limits: list[float] = field(default_factory=list)
    action_upper_limits: list[float] = field(default_factory=list)
    action_max_step: list[float] = field(default_factory=list)
    start_enabled: bool = True
    autostart: bool = False
    rate_hz: float = 10.0
    prefix_trigger: str = "new_inputs"
    prefix_period_s: float = 0.1
    max_age_s: float = 0.5
    prompt: str = "pick up the cube"
    prompt_topic: str = ""
    prompt_durability: str = "volatile"
    step_duration_s: float = 0.02
    trajectory_stamp: str = "observation"
    trajectory_groups: list[str] = field(default_factory=list)
    command_rate_hz: float = 0.0
    command_groups: list[str] = field(default_factory=list)
    command_interpolation: str = "hold"
    command_blend_steps: int = 0
    rtc: bool = False
    rtc_max_guidance: float = 5.0
    rtc_schedule: str = "exp"
    rtc_delay_steps: int = -1
    rtc_jacobian: str = "identity"
    frame_id: str = ""
    status_rate_hz: float = 1.0
    stats_log_period_s: float = 10.0
    log_throttle_s: float = 5.0

    # ---- derived ---------------------------------------------------------------------------
    @property
    def transports(self) -> list[str]:
        """One transport per camera (``raw`` where none is configured)."""
        return list(self.camera_transports) or ["raw"] * len(self.camera_topics)

    @property
    def output_joint_names(self) -> list[str]:
        return list(self.action_joint_names) or list(self.joint_names)

    def parsed_groups(self, name: str) -> list[tuple[str, list[str]]]:
        """trajectory_groups or command_groups as (topic, joints); entries that do not parse are
        left out here (validation names them)."""
        return [parsed for parsed in map(parse_group, getattr(self, name)) if parsed is not None]

    @property
    def expected_hw(self) -> tuple[int, int] | None:
        return (self.image_height, self.image_width) if self.image_height and self.image_width else None

    @property
    def is_tiny(self) -> bool:
        return self.policy in TINY_PRESETS

    @property
    def checkpoint_folder(self) -> str | None:
        """The checkpoint's folder; None for random weights ("random", or "" for a tiny policy)."""
        return None if self.checkpoint in ("", RANDOM_WEIGHTS) else self.checkpoint

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> NodeConfig:
        """From raw parameter values (rclpy or YAML). Unknown names are ignored (see
        :func:`unknown_names`); values are normalised, not judged: :meth:`validate` does that."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {name: _normalise(known[name], value) for name, value in values.items() if name in known}
        return cls(**kwargs)

    @classmethod
    def from_parameters(cls, node: Any) -> NodeConfig:
        """From the parameters declared on ``node`` by :func:`declare_parameters`."""
        return cls.from_values({name: node.get_parameter(name).value for name in PARAMETERS})

    @classmethod
    def from_yaml(cls, path: str | Path, node_name: str = NODE_NAME) -> NodeConfig:
        return cls.from_values(load_yaml_parameters(path, node_name))

    def with_values(self, changes: Mapping[str, Any]) -> NodeConfig:
        """A copy with some parameters changed (raw values, normalised like from_values)."""
        return NodeConfig.from_values({**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---- validation ------------------------------------------------------------------------
    def validate(self, check_paths: bool = True, resolve: Resolver | None = None) -> list[str]:
        """Every problem, one sentence each (empty list = valid). ``check_paths=False`` skips
        the existence of checkpoint/tokenizer files (for example configs checked off-robot).
        ``resolve`` gives topics their full names as the node will (its namespace and
        remappings); without one they are expanded by rcl's rules in the root namespace."""
        mistyped = _type_problems(self)
        resolve = resolve or expand_in_namespace()
        if not mistyped:
            return self._value_problems(check_paths, resolve)
        # The other values are judged with a valid stand-in for each mistyped one (so one run reports
        # every problem, without range-checking a string as a number), twice with two stand-ins: a
        # problem that comes out differently depends on the stand-in, not on the user's values.
        judged = [
            dataclasses.replace(self, **{name: stand_in(name, which) for name in mistyped})._value_problems(
                check_paths, resolve
            )
            for which in (0, 1)
        ]
        return list(mistyped.values()) + [p for p in judged[0] if p in judged[1]]

    def _value_problems(self, check_paths: bool, resolve: Resolver) -> list[str]:
        """The problems of a config whose values all have their types."""
        problems = []
        for check in (
            _check_choices,
            _check_policy,
            _check_cameras,
            _check_joints,
            _check_limits,
            _check_rates,
            _check_text,
            _check_groups,
            _check_commands,
            _check_rtc,
        ):
            problems += check(self)
        problems += _check_topics(self, resolve)
        return problems + (_check_paths(self) if check_paths else [])


# ---- the parameter table -------------------------------------------------------------------


@dataclass(frozen=True)
class ParamInfo:
    description: str
    runtime: bool = False  # may change with `ros2 param set` while the node runs


PARAMETERS: dict[str, ParamInfo] = {
    "policy": ParamInfo(f"policy preset: {', '.join(PRESETS)}; *_tiny = small random-weight CPU demo"),
    "checkpoint": ParamInfo(
        'folder with model.safetensors (openpi or LeRobot layout); "random" = random weights (benchmarks: the '
        'actions mean nothing); "" = random weights for the tiny policies, refused for pi05 and pi0'
    ),
    "tokenizer": ParamInfo('PaliGemma SentencePiece tokenizer.model; "" only for *_tiny presets'),
    "device": ParamInfo("auto (cuda if available, else cpu), cpu, cuda or cuda:N"),
    "precision": ParamInfo("float32 or bfloat16"),
    "fp8": ParamInfo(
        "none, or prefix_mlp: the prefix LM's MLP GEMMs in FP8 (e4m3; bfloat16 + fused backend, sm_90+; "
        "faster, chunk cosine ~0.9995 vs ~0.99999)"
    ),
    "backend": ParamInfo(
        "auto (fused on CUDA, else reference), fused (fail if unavailable) or reference; "
        "with the fused path the reference's weights are freed after start-up"
    ),
    "seed": ParamInfo("seed of random weights and of the noise generator (>= 0); reset returns to it"),
    "camera_topics": ParamInfo("sensor_msgs/Image (or CompressedImage) topics, in the policy's view order"),
    "camera_transports": ParamInfo("raw or compressed per camera, parallel to camera_topics; [] = all raw"),
    "image_height": ParamInfo("expected image height in pixels; 0 = any (checked with image_width)"),
    "image_width": ParamInfo("expected image width in pixels; 0 = any"),
    "joint_state_topic": ParamInfo("sensor_msgs/JointState topic"),
    "joint_names": ParamInfo("joints of the state vector, in the policy's order (picked by name)"),
    "action_joint_names": ParamInfo("names of the action dimensions, in output order; [] = joint_names"),
    "action_lower_limits": ParamInfo(
        "lowest position per action joint (action_joint_names order; one value = every joint; [] = none; "
        "-.inf = no bound, a continuous joint): actions below are clamped, counted as action_clamped and logged"
    ),
    "action_upper_limits": ParamInfo("highest position per action joint, as action_lower_limits (.inf = no bound)"),
    "action_max_step": ParamInfo(
        "largest move per action of each action joint (one value = every joint; [] = none), from the joint "
        "state to action 0 and between actions: a chunk that moves faster is slowed to it, counted and logged"
    ),
    "start_enabled": ParamInfo(
        "decide and publish from the start; false = load and warm up, take inputs, but publish no chunk, "
        "trajectory or command until ~/enable is called with true (an operator engages the policy)"
    ),
    "autostart": ParamInfo(
        "flashrt_lifecycle_node: configure and activate itself at start, for a launch without a lifecycle "
        "manager (with start_enabled false: configure only, and stay inactive; a failed configure leaves it "
        "unconfigured, the reason logged); flashrt_node starts "
        "configured anyway (start_enabled decides whether it decides)"
    ),
    "rate_hz": ParamInfo(f"decision rate in Hz, [{MIN_RATE_HZ:g}, {MAX_RATE_HZ:g}]", runtime=True),
    "prefix_trigger": ParamInfo(
        "when the prefix stage (vision + prefix LM) runs: new_inputs (when a camera frame, the prompt or "
        "pi0.5's state tokens changed; otherwise the decision re-uses its K/V, with the same chunk a full "
        "decision gives), period (as new_inputs, but new frames alone run it at most once per "
        "prefix_period_s: the decisions between act on older frames, with the current joint state) or "
        "every_decision",
        runtime=True,
    ),
    "prefix_period_s": ParamInfo(
        "with prefix_trigger period: how long a prefix serves decisions on newer frames, s > 0, at most 3600 "
        "(its frames must also stay within max_age_s)",
        runtime=True,
    ),
    "max_age_s": ParamInfo(
        "inputs older than this (header stamp vs node clock) are not used, s > 0, at most 3600", runtime=True
    ),
    "prompt": ParamInfo("task instruction given to the policy (non-empty)", runtime=True),
    "prompt_topic": ParamInfo(
        "std_msgs/String topic whose messages set prompt, as ros2 param set does (checked; one that does not "
        "fit is refused, counted as invalid_prompt on the topic and logged; the prompt in force stays); "
        "'' = none"
    ),
    "prompt_durability": ParamInfo(
        "durability of prompt_topic's subscription: volatile (every publisher matches; a prompt published "
        "before the node subscribed is not received) or transient_local (the last prompt a transient_local "
        "publisher latched is received at start; volatile publishers do not match, which is logged)"
    ),
    "step_duration_s": ParamInfo(
        f"time between consecutive actions of a chunk, s >= {MIN_STEP_DURATION_S:g}, at most 60"
    ),
    "trajectory_stamp": ParamInfo(
        "header.stamp of the chunks and trajectories, from which action i is (i + 1) * step_duration_s ahead: "
        "observation (the joint state's stamp, the time the chunk was computed for: the controller skips "
        "what the decision's latency has already passed), publication (now) or zero (the controller's "
        "'start now', for clocks that differ)"
    ),
    "trajectory_groups": ParamInfo(
        "extra JointTrajectory topics, one per controller, each 'TOPIC=joint, joint, ...' (joints of "
        "action_joint_names, any order): for controllers that own some of the joints; ~/joint_trajectory "
        "keeps all of them; [] = none"
    ),
    "command_rate_hz": ParamInfo(
        "publish the action due now (each action held for step_duration_s, or followed linearly: "
        "command_interpolation; from the newest chunk that has started) as std_msgs/Float64MultiArray on "
        "~/joint_command and each of command_groups, "
        "at this rate in Hz: for controllers that take one position command per tick "
        f"(forward_position_controller); 0 = off, else [{MIN_RATE_HZ:g}, {MAX_RATE_HZ:g}]; at runtime one "
        "rate above 0 to another (on or off needs a restart)",
        runtime=True,
    ),
    "command_groups": ParamInfo(
        "extra Float64MultiArray command topics, one per controller, each 'TOPIC=joint, joint, ...' (joints "
        "of action_joint_names, in the controller's order); needs command_rate_hz > 0; [] = none"
    ),
    "command_interpolation": ParamInfo(
        "hold (each action commanded as it is for its step_duration_s) or linear (the command follows the "
        "chunk's trajectory between its actions: for controllers that tick faster than the actions come); "
        "applies from the next chunk that takes over",
        runtime=True,
    ),
    "command_blend_steps": ParamInfo(
        "over this many actions after a newer chunk takes over the command stream, the command moves "
        "linearly from what the older chunks command to the newer chunk's own (smooths the jump between "
        "chunks); 0 = switch at once; applies from the next chunk that takes over",
        runtime=True,
    ),
    "rtc": ParamInfo(
        "real-time chunking: each chunk is guided, during its denoise, towards the chunk the robot executes "
        "(fully on the actions executed before it can take over, fading over the rest of their overlap), so "
        "that consecutive chunks agree and the switch does not jump"
    ),
    "rtc_max_guidance": ParamInfo(
        "with rtc: the cap of the guidance weight (the paper's beta), > 0 and <= 100; higher holds the new "
        "chunk closer to the executing one, up to the policy's number of denoise steps (the weight's own cap)",
        runtime=True,
    ),
    "rtc_schedule": ParamInfo(
        "with rtc: how the hold fades over the overlap after the delayed actions: exp (the paper's), linear, "
        "ones (the whole overlap held) or zeros (only the delayed actions)",
        runtime=True,
    ),
    "rtc_delay_steps": ParamInfo(
        "with rtc: actions held with full weight (those executed before the new chunk takes over); -1 = from "
        "the slowest of the last 10 decisions and the joint state's age",
        runtime=True,
    ),
    "rtc_jacobian": ParamInfo(
        "with rtc: identity (the correction drops the expert's Jacobian: elementwise, inside the fused "
        "path's denoise at no measurable cost) or exact (autograd through the expert: backend reference "
        "only, several times slower)"
    ),
    "frame_id": ParamInfo("header.frame_id of the published chunks and trajectories"),
    "status_rate_hz": ParamInfo(
        f"PipelineStatus and /diagnostics rate in Hz, [{MIN_RATE_HZ:g}, {MAX_RATE_HZ:g}]", runtime=True
    ),
    "stats_log_period_s": ParamInfo(
        "log per-stage timings every this many seconds, at most 86400; 0 = never", runtime=True
    ),
    "log_throttle_s": ParamInfo(
        "repeat a warning about the same topic and reason at most this often, s >= 0, at most 86400", runtime=True
    ),
}
NUMBER_RANGES: dict[str, tuple[float, float, bool]] = {
    "rate_hz": (MIN_RATE_HZ, MAX_RATE_HZ, True),
    "prefix_period_s": (0.0, 3600.0, False),
    "max_age_s": (0.0, 3600.0, False),
    "step_duration_s": (MIN_STEP_DURATION_S, 60.0, True),
    "command_rate_hz": (0.0, MAX_RATE_HZ, True),
    "rtc_max_guidance": (0.0, 100.0, False),
    "status_rate_hz": (MIN_RATE_HZ, MAX_RATE_HZ, True),
    "stats_log_period_s": (0.0, 86400.0, True),
    "log_throttle_s": (0.0, 86400.0, True),
}
"""name -> (low, high, whether low itself is allowed): what validation judges, and the range the
descriptor declares, which `ros2 param describe` and rqt_reconfigure show (rclpy's ranges are
closed: max_age_s = 0 passes rclpy and is refused by the node)."""
INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "command_blend_steps": (0, MAX_BLEND_STEPS),
    "rtc_delay_steps": (-1, 10_000),
}
"""name -> (low, high), both allowed: the integers with a range to declare (an IntegerRange, step 1).
Validation judges them too (the declared range is skipped for a start value outside it)."""
RUNTIME: frozenset[str] = frozenset(name for name, info in PARAMETERS.items() if info.runtime)

_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(NodeConfig)}
assert set(PARAMETERS) == set(_FIELD_TYPES), "PARAMETERS and NodeConfig must list the same names"


def declare_parameters(node: Any) -> None:
    """Declare every parameter on ``node`` with its default and a descriptor (``ros2 param
    describe`` shows the description; runtime-changeable ones say so)."""
    from rclpy.exceptions import InvalidParameterValueException
    from rclpy.parameter import Parameter

    defaults = NodeConfig().as_dict()
    for name in PARAMETERS:
        try:
            declared = node.declare_parameter(name, defaults[name], descriptor(name))
        except InvalidParameterValueException:
            # a params-file value outside the declared range: declared without it, so that the
            # node's validation names the value and the range and the start stops there
            declared = node.declare_parameter(name, defaults[name], descriptor(name, ranged=False))
        empty = (Parameter.Type.BYTE_ARRAY, Parameter.Type.NOT_SET)
        if isinstance(defaults[name], list) and declared.type_ in empty and not list(declared.value or []):
            # rclpy types an empty default as a byte array, and a params file's `[]` as not set:
            # `ros2 param get` would show bytes, or "not set"; typed as the field is
            node.set_parameters([Parameter(name, _array_type(name), [])])
    current = [node.get_parameter(name) for name in PARAMETERS]
    changed = [q for p, q in zip(current, floats_as_doubles(current), strict=True) if q is not p]
    if changed:
        node.set_parameters(changed)


def _array_type(name: str) -> Any:
    """The rclpy array type of a list parameter (its NodeConfig field's element type)."""
    from rclpy.parameter import Parameter

    floats = "float" in str(NodeConfig.__dataclass_fields__[name].type)
    return Parameter.Type.DOUBLE_ARRAY if floats else Parameter.Type.STRING_ARRAY


def descriptor(name: str, ranged: bool = True) -> Any:
    """The ParameterDescriptor of one of our parameters: its description, whether it changes at
    runtime, and for the numbers their range."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    info = PARAMETERS[name]
    when = "changeable at runtime" if info.runtime else "read-only at runtime (restart to change)"
    out = ParameterDescriptor(description=f"{info.description} [{when}]", dynamic_typing=True)
    if ranged and name in NUMBER_RANGES:
        low, high, _ = NUMBER_RANGES[name]
        out.floating_point_range = [FloatingPointRange(from_value=low, to_value=high, step=0.0)]
    if ranged and name in INTEGER_RANGES:
        low, high = INTEGER_RANGES[name]
        out.integer_range = [IntegerRange(from_value=low, to_value=high, step=1)]
    return out


_UNTYPED_EMPTY = ("BOOL_ARRAY", "BYTE_ARRAY", "INTEGER_ARRAY")  # what an empty `[]` may come as (rclpy's Type names)


def floats_as_doubles(params: list[Any]) -> list[Any]:
    """The parameters with an integer given for a float field (`rate_hz: 5`, accepted) turned
    into doubles, so that `ros2 param get` shows the type the node uses. The node runs this
    before every set (a pre-set callback) and once after declaring (a params file's ints)."""
    from rclpy.parameter import Parameter

    out = []
    for p in params:
        if _FIELD_TYPES.get(p.name) == "float" and p.type_ == Parameter.Type.INTEGER:
            p = Parameter(p.name, Parameter.Type.DOUBLE, float(p.value))
        elif _FIELD_TYPES.get(p.name) == "list[float]" and p.type_ == Parameter.Type.INTEGER_ARRAY:
            p = Parameter(p.name, Parameter.Type.DOUBLE_ARRAY, [float(v) for v in p.value])
        elif str(_FIELD_TYPES.get(p.name)).startswith("list[") and p.type_.name in _UNTYPED_EMPTY and not len(p.value):
            p = Parameter(p.name, _array_type(p.name), [])  # `[]` from the CLI (bools) or rclpy (bytes)
        out.append(p)
    return out


def refused_by_rclpy(node: Any, params: list[Any]) -> str | None:
    """Why rclpy's own descriptor check will refuse this set, or None. It does so before the
    node's set-parameters callback and says nothing in the log: for a read-only parameter (rclpy's
    own, e.g. start_type_description_service), for a number outside its declared range, and for
    one declared with a fixed type (use_sim_time; ours are dynamically typed) given another type,
    or unset. The
    node's pre-set callback asks this to log and count such a set like any other it refuses
    (rclpy still refuses it, and its reason goes back to the caller)."""
    from rclpy.parameter import Parameter

    for p in params:
        if not node.has_parameter(p.name):
            continue
        declared = node.describe_parameter(p.name)
        if declared.read_only:
            return f"{p.name} is read-only"
        if declared.floating_point_range and p.type_ == Parameter.Type.DOUBLE:
            outside = _outside(p.value, declared.floating_point_range[0], node.PARAM_REL_TOL)
            if outside:
                return f"{p.name} {outside}, got {p.value!r}"
        if declared.integer_range and p.type_ == Parameter.Type.INTEGER:
            low, high = sorted((declared.integer_range[0].from_value, declared.integer_range[0].to_value))
            if not low <= p.value <= high:  # step 1: every integer within is allowed
                return f"{p.name} must be within its declared range [{low}, {high}], got {p.value!r}"
        if declared.dynamic_typing:
            continue
        expected = Parameter.Type(declared.type).name.lower()
        if p.type_ == Parameter.Type.NOT_SET:
            return f"{p.name} cannot be unset: it is declared with a fixed type ({expected})"
        if p.type_.value != declared.type:
            return f"{p.name} must be a {expected}, got {p.type_.name.lower()} {p.value!r}"
    return None


def answer_unreadable_values(node: Any, on_refusal: Callable[[str], None]) -> None:
    """A set_parameters request holding a value of a type ROS does not define (a ParameterValue
    of type 200 from a client's bug): rclpy's parameter services raised on it out of the executor,
    and the caller waited for a reply that never came. Answered here: that parameter refused with
    the reason (the whole request, for the atomic service), the others set as asked; each refusal
    goes to `on_refusal` to be counted and logged."""
    for service in node.services:
        owner, _, kind = service.srv_name.rpartition("/")  # rclpy's names are relative: "<node>/<kind>"
        if owner in (node.get_name(), node.get_fully_qualified_name()) and kind.startswith("set_parameters"):
            service.callback = _refusing_unreadable(service.callback, kind, on_refusal)


def _refusing_unreadable(callback: Callable, kind: str, on_refusal: Callable[[str], None]) -> Callable:
    from rcl_interfaces.msg import SetParametersResult

    def answer(request: Any, response: Any) -> Any:
        reasons = [_unreadable(p) for p in request.parameters]
        if not any(reasons):
            return callback(request, response)
        bad = "; ".join(r for r in reasons if r)
        on_refusal(bad)
        if kind == "set_parameters_atomically":
            response.result = SetParametersResult(successful=False, reason=f"{bad}: nothing set")
            return response
        good = [p for p, r in zip(request.parameters, reasons, strict=True) if not r]
        done = iter(callback(type(request)(parameters=good), type(response)()).results)
        response.results = [SetParametersResult(successful=False, reason=r) if r else next(done) for r in reasons]
        return response

    return answer


def _unreadable(msg: Any) -> str | None:
    from rclpy.parameter import Parameter

    try:
        Parameter.from_parameter_msg(msg)
    except (ValueError, TypeError) as exc:
        return f"{shown(msg.name)}: value type {msg.value.type} is not a ROS parameter type ({exc})"
    return None


def _outside(value: float, declared: Any, rel_tol: float) -> str | None:
    """Where `value` falls outside a declared FloatingPointRange, judged as rclpy judges it (the
    ends and what is close to them are in), or None."""
    low, high = sorted((declared.from_value, declared.to_value))
    if math.isclose(value, low, rel_tol=rel_tol) or math.isclose(value, high, rel_tol=rel_tol) or low < value < high:
        return None
    return f"must be within its declared range [{low:g}, {high:g}]"


def check_update(current: NodeConfig, changes: Mapping[str, Any], resolve: Resolver | None = None) -> str | None:
    """Why a runtime change of our parameters must be refused, or None to accept it.
    Names that are not ours (use_sim_time) are left to rclpy. ``resolve``: as for validate
    (the running node's, so that its topics are judged in its namespace)."""
    ours = {name: value for name, value in changes.items() if name in PARAMETERS}
    # a restart-only parameter set to the value in use is no change (`ros2 param load` of the
    # node's own params file sets every one of them; a path as written, ~ and all, is the one in use)
    fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
    fixed = sorted(
        name
        for name in ours
        if name not in RUNTIME and not same_value(_normalise(fields[name], ours[name]), getattr(current, name))
    )
    if fixed:
        return (
            f"{', '.join(fixed)} {'is' if len(fixed) == 1 else 'are'} read-only at runtime: "
            "set it in the params file and restart the node "
            f"(changeable at runtime: {', '.join(sorted(RUNTIME))})"
        )
    rate = ours.get("command_rate_hz", current.command_rate_hz)
    number = isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate)
    if number and (rate > 0) != (current.command_rate_hz > 0):  # other values: validate says what is wrong
        return (
            f"command_rate_hz {current.command_rate_hz:g} -> {rate:g}: the command stream is turned on or off "
            "only at start (its publishers and thread are made then): set it in the params file and restart "
            "the node; a rate above 0 can change to another at runtime"
        )
    problems = current.with_values(ours).validate(check_paths=False, resolve=resolve)
    return "; ".join(problems) if problems else None


def same_value(new: Any, old: Any) -> bool:
    """Whether a parameter's new value is the one in use: of its type (an integer for a float
    parameter by value: a params file's 5 is 5.0), sequences element by element (rclpy gives
    arrays as array.array)."""
    if isinstance(new, (list, tuple, array.array)):
        return isinstance(old, (list, tuple)) and len(new) == len(old) and all(map(same_value, new, old))
    if type(old) is float and type(new) is int:
        return float(new) == old
    return type(new) is type(old) and new == old


RCLPY_PARAMETERS = ("use_sim_time", "start_type_description_service")
"""What rclpy's Node declares and acts on itself (Jazzy): not ours, and no typos."""


def unknown_names(
    names: list[str] | set[str], runtime: bool = False, known: Mapping[str, Any] | None = None
) -> list[str]:
    """Parameter names that are not ours (typos; `known`: the node's names, flashrt_node's by
    default); rclpy's own (RCLPY_PARAMETERS) are excluded.

    ``qos_overrides.*`` are let through at start, where a shared ``/**`` section may hold them
    for other nodes; this node enables no QoS overrides (its QoS is fixed), so at runtime
    (``runtime=True``) such a set would change nothing and is unknown like any other name."""
    known = PARAMETERS if known is None else known
    return sorted(
        n
        for n in names
        if n not in known and n not in RCLPY_PARAMETERS and (runtime or not n.startswith("qos_overrides."))
    )


TYPO_CUTOFF = 0.75
"""How alike (difflib's ratio) a name must be to one of ours to be taken as its typo."""


def did_you_mean(unknown: list[str], known: Mapping[str, Any] | None = None) -> str:
    """ " did you mean checkpoint for checkpiont?" for the unknown names close to one of ours."""
    names = list(PARAMETERS if known is None else known)
    close = [(n, difflib.get_close_matches(n, names, n=1, cutoff=TYPO_CUTOFF)) for n in unknown]
    pairs = [f"{match[0]} for {name}" for name, match in close if match]
    return f" did you mean {', '.join(pairs)}?" if pairs else ""


def load_yaml_parameters(path: str | Path, node_name: str = NODE_NAME, namespace: str = "/") -> dict[str, Any]:
    """The ``ros__parameters`` a ROS params file gives the node ``node_name`` in ``namespace``:
    the sections that name the node by rcl's rules (``/**``, ``/**/flashrt_node``,
    ``/robot1/flashrt_node``, ``flashrt_node`` = ``/flashrt_node``, and a namespace written as an
    enclosing key, ``robot1: {flashrt_node: ...}``), merged in the file's order: a later section's
    value wins, as rcl gives it to the node (a ``/**`` after the node's own section overrides it)."""
    fqn = f"{namespace.rstrip('/')}/{node_name}"
    merged: dict[str, Any] = {}
    for key, params in node_sections(_yaml_sections(path)):
        if section_applies(key, fqn):
            if not isinstance(params, dict):
                raise ValueError(f"{path}: section {key!r} has no ros__parameters mapping")
            merged.update(_flatten(params))
    return merged


def node_sections(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(node name, its ros__parameters) of each section of a params file. rcl lets a namespace
    be written as enclosing keys (``robot1: {flashrt_node: {ros__parameters: ...}}``), so the
    name is the path of keys down to ``ros__parameters``."""
    out = []
    for key, value in data.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict) and "ros__parameters" not in value:
            out += node_sections(value, name)
        else:
            out.append((name, value.get("ros__parameters") if isinstance(value, dict) else None))
    return out


def _yaml_sections(path: str | Path) -> dict:
    """A params file's sections, its documents (`---`) merged as rcl merges them."""
    import yaml

    data: dict = {}
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: expected a mapping of node names to ros__parameters")
        _merge_into(data, doc)
    return data


def _merge_into(into: dict, more: dict) -> None:
    """`more` merged into `into`, mappings key by key (rcl merges a section given twice)."""
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_into(into[key], value)
        else:
            into[key] = value


def section_applies(key: str, fqn: str) -> bool:
    """Whether a params file's section ``key`` reaches the node ``fqn`` (/ns/name), as rcl
    decides: ``/**`` stands for any namespace (none included), ``/*`` for one token, and a key
    without a leading ``/`` is under the root."""
    wildcards = {"**": "(/[^/]+)*", "*": "/[^/]+"}
    parts = [part for part in key.strip("/").split("/") if part]
    pattern = "".join(wildcards.get(part, "/" + re.escape(part)) for part in parts)
    return re.fullmatch(pattern or "/", fqn) is not None


def files_of(sources: Sequence[tuple[str, ...]]) -> list[str]:
    """The ``--params-file`` paths among `param_sources`' sources (what ``ros2 run`` and
    ``ros2 launch`` pass), in order."""
    return [source[1] for source in sources if source[0] == "file"]


def param_sources(argv: list[str]) -> list[tuple[str, str] | tuple[str, str, str]]:
    """The parameter sources among the ROS arguments of a command line, in order, as rcl applies
    them: ("file", path) for ``--params-file``, ("arg", "node:name" or "name", value text) for
    ``-p`` / ``--param name:=value``."""
    sources: list[tuple[str, str] | tuple[str, str, str]] = []
    in_ros_args = False
    for i, arg in enumerate(argv):
        if arg == "--ros-args":
            in_ros_args = True
        elif arg == "--":
            in_ros_args = False
        elif in_ros_args and i + 1 < len(argv):
            if arg == "--params-file":
                sources.append(("file", argv[i + 1]))
            elif arg in ("-p", "--param") and ":=" in argv[i + 1]:
                name, _, value = argv[i + 1].partition(":=")
                sources.append(("arg", name, value))
    return sources


# rcl's typing of a plain (unquoted) YAML scalar (rcl_yaml_param_parser's get_value): these words,
# then a whole integer as C's strtoll(base 0) reads it (0x10 is 16, 010 is 8), then a whole double
# as strtod reads it (2e-2, .inf, nan); anything else, and every quoted scalar, is a string.
# PyYAML types plainly written values otherwise (2e-2 and y are strings there). Forms read here
# with less certainty than rcl's C library reads them (hex floats, nan(...), overflow, an explicit
# tag) are UNSURE, and a parameter given one is not checked.
UNSURE = object()
_RCL_TRUE = frozenset("Y y yes Yes YES true True TRUE on On ON".split())
_RCL_FALSE = frozenset("N n no No NO false False FALSE off Off OFF".split())
_RCL_INF = frozenset(f"{s}.{w}" for s in ("", "+", "-") for w in ("inf", "Inf", "INF")) | {".nan", ".NaN", ".NAN"}
_STRTOLL = re.compile(r"[ \t]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", re.ASCII)
_STRTOD = re.compile(r"[ \t]*[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf(inity)?|nan)", re.ASCII | re.I)
_NUMERIC_LOOKING = re.compile(r"[ \t]*[+-]?(\.?[0-9]|inf|nan)", re.ASCII | re.I)


def rcl_scalar(text: str, quoted: bool = False) -> Any:
    """A YAML scalar as rcl types it for a parameter (bool, int, float, str), or UNSURE."""
    if quoted:
        return text
    if text in _RCL_TRUE or text in _RCL_FALSE:
        return text in _RCL_TRUE
    m = _STRTOLL.fullmatch(text)
    if m:
        body = m.group(2)
        base = 16 if body[:2] in ("0x", "0X") else 8 if len(body) > 1 and body[0] == "0" else 10
        value = int(body, base) * (-1 if m.group(1) == "-" else 1)
        return value if -(2**63) <= value < 2**63 else UNSURE  # strtoll's ERANGE: then strtod
    if text in _RCL_INF:
        return float(text.replace(".", ""))
    if _STRTOD.fullmatch(text):
        value = float(text)
        mantissa = re.sub(r"[eE].*", "", text)
        underflow = abs(value) < sys.float_info.min and re.search("[1-9]", mantissa)  # 0 or subnormal
        if math.isinf(value) and "inf" not in text.lower() or underflow:
            return UNSURE  # strtod's ERANGE (overflow, underflow)
        return value
    return UNSURE if _NUMERIC_LOOKING.match(text) else text  # 0x1p3, nan(1), 1_000: C reads some of these


def _rcl_typed(node: Any) -> Any:
    """A composed YAML node's value as rcl types parameters (scalars by `rcl_scalar`); mappings
    given twice merged; UNSURE for an explicitly tagged scalar (`!!str 5`)."""
    import yaml

    if isinstance(node, yaml.ScalarNode):
        if getattr(node, "explicit_tag", False):
            return UNSURE
        return rcl_scalar(node.value, quoted=node.style in ("'", '"'))
    if isinstance(node, yaml.SequenceNode):
        items = [_rcl_typed(n) for n in node.value]
        return UNSURE if any(i is UNSURE or isinstance(i, list | dict) for i in items) else items
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for k, v in node.value:  # a key given twice: merged, as rcl merges it
            _merge_into(out, {str(k.value): _rcl_typed(v)})
        return out
    return UNSURE


def list_at_line(text: str, line: int) -> tuple[str | None, list[Any]]:
    """The innermost list in the YAML `text` that spans `line` (1-based, as rcl counts them): its
    key and its items, each as rcl types it (`rcl_scalar`: UNSURE where it cannot tell); (None, [])
    if there is none or the text is no YAML. By line, not by key: two nodes' sections may hold a
    key of one name."""
    import yaml

    try:
        stack: list[tuple[str | None, Any]] = [(None, doc) for doc in _compose_all(text)]
    except yaml.YAMLError:
        return None, []
    found: tuple[str | None, list[Any]] = (None, [])
    while stack:
        key, node = stack.pop()
        if isinstance(node, yaml.SequenceNode) and node.start_mark.line <= line - 1 <= node.end_mark.line:
            found = (key, [_rcl_typed(item) for item in node.value])  # the innermost such list: found last
        if isinstance(node, yaml.MappingNode):
            stack.extend((str(k.value), value) for k, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((key, item) for item in node.value)
    return found


def _compose_all(text: str) -> list[Any]:
    """The documents of a YAML text as nodes, each scalar marked whether its tag was written
    (`!!str 5`): the composed node cannot tell a written tag from a resolved one."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_scalar_node(self, anchor: Any) -> Any:
            explicit = self.peek_event().tag not in (None, "!")
            node = super().compose_scalar_node(anchor)
            node.explicit_tag = explicit
            return node

    return list(yaml.compose_all(text, Loader=Loader))


def _rcl_kind(value: Any) -> str | None:
    """rcl's type of a value: bool, integer, double, string, or a list of one (None: unknown)."""
    if isinstance(value, list | tuple | array.array):
        kinds = {_rcl_kind(v) for v in value}
        return f"list of {kinds.pop()}" if len(kinds) == 1 else None
    return {bool: "bool", int: "integer", float: "double", str: "string"}.get(type(value))


def lost_values(sources: Sequence[tuple[str, ...]], fqn: str, received: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, sentence) per parameter whose last source (params file or `-p`, in command-line order)
    gives it another type than the value the node received: rcl merges sources value by value
    only within one type, and where two give a parameter different types it keeps one by type
    (bool over integer over double over string over lists), wherever it came, without a word. A
    robot overlay's `start_enabled: "false"` over the base file's `true` started the node
    enabled; an overlay's `max_age_s: 0.25` over the base's `1` kept 1. Also a file's `[]` over an
    earlier list (rcl keeps the list), and a `-p node:name` that misses a namespaced node. Values
    of one type are not compared (rcl's order of sections decides among them), nor forms read
    here with less certainty than rcl reads them (UNSURE). `received`: `given_values`."""
    import yaml

    last: dict[str, tuple[str, Any, bool]] = {}  # name -> (where, value, from a file)
    problems: list[tuple[str, str]] = []
    for source in sources:
        if source[0] == "file":
            try:
                data: dict = {}
                for doc in _compose_all(Path(source[1]).read_text()):
                    typed = _rcl_typed(doc)
                    _merge_into(data, typed if isinstance(typed, dict) else {})
                sections = node_sections(data)
            except (OSError, ValueError, yaml.YAMLError):  # unaddressed_params_files says so
                continue
            for key, params in sections:
                if section_applies(key, fqn) and isinstance(params, dict):
                    last.update((n, (f"params file {source[1]}", v, True)) for n, v in _flatten(params).items())
            continue
        target, _, name = source[1].rpartition(":")
        where = f"-p {source[1]}:={source[2]}"
        if target and "/" + target.lstrip("/") != fqn:
            if target.lstrip("/") == fqn.rsplit("/", 1)[-1]:  # rcl reads the node part as /target
                sentence = (
                    f"{where} reaches only /{target.lstrip('/')}, not this node {fqn}; expected -p {name}:=... "
                    "(or the value in a params file section for the node)"
                )
                problems.append((name, sentence))
            continue
        try:
            (doc,) = _compose_all(source[2]) or [None]
        except (ValueError, yaml.YAMLError):
            continue
        last[name] = (where, UNSURE if doc is None else _rcl_typed(doc), False)
    for name, (where, value, from_file) in last.items():
        got = received.get(name)
        if name not in received or value is UNSURE:
            continue
        if isinstance(value, list) and not value:  # a file's [] has no type: an earlier list stays
            if from_file and got is not None and len(got):
                sentence = (
                    f"{where} gives {name} [], but the node received {list(got)!r} from an earlier source: rcl keeps "
                    f"a list given before over an empty one; expected the empty list given by -p {name}:=[] or the "
                    "earlier file changed"
                )
                problems.append((name, sentence))
            continue
        want, kind = _rcl_kind(value), _rcl_kind(got)
        if want is not None and kind is not None and want != kind:
            sentence = (
                f"{where} gives {name} {value!r} ({want}), but the node received {got!r} ({kind}) from an earlier "
                f"source: rcl keeps a value of another type given before, without a word; expected one type for "
                f"{name} in every params file and -p"
            )
            problems.append((name, sentence))
    return problems


def unknown_given(
    node: Any, files: list[str], known: Mapping[str, Any] | None = None, siblings: Collection[str] = ()
) -> tuple[list[str], list[str]]:
    """The names given to `node` at start that it does not know (`known`: flashrt_node's by
    default), as (typos, another node's): those only a section for every node (`/**`) sets are a
    robot-wide file's keys for other nodes, not typos - unless close to one of ours
    (`action_max_stpe` in a single-node file of only `/**`: a limit dropped as "not ours") and not
    one of `siblings`, the parameters of this package's other node (flashrt_node's
    `action_joint_names` beside synthetic_sensors' `joint_names` in one robot-wide section)."""
    given = set(given_values(node))
    shared = shared_only_names(files, node.get_fully_qualified_name())
    names = list(PARAMETERS if known is None else known)
    shared = {n for n in shared if n in siblings or not difflib.get_close_matches(n, names, n=1, cutoff=TYPO_CUTOFF)}
    return unknown_names(given - shared, known=known), unknown_names(given & shared, known=known)


def given_values(node: Any) -> dict[str, Any]:
    """The values rcl gave a node at start (its parameter overrides), as rcl typed them: before
    the node declared them (a declared double turns a given integer 5 into 5.0)."""
    return {name: p.value for name, p in getattr(node, "_parameter_overrides", {}).items()}


def unaddressed_params_files(files: list[str], fqn: str, known: Mapping[str, Any] | None = None) -> list[str]:
    """One sentence per params file with no section for the node ``fqn``, and one where only
    sections for every node (``/**``) reach it and set none of its parameters. rcl ignores such a
    file without a word, and the node would run its defaults (random weights) on the robot: a
    section keyed ``flashrt_node:`` reaches only ``/flashrt_node``, not ``/robot1/flashrt_node``;
    a misspelt node key beside a shared ``/**: {use_sim_time: true}`` reaches nothing. `known`:
    the node's parameter names (flashrt_node's by default)."""
    import yaml

    known = PARAMETERS if known is None else known

    problems, addressed = [], False
    expected = f"expected a section keyed '/**/{fqn.rsplit('/', 1)[-1]}' or '{fqn}'"
    for path in files:
        try:
            sections = node_sections(_yaml_sections(path))
        except (OSError, ValueError, yaml.YAMLError) as exc:  # rcl has read it already; say if we cannot
            problems.append(f"params file {path}: cannot check its sections ({exc})")
            continue
        applying = [(key, params) for key, params in sections if section_applies(key, fqn)]
        if not applying:
            shown = some([repr(k) for k, _ in sections], SHOWN_SECTIONS) or "none"
            problems.append(
                f"params file {path} has no section for this node {fqn} (its sections: {shown}), so none "
                f"of its parameters apply; {expected}"
            )
        addressed |= any(not _is_wildcard(key) or _sets_ours(params, known) for key, params in applying)
    if files and not problems and not addressed:  # e.g. `/**: {use_sim_time}` beside a misspelt node key
        problems.append(
            f"params files {', '.join(files)}: only sections for every node ('/**' and the like) apply to this node "
            f"{fqn}, and they set none of its parameters, so it would run its defaults; {expected}"
        )
    return problems


def shared_only_names(files: list[str], fqn: str) -> set[str]:
    """The parameter names that only sections for every node (`/**` and the like) give the node
    `fqn`, none of its own sections: a robot-wide section's keys for other nodes. Files that
    cannot be read give none (unaddressed_params_files says so)."""
    import yaml

    shared: set[str] = set()
    own: set[str] = set()
    for path in files:
        try:
            sections = node_sections(_yaml_sections(path))
        except (OSError, ValueError, yaml.YAMLError):
            continue
        for key, params in sections:
            if section_applies(key, fqn) and isinstance(params, dict):
                (shared if _is_wildcard(key) else own).update(_flatten(params))
    return shared - own


def _is_wildcard(key: str) -> bool:
    """A section for every node (of a namespace): `/**`, `/robot1/*`."""
    return key.rstrip("/").rsplit("/", 1)[-1] in ("*", "**")


def _sets_ours(params: object, known: Mapping[str, Any]) -> bool:
    return isinstance(params, dict) and any(name in known for name in _flatten(params))


SHOWN_SECTIONS = 8


def _flatten(params: dict, prefix: str = "") -> dict[str, Any]:
    """Nested YAML mappings are dotted parameter names in ROS (``a: {b: 1}`` -> ``a.b``)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        out.update(_flatten(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return out


# ---- normalisation and checks --------------------------------------------------------------


PATH_PARAMETERS = ("checkpoint", "tokenizer")


def _normalise(f: dataclasses.Field, value: Any) -> Any:
    """Lossless conversions only: int -> float for float fields, sequences -> list, NOT_SET
    (an empty YAML list reaches rclpy as NOT_SET) -> [], a leading ~ of a file path expanded
    (YAML, -p and launch arguments leave it: the check and the loader then see one path). Anything
    else is kept for validate()."""
    kind = f.type
    if f.name in PATH_PARAMETERS and isinstance(value, str) and value.startswith("~"):
        try:
            return str(Path(value).expanduser())
        except RuntimeError:  # ~user of no such user: kept, for the check to name it
            return value
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in ("list[str]", "list[float]"):
        if value is None:
            return []
        if isinstance(value, (list, tuple)) or type(value).__name__ == "array":
            value = list(value)
    if kind == "list[float]" and isinstance(value, list):
        return [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


def _type_name(value: Any) -> str:
    return type(value).__name__


_CHOICES = {
    "policy": PRESETS,
    "device": DEVICES,
    "precision": PRECISIONS,
    "backend": BACKENDS,
    "fp8": FP8_PARTS,
    "trajectory_stamp": TRAJECTORY_STAMPS,
    "prompt_durability": PROMPT_DURABILITIES,
    "prefix_trigger": PREFIX_TRIGGERS,
    "command_interpolation": INTERPOLATIONS,
    "rtc_schedule": RTC_SCHEDULES,
    "rtc_jacobian": RTC_JACOBIANS,
}


def stand_in(name: str, which: int) -> Any:
    """A value of the right type for a mistyped parameter: its default (which = 0), or another
    valid one (which = 1), to tell the problems that depend on it from those that do not."""
    default = getattr(NodeConfig(), name)
    if which == 0:
        return default
    if isinstance(default, bool):
        return not default
    if name in _CHOICES:
        choices = _CHOICES[name]
        return choices[(choices.index(default) + 1) % len(choices)]
    if _FIELD_TYPES[name] == "list[float]":
        return [*default, 1.0]
    if isinstance(default, list):
        return [*default, "stand_in"]
    if isinstance(default, str):
        return default + "_stand_in"
    if name in NUMBER_RANGES:  # within the range: halfway from the default to the top
        return (default + NUMBER_RANGES[name][1]) / 2
    return default + 1


def _type_problems(cfg: NodeConfig) -> dict[str, str]:
    """Parameter name -> why its value has the wrong type."""
    problems = {}
    for name, kind in _FIELD_TYPES.items():
        value = getattr(cfg, name)
        ok = {
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, float),
            "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "list[float]": isinstance(value, list) and all(isinstance(v, float) for v in value),
        }[kind]
        if not ok:
            expected = {
                "str": "a string",
                "bool": "true or false",
                "int": "an integer",
                "float": "a number",
                "list[str]": "a list of strings",
                "list[float]": "a list of numbers",
            }
            problems[name] = f"{name} must be {expected[kind]}, got {_type_name(value)} {shown(value)}"
    return problems


_RCLPY_TYPE_REFUSAL = re.compile(r"Trying to set parameter '(.*)' to '(.*)' of type '(\w+)', expecting type '(\w+)'")


@contextmanager
def rclpy_parameter_refusals() -> Iterator[None]:
    """Around rclpy's Node constructor, which declares its own parameters (use_sim_time, a bool)
    from the params files and -p: a wrong type there (`use_sim_time: "true"`, in a robot-wide
    `/**` section too) raised from inside it, a traceback and exit 1 before any check of ours. As
    a ConfigError instead: one sentence, as for our parameters, and exit 2."""
    from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException

    try:
        yield
    except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
        found = _RCLPY_TYPE_REFUSAL.search(str(exc))
        if found is None:
            raise ConfigError([f"rclpy refused a parameter of its own: {exc}"]) from None
        name, value, got, expected = found.groups()
        wanted = "true or false" if expected == "BOOL" else f"of type {expected.lower()}"
        raise ConfigError([f"{name} must be {wanted}, got {got.lower()} {value!r} (rclpy's own parameter)"]) from None


def _check_choices(cfg: NodeConfig) -> list[str]:
    """The parameters that take one of a few words (device also takes cuda:N: _check_policy)."""
    return [
        f"{name} must be one of {', '.join(choices)}, got {getattr(cfg, name)!r}"
        for name, choices in _CHOICES.items()
        if name != "device" and getattr(cfg, name) not in choices
    ]


def _check_policy(cfg: NodeConfig) -> list[str]:
    problems = []
    if not cfg.tokenizer and cfg.policy in ("pi05", "pi0"):
        problems.append(
            f"tokenizer is empty: policy {cfg.policy!r} needs PaliGemma's tokenizer.model "
            f"(only {', '.join(TINY_PRESETS)} use the built-in tiny tokenizer)"
        )
    if not cfg.checkpoint and cfg.policy in ("pi05", "pi0"):  # a typo'd key leaves it so: a real arm on noise
        problems.append(
            f"checkpoint is empty: policy {cfg.policy!r} needs its weights (a folder with model.safetensors); "
            f"random weights move a robot without meaning: set checkpoint: {RANDOM_WEIGHTS} for that (benchmarks)"
        )
    if not re.fullmatch(r"auto|cpu|cuda(:(0|[1-9][0-9]*))?", cfg.device):  # as torch reads it: no "cuda:01"
        problems.append(f"device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.fp8 in FP8_PARTS and cfg.fp8 != "none" and (cfg.precision != "bfloat16" or cfg.backend == "reference"):
        problems.append(
            f"fp8 {cfg.fp8!r} needs precision bfloat16 and the fused backend (auto or fused), "
            f"got precision {cfg.precision!r}, backend {cfg.backend!r}"
        )
    if cfg.seed < 0:
        problems.append(f"seed must be >= 0, got {cfg.seed}")
    return problems


def _check_cameras(cfg: NodeConfig) -> list[str]:
    problems = []
    if not cfg.camera_topics:
        problems.append("camera_topics is empty; expected at least one camera topic")
    most = MAX_INTS["num_views"]
    if len(cfg.camera_topics) > most:
        problems.append(f"camera_topics has {len(cfg.camera_topics)} topics; expected at most {most} (one per view)")
    if cfg.camera_transports and len(cfg.camera_transports) != len(cfg.camera_topics):
        problems.append(
            f"camera_transports has {len(cfg.camera_transports)} entries for {len(cfg.camera_topics)} "
            "camera_topics; expected one per camera (or [] for all raw)"
        )
    bad = [t for t in cfg.camera_transports if t not in TRANSPORTS]
    if bad:
        problems.append(f"camera_transports {bad} not understood; expected each to be raw or compressed")
    if cfg.image_height < 0 or cfg.image_width < 0:
        problems.append(f"image_height/image_width must be >= 0, got {cfg.image_height}/{cfg.image_width}")
    elif (cfg.image_height == 0) != (cfg.image_width == 0):
        problems.append(
            f"image_height={cfg.image_height}, image_width={cfg.image_width}: set both (> 0) or neither (0 = any size)"
        )
    elif cfg.image_height * cfg.image_width > MAX_DECODED_PIXELS:  # the warm-up would decide on frames that big
        problems.append(
            f"image_height x image_width = {cfg.image_height} x {cfg.image_width}, more pixels than any robot camera "
            f"gives; expected at most {MAX_DECODED_PIXELS} (8K, 7680 x 4320): a digit too many?"
        )
    return problems


def _check_joints(cfg: NodeConfig) -> list[str]:
    problems = []
    for name in ("joint_names", "action_joint_names"):
        names = getattr(cfg, name)
        if any(not n.strip() for n in names):
            problems.append(f"{name} has an empty name; expected joint names")
        duplicated = _listed_twice(names)
        if duplicated:
            problems.append(f"{name} lists {duplicated} more than once; expected each joint once")
    if not cfg.joint_names:
        problems.append("joint_names is empty; expected the joints of the policy's state, in order")
    if cfg.policy in PRESETS:
        model = PolicyConfig.preset(cfg.policy)
        if len(cfg.joint_names) > model.state_dim:
            problems.append(
                f"joint_names has {len(cfg.joint_names)} joints; {cfg.policy} takes at most {model.state_dim}"
            )
        if len(cfg.output_joint_names) > model.action_dim:
            problems.append(
                f"action_joint_names has {len(cfg.output_joint_names)} names; "
                f"{cfg.policy} outputs at most {model.action_dim}"
            )
    return problems


LIMITS = ("action_lower_limits", "action_upper_limits", "action_max_step")


def _check_limits(cfg: NodeConfig) -> list[str]:
    """Each limit list is empty, one value for every joint, or one per action joint; finite; the
    lower below the upper; steps > 0."""
    problems, names = [], cfg.output_joint_names
    for name in LIMITS:
        values = getattr(cfg, name)
        if len(values) not in (0, 1, len(names)):
            problems.append(
                f"{name} has {len(values)} values for {len(names)} action joints; expected one per joint "
                "(in action_joint_names order, or joint_names'), one for every joint, or [] for none"
            )
            continue
        for i, v in enumerate(values):
            where = f"{name}[{i}]" + (f" ({names[i]})" if len(values) > 1 else "")
            # a continuous joint has no position bound: -.inf / .inf there (never the other way, nor NaN)
            unbounded = {"action_lower_limits": -math.inf, "action_upper_limits": math.inf}.get(name)
            if not math.isfinite(v) and v != unbounded:
                allowed = f" or {unbounded:+} for no bound (a continuous joint)" if unbounded else ""
                problems.append(f"{where} must be a finite number{allowed}, got {v!r}")
            elif name == "action_max_step" and v <= 0:
                problems.append(f"{where} must be > 0, got {v!r}")
    lower, upper = cfg.action_lower_limits, cfg.action_upper_limits
    if lower and upper and all(len(x) in (1, len(names)) for x in (lower, upper)):
        pairs = [(n, lower[i if len(lower) > 1 else 0], upper[i if len(upper) > 1 else 0]) for i, n in enumerate(names)]
        crossed = [f"{n} ({low!r} >= {high!r})" for n, low, high in pairs if low >= high]
        if crossed:
            problems.append(f"action_lower_limits is not below action_upper_limits for {some(crossed, 4)}")
    return problems


def _check_rates(cfg: NodeConfig) -> list[str]:
    """Ranges of the numbers; a lower bound is inclusive where ``low_ok`` (see MIN_RATE_HZ,
    MIN_STEP_DURATION_S for why some are above 0)."""
    problems = []
    for name, (low, high, low_ok) in NUMBER_RANGES.items():
        value = getattr(cfg, name)
        lower_ok = value >= low if low_ok else value > low
        if not (math.isfinite(value) and lower_ok and value <= high):
            bound = ">=" if low_ok else ">"
            problems.append(f"{name} must be {bound} {low:g} and <= {high:g}, got {value!r}")
    return problems


def _listed_twice(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


def parse_group(text: str) -> tuple[str, list[str]] | None:
    """'arm_controller/joint_trajectory=j1, j2' -> (topic, [joints]); None if it has no '='."""
    topic, sep, joints = text.partition("=")
    if not sep:
        return None
    return topic.strip(), [j.strip() for j in joints.split(",")]


GROUP_EXAMPLES = {
    "trajectory_groups": "'arm_controller/joint_trajectory=j1, j2'",
    "command_groups": "'arm_controller/commands=j1, j2'",
}


def _check_groups(cfg: NodeConfig) -> list[str]:
    """Each trajectory or command group names a topic and joints the chunk has, each once."""
    problems = []
    for name, example in GROUP_EXAMPLES.items():
        for i, text in enumerate(getattr(cfg, name)):
            problems += _group_problems(f"{name}[{i}] {shown(text)}", text, example, cfg.output_joint_names)
    return problems


def _group_problems(where: str, text: str, example: str, actions: list[str]) -> list[str]:
    problems = []
    parsed = parse_group(text)
    if parsed is None or not parsed[0] or not any(parsed[1]):
        return [f"{where}: expected 'TOPIC=joint, joint, ...', e.g. {example}"]
    joints = parsed[1]
    if any(not j for j in joints):
        problems.append(f"{where}: an empty joint name; expected joint names separated by commas")
    unknown = [j for j in joints if j and j not in actions]
    if unknown:
        known = some(actions, 16)
        problems.append(f"{where}: {some(unknown, 8)} not among action_joint_names (or joint_names): {known}")
    duplicated = _listed_twice(joints)
    if duplicated:
        problems.append(f"{where}: lists {duplicated} more than once; expected each joint once")
    return problems


def _check_commands(cfg: NodeConfig) -> list[str]:
    """The command stream's rate is off (0) or a rate a timer can keep; its groups need it on."""
    problems = []
    if 0.0 < cfg.command_rate_hz < MIN_RATE_HZ:
        problems.append(f"command_rate_hz must be 0 (off) or >= {MIN_RATE_HZ:g}, got {cfg.command_rate_hz!r}")
    if cfg.command_groups and cfg.command_rate_hz == 0.0:
        problems.append(
            "command_groups is set but command_rate_hz is 0 (off): "
            "expected command_rate_hz > 0 to publish them, or command_groups []"
        )
    if not 0 <= cfg.command_blend_steps <= MAX_BLEND_STEPS:
        problems.append(f"command_blend_steps must be >= 0 and <= {MAX_BLEND_STEPS}, got {cfg.command_blend_steps}")
    return problems


def _check_rtc(cfg: NodeConfig) -> list[str]:
    """Real-time chunking's delay is -1 (estimated) or a count; "exact" needs the reference."""
    problems = []
    low, high = INTEGER_RANGES["rtc_delay_steps"]
    if not low <= cfg.rtc_delay_steps <= high:
        problems.append(f"rtc_delay_steps must be -1 (from the latency) or 0..{high}, got {cfg.rtc_delay_steps}")
    if cfg.rtc and cfg.rtc_jacobian == "exact" and cfg.backend != "reference":
        problems.append(
            f"rtc_jacobian 'exact' differentiates through the expert, which only backend 'reference' can (backend "
            f"is {cfg.backend!r}); expected rtc_jacobian 'identity' or backend 'reference'"
        )
    return problems


def _check_text(cfg: NodeConfig) -> list[str]:
    return [] if cfg.prompt.strip() else ["prompt is empty; expected the task instruction, e.g. 'pick up the cube'"]


def _check_paths(cfg: NodeConfig) -> list[str]:
    problems = []
    if cfg.checkpoint_folder and not Path(cfg.checkpoint_folder).is_dir():
        problems.append(f"checkpoint {cfg.checkpoint!r} is not a folder; expected one with model.safetensors")
    if cfg.tokenizer and not Path(cfg.tokenizer).is_file():
        problems.append(f"tokenizer {cfg.tokenizer!r} is not a file; expected PaliGemma's tokenizer.model")
    return problems


def expand_in_namespace(namespace: str = "/", node_name: str = NODE_NAME) -> Resolver:
    """A resolver by rcl's own rules (rclpy's expansion and validation: tokens, ``~``, ``{}``
    substitutions, length), for a node ``node_name`` in ``namespace``, without remappings.
    Without rclpy (a config checked off-robot) names are only expanded, not judged."""
    try:
        from rclpy.expand_topic_name import expand_topic_name
        from rclpy.validate_full_topic_name import validate_full_topic_name
    except ImportError:
        return partial(_expand_plainly, namespace=namespace, node_name=node_name)

    def resolve(topic: str) -> str:
        try:
            full = expand_topic_name(topic, node_name, namespace)
            validate_full_topic_name(full)
        except Exception as exc:  # ValueError / InvalidTopicNameException, rcl's reason inside
            raise ValueError(rcl_reason(exc)) from exc
        return full

    return resolve


def _expand_plainly(topic: str, namespace: str, node_name: str) -> str:
    """Without rclpy: a rough check of the characters and an expansion without substitutions."""
    if not re.fullmatch(r"~?/?[A-Za-z_{][A-Za-z0-9_/{}]*", topic) or "//" in topic or topic.endswith("/"):
        raise ValueError("expected tokens of letters, digits and '_' separated by '/'")
    ns = namespace.rstrip("/")
    if topic.startswith("~"):
        return f"{ns}/{node_name}{topic[1:]}"
    return topic if topic.startswith("/") else f"{ns}/{topic}"


def rcl_reason(exc: Exception) -> str:
    """rcl's sentence from an rclpy error, without its C source location, its repetition of
    the name and the caret drawing under it."""
    if type(exc).__name__ == "UnknownROSArgsError":  # rclpy gives only the list of them
        return f"unknown ROS arguments {exc} (a typo? expected --params-file FILE, -p NAME:=VALUE, -r FROM:=TO, ...)"
    text = str(exc).split("\n")[0]
    text = re.sub(r",? at /\S+:\d+", "", text)  # rcl appends one per layer it passed through
    text = re.sub(r"^(failed to resolve name|Invalid topic name|topic name '.*' is invalid): ", "", text)
    return text.rstrip(":").strip()


def _node_topics(cfg: NodeConfig) -> list[tuple[str, str, str]]:
    """(what, name as written, message type) of every topic the node subscribes or publishes."""
    transports = cfg.transports
    cams = [
        (
            f"camera_topics[{i}]",
            topic,
            INPUT_TYPES.get(transports[i] if i < len(transports) else "raw", INPUT_TYPES["raw"]),
        )
        for i, topic in enumerate(cfg.camera_topics)
    ]
    joints = [("joint_state_topic", cfg.joint_state_topic, INPUT_TYPES["joints"])]
    if cfg.prompt_topic:
        joints.append(("prompt_topic", cfg.prompt_topic, INPUT_TYPES["prompt"]))
    groups = [
        (f"{name}[{i}]", parsed[0], OUTPUTS[output])
        for name, output in (("trajectory_groups", "~/joint_trajectory"), ("command_groups", "~/joint_command"))
        for i, parsed in enumerate(map(parse_group, getattr(cfg, name)))
        if parsed is not None and parsed[0]
    ]
    return cams + joints + groups + [("the node's output", name, kind) for name, kind in OUTPUTS.items()]


def _check_topics(cfg: NodeConfig, resolve: Resolver) -> list[str]:
    """Names rcl would refuse (with its reason), and names that resolve to one topic: the same
    camera twice (one camera feeding two views), or topics whose types cannot share it."""
    refused, by_name = resolve_topics(_node_topics(cfg), resolve)
    problems = [invalid_topic(what.split("[")[0], topic, exc) for what, topic, exc in refused]
    return problems + [clash_sentence(full, users) for full, users in by_name.items() if len(users) > 1]


def resolve_topics(
    topics: list[tuple[str, str, str]], resolve: Resolver
) -> tuple[list[tuple[str, str, ValueError]], dict[str, list[tuple[str, str, str]]]]:
    """Each topic (what, name as written, message type) resolved once: those rcl refuses (what,
    name, rcl's reason) and, by full name, the topics that resolve to it."""
    refused, by_name = [], {}
    for what, topic, kind in topics:
        try:
            by_name.setdefault(resolve(topic), []).append((what, topic, kind))
        except ValueError as exc:
            refused.append((what, topic, exc))
    return refused, by_name


def invalid_topic(what: str, topic: str, reason: object) -> str:
    """The sentence for a topic name rcl refuses (`reason`: rcl's), the name cut when long."""
    shown = repr(topic) if len(topic) <= 80 else f"{topic[:40]!r}... ({len(topic)} characters)"
    return f"{what}: {shown} is not a valid ROS topic name: {reason}"


def node_resolver(node: Any) -> Resolver:
    """`node`'s own resolution of a topic name (its namespace and remappings), so that validation
    sees what rcl will; rcl's refusal becomes a ValueError with its reason, not a traceback."""
    from rclpy._rclpy_pybind11 import RCLError

    def resolve(topic: str) -> str:
        try:
            return node.resolve_topic_name(topic)
        except RCLError as exc:
            raise ValueError(rcl_reason(exc)) from exc

    return resolve


def clash_sentence(full: str, users: list[tuple[str, str, str]]) -> str:
    """The sentence for topics `users` (what, name as written, message type) that resolve to `full`."""
    named = " and ".join(f"{what} {topic!r}" for what, topic, _ in users)
    named += " both" if len(users) == 2 else " all"
    kinds = sorted({kind for _, _, kind in users})
    if len(kinds) == 1:
        first = users[0][0]
        mine = next((f"{kind} group" for kind in ("trajectory", "command") if first.startswith(kind)), "camera")
        return f"{named} resolve to {full}; expected each {mine} on a topic of its own"
    return (
        f"{named} resolve to {full}, which cannot carry {' and '.join(kinds)} at once; "
        "expected a topic of its own for each"
    )
