"""``flashrt_node``: cameras + joint states in, action chunks out, at a fixed decision rate.

Data path: each sensor callback converts and validates its message at once (so a bad
message is reported where it arrived, and the decision never waits for a conversion) and
keeps the latest good sample per topic. A decision timer in its own callback group takes
the held samples, refuses to decide unless every input is present and fresh, runs the
policy, and publishes an ``ActionChunk`` and a ``trajectory_msgs/JointTrajectory``. A
MultiThreadedExecutor keeps the sensor callbacks flowing while the policy runs.

The status timer and the services have callback groups of their own, so that a decision rate
the policy cannot keep (its timer always due) starves neither; the services that touch the
policy's state (reset, capsules) take turns with the decision on a lock, so they always run
between two decisions.

Robots see why nothing moves: every refused message and every skipped decision is
counted by (topic, reason) in ``~/status`` and ``/diagnostics`` and logged (throttled per
topic and reason) with what was wrong and what was expected.

The node's parts, one module each: the sensor and prompt callbacks (``node_inputs``), ROS time's
jumps (``node_time``), the status and diagnostics (``node_status``), runtime parameter changes
(``node_parameters``) and the services (``node_services``); the counters' reasons are in
``reasons``. Here: set-up, decisions, publishing and the command stream.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import rclpy
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType, JumpThreshold
from rclpy.duration import Duration
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.executors import MultiThreadedExecutor
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.qos import (
    DurabilityPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_sensor_data,
)
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger
from trajectory_msgs.msg import JointTrajectory

from flashrt_ros.engine.action_limits import ActionLimits
from flashrt_ros.engine.action_stream import ActionStream, Command, Exhausted
from flashrt_ros.engine.pipeline import Decision
from flashrt_ros.engine.real_time_chunking import ExecutingChunk, Hold, LatencyWindow, hold
from flashrt_ros.engine.stats import PipelineStats
from flashrt_ros.msg import ActionChunk, PipelineStatus
from flashrt_ros.policies.prompt import PromptTooLong
from flashrt_ros.policies.robot_space import ALOHA_GRIPPERS
from flashrt_ros.ros import messages
from flashrt_ros.ros.clock_watch import ClockWatch
from flashrt_ros.ros.image_convert import compressed_to_rgb, image_to_rgb
from flashrt_ros.ros.input_error import STALE, InputError
from flashrt_ros.ros.inputs import InputSlot, Sample, ThrottledLog
from flashrt_ros.ros.joint_convert import check_fresh, stamp_to_ns
from flashrt_ros.ros.node_inputs import InputCallbacks
from flashrt_ros.ros.node_parameters import ParameterUpdates
from flashrt_ros.ros.node_services import NodeServices
from flashrt_ros.ros.node_status import StatusReports
from flashrt_ros.ros.node_time import RosTimeJumps
from flashrt_ros.ros.params import (
    NODE_NAME,
    PARAMETERS,
    ConfigError,
    NodeConfig,
    answer_unreadable_values,
    declare_parameters,
    did_you_mean,
    files_of,
    given_values,
    lost_values,
    node_resolver,
    param_sources,
    rclpy_parameter_refusals,
    unaddressed_params_files,
    unknown_given,
)
from flashrt_ros.ros.process import init_rclpy, interrupt_on_signals, run_until_signal, signals_held, stopping
from flashrt_ros.ros.qos_mismatch import MismatchNamer
from flashrt_ros.ros.reasons import (
    ABSENT,
    ACTION_CLAMPED,
    CHUNK_ENDED,
    CHUNK_EXHAUSTED,
    COMMAND_LIMITED,
    DISCOVERY_S,
    MIN_JUMP_BACK_S,
    MIN_JUMP_FORWARD_S,
    NODE_ERROR,
    NON_FINITE_ACTION,
    POLICY_ERROR,
    PROMPT_TOO_LONG,
    UNKNOWN_PARAMETER,
)
from flashrt_ros.ros.startup import (
    StartupError,
    build_pipeline_state,
    check_decoders,
    describe_rtc,
    joint_coverage,
    moved_joints,
    prefix_schedule,
)
from flashrt_ros.ros.usage import command_line, usage
from flashrt_ros.srv import DropCapsule, ForkCapsule, ListCapsules, RestoreCapsule, SnapshotCapsule

# ---- the node ------------------------------------------------------------------------------


class ClockMark(NamedTuple):
    """Where a decision began on the node's clocks, to tell its length on them."""

    timer_s: float  # the decision timer's clock: ROS time under use_sim_time, else monotonic
    sim: bool  # ROS time active (use_sim_time)
    jumps_forward: int  # ROS time's jumps forward so far


def action_state_columns(names: list[str], joint_names: list[str], unlike: tuple[int, ...] = ()) -> list[int | None]:
    """Each action joint's column in the joint state (None: none to step from). `unlike`: action
    columns whose state is another quantity (ALOHA's grippers under adapt_to_pi: the finger
    position in, the gripper joint out), which the step limit and the commands' first move must
    not measure against each other."""
    return [None if j in unlike or n not in joint_names else joint_names.index(n) for j, n in enumerate(names)]


class FlashRTNode(InputCallbacks, RosTimeJumps, StatusReports, ParameterUpdates, NodeServices, Node):
    """See the module docstring. ``stats_window`` sizes the rolling timing windows (the
    benchmark makes it large to keep every decision)."""

    MANAGED = False
    """True in the lifecycle node: the pipeline is set up on configure, decisions run while active,
    and activate / deactivate take the place of ~/enable."""
    PAUSED_STATE = "paused by ~/enable"  # how diagnostics, stats and logs name a pause
    PAUSED_STATS = "PAUSED (~/enable)"
    PAUSED_DIAG = "no (~/enable)"  # /diagnostics' `enabled` while paused
    PAUSED_DROP = "~/enable paused the policy"
    TIME_JUMP_DROP = "ROS time went back"

    def __init__(
        self,
        *,
        stats_window: int = 200,
        sources: Sequence[tuple[str, ...]] = (),
        set_up: bool = True,
        **node_kwargs: Any,
    ):
        # undeclared names reach _on_set_parameters, which refuses them with the known names and
        # a counter (rclpy's own refusal says only "Invalid access to undeclared parameter(s)")
        node_kwargs.setdefault("allow_undeclared_parameters", True)
        with rclpy_parameter_refusals():
            super().__init__(NODE_NAME, **node_kwargs)
        _FORWARD.ros_logger = self.get_logger()  # the policy's logs under this node's name (and /rosout)
        declare_parameters(self)
        self._sources = list(sources)  # params files and -p, in command-line order (params.param_sources)
        self._params_files = files_of(self._sources)
        self._unknown = self._warn_unknown_parameters()  # before the problems: a typo is often their cause
        self._start_source_problems = self._source_problems()
        self._set_since_start: set[str] = set()  # what `ros2 param set` gave since: it replaced rcl's merge
        self.stats_window = stats_window
        self.stopping = threading.Event()  # set by begin_shutdown
        self.stop_owes_hold = False  # a pause the stop signal cut short: its hold is the stop's (hold_at_stop)
        self._dropped_for_prompt = False  # the last decision's chunk was dropped for a prompt change
        self.is_set_up = False
        self.enabled = False  # ~/enable (or the lifecycle): decide and publish, or only take inputs
        self._live = threading.Condition()  # is_set_up and the callbacks running (tear_down waits for them)
        self._running = 0
        self._own_services: list = []  # made here, kept through tear_down (see there)
        self.capsules = self.state = None
        self._no_entities()
        self.add_pre_set_parameters_callback(self._before_set_parameters)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)
        answer_unreadable_values(self, self._refused_parameter)
        # ROS time going back (_on_time_jump): how often, from where, by how much; read by the
        # inputs and the commands, which settle on it at their next use
        self._time_epoch = self._inputs_epoch = self._commands_epoch = self._prefix_epoch = 0
        self._jump_from_ns = self._jump_to_ns = self._jump_back_ns = 0
        self._jumps_back_ns: deque[int] = deque()  # not yet counted and logged
        self._jumps_forward = 0  # ROS time's jumps forward so far: no decision's length spans one
        self._last_step_forward: tuple[float, int] | None = None  # (steady s, ns) of the last step seen
        self._jump_handle = self.get_clock().create_jump_callback(  # kept: the callback lives with it
            JumpThreshold(
                min_forward=Duration(seconds=MIN_JUMP_FORWARD_S),
                min_backward=Duration(seconds=-MIN_JUMP_BACK_S),
                on_clock_change=False,
            ),
            post_callback=self._on_time_jump,
        )
        self._create_services()  # unconfigured (a lifecycle node's start) they answer "not configured"
        if set_up:
            self.set_up()

    def destroy_node(self) -> None:
        self._jump_handle.unregister()  # the clock is not destroyed with the node: no call into it after
        super().destroy_node()

    def set_up(self) -> None:
        """Read and check the parameters, build the pipeline (load the policy, warm it up) and
        make every topic, timer and service: at start, or on a lifecycle node's configure.
        Raises ConfigError (the parameters) or StartupError (the policy) before anything is made."""
        self.cfg = NodeConfig.from_parameters(self)
        problems = [s for name, s in self._start_source_problems if name not in self._set_since_start]
        problems += self.cfg.validate(resolve=node_resolver(self))
        if problems:
            raise ConfigError(problems)
        check_decoders(self.cfg)
        self.state, self.description = build_pipeline_state(self.cfg)
        names = self.cfg.output_joint_names
        self._limits = ActionLimits.from_lists(
            names, self.cfg.action_lower_limits, self.cfg.action_upper_limits, self.cfg.action_max_step
        )
        # each action joint's column in the joint state (None: the state has no such joint)
        aloha = self.state.pipeline.policy.cfg.aloha_adapt_to_pi
        self._state_columns = action_state_columns(names, self.cfg.joint_names, ALOHA_GRIPPERS if aloha else ())
        self.state.pipeline.prefix_cache.clock = self._timer_seconds  # prefix_period_s on the decisions' clock
        self._lock = threading.Lock()  # counters and conversion stats (sensor threads)
        self._throttle = ThrottledLog(self.cfg.log_throttle_s, self.get_logger())
        self._reset_counters()
        # a jump before set-up held nothing
        self._inputs_epoch = self._commands_epoch = self._prefix_epoch = self._time_epoch
        self._jumps_back_ns.clear()
        if self._unknown:
            self.invalid[("", UNKNOWN_PARAMETER)] += len(self._unknown)
        # decisions, status and services each in their own group, so that a decision rate the
        # policy cannot keep (its timer always due) starves neither the status nor the services;
        # the decision and the services that change its state take turns on this lock instead
        self._state_lock = threading.Lock()
        self.enabled = self.cfg.start_enabled and not self.MANAGED
        self._started_at: float | None = None  # the first decision tick: absent inputs are expected then
        from flashrt_ros.engine.capsule import CapsuleStore

        self.capsules = CapsuleStore(self.state, clock_ns=lambda: self.get_clock().now().nanoseconds)
        self._create_inputs()
        self._create_outputs()
        self._create_timers()
        with self._live:  # the callbacks of what was just made run from here on
            self.is_set_up = True
        self._subscribe_prompt()
        self._log_startup()

    def _source_problems(self) -> list[tuple[str | None, str]]:
        """What went wrong with the params files and -p as rcl read them at start, judged once: a
        lifecycle node configured again must not re-read files edited since (rcl never applies
        them), nor judge values set since by the start's. (parameter, sentence); None: a file's."""
        fqn = self.get_fully_qualified_name()
        restart = "; rcl reads params files only when the process starts: restart it with the file fixed"
        problems: list[tuple[str | None, str]] = [
            (None, s + (restart if self.MANAGED else "")) for s in unaddressed_params_files(self._params_files, fqn)
        ]

        def settable(name: str) -> str:  # an unknown name cannot be set: only a restart helps
            known = self.MANAGED and name in PARAMETERS
            return f" (or `ros2 param set {fqn} {name} <value>`, then configure)" if known else ""

        return problems + [(n, s + settable(n)) for n, s in lost_values(self._sources, fqn, given_values(self))]

    def tear_down(self) -> None:
        """Undo `set_up` (a lifecycle node's cleanup or shutdown): nothing is decided or published
        from here on, the callbacks running finish, every topic and timer of the pipeline goes, and
        the policy with its GPU memory is released. The parameters stay, and so do the services
        (they answer that the node is not configured): rclpy sends a reply after its callback has
        returned, and a service destroyed in between raised out of the executor and ended the
        process."""
        with self._live:
            self.is_set_up = self.enabled = False  # callbacks that start from now on return at once
            while not self._live.wait_for(lambda: self._running == 0, timeout=5.0):
                self.get_logger().warning(f"tear-down: waiting for {self._running} callbacks still running")
        for timer in (self._decision_timer, self._status_timer, self._command_timer, *self._relook_timers):
            if timer is not None:
                self.destroy_timer(timer)
        for sub in [*self._subscriptions_in, self._prompt_sub]:
            if sub is not None:
                self.destroy_subscription(sub)
        pubs = [self._chunk_pub, self._traj_pub, self._status_pub, self._diag_pub]
        for pub in pubs + [pub for pub, _, _ in self._group_pubs + self._command_pubs]:
            if pub is not None:
                self.destroy_publisher(pub)
        self._no_entities()
        self.capsules = self.state = None  # the policy, its buffers, graphs and capsules
        self.slots = []  # the held samples: on a GPU, page-locked frames of the pipeline's pool
        if "torch" in sys.modules:  # also what a set-up that failed half-way had allocated
            from flashrt_ros.engine.pipeline import release_device_memory

            release_device_memory()

    def _no_entities(self) -> None:
        """The pipeline's topics and timers as before set-up (and after tear-down): none."""
        self._subscriptions_in, self._prompt_sub, self._group_pubs, self._command_pubs = [], None, [], []
        self._chunk_pub = self._traj_pub = self._status_pub = self._diag_pub = None
        self._decision_timer = self._status_timer = self._command_timer = None
        self._relook_timers: list = []  # the incompatible-QoS namers' (qos_mismatch.py)

    def _guarded(self, callback: Callable, service: bool = False) -> Callable:
        """`callback` that runs only while the node is set up, counted while it runs so that
        `tear_down` can wait for it. Skipped, a `service` callback answers that nothing was done."""

        def run(*args: Any) -> Any:
            with self._live:
                if not self.is_set_up:
                    return _not_set_up(args[-1]) if service else None
                self._running += 1
            try:
                return callback(*args)
            finally:
                with self._live:
                    self._running -= 1
                    self._live.notify_all()

        return run

    # ---- set-up ----------------------------------------------------------------------------
    def _warn_unknown_parameters(self) -> list[str]:
        """Names given to this node that it does not know: warned about and counted. Those only a
        section for every node (`/**`) sets are another node's (robot_description, update_rate in a
        robot-wide file): said once, at INFO, and not counted."""
        from flashrt_ros.ros.synthetic_sensors import SensorConfig  # the package's other node, in one file

        unknown, others = unknown_given(self, self._params_files, siblings=SensorConfig.__dataclass_fields__)
        if others:
            self.get_logger().info(f"not ours, from a section for every node ('/**'): {others}; for the other nodes")
        if unknown:
            self.get_logger().warning(
                f"ignoring unknown parameters {unknown} (typo in the params file?{did_you_mean(unknown)}); "
                f"known: {', '.join(PARAMETERS)}"
            )
        return unknown

    def _reset_counters(self) -> None:
        self.decisions = 0
        self.deadline_misses = 0
        self.dropped_decisions = 0
        self.dropped_inputs = 0
        self.prefix_reuses = 0
        self.rtc_guided = 0
        self.commands_sent = 0  # command ticks that published (the stats line)
        self.invalid: Counter = Counter()  # (topic, reason) -> count
        self._dropped_streak = 0
        self._outage = False  # a tick since the last decision skipped for more than the expected wait
        # decision stages rated on the decision timer's clock (compared with target_rate_hz), the
        # inputs' conversions on wall time (their publishers' rates)
        self.node_stats = PipelineStats(self.stats_window, self._timer_seconds)  # node_overhead, input_wait, ...
        self.conversion_stats = PipelineStats(self.stats_window)  # per topic, guarded by _lock
        self.state.pipeline.stats = PipelineStats(self.stats_window, self._timer_seconds)
        self._last_health = (0, 0)
        self._last_decision_at = time.monotonic()
        self._decision_s: deque[float] = deque(maxlen=8)  # how long the last decisions took (timer clock)
        self._last_invalid: dict[tuple[str, str], int] = {}
        self._invalid_at_decision: dict[tuple[str, str], int] = {}  # the counts when the last decision ran
        self._blocking: frozenset[str] = frozenset()  # the inputs that stopped the last decision tick
        self._deciding = False  # a decision past its inputs' checks is computing (the first after an outage)
        self._decision_began = time.monotonic()  # when the one computing began (steady time)
        self._last_missed: float | None = None  # the last decision's length where it missed its deadline
        self._tick_failures = 0  # decision ticks that failed outside the policy (node_error), and as of
        self._tick_failures_at_decision = 0  # the last decision
        self._last_stats_log = time.monotonic()
        self._clock_watch = ClockWatch()
        self._last_decision_ros_ns = self.get_clock().now().nanoseconds

    def _create_inputs(self) -> None:
        cfg = self.cfg
        self.slots: list[InputSlot] = []  # cameras in view order, then the joint states
        self._subscriptions_in = []
        self._subscribed_at = time.monotonic()  # DDS discovery of the publishers runs from here
        for topic, transport in zip(cfg.camera_topics, cfg.transports, strict=True):
            msg_type, convert = (Image, image_to_rgb) if transport == "raw" else (CompressedImage, compressed_to_rgb)
            self._subscribe(msg_type, topic, partial(self._on_image, convert))
        self._subscribe(JointState, cfg.joint_state_topic, self._on_joint_state)
        self._prompt_sub = None
        self._refused_prompt: tuple[str | None, str] = (None, "")  # the last text refused, and why

    def _subscribe_prompt(self) -> None:
        """prompt_topic's subscription, made once the node is set up: a prompt latched by a
        transient_local publisher is delivered once, at once, and the guard would drop it before.
        In the node's default group, with the parameter services: one parameter change at a time
        (self.cfg is replaced in their callbacks)."""
        if self.cfg.prompt_topic:
            topic = self.resolve_topic_name(self.cfg.prompt_topic)
            mismatch = self._guarded(partial(self._on_incompatible_prompt_publisher, topic))
            self._prompt_mismatches = self._mismatch_namer(
                self._incompatible_prompt_publishers, self._say_prompt_mismatch
            )
            self._prompt_sub = self.create_subscription(
                String,
                self.cfg.prompt_topic,
                self._guarded(self._on_prompt),
                prompt_qos(self.cfg.prompt_durability),
                event_callbacks=SubscriptionEventCallbacks(incompatible_qos=mismatch),
            )

    def _mismatch_namer(self, find: Callable, say: Callable) -> MismatchNamer:
        """Names the endpoints an incompatible-QoS event counts, looking at the graph again on a
        steady timer of its own (0.1 s, running only while the graph lists fewer than counted)."""
        namer = MismatchNamer(find, say)
        namer.relook = self.create_timer(0.1, self._guarded(namer.look), clock=Clock(clock_type=ClockType.STEADY_TIME))
        namer.relook.cancel()
        self._relook_timers.append(namer.relook)
        return namer

    def _subscribe(self, msg_type: type, topic: str, handler: Callable) -> None:
        """One input: a slot for its latest good sample, and a best-effort subscription."""
        type_name = f"{msg_type.__module__.split('.')[0]}/msg/{msg_type.__name__}"
        slot = InputSlot(self.resolve_topic_name(topic), type_name)
        self.slots.append(slot)
        sub = self.create_subscription(
            msg_type,
            topic,
            self._guarded(partial(handler, slot)),
            qos_profile_sensor_data,
            callback_group=MutuallyExclusiveCallbackGroup(),  # topics in parallel, each in order
            # A best-effort, volatile subscription is compatible with every publisher, so rclpy's
            # default "incompatible QoS" handlers could never fire - yet with them the executor
            # (rclpy 7.1.6) burnt 100% CPU on 3 cameras + 200 Hz joints and handled 13 of 200
            # joint states/s, and the policy ran 50x slower (GIL); without them: 25% CPU.
            event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False),
        )
        self._subscriptions_in.append(sub)

    def _publisher(self, msg_type: type, topic: str, depth: int) -> Any:
        """An output: reliable, volatile, and a subscriber that cannot match it named and counted
        (rclpy's default says neither who nor how to fix it, and nothing counts it)."""
        mismatch = self._guarded(partial(self._on_incompatible_subscriber, self.resolve_topic_name(topic)))
        events = PublisherEventCallbacks(incompatible_qos=mismatch)
        return self.create_publisher(msg_type, topic, depth, event_callbacks=events)

    def _create_outputs(self) -> None:
        self._subscriber_mismatches = self._mismatch_namer(
            self._incompatible_subscribers, self._say_subscriber_mismatch
        )
        self._chunk_pub = self._publisher(ActionChunk, "~/action_chunk", 10)
        self._traj_pub = self._publisher(JointTrajectory, "~/joint_trajectory", 10)
        # the last chunk published: where a pause holds the trajectory controllers (None once held)
        self._last_trajectory: ExecutingChunk | None = None
        self._ended_since_hold = False  # a chunk published since then had ended on arrival (chunk_ended)
        # real-time chunking (rtc): the same chunk, what the robot executes (None after a reset or a
        # pause), and the recent decisions' latencies, from which the next chunk's takeover is estimated
        self._executing: ExecutingChunk | None = None
        self._latency = LatencyWindow()
        # one per controller that owns some of the joints: (publisher, the joints' columns, names)
        names = self.cfg.output_joint_names
        self._group_pubs = [
            (self._publisher(JointTrajectory, topic, 10), [names.index(j) for j in joints], joints)
            for topic, joints in self.cfg.parsed_groups("trajectory_groups")
        ]
        # the command stream: all the action joints, then one per controller that owns some; depth 1,
        # as a command that waited behind a newer one is of no use to a controller
        self.commands = ActionStream(
            self.cfg.command_blend_steps,
            self.cfg.command_interpolation,
            self._max_move(),
            self._command_tick_ns(self.cfg),
        )
        # the chunk (id, start) whose held-back commands were counted: a restored capsule repeats ids
        self._limited_chunk: tuple[int, int] | None = None
        self._exhausted_counted: Exhausted | None = None  # the chunk whose end was counted (once each)
        self._command_lock = threading.Lock()  # a tick's command and count, or a reset: one at a time
        commands = [("~/joint_command", names)] + self.cfg.parsed_groups("command_groups")
        self._command_pubs = [
            (self._publisher(Float64MultiArray, topic, 1), [names.index(j) for j in joints], joints)
            for topic, joints in (commands if self.cfg.command_rate_hz > 0 else [])
        ]
        self._status_pub = self._publisher(PipelineStatus, "~/status", 10)
        self._twin_said = False  # another publisher of the chunks was logged (once)
        self._diag_pub = self._publisher(DiagnosticArray, "/diagnostics", 10)

    def _max_move(self) -> np.ndarray | None:
        """How fast the commands may move: action_max_step per action step (the stream spreads
        it over its ticks)."""
        if self._limits.max_step is None or self.cfg.command_rate_hz <= 0:
            return None
        return self._limits.max_step

    def _create_timers(self) -> None:
        self._decision_timer = self.create_timer(
            1.0 / self.cfg.rate_hz, self._guarded(self._on_decision), callback_group=MutuallyExclusiveCallbackGroup()
        )
        # status on the steady clock: it keeps reporting when ROS time stops (use_sim_time with
        # no /clock, a paused simulator)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        status_group = MutuallyExclusiveCallbackGroup()
        self._status_timer = self.create_timer(
            1.0 / self.cfg.status_rate_hz, self._guarded(self._on_status), callback_group=status_group, clock=steady
        )
        # commands on the ROS clock, the chunks' stamps' own, in a group of their own: a decision
        # in progress must not delay the controller's next command
        self._command_timer = None
        if self.cfg.command_rate_hz > 0:
            self._command_timer = self.create_timer(
                1.0 / self.cfg.command_rate_hz,
                self._guarded(self._on_command),
                callback_group=MutuallyExclusiveCallbackGroup(),
            )

    def _create_services(self) -> None:
        group = MutuallyExclusiveCallbackGroup()  # one service at a time; each takes the state lock
        services = [
            (Trigger, "~/reset", self._on_reset, group),
            (SnapshotCapsule, "~/capsule/snapshot", self._on_snapshot, group),
            (RestoreCapsule, "~/capsule/restore", self._on_restore, group),
            (ForkCapsule, "~/capsule/fork", self._on_fork, group),
            (ListCapsules, "~/capsule/list", self._on_list, group),
            (DropCapsule, "~/capsule/drop", self._on_drop, group),
        ]
        if not self.MANAGED:  # the lifecycle node's (de)activate takes its place
            # a group of its own: a pause acts at once (it stops the commands and the decision in
            # flight before it waits for the state lock), also while a reset or capsule call holds
            # the other services' group waiting for that decision
            services.insert(1, (SetBool, "~/enable", self._on_enable, MutuallyExclusiveCallbackGroup()))
        self._own_services = [
            self.create_service(srv, name, self._guarded(callback, service=True), callback_group=callback_group)
            for srv, name, callback, callback_group in services
        ]

    def _log_startup(self) -> None:
        cfg, d, log = self.cfg, self.description, self.get_logger()
        log.info(
            f"policy {d['policy']}: {d['weights']}; tokenizer {d['tokenizer']}; "
            f"{d['device']}, {d['precision']}, {d['backend']} path"
        )
        warmed = d["warm_up"]
        (log.warning if warmed.startswith("failed") else log.info)(f"warm-up decision: {warmed}")
        size = f"{cfg.image_height}x{cfg.image_width}" if cfg.expected_hw else "any size"
        names = self.state.pipeline.policy.cfg.extra.get("camera_names") or []  # a LeRobot checkpoint's
        cams = ", ".join(
            f"{s.topic} ({t})" + (f" as {names[i]}" if i < len(names) else "")
            for i, (s, t) in enumerate(zip(self.slots, cfg.transports, strict=False))
        )
        log.info(
            f"inputs: {len(cfg.camera_topics)} cameras [{cams}], {size}; joints {self.slots[-1].topic} "
            f"({len(cfg.joint_names)}: {', '.join(cfg.joint_names)})"
        )
        log.info(
            f"outputs: {self._chunk_pub.topic_name}, {self._traj_pub.topic_name} "
            f"({d['horizon']} x {len(cfg.output_joint_names)} actions, step {cfg.step_duration_s:g} s; joints "
            f"{', '.join(cfg.output_joint_names)}), "
            f"{self._status_pub.topic_name} at {cfg.status_rate_hz:g} Hz, /diagnostics; actions {d['actions']}"
        )
        for pub, _, joints in self._group_pubs:
            log.info(f"trajectory group: {pub.topic_name} ({len(joints)} joints: {', '.join(joints)})")
        for pub, _, joints in self._command_pubs:
            log.info(
                f"commands: {pub.topic_name} at {cfg.command_rate_hz:g} Hz ({len(joints)} joints: {', '.join(joints)}; "
                f"{_INTERPOLATED[cfg.command_interpolation].format(cfg.step_duration_s)}, "
                f"blend {cfg.command_blend_steps} actions)"
            )
        free = [n for n, i in zip(cfg.output_joint_names, self._state_columns, strict=True) if i is None]
        why = "not in joint_names, or ALOHA's grippers"
        unbounded_start = f" (action 0 free on {', '.join(free)}: {why})" if free else ""
        held = "; commands move at most action_max_step per step, chunk switches included"
        log.info(
            f"action limits: {self._limits.describe()}"
            + (unbounded_start if self._limits.max_step is not None else "")
            + (held if self.commands.max_move is not None else "")
        )
        latched = ", a latched one too" if cfg.prompt_durability == "transient_local" else ""
        from_topic = f" (then each message on {self._prompt_sub.topic_name}{latched})" if self._prompt_sub else ""
        log.info(
            f"deciding at {cfg.rate_hz:g} Hz on inputs at most {cfg.max_age_s:g} s old; "
            f"prompt {cfg.prompt!r}{from_topic}"
        )
        if not self.enabled and not self.MANAGED:  # the lifecycle node says it once configured
            log.warning(self._paused_at_start())
        log.info(f"prefix stage (prefix_trigger {cfg.prefix_trigger}): {prefix_schedule(cfg)}")
        log.info(describe_rtc(cfg, self.state.pipeline.policy.cfg.num_steps))
        self._warn_rtc_blend(cfg)
        self._warn_fewer_joints_than_statistics()
        self._warn_reordered_actions(cfg)
        self._warn_chunk_gap(cfg)
        self._say_how_often_lerobot_replans(cfg)

    def _warn_rtc_blend(self, cfg: NodeConfig, old: NodeConfig | None = None) -> None:
        """rtc's chunks continue each other: a blend on top only delays each (allowed, but said;
        at a runtime change only when it turns on: a slider over command_blend_steps says it once)."""
        on = lambda c: c.rtc and c.command_blend_steps > 0 and bool(self._command_pubs)  # noqa: E731
        if on(cfg) and (old is None or not on(old)):
            self.get_logger().warning(
                f"rtc with command_blend_steps {cfg.command_blend_steps}: the chunks already continue each other; "
                "the blend only delays each new one (command_blend_steps 0 is meant for rtc)"
            )

    def _warn_chunk_gap(self, cfg: NodeConfig, old: NodeConfig | None = None) -> None:
        """Said at start, and at a runtime change only when the gap turns on or changes kind: a
        slider over rate_hz repeated the same warning at every step."""
        gap = self._chunk_gap(cfg)
        was = None if old is None else self._chunk_gap(old)
        if gap is not None and (was is None or was[0] != gap[0]):
            self.get_logger().warning(gap[1])

    def _chunk_gap(self, cfg: NodeConfig) -> tuple[str, str] | None:
        """(kind, warning) where chunks can leave the controller without points. A decision period
        longer than a chunk lasts leaves it without points between chunks (the arm stops, or holds
        its last point): allowed (a slow demo), but said. So is a chunk stamped at its observation
        that can end before the next arrives: it starts as old as its inputs (up to max_age_s), and
        the next comes a period (plus a decision) later."""
        horizon = self.state.pipeline.policy.cfg.horizon
        lasts = horizon * cfg.step_duration_s
        period = 1.0 / cfg.rate_hz
        if period > lasts:
            return "period", (
                f"rate_hz {cfg.rate_hz:g} decides every {period:g} s, but a chunk lasts {lasts:g} s "
                f"({horizon} actions x step_duration_s {cfg.step_duration_s:g}): the controller runs out of "
                f"points between chunks; expected rate_hz >= {1.0 / lasts:g}"
            )
        if cfg.trajectory_stamp == "observation" and period + cfg.max_age_s > lasts:
            return "age", (
                f"a chunk lasts {lasts:g} s ({horizon} actions x step_duration_s {cfg.step_duration_s:g}) from its "
                f"observation, which may be max_age_s {cfg.max_age_s:g} s old, and the next comes a period "
                f"({period:g} s) and a decision later: chunks can end before the next arrives (counted as "
                f"chunk_ended, chunk_exhausted); expected max_age_s + 1 / rate_hz below {lasts:g} s"
            )
        return None

    def _say_how_often_lerobot_replans(self, cfg: NodeConfig) -> None:
        """A LeRobot checkpoint says how many of a chunk's actions LeRobot executes before it
        decides again (n_action_steps): the node publishes whole chunks and replans at rate_hz, so
        a slower rate executes more of each chunk than the policy was run with there."""
        policy_cfg = self.state.pipeline.policy.cfg
        executed = policy_cfg.extra.get("n_action_steps")
        if not executed or executed >= policy_cfg.horizon:
            return
        per_decision = 1.0 / (cfg.rate_hz * cfg.step_duration_s)
        said = (
            f"the checkpoint's n_action_steps is {executed} of its {policy_cfg.horizon} actions (LeRobot executes "
            f"{executed}, then decides again); at rate_hz {cfg.rate_hz:g} a chunk comes every {per_decision:g} actions"
        )
        if per_decision > executed:
            wanted = 1.0 / (executed * cfg.step_duration_s)
            self.get_logger().warning(f"{said}: more than LeRobot runs it with; expected rate_hz >= {wanted:g}")
        else:
            self.get_logger().info(said)

    def _warn_reordered_actions(self, cfg: NodeConfig) -> None:
        """action_joint_names naming joint_names' joints in another order: the policy's action
        columns come in its training order, which action_joint_names only labels (a delta
        checkpoint refuses it at start). Most often the controller's order written there by mistake:
        the actions then go to the wrong joints, and the step limit compares them with the wrong
        joint's state."""
        moved = moved_joints(list(cfg.output_joint_names), list(cfg.joint_names))
        if moved:
            shown = ", ".join(f"{n} (action {i}, state {j})" for i, n, j in moved[:6])
            self.get_logger().warning(
                f"action_joint_names orders joints otherwise than joint_names: {shown}"
                f"{' ...' if len(moved) > 6 else ''}. It names the policy's action columns, which come in the "
                "order it was trained on (mostly the state's): a controller's own order goes in trajectory_groups "
                "or command_groups, which pick joints by name"
            )

    def _warn_fewer_joints_than_statistics(self) -> None:
        """Fewer joints than the checkpoint's statistics cover runs (a robot that is a subset of
        the one trained on), but is more often the wrong checkpoint: say so once, at start."""
        for what, joints, dims, _ in joint_coverage(self.state.pipeline.policy, self.cfg):
            if dims is not None and joints < dims:
                self.get_logger().warning(
                    f"{what} has {joints} joints, the checkpoint's normalisation statistics cover {dims}: "
                    f"only the first {joints} dims are used (right only if this robot's joints are the "
                    "first ones the policy was trained on)"
                )

    # ---- decisions -------------------------------------------------------------------------
    @property
    def callback_threads(self) -> int:
        """Executor threads for every group to run at once: one per input, decisions, status,
        our services, ~/enable (not on the lifecycle node), the node's default group (parameter
        services, /clock) and the commands. Before set-up (a lifecycle node), from the parameters
        as they are, commands counted."""
        if not self.is_set_up:
            cameras = self.get_parameter("camera_topics").value
            return (len(cameras) if isinstance(cameras, list | tuple) else 3) + 1 + 4 + 1
        return len(self.slots) + 4 + (not self.MANAGED) + (self._command_timer is not None)

    def begin_shutdown(self) -> None:
        """A signal arrived: the callbacks still in flight finish without publishing or changing
        state, so that nothing happens after the node said it is shutting down."""
        self.stopping.set()

    def hold_at_stop(self) -> None:
        """After a signal, the callbacks in flight done: the arm stops with the node, as on a pause
        (the trajectory controllers get one point where the last chunk has them now, the command
        controllers hold their last command), rather than play the rest of the last chunk out."""
        if not self.is_set_up:
            return
        # paused too: a pause the signal cut short has not held them (one that did left nothing to hold)
        try:
            self._stop_commands()
            self.get_logger().info(f"stopping: {self._hold_trajectories()}")
        except Exception as exc:  # the stop goes on whatever this does
            self.get_logger().warning(f"stopping: could not hold the trajectory controllers: {exc!r}")

    def _on_decision(self) -> None:
        with self._state_lock:  # a reset or capsule call waits for this decision, and the other way
            if self.enabled and not self.stopping.is_set():
                try:
                    self._decide()
                except Exception as exc:  # raised, it would end the executor and every decision after it
                    self._our_failure("decision_failed", f"decision tick failed: {exc!r}")
                finally:
                    self._deciding = False

    def _decide(self) -> None:
        start = time.perf_counter_ns()
        began = self._clock_mark()  # its length in rate_hz's periods, and on the clock chunks are stamped on
        cfg = self.cfg
        epoch = self._time_epoch
        now_ns = self.get_clock().now().nanoseconds
        samples = self._fresh_samples(now_ns, cfg)
        if samples is None:
            return
        self._deciding, self._decision_began = True, time.monotonic()  # for the status: a decision on its way
        self._forget_old_prefix(now_ns, cfg)
        if self._commands_epoch != self._time_epoch:  # the executing chunk guides this one (rtc): not one
            with self._command_lock:  # from before a jump
                self._settle_jump_commands()
        from flashrt_ros.engine.pipeline import NonFiniteActions
        from flashrt_ros.policies.policy import Observation

        empty = [None] * self.state.pipeline.policy.cfg.empty_cameras  # views no camera feeds: absent
        cameras = samples[:-1]
        obs = Observation(
            images=[s.value for s in cameras] + empty,
            state=samples[-1].value,
            prompt=cfg.prompt,
            # a message's stamp and arrival name its frame: the same ids, the same pixels (prefix re-use)
            frame_ids=tuple((stamp_to_ns(s.stamp), s.arrived_ns) for s in cameras) + tuple(empty),
        )
        held = self._hold(samples[-1], now_ns, cfg)  # before t0: part of the node's overhead
        t0 = time.perf_counter_ns()
        try:
            decision = self.state.decide(obs, hold=held)
        except (PromptTooLong, NonFiniteActions) as exc:
            reason = PROMPT_TOO_LONG if isinstance(exc, PromptTooLong) else NON_FINITE_ACTION
            self._count_node_wide(reason)
            self._throttle((reason,), "error", f"no chunk published: [{reason}] {exc}")
            return
        except Exception as exc:  # a policy bug must not kill the node; it is counted and logged
            self._count_node_wide(POLICY_ERROR)
            self._throttle((POLICY_ERROR,), "error", f"policy failed, no chunk published: {exc!r}")
            return
        latency_ms = (time.perf_counter_ns() - t0) / 1e6
        try:
            decision = self._limited(decision, samples[-1])
        except Exception as exc:  # a bug of ours: nothing unlimited may go out, and the node goes on
            self._count_node_wide(POLICY_ERROR)
            self._throttle((POLICY_ERROR,), "error", f"action limits failed, no chunk published: {exc!r}")
            return
        if self.stopping.is_set():
            self.get_logger().info(f"stop signal: chunk {decision.chunk_id}, computed meanwhile, not published")
            return
        if not self.enabled:  # ~/enable false came while it was computed
            self.get_logger().info(f"{self.PAUSED_DROP}: chunk {decision.chunk_id}, computed meanwhile, not published")
            return
        if epoch != self._time_epoch:  # its inputs and stamps are on the timeline before the jump
            chunk = decision.chunk_id
            self.get_logger().info(f"{self.TIME_JUMP_DROP}: chunk {chunk}, computed meanwhile, not published")
            return
        if self._prompt_changed_since(cfg.prompt, decision.chunk_id):
            return
        if began.jumps_forward != self._jumps_forward and self._stale_after_jump(samples, decision, cfg):
            return
        if not self._publish(decision, samples, latency_ms, cfg, held, epoch):
            return
        timed_s = self._elapsed_s(began)
        if timed_s is not None:  # none across a jump forward: the estimate would hold the jump's steps
            self._latency.add(round(timed_s * 1e9))
        self._account(samples, decision, start, time.perf_counter_ns(), cfg, guided=held is not None, timed_s=timed_s)

    def _stale_after_jump(self, samples: list[Sample], decision: Decision, cfg: NodeConfig) -> bool:
        """ROS time jumped forward while the decision ran (a simulator that skipped, a bag played
        on): inputs now older than max_age_s drop it, counted as a skipped tick for them (stamped
        at publication, it went out as fresh, and the robot acted on observations the jump made old).
        The cameras' are the frames the decision acted on: under "period", a re-used prefix's."""
        now_ns = self.get_clock().now().nanoseconds
        chunk_id = decision.chunk_id
        stale = []
        for topic, stamp in self._acted_on(samples, decision):
            try:
                check_fresh(stamp, now_ns, cfg.max_age_s, topic)
            except InputError as err:
                stale.append((topic, err))
        if not stale:
            return False
        with self._lock:
            self._book_skipped_tick([(topic, err.reason) for topic, err in stale])
        self._throttle(
            ("jumped forward",),
            "warning",
            f"ROS time jumped forward while chunk {chunk_id} was computed: not published, its inputs are now "
            + "; ".join(str(err) for _, err in stale),
        )
        return True

    def _acted_on(self, samples: list[Sample], decision: Decision) -> list[tuple[str, Any]]:
        """(topic, stamp) of what a decision acted on: the cameras' are the frames the prefix saw
        (older ones where a re-used prefix held them, under "period"), the joint state's its own."""
        sources = [(slot.topic, s.stamp) for slot, s in zip(self.slots, samples, strict=True)]
        for i, frame in enumerate((decision.prefix_frames or ())[: len(samples) - 1]):
            sources[i] = (sources[i][0], messages.time_msg(frame[0]))
        return sources

    def _hold(self, joints: Sample, now_ns: int, cfg: NodeConfig) -> Hold | None:
        """Real-time chunking: what of the executing chunk the next one is held to (None: rtc off,
        or nothing executing that it overlaps). The new chunk takes over when published: now plus
        the slowest recent decision. It starts at its stamp: the joint state's, exact; stamped at
        its publication (or zero: the controller's receipt), likely now plus the median decision.
        A failure here is a bug of ours: logged, and the decision goes on unguided."""
        settings, executing = self.state.pipeline.rtc, self._executing  # read once: a jump clears it
        if settings is None or executing is None:
            return None
        try:
            takeover_ns = now_ns + self._latency.slowest_ns()
            if cfg.trajectory_stamp == "observation":
                start_ns = stamp_to_ns(joints.stamp)
            else:
                start_ns = now_ns + self._latency.typical_ns()
            horizon = self.state.pipeline.policy.cfg.horizon
            return hold(executing, start_ns, takeover_ns, horizon, settings)
        except Exception as exc:
            self._our_failure("rtc_failed", f"real-time chunking failed, deciding unguided: {exc!r}")
            return None

    def _robot_at(self, joints: Sample) -> np.ndarray:
        """Each action joint's position in the joint state (NaN: the state has no such joint)."""
        return np.array([np.nan if i is None else joints.value[i] for i in self._state_columns], dtype=np.float64)

    def _limited(self, decision: Any, joints: Sample) -> Any:
        """The decision with its chunk within the action limits; a change counted and logged."""
        if not self._limits.active:
            return decision
        actions, clamped = self._limits.apply(decision.actions, self._robot_at(joints))
        if clamped is None:
            return decision
        self._count_node_wide(ACTION_CLAMPED)
        self._throttle(
            (ACTION_CLAMPED,),
            "warning",
            f"chunk {decision.chunk_id} limited before publishing: {clamped.values} values of {clamped.joints} "
            f"joints changed; the most: {clamped.worst} (action_lower_limits / action_upper_limits / action_max_step)",
        )
        return dataclasses.replace(decision, actions=actions)

    def _forget_old_prefix(self, now_ns: int, cfg: NodeConfig) -> None:
        """Under prefix_trigger "period" a decision may act on the frames an earlier one built the
        prefix from: only while each is within max_age_s of the clock, as for any input it uses,
        and not across a jump of ROS time back (its frames are from the old timeline, which a jump
        shorter than max_age_s would pass as fresh; also the prefix a decision dropped for the jump
        built). Here, on the decision thread: forgotten from a camera thread, it could race a lookup."""
        pipeline = self.state.pipeline
        if self._prefix_epoch != self._time_epoch:
            self._prefix_epoch = self._time_epoch
            pipeline.forget_prefix()
            return
        frames = pipeline.prefix_cache.held_frames or ()  # (stamp ns, arrival) per camera, as _decide names them
        try:
            for frame in filter(None, frames):
                check_fresh(messages.time_msg(frame[0]), now_ns, cfg.max_age_s, "the held prefix's frames")
        except InputError:
            pipeline.forget_prefix()

    def _fresh_samples(self, now_ns: int, cfg: NodeConfig) -> list[Sample] | None:
        """The held samples (cameras in view order, then joints), or None - and counted,
        logged reasons - if any is absent, stale or from the future."""
        if self._started_at is None:  # the wait for first inputs runs from the first tick, once spinning
            self._started_at = self._timer_seconds()
        with self._lock:  # read, judged and marked taken at once: a sample replaced meanwhile was not used
            self._settle_jump_inputs()
            found = self._held_problems(now_ns, cfg.max_age_s)
            if not found:  # nothing stops this tick: a failure now is the policy's, not an input's
                self._blocking = frozenset()
                # taken now, not at publication: one replaced while the policy runs was used
                for slot in self.slots:
                    slot.used = True
                return [slot.latest for slot in self.slots]
            # the rejections as they are now: camera threads change the counters once the lock is
            # let go, and the details are only built (lazily) after that
            problems: list[tuple[InputSlot, str, Callable[[], str]]] = [
                (slot, ABSENT, partial(self._absent_detail, slot, Counter(slot.rejected_since_good)))
                if err is None
                else (slot, err.reason, partial(self._stale_detail, slot, err, Counter(slot.rejected_since_good)))
                for slot, err in found
            ]
            # the wait the log calls expected (first inputs, after a reset): an info line, and no
            # outage for the status
            waits = [reason == ABSENT and self._just_emptied(slot) for slot, reason, _ in problems]
            self._book_skipped_tick([(slot.topic, reason) for slot, reason, _ in problems], all(waits))
        for (slot, reason, detail), wait in zip(problems, waits, strict=True):
            # the expected wait's info line has its own key: the warning once the wait is over
            # must not be held back by it for a throttle period
            level = "info" if wait else "warning"
            self._throttle(
                ("skipped", slot.topic, reason, level),
                level,
                lambda r=reason, s=slot, d=detail: f"decision skipped: [{r}] {s.topic}: {d()}",
            )
        return None

    def _book_skipped_tick(self, blocked: list[tuple[str, str]], expected: bool = False) -> None:
        """A decision tick that published nothing for these (input topic, reason): the status's
        counts, the streak the resume line reports, the inputs /diagnostics names as blocking, and
        - unless only the `expected` wait for inputs - an outage. Called with self._lock held."""
        self.dropped_decisions += 1
        self._dropped_streak += 1
        self._outage = self._outage or not expected
        self._blocking = frozenset(topic for topic, _ in blocked)
        for topic, reason in blocked:
            self.invalid[(topic, reason)] += 1

    def _held_problems(self, now_ns: int, max_age_s: float) -> list[tuple[InputSlot, InputError | None]]:
        """The inputs a decision now could not use: (slot, None) where none is held, (slot, why)
        where the held one is stale or from the future. Called with self._lock held."""
        found = []
        for slot in self.slots:
            if slot.latest is None:
                found.append((slot, None))
                continue
            try:
                check_fresh(slot.latest.stamp, now_ns, max_age_s, slot.topic)
            except InputError as err:
                found.append((slot, err))
        return found

    def _since_reset(self, slot: InputSlot) -> float | None:
        """Seconds since ~/reset (or ROS time going back) emptied the slot, on the decision timer's
        clock (None: never)."""
        return None if slot.cleared_at is None else self._timer_seconds() - slot.cleared_at

    def _just_emptied(self, slot: InputSlot) -> bool:
        """The node started, or a ~/reset emptied the slot, less than max_age_s (or two decision
        periods) ago, on the clock the decisions run on: waiting for a message is expected then,
        not a sensor fault. And for DISCOVERY_S after the subscriptions were made (the start, a
        lifecycle configure; not a later ~/enable): DDS may not have found the publishers yet (the
        node and its sensors started together; "no publisher on this topic: check the name" came
        half a second in, for publishers found a moment later)."""
        since = self._since_reset(slot)
        if since is None:
            if time.monotonic() - self._subscribed_at < DISCOVERY_S:  # steady time since the subscriptions
                return True
            started = self._started_at  # read once: ~/enable sets it to None from another thread
            if started is None:  # no decision tick since: the wait has not begun
                return True
            since = self._timer_seconds() - started
        # negative: the clock changed source since (use_sim_time switched); not a fresh start then
        return 0.0 <= since < max(self.cfg.max_age_s, 2.0 / self.cfg.rate_hz)

    def _stale_detail(self, slot: InputSlot, err: InputError, rejected: Counter) -> str:
        """A held sample too old: with what was refused since, or - when the topic has no
        publisher any more - that its driver is gone (only computed for lines that are logged)."""
        text = err.detail + _rejected_hint(rejected)
        if not rejected and err.reason == STALE and not self.count_publishers(slot.topic):
            text += "; no publisher on this topic any more (its driver stopped?)"
        return text

    def _absent_detail(self, slot: InputSlot, rejected: Counter) -> str:
        """Why nothing usable arrived, from what was rejected (a copy taken under the lock) or from
        the ROS graph (only computed for lines that are logged)."""
        since = self._since_reset(slot)
        text = (
            "no good message received yet"
            if since is None
            else f"no good message since {slot.cleared_by} {since:.1f} s ago"
        )
        if rejected:
            return text + _rejected_hint(rejected)
        if self._just_emptied(slot):
            return text + ("; waiting for the first one" if since is None else "; waiting for the next one")
        publishers = self.get_publishers_info_by_topic(slot.topic)
        types = sorted({p.topic_type for p in publishers})
        if not publishers:
            return text + "; no publisher on this topic: check the topic name, namespace and remappings"
        if types != [slot.type_name]:
            return text + (
                f"; its publishers send {', '.join(types)}, expected {slot.type_name} "
                "(camera_transports raw = sensor_msgs/Image, compressed = sensor_msgs/CompressedImage)"
            )
        return text + f" from its {len(publishers)} publisher(s); is it publishing (ros2 topic hz)?"

    def _publish(
        self,
        decision: Any,
        samples: list[Sample],
        latency_ms: float,
        cfg: NodeConfig,
        held: Hold | None = None,
        epoch: int | None = None,
    ) -> bool:
        """The chunk on every output; `epoch`: ROS time's jump count when the decision took its
        inputs (nothing is published from a decision across a jump). Whether it was published."""
        stamp = self._chunk_stamp(samples[-1], cfg)
        step_ns = round(cfg.step_duration_s * 1e9)
        with self._command_lock:  # ROS time went back since `_decide` looked: its stamps are on the old timeline
            self._settle_jump_commands()
            if self._jumped_since(epoch, decision.chunk_id):
                return False
        names = cfg.output_joint_names
        sources = self._acted_on(samples, decision)
        chunk = messages.action_chunk(
            decision.actions,
            stamp=stamp,
            frame_id=cfg.frame_id,
            joint_names=names,
            step_ns=step_ns,
            chunk_id=decision.chunk_id,
            sources=sources,
            latency_ms=latency_ms,
            prefix_reused=decision.prefix_reused,
            rtc_held=held.delay if held else 0,
            rtc_overlap=held.overlap if held else 0,
        )
        # again, last: a jump back while the messages were made (it takes no lock: this narrows the
        # window to the publish calls themselves)
        if self._jumped_since(epoch, decision.chunk_id):
            return False
        ended = self._warn_if_ended(stamp, len(decision.actions) * step_ns, cfg)  # counted once it goes out
        self._chunk_pub.publish(chunk)
        self._publish_trajectories(decision.actions, stamp, step_ns)
        # a zero stamp is the controller's "start now": the publication's now
        start_ns = stamp_to_ns(stamp) or self.get_clock().now().nanoseconds
        robot_at = self._robot_at(samples[-1])
        executing = ExecutingChunk(decision.actions, start_ns, step_ns, origin=robot_at)
        # a pause clears the stream under this lock after enabled went false; ROS time going back
        # after the epoch was read, before the settle here
        with self._command_lock:
            self._settle_jump_commands()
            if epoch is not None and epoch != self._time_epoch:
                return True
            if ended:  # the controllers refuse it and the stream skips it: the arm goes on with the one before
                self._ended_since_hold = True  # so neither a pause's hold point nor rtc's target may come from it
                return True
            self._last_trajectory = self._executing = executing
            self._ended_since_hold = False
            if not self._command_pubs or not self.enabled:
                return True
            try:  # the policy's checks make a refusal unreachable; if one comes, the node goes on
                self.commands.push(decision.actions, start_ns, step_ns, decision.chunk_id, robot_at=robot_at)
            except ValueError as exc:
                self._our_failure("command_failed", f"chunk {decision.chunk_id} not streamed: {exc}")
        return True

    def _prompt_changed_since(self, prompt: str, chunk_id: int) -> bool:
        """The instruction changed (its change logged) while the decision ran on `prompt`: its chunk
        is not published, none acts on the old one after. At most one in a row: a planner that
        rewords faster than the node decides would otherwise stop every chunk."""
        changed = not self.state.pipeline.policy.same_prompt(self.cfg.prompt, prompt)
        if not changed or self._dropped_for_prompt:
            self._dropped_for_prompt = False
            return False
        self._dropped_for_prompt = True
        self.get_logger().info(f"prompt changed: chunk {chunk_id}, computed on the one before, not published")
        return True

    def _jumped_since(self, epoch: int | None, chunk_id: int) -> bool:
        """ROS time went back since `epoch` was read: the chunk is not published (said)."""
        if epoch is None or epoch == self._time_epoch:
            return False
        self.get_logger().info(f"{self.TIME_JUMP_DROP}: chunk {chunk_id}, computed meanwhile, not published")
        return True

    def _publish_trajectories(self, actions: np.ndarray, stamp: Any, step_ns: int) -> None:
        """``actions`` [points, action joints] on ~/joint_trajectory, and each trajectory group's
        columns on its topic."""
        frame, names = self.cfg.frame_id, self.cfg.output_joint_names
        self._traj_pub.publish(
            messages.joint_trajectory(actions, stamp=stamp, frame_id=frame, joint_names=names, step_ns=step_ns)
        )
        for pub, columns, joints in self._group_pubs:
            pub.publish(
                messages.joint_trajectory(
                    actions[:, columns], stamp=stamp, frame_id=frame, joint_names=joints, step_ns=step_ns
                )
            )

    def _warn_if_ended(self, stamp: Any, lasts_ns: int, cfg: NodeConfig) -> bool:
        """Whether the chunk's last point is already past when published: joint_trajectory_controller
        refuses it ("ends in the past"), and only its own log would say so; counted and warned.
        Stamped at the joint state, that is a state older than the chunk lasts (max_age_s above
        it) or a decision slower than that."""
        ends_ns = stamp_to_ns(stamp) + lasts_ns
        now_ns = self.get_clock().now().nanoseconds
        if cfg.trajectory_stamp != "zero" and ends_ns < now_ns:
            self._count_node_wide(CHUNK_ENDED)
            self._throttle(
                (CHUNK_ENDED,),
                "warning",
                f"[{CHUNK_ENDED}] published a chunk that ended {(now_ns - ends_ns) / 1e6:.1f} ms ago (trajectory_stamp "
                f"{cfg.trajectory_stamp}, {lasts_ns / 1e9:g} s of actions): a controller refuses it; expected "
                "a fresher joint state (max_age_s below the chunk's length), a faster decision or a longer chunk",
            )
            return True
        return False

    def _chunk_stamp(self, joints: Sample, cfg: NodeConfig) -> Any:
        """Where the chunk's time starts. The policy computed it for the moment of its joint state
        (the state its deltas are added to), not for the end of the decision: stamped there, a
        controller that replans at every chunk (joint_trajectory_controller) skips the points the
        decision's latency has already passed instead of replaying them late, which slowed the arm
        (at 25 ms of latency and 20 ms steps, to ~0.75 of the trained speed, stepping back at each
        replan)."""
        if cfg.trajectory_stamp == "observation":
            return joints.stamp
        if cfg.trajectory_stamp == "zero":
            return Time()
        return self.get_clock().now().to_msg()

    def _account(
        self,
        samples: list[Sample],
        decision: Any,
        start_ns: int,
        end_ns: int,
        cfg: NodeConfig,
        guided: bool = False,
        timed_s: float | None = None,
    ) -> None:
        """Times of one decision, from the arrival of the newest input it used to publication
        (wall time), and `timed_s`, its length on the decision timer's clock (ROS time under sim
        time, as rate_hz's periods: a deadline miss and the idle limit are judged on it; None where
        that clock changed during it: its wall time stands in, and no deadline is judged):

        - ``arrival_to_publish``: all of it, minus the policy's compute;
        - ``input_wait``: the part the converted input waited for the decision timer - set by
          the decision rate (up to one input period), not by the node's code;
        - ``node_overhead`` = the rest: converting that input, plus the decision callback
          (checks, messages, publication) minus the policy's compute.
        """
        last = max(samples, key=lambda s: s.ready_ns)
        compute_ms = decision.total_ms
        # an input converted while the callback was starting (ready after start) waited for nothing
        waited_from = max(start_ns, last.ready_ns)
        overhead_ms = ((last.ready_ns - last.arrived_ns) + (end_ns - waited_from)) / 1e6 - compute_ms
        self.node_stats.add(
            {
                "node_overhead": overhead_ms,
                "input_wait": (waited_from - last.ready_ns) / 1e6,
                "arrival_to_publish": (end_ns - last.arrived_ns) / 1e6 - compute_ms,
            }
        )
        with self._lock:
            self.decisions += 1
            self.prefix_reuses += decision.prefix_reused
            self.rtc_guided += guided
            self._last_decision_at = time.monotonic()
            self._last_decision_ros_ns = self.get_clock().now().nanoseconds
            took_s = (end_ns - start_ns) / 1e9 if timed_s is None else timed_s
            self._decision_s.append(took_s)
            self._invalid_at_decision = dict(self.invalid)
            self._tick_failures_at_decision = self._tick_failures
            self._blocking = frozenset()
            missed = timed_s is not None and timed_s > 1.0 / cfg.rate_hz  # judged on the timer's clock only
            self.deadline_misses += missed
            self._last_missed = timed_s if missed else None  # the status says it until the next decision
            streak, self._dropped_streak, self._outage = self._dropped_streak, 0, False
        if streak:
            self._throttle.forget_held("skipped")  # the next outage's lines count only its own ticks
            self._throttle(
                ("resumed",), "info", f"decisions resumed (chunk {decision.chunk_id}) after {streak} skipped"
            )

    def _clock_mark(self) -> ClockMark:
        return ClockMark(self._timer_seconds(), self.get_clock().ros_time_is_active, self._jumps_forward)

    def _elapsed_s(self, mark: ClockMark) -> float | None:
        """Seconds since `mark` on the decision timer's clock (ROS time under use_sim_time, else
        monotonic: a step of the system clock is no part of it); None where that clock changed
        meanwhile (use_sim_time switched, ROS time jumped forward or went back): the difference
        would be the change."""
        if mark.sim != self.get_clock().ros_time_is_active or mark.jumps_forward != self._jumps_forward:
            return None
        took_s = self._timer_seconds() - mark.timer_s
        return took_s if took_s >= 0 else None

    def on_callback_error(self, exc: Exception) -> None:
        """A callback that raised in the executor: not one of ours (they catch what they raise)
        but rclpy's, e.g. its /clock subscription under use_sim_time on a time it cannot take (a
        negative one). That message is lost; counted as node_error, and the node goes on."""
        frames = traceback.extract_tb(exc.__traceback__)
        inner = [i for i, f in enumerate(frames) if f.filename.endswith("executors.py")]
        called = frames[inner[-1] + 1] if inner and inner[-1] + 1 < len(frames) else None  # the callback
        at = f" in {called.name} ({os.path.basename(called.filename)}:{called.lineno})" if called else ""
        text = f"a callback raised{at}: {exc!r}; its message is dropped and the node goes on"
        if self.is_set_up:
            self._our_failure("callback_failed", text)
        else:  # a lifecycle node before configure: no counters, no throttle yet
            self.get_logger().error(f"[{NODE_ERROR}] {text}", throttle_duration_sec=1.0)

    def _our_failure(self, what: str, text: str) -> None:
        """A failure of ours caught where it cannot stop the node: counted as node_error and logged
        at ERROR, throttled per `what`."""
        self._count_node_wide(NODE_ERROR)
        if what == "decision_failed":  # the one node_error that stops a decision: /diagnostics says it
            self._tick_failures += 1
        self._throttle((what,), "error", f"[{NODE_ERROR}] {text}")

    def _count_node_wide(self, reason: str) -> None:
        if not self.is_set_up:  # no counters and no status before set-up (a lifecycle node): logged only
            return
        with self._lock:
            self.invalid[("", reason)] += 1

    # ---- commands --------------------------------------------------------------------------
    def _on_command(self) -> None:
        """The command timer. A failure here is a bug of ours: logged (throttled), and the next
        tick tries again; raised, it would end the executor and with it the decisions."""
        if self.stopping.is_set():
            return
        try:
            self._publish_command(self.get_clock().now().nanoseconds)
        except Exception as exc:
            self._our_failure("command_failed", f"command not published: {exc!r}")

    def _publish_command(self, now_ns: int) -> None:
        """The command due now on each command topic; past the end of the chunk its last action
        once, then nothing, counted once per chunk: the controller holds its last command."""
        with self._command_lock:  # one tick or a reset at a time: no command after a reset's reply
            self._settle_jump_commands()
            due = self.commands.command(now_ns)
            if isinstance(due, Command):
                for pub, columns, _ in self._command_pubs:
                    pub.publish(messages.joint_command(due.values[columns]))
                self.commands_sent += 1
                if due.limited and (due.chunk_id, due.start_ns) != self._limited_chunk:
                    self._limited_chunk = (due.chunk_id, due.start_ns)
                    self._count_node_wide(COMMAND_LIMITED)
                    self._throttle(
                        (COMMAND_LIMITED,),
                        "warning",
                        f"commands held to action_max_step on chunk {due.chunk_id}: it starts further from the last "
                        "command (the first after a start, pause or reset: from the joint state) than one command "
                        "may move, or a gap in the command ticks (longer than two steps) left the commands behind it "
                        "(the arm lags the chunk, or chunks disagree)",
                    )
                return
            if not isinstance(due, Exhausted) or due == self._exhausted_counted:
                return
            self._exhausted_counted = due
            self._count_node_wide(CHUNK_EXHAUSTED)
        self._throttle(
            (CHUNK_EXHAUSTED,),
            "warning",
            f"no command: chunk {due.chunk_id}'s last action ended {(now_ns - due.ended_ns) / 1e6:.1f} ms ago "
            "and no newer chunk has started, so the controller holds its last command; expected a chunk "
            "before the last one ends (are decisions skipped, or slower than a chunk lasts? see ~/status)",
        )


# ---- helpers -------------------------------------------------------------------------------

NOT_CONFIGURED = "the node is not configured (lifecycle: unconfigured): nothing was done"


def _not_set_up(response: Any) -> Any:
    """A service's answer while the node is not set up (ListCapsules: no names either)."""
    response.success, response.message = False, NOT_CONFIGURED
    return response


_INTERPOLATED = {"hold": "each action held for its {:g} s", "linear": "linear between actions {:g} s apart"}


def prompt_qos(durability: str) -> QoSProfile:
    """prompt_topic's subscription: reliable (an instruction must not be lost), depth 1 (only the
    newest matters), volatile or transient_local (`prompt_durability`)."""
    kind = DurabilityPolicy.TRANSIENT_LOCAL if durability == "transient_local" else DurabilityPolicy.VOLATILE
    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=kind)


def _rejected_hint(rejected: Counter) -> str:
    """What was refused since the last good message, from a copy of the slot's counts."""
    text = ", ".join(f"{r} x{n}" for r, n in rejected.items())
    return f" (newer messages were rejected: {text})" if text else ""


class _ForwardToRos(logging.Handler):
    """Python `logging` records of the policy/engine layers -> the node's ROS logger (and so
    /rosout), so that e.g. the random-weights warning is seen where the node's logs are."""

    def __init__(self, logger: Any):
        super().__init__()
        self.ros_logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        text = f"[{record.name}] {record.getMessage()}"
        if record.levelno >= logging.ERROR:
            self.ros_logger.error(text)
        elif record.levelno >= logging.WARNING:
            self.ros_logger.warning(text)
        else:
            self.ros_logger.info(text)


_FORWARD = _ForwardToRos(get_logger(NODE_NAME))
"""The one forwarder main() installs; the node points it at its own logger once it exists (a
logger named after the bare node name is not the node's in a namespace, and misses /rosout)."""


def node_usage(executable: str = NODE_NAME, lifecycle: str = "") -> str:
    """`flashrt_node --help` (or the lifecycle node's): every parameter with its default and description."""
    defaults = NodeConfig().as_dict()
    params = {
        name: (defaults[name], info.description + (" [runtime]" if info.runtime else ""))
        for name, info in PARAMETERS.items()
    }
    return usage(
        executable,
        "Runs a pi0 / pi0.5 policy on camera and joint-state topics and publishes action chunks "
        "(~/action_chunk, ~/joint_trajectory), ~/status and /diagnostics. Parameters marked [runtime] "
        f"may be changed while it runs; docs/ros.md has the topics, services and input checks.{lifecycle}",
        params,
        f"ros2 run flashrt_ros {executable} --ros-args --params-file config/flashrt.yaml -p rate_hz:=5.0",
    )


def forward_python_logs() -> Any:
    """The library's Python logs (flashrt_ros.*: loading, kernels, graphs) to the ROS logger named
    after the node, until the node points them at its own; returns that logger."""
    _FORWARD.ros_logger = get_logger(NODE_NAME)
    root = logging.getLogger("flashrt_ros")
    root.setLevel(logging.INFO)
    if _FORWARD not in root.handlers:
        root.addHandler(_FORWARD)
    return _FORWARD.ros_logger


def main(args: list[str] | None = None) -> int:
    """Entry point of ``ros2 run flashrt_ros flashrt_node`` and ``python -m flashrt_ros.ros.node``.
    Exit codes: 0 after a normal shutdown, 2 for invalid parameters, 1 if the policy cannot
    be built."""
    argv = args if args is not None else sys.argv
    code = command_line(NODE_NAME, argv, node_usage)
    if code is not None:
        return code
    interrupt_on_signals()  # until spinning starts: building the pipeline can take minutes on a robot
    try:
        if not init_rclpy(argv, NODE_NAME):
            return 2
        forward_python_logs()  # to the bare name's logger until the node exists; then its own
        node = FlashRTNode(sources=param_sources(argv))
        with signals_held():
            executor = MultiThreadedExecutor(num_threads=node.callback_threads)
    except (ConfigError, StartupError) as exc:
        stopping()
        _FORWARD.ros_logger.error(f"not starting: {exc}")
        rclpy.try_shutdown()
        return 2 if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        stopping()
        _FORWARD.ros_logger.info("not starting: stopped by a signal while the pipeline was being built")
        rclpy.try_shutdown()
        return 0

    def on_stop() -> None:
        node.hold_at_stop()
        node.get_logger().info(f"shutting down; {node.stats_line()}")

    return run_until_signal(
        node, executor, on_signal=node.begin_shutdown, on_stop=on_stop, on_error=node.on_callback_error
    )


if __name__ == "__main__":
    sys.exit(main())
