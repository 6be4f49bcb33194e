"""flashrt_node end to end over real DDS: the node in its own process (started as on a robot),
this test process as the robot. One node serves the whole module.

Chunks and trajectories with the right shape, names and source stamps; status and
diagnostics; runtime parameter changes (accepted and refused, with reasons); capsule
services; the reset service.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time

import numpy as np
import pytest
from node_harness import (
    CAMERAS,
    HW,
    JOINT_TOPIC,
    JOINTS,
    NODE,
    TEST_PARAMS,
    check_wait_after_reset,
    in_process_node,
    past_start,
    running_node_and_peer,
    sim_clock,
    stamp_ns,
)

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def running(ros_env, ros_module_context, tmp_path_factory):
    # rate_h: a typo in the params file, which the node must name and count, then ignore
    tmp = tmp_path_factory.mktemp("node")
    with running_node_and_peer(ros_env, tmp, ros_module_context, rate_h=5.0) as node_and_peer:
        yield node_and_peer


def test_unknown_parameter_at_start_is_named_counted_and_ignored(running):
    node, peer = running
    line = node.wait_for_line(
        "ignoring unknown parameters ['rate_h'] (typo in the params file? did you mean rate_hz for rate_h?); known: "
    )
    assert "rate_hz" in line
    assert peer.pump(3.0, until=lambda: bool(peer.statuses))
    # 1 from the start (later tests add a refused run-time one, and ~/reset clears counters)
    assert peer.latest_counter("", "unknown_parameter") >= 1


def test_start_up_log_says_when_the_prefix_stage_runs(running):
    node, _ = running
    node.wait_for_line("prefix stage (prefix_trigger new_inputs): runs when the prompt tokens")


def test_policy_logs_go_out_under_the_nodes_own_name(running):
    """The policy's log lines (the random-weights warning) carry the node's namespaced logger name:
    under the bare node name they missed /rosout and any filter on the node in a namespace."""
    node, peer = running
    node.wait_for_line(f"[{peer.namespace[1:]}.{NODE}]: [flashrt_ros.policies.policy] no checkpoint given")


def chunk_period(peer, count: int, after_ns: int = 0) -> float:
    """The median seconds between the header stamps of the next ``count`` chunks stamped after
    ``after_ns`` (their joint states' stamps, published at 20 Hz: quantised to 50 ms). The
    median, because a decision skipped on a loaded machine (an input gone stale, a timer period
    missed) lengthens one interval, not the rate."""
    start = len(peer.chunks)

    def stamps() -> list[int]:
        return [ns for c in peer.chunks[start:] if (ns := stamp_ns(c.header.stamp)) > after_ns]

    assert peer.pump(15.0, until=lambda: len(stamps()) >= count), f"only {len(stamps())} chunks in 15 s"
    return float(np.median(np.diff(stamps()[:count]))) / 1e9


def test_chunk_has_shape_names_and_source_stamps(running):
    node, peer = running
    start = len(peer.chunks)
    assert peer.pump(5.0, until=lambda: len(peer.chunks) > start + 2)
    chunk = peer.chunks[-1]
    assert (chunk.horizon, chunk.action_dim) == (10, len(JOINTS))  # pi05_tiny: horizon 10
    assert list(chunk.joint_names) == JOINTS
    assert len(chunk.actions) == chunk.horizon * chunk.action_dim
    actions = np.frombuffer(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.action_dim)
    assert np.isfinite(actions).all()
    assert chunk.header.frame_id == "base_link"
    assert (chunk.step_duration.sec, chunk.step_duration.nanosec) == (0, 50_000_000)
    assert chunk.inference_latency_ms > 0
    assert chunk.chunk_id > peer.chunks[start].chunk_id
    expected_topics = [peer.topic(t) for t in [*CAMERAS, JOINT_TOPIC]]
    assert list(chunk.source_topics) == expected_topics
    for topic, ns in peer.chunk_sources(chunk).items():
        assert ns in peer.good[topic], f"{topic}: stamp {ns} was never published"
    # trajectory_stamp "observation" (the default): the chunk starts at its joint state's stamp
    assert stamp_ns(chunk.header.stamp) == peer.chunk_sources(chunk)[peer.topic(JOINT_TOPIC)]
    peer.assert_chunks_from_good_data()

    def trajectory_of_chunk():
        same = [
            t
            for t in peer.trajectories
            if stamp_ns(t.header.stamp) == stamp_ns(chunk.header.stamp)
            and np.array_equal([p.positions for p in t.points], actions)
        ]
        return same[0] if same else None

    assert peer.pump(2.0, until=lambda: trajectory_of_chunk() is not None), "no JointTrajectory for the chunk"
    trajectory = trajectory_of_chunk()
    assert list(trajectory.joint_names) == JOINTS and len(trajectory.points) == chunk.horizon
    for i, point in enumerate(trajectory.points):
        assert stamp_ns(point.time_from_start) == (i + 1) * 50_000_000
        np.testing.assert_allclose(point.positions, actions[i], rtol=0, atol=0)


def test_status_and_diagnostics(running):
    node, peer = running
    assert peer.pump(3.0, until=lambda: len(peer.statuses) >= 2 and peer.diagnostics)
    status = peer.statuses[-1]
    names = [s.name for s in status.stages]
    assert names == ["preprocess", "prefix", "denoise", "postprocess", "node_overhead"]
    assert status.decisions > 0 and status.policy == "pi05_tiny"
    assert status.device == "cpu" and status.precision == "float32"
    overhead = status.stages[-1]
    assert overhead.runs > 0 and 0 < overhead.latency_p50_ms <= overhead.latency_p99_ms
    assert all(s.target_rate_hz == 10.0 for s in status.stages)
    diag = peer.diagnostics[-1].status[0]
    assert diag.name == f"{peer.namespace}/{NODE}: pipeline" and diag.hardware_id == "cpu"
    keys = {kv.key for kv in diag.values}
    assert keys >= {"policy", "decisions", "dropped decisions", "deadline misses"}
    # the start's rate_h typo is the node's event, not a bad input ("invalid unknown_parameter" before)
    assert "node unknown_parameter" in keys, keys
    inputs = {*(f"{peer.namespace}/{cam}" for cam in CAMERAS), f"{peer.namespace}/{JOINT_TOPIC}"}
    assert all(key.split()[-1] in inputs for key in keys if key.startswith("invalid ")), (keys, inputs)


def test_a_subscriber_that_cannot_match_an_output_is_named_and_counted(running):
    """A controller subscribing to the chunks transient_local (a latched subscription) matches no
    volatile publisher: it received nothing, with rclpy's generic warning and no count."""
    from flashrt_ros.msg import ActionChunk
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    node, peer = running
    topic = peer.topic(f"{NODE}/action_chunk")
    before = peer.latest_counter(topic, "incompatible_subscriber")
    mark = node.mark()
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    sub = peer.node.create_subscription(ActionChunk, topic, lambda _: None, latched)
    try:
        line = node.wait_for_line(f"[incompatible_subscriber] a subscriber on {topic} receives nothing", since=mark)
        assert f"({peer.node.get_fully_qualified_name()} subscribes transient_local;" in line, line
        assert "subscribe volatile" in line and "[WARN]" in line, line
        assert peer.wait_for_counter(topic, "incompatible_subscriber", above=before) == before + 1
    finally:
        peer.node.destroy_subscription(sub)


def test_each_subscriber_that_cannot_match_is_named_with_its_own_policy(running):
    """Subscribers made back to back can come as one merged event whose last policy names one
    cause for all: each is named from the graph with its own (a latched one, one asking for a
    deadline, one for a liveliness lease), and counted."""
    from rclpy.duration import Duration
    from rclpy.qos import DurabilityPolicy, LivelinessPolicy, QoSProfile
    from trajectory_msgs.msg import JointTrajectory

    node, peer = running
    topic = peer.topic(f"{NODE}/joint_trajectory")
    before = peer.latest_counter(topic, "incompatible_subscriber")
    mark = node.mark()
    asks = [
        QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL),
        QoSProfile(depth=1, deadline=Duration(seconds=1)),
        QoSProfile(depth=1, liveliness=LivelinessPolicy.MANUAL_BY_TOPIC, liveliness_lease_duration=Duration(seconds=2)),
    ]
    subs = [peer.node.create_subscription(JointTrajectory, topic, lambda _: None, qos) for qos in asks]
    who = peer.node.get_fully_qualified_name()
    try:
        for what in ("subscribes transient_local", "asks for a deadline", "asks for a liveliness lease"):
            line = node.wait_for_line(f"receives nothing ({who} {what};", since=mark)
            assert f"[incompatible_subscriber] a subscriber on {topic} " in line, line
        assert peer.wait_for_counter(topic, "incompatible_subscriber", above=before + 2) == before + 3
        unnamed = [line for line in node.lines[mark:] if "policy does not match" in line]
        assert not unnamed, unnamed
    finally:
        for sub in subs:
            peer.node.destroy_subscription(sub)


def test_decisions_on_frames_already_used_reuse_the_prefix(running):
    """Cameras at 4 Hz, joints at 20 Hz, decisions at 10 Hz: a decision on the frames the one before
    it used (its prefix inputs unchanged: pi0.5's state tokens too, the joints stand still) re-uses
    the prefix and says so; one on a new frame runs it. prefix_trigger every_decision, set while
    running, stops the re-use; a word it does not know is refused with the choices."""
    node, peer = running
    ticks = iter(range(10**6))

    def cameras_now_and_then() -> None:
        if next(ticks) % 5 == 0:
            peer.publish_good(skip={JOINT_TOPIC})

    def camera_stamps(chunk) -> list[int]:
        return [ns for topic, ns in peer.chunk_sources(chunk).items() if not topic.endswith(JOINT_TOPIC)]

    def pairs_since(start: int) -> list:
        return [(a, b) for a, b in itertools.pairwise(peer.chunks[start:]) if b.chunk_id == a.chunk_id + 1]

    start = len(peer.chunks)
    assert peer.pump(15.0, skip=set(CAMERAS), extra=cameras_now_and_then, until=lambda: len(pairs_since(start)) >= 10)
    pairs = pairs_since(start)
    assert [b.prefix_reused for _, b in pairs] == [camera_stamps(a) == camera_stamps(b) for a, b in pairs]
    assert any(b.prefix_reused for _, b in pairs) and not all(b.prefix_reused for _, b in pairs)
    assert peer.pump(2.0, until=lambda: peer.statuses[-1].prefix_reuses > 0)
    runs = {s.name: s.runs for s in peer.statuses[-1].stages}
    assert runs["prefix"] < runs["denoise"]
    peer.assert_chunks_from_good_data()

    result = peer.set_parameters(prefix_trigger="sometimes")[0]
    assert not result.successful and "prefix_trigger must be one of new_inputs, period, every_decision" in result.reason
    assert peer.set_parameters(prefix_trigger="every_decision")[0].successful
    changed_ns = peer.now().nanoseconds  # a decision begun before the reply may still re-use
    start = len(peer.chunks)

    def decided_after() -> list:
        return [c for c in peer.chunks[start:] if stamp_ns(c.header.stamp) > changed_ns]

    try:
        assert peer.pump(10.0, skip=set(CAMERAS), extra=cameras_now_and_then, until=lambda: len(decided_after()) >= 5)
        assert not any(c.prefix_reused for c in decided_after())
    finally:
        assert peer.set_parameters(prefix_trigger="new_inputs")[0].successful


def test_period_acts_on_held_frames_no_older_than_max_age(running):
    """prefix_trigger period: cameras at 20 Hz, decisions at 10 Hz, a period far longer than the
    test. A re-using chunk names the frames its prefix was built from (those of the chunk that
    built it), with its own newer joint state; max_age_s (0.4 s) still bounds how old they are, so
    new prefixes are built all the same. A period of 0 is refused with the range."""
    node, peer = running
    result = peer.set_parameters(prefix_period_s=0.0)[0]
    assert not result.successful and "prefix_period_s must be > 0 and <= 3600, got 0.0" in result.reason
    assert all(r.successful for r in peer.set_parameters(prefix_trigger="period", prefix_period_s=100.0))
    joint = peer.topic(JOINT_TOPIC)

    def camera_stamps(chunk) -> list[int]:
        return [ns for topic, ns in peer.chunk_sources(chunk).items() if topic != joint]

    start = len(peer.chunks)
    try:
        assert peer.pump(15.0, until=lambda: len(peer.chunks) - start >= 16)
    finally:
        assert all(r.successful for r in peer.set_parameters(prefix_trigger="new_inputs", prefix_period_s=0.1))
    chunks = peer.chunks[start + 1 :]  # the first may predate the change
    builders = [c for c in chunks if not c.prefix_reused]
    assert len(builders) >= 3 and len(builders) < len(chunks) - 5
    for before, chunk in itertools.pairwise(chunks):
        sources = peer.chunk_sources(chunk)
        assert sources[joint] - min(camera_stamps(chunk)) <= 0.4e9, "frames older than max_age_s were used"
        if chunk.prefix_reused and chunk.chunk_id == before.chunk_id + 1:
            assert camera_stamps(chunk) == camera_stamps(before), "a re-used prefix must name the frames it saw"
            assert sources[joint] >= peer.chunk_sources(before)[joint], "the joint state is never held back"
    peer.assert_chunks_from_good_data()


def test_diagnostics_levels_and_the_counts_behind_them(running):
    """OK while running (inputs at 20 Hz for 10 Hz decisions: every other one replaced unused,
    counted as dropped); WARN naming what happened since the last status (a frame of an encoding
    the node cannot read; deadline misses at a rate no CPU decision keeps, where the status and the
    services must still get their turn: they once shared the decision's callback group and
    starved); ERROR once no decision runs (inputs stopped); OK again when they come back."""
    from diagnostic_msgs.msg import DiagnosticStatus

    node, peer = running

    def level_since(start: int, level: bytes, text: str = "") -> bool:
        return any(d.status[0].level == level and text in d.status[0].message for d in peer.diagnostics[start:])

    start = len(peer.diagnostics)
    assert peer.pump(15.0, until=lambda: level_since(start, DiagnosticStatus.OK, "running at 10 Hz"))
    assert peer.statuses[-1].dropped_inputs > 0

    start = len(peer.diagnostics)
    bad_frame = lambda: peer.publish_camera(0, peer.image(encoding="yuv422"), good=False)  # noqa: E731
    assert peer.pump(15.0, extra=bad_frame, until=lambda: level_since(start, DiagnosticStatus.WARN, "input refusals"))

    misses = peer.statuses[-1].deadline_misses
    assert peer.set_parameters(rate_hz=500.0)[0].successful
    try:
        start = len(peer.diagnostics)
        assert peer.pump(3.0, until=lambda: level_since(start, DiagnosticStatus.WARN, "deadline misses"))
        assert peer.statuses[-1].deadline_misses > misses
        from flashrt_ros.srv import ListCapsules  # the services answer too, between two decisions

        peer.call(ListCapsules, f"{peer.namespace}/{NODE}/capsule/list", ListCapsules.Request(), timeout=10.0)
    finally:
        assert peer.set_parameters(rate_hz=10.0)[0].successful

    # wide windows: the idle limit is twice the slowest recent decision, and the overload above
    # can make those long on a loaded machine (the sim-time test saw seconds)
    start = len(peer.diagnostics)
    assert peer.pump(20.0, publish=False, until=lambda: level_since(start, DiagnosticStatus.ERROR, "no decision for"))
    start = len(peer.diagnostics)
    assert peer.pump(10.0, until=lambda: level_since(start, DiagnosticStatus.OK))


def test_runtime_rate_and_prompt_change(running):
    node, peer = running
    before = chunk_period(peer, 12)
    mark = node.mark()
    try:
        results = peer.set_parameters(rate_hz=4, prompt="fold the towel")  # an int is fine for a rate
        assert [r.successful for r in results] == [True, True], [r.reason for r in results]
        changed_ns = peer.now().nanoseconds  # chunks on joint states stamped later: decided at 4 Hz
        node.wait_for_line("parameters changed: rate_hz 10.0 -> 4.0", since=mark)
        node.wait_for_line("parameters changed: prompt 'pick up the cube' -> 'fold the towel'", since=mark)
        after = chunk_period(peer, 8, after_ns=changed_ns)
        rate, prompt, status_rate = peer.get_parameters("rate_hz", "prompt", "status_rate_hz")
        assert (rate, type(rate), prompt) == (4.0, float, "fold the towel")  # stored as the double it is used as
        assert (status_rate, type(status_rate)) == (5.0, float)  # an int in the params file, too
    finally:  # the module's later tests run at 10 Hz
        assert peer.set_parameters(rate_hz=10.0)[0].successful
    assert 0.07 < before < 0.13, before  # 10 Hz
    assert 0.2 < after < 0.31, after  # 4 Hz


def test_a_decision_period_longer_than_a_chunk_is_warned_about(running):
    """pi05_tiny's chunk lasts 10 x 0.05 s: deciding at 1 Hz leaves the controller without points
    for half of each second. Allowed, but said with the rate that would cover it. At 4 Hz a chunk
    from inputs max_age_s (0.4 s) old can end 0.15 s before the next comes: said too. 10 Hz is fine."""
    node, peer = running
    mark = node.mark()
    try:
        assert peer.set_parameters(rate_hz=1)[0].successful
        line = node.wait_for_line("rate_hz 1 decides every 1 s, but a chunk lasts 0.5 s", since=mark)
        assert "[WARN]" in line and "(10 actions x step_duration_s 0.05)" in line and "rate_hz >= 2" in line, line
        mark = node.mark()
        assert peer.set_parameters(rate_hz=4)[0].successful
        line = node.wait_for_line("from its observation, which may be max_age_s 0.4 s old", since=mark)
        assert "[WARN]" in line and "expected max_age_s + 1 / rate_hz below 0.5 s" in line, line
        mark = node.mark()
    finally:  # the module's later tests run at 10 Hz
        assert peer.set_parameters(rate_hz=10.0)[0].successful
    node.wait_for_line("parameters changed: rate_hz 4.0 -> 10.0", since=mark)
    assert not any("a chunk lasts" in line for line in node.lines[mark:])


def test_runtime_changes_say_what_start_would_have_said(rclpy_context, monkeypatch):
    """rtc with a blend, reached by a runtime change, is warned about as at start; a change that
    fails in the node's own hands (a timer refusing its period) is logged as an error, not as a
    refused request."""
    from rclpy.parameter import Parameter

    node = in_process_node(rclpy_context, rtc=True, command_rate_hz=50.0)
    try:
        said = []
        logger = node.get_logger()
        for level in ("warning", "error"):
            monkeypatch.setattr(logger, level, lambda msg, _level=level, **_: said.append((_level, msg)))
        assert node.set_parameters([Parameter("command_blend_steps", value=4)])[0].successful
        assert [m for lvl, m in said if lvl == "warning" and m.startswith("rtc with command_blend_steps 4")], said
        said.clear()
        node.state.pipeline.rtc = None  # as with rtc false: its settings change nothing
        assert node.set_parameters([Parameter("rtc_delay_steps", value=3)])[0].successful
        assert said == [
            (
                "warning",
                "rtc_delay_steps changed, but real-time chunking is off (rtc false, read at "
                "start): they take effect once the node restarts with rtc true",
            )
        ], said
        said.clear()

        def refuse(*_):
            raise RuntimeError("timer refused")

        monkeypatch.setattr(node, "_apply_timer_rates", refuse)
        assert not node.set_parameters([Parameter("rate_hz", value=20.0)])[0].successful
        assert said == [
            (
                "error",
                "parameter change refused: not applied (rate_hz keeps its previous value): RuntimeError: timer refused",
            )
        ], said
    finally:
        node.destroy_node()


@pytest.mark.parametrize("set_up", [True, False])
def test_a_parameter_cannot_be_deleted(rclpy_context, set_up):
    """`ros2 param delete` (a NOT_SET value) is refused in every state, also before a lifecycle
    node's configure: a deleted limits list would read as no limits, a deleted rate as nothing."""
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.node import FlashRTNode

    overrides = [Parameter(n, value=v) for n, v in {**TEST_PARAMS, "action_upper_limits": [3.0]}.items()]
    node = FlashRTNode(context=rclpy_context, parameter_overrides=overrides, set_up=set_up)
    try:
        for name in ("action_upper_limits", "rate_hz"):
            result = node.set_parameters([Parameter(name, Parameter.Type.NOT_SET)])[0]
            assert not result.successful and result.reason.startswith(f"{name} cannot be deleted"), result.reason
            assert node.has_parameter(name)
        assert node.get_parameter("action_upper_limits").value == [3.0]
        assert node.get_parameter("rate_hz").value == TEST_PARAMS["rate_hz"]
        if set_up:  # before set-up there are no counters (logged only)
            assert node.invalid[("", "invalid_parameter")] == 2
        assert node.set_parameters([Parameter("rate_hz", value=12.0)])[0].successful  # a value: as before
    finally:
        node.destroy_node()


def test_invalid_runtime_parameters_are_refused_with_reasons(running):
    node, peer = running
    mark = node.mark()
    peer.settle()
    before, (prompt,) = peer.latest_counter("", "invalid_parameter"), peer.get_parameters("prompt")
    long_prompt = "pick up the red cube on the left and put it into the blue box on the right side " * 3
    bad_rate, bad_prompt, fixed, too_long = (
        peer.set_parameters(rate_hz=-1.0)[0],
        peer.set_parameters(prompt="   ")[0],
        peer.set_parameters(policy="pi0_tiny")[0],
        peer.set_parameters(prompt=long_prompt)[0],
    )
    # outside the declared range: rclpy refuses it in its words; the node logs and counts it in its own
    assert not bad_rate.successful
    assert bad_rate.reason == "Parameter rate_hz out of range Min: 0.01, Max: 1000.0, value: -1.0"
    assert not bad_prompt.successful and bad_prompt.reason.startswith("prompt is empty")
    assert not fixed.successful
    assert fixed.reason.startswith("policy is read-only at runtime: set it in the params file and restart the node")
    assert not too_long.successful
    assert re.fullmatch(
        r"prompt '.*' takes up to \d+ tokens with a 4-joint state, more than the policy's prompt length 96; "
        r"expected a shorter instruction",
        too_long.reason,
    ), too_long.reason
    node.wait_for_line(
        "parameter change refused: rate_hz must be within its declared range [0.01, 1000], got -1.0", since=mark
    )
    assert peer.get_parameters("rate_hz", "policy", "prompt") == [10.0, "pi05_tiny", prompt]
    assert peer.wait_for_counter("", "invalid_parameter", above=before + 3) == before + 4
    # a value of the wrong type, and a name the node does not have (a typo): refused, counted
    wrong_type = peer.set_parameters(rate_hz="fast")[0]
    assert not wrong_type.successful and wrong_type.reason.startswith("rate_hz must be a number"), wrong_type.reason
    unknown_before = peer.latest_counter("", "unknown_parameter")
    typo = peer.set_parameters(rate_h=5.0)[0]
    assert not typo.successful and typo.reason.startswith("unknown parameter(s) ['rate_h']: not set; known: "), (
        typo.reason
    )
    assert "rate_hz" in typo.reason
    assert peer.wait_for_counter("", "unknown_parameter", above=unknown_before) == unknown_before + 1
    # long values are quoted cut, with their length: the reply and the log line stay short
    huge = "x" * 200_000
    for reply in (
        peer.set_parameters(rate_hz=huge)[0],
        peer.set_parameters(prompt="pick up the cube " * 20_000)[0],
        peer.set_parameters(**{huge: 1.0})[0],
    ):
        assert not reply.successful and len(reply.reason) < 1000, reply.reason[:200]
        assert " characters)" in reply.reason, reply.reason
    assert peer.get_parameters("rate_hz") == [10.0]
    start = len(peer.chunks)
    assert peer.pump(3.0, until=lambda: len(peer.chunks) > start + 2), "node stopped deciding"


def test_a_value_of_no_ros_type_is_answered_refused_not_raised(running):
    """rclpy's parameter services raised on a ParameterValue type ROS does not define (a client's
    bug): the caller got no reply, and the executor's error was counted as node_error twice."""
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rcl_interfaces.msg import ParameterValue
    from rcl_interfaces.srv import SetParameters, SetParametersAtomically
    from rclpy.parameter import Parameter

    node, peer = running
    base = f"{peer.namespace}/{NODE}"
    peer.settle()  # a status assembled after the earlier tests' refusals: the counts to start from
    before = peer.latest_counter("", "invalid_parameter")
    errors = peer.latest_counter("", "node_error")
    odd = ParameterMsg(name="rate_hz", value=ParameterValue(type=200))
    fine = Parameter("rate_hz", value=10.0).to_parameter_msg()
    both = SetParameters.Request(parameters=[odd, fine])
    refused, set_ = peer.call(SetParameters, f"{base}/set_parameters", both).results
    expected = "'rate_hz': value type 200 is not a ROS parameter type (200 is not a valid Parameter.Type)"
    assert (refused.successful, refused.reason, set_.successful) == (False, expected, True), (refused, set_)
    atomic = SetParametersAtomically.Request(parameters=[fine, odd])
    reply = peer.call(SetParametersAtomically, f"{base}/set_parameters_atomically", atomic).result
    assert (reply.successful, reply.reason) == (False, f"{expected}: nothing set"), reply
    assert peer.wait_for_counter("", "invalid_parameter", above=before + 1) == before + 2
    assert peer.latest_counter("", "node_error") == errors
    assert peer.get_parameters("rate_hz") == [10.0]


def test_tiny_rates_and_unused_qos_overrides_are_refused_at_runtime(running):
    """1e-10 Hz passed validation once and killed the node in the timer update (a 1e19 ns period
    does not fit rcl's int64); a qos_overrides name the node does not use was accepted and did
    nothing. Now both are refused with the reason and counted, and the node keeps deciding."""
    node, peer = running
    peer.settle()  # after the earlier tests' refusals
    invalid_before = peer.latest_counter("", "invalid_parameter")
    unknown_before = peer.latest_counter("", "unknown_parameter")
    rate, status = peer.set_parameters(rate_hz=1e-10)[0], peer.set_parameters(status_rate_hz=1e-10)[0]
    assert not rate.successful and rate.reason.startswith("Parameter rate_hz out of range Min: 0.01"), rate.reason
    assert not status.successful and status.reason.startswith("Parameter status_rate_hz out of range"), status.reason
    qos_name = "qos_overrides./joint_states.subscription.reliability"
    qos = peer.set_parameters(**{qos_name: "reliable"})[0]
    assert not qos.successful and qos.reason.startswith(f"unknown parameter(s) ['{qos_name}']: not set"), qos.reason
    assert peer.wait_for_counter("", "invalid_parameter", above=invalid_before + 1) == invalid_before + 2
    assert peer.wait_for_counter("", "unknown_parameter", above=unknown_before) == unknown_before + 1
    assert node.proc.poll() is None, node.tail()
    assert peer.get_parameters("rate_hz", "status_rate_hz", qos_name)[:2] == [10.0, TEST_PARAMS["status_rate_hz"]]
    start = len(peer.chunks)
    assert peer.pump(3.0, until=lambda: len(peer.chunks) > start + 2), "node stopped deciding"


def test_a_change_that_cannot_be_applied_leaves_everything_as_it_was(rclpy_context, monkeypatch):
    """The runtime path applies all of a change or none, and says so: with the status timer made
    to fail its new period (injected: validation leaves nothing real to fail), the decision rate
    set with it in one atomic call is put back too, the reply is a refusal with the reason, the
    parameters read back their old values, and the failure is counted as invalid_parameter. The
    node runs in this process (real rclpy)."""
    from rclpy.parameter import Parameter

    from flashrt_ros.ros import node_parameters
    from flashrt_ros.ros.node import FlashRTNode
    from flashrt_ros.ros.reasons import INVALID_PARAMETER

    overrides = [Parameter(name, value=value) for name, value in TEST_PARAMS.items()]
    node = FlashRTNode(context=rclpy_context, parameter_overrides=overrides)
    set_period = node_parameters._set_period

    def failing(timer, period_ns: int) -> None:
        if timer is node._status_timer and period_ns == 500_000_000:
            raise RuntimeError("injected timer failure")
        set_period(timer, period_ns)

    try:
        cfg = node.cfg
        periods = (node._decision_timer.timer_period_ns, node._status_timer.timer_period_ns)
        monkeypatch.setattr(node_parameters, "_set_period", failing)
        result = node.set_parameters_atomically(
            [Parameter("rate_hz", value=20.0), Parameter("status_rate_hz", value=2.0)]
        )
        assert not result.successful
        assert result.reason == (
            "not applied (rate_hz, status_rate_hz keep their previous values): RuntimeError: injected timer failure"
        )
        assert node.cfg == cfg
        assert (node._decision_timer.timer_period_ns, node._status_timer.timer_period_ns) == periods
        assert [node.get_parameter(n).value for n in ("rate_hz", "status_rate_hz")] == [10.0, 5.0]
        assert node.invalid[("", INVALID_PARAMETER)] == 1
    finally:
        node.destroy_node()


def test_capsule_services(running):
    from flashrt_ros.srv import DropCapsule, ForkCapsule, ListCapsules, RestoreCapsule, SnapshotCapsule

    from flashrt_ros.ros.node import FlashRTNode

    node, peer = running
    base = f"{peer.namespace}/{NODE}/capsule"
    snap = peer.call(SnapshotCapsule, f"{base}/snapshot", SnapshotCapsule.Request(name="warm"))
    assert snap.success, snap.message
    next_id = int(re.search(r"next_chunk_id int64\[1\]=(\d+)", snap.message).group(1))

    listing = peer.call(ListCapsules, f"{base}/list", ListCapsules.Request())
    assert list(listing.names) == ["warm"] and listing.size_bytes[0] > 0 and stamp_ns(listing.created[0]) > 0
    assert listing.success and listing.message == "1 capsule(s)"

    unknown = peer.call(RestoreCapsule, f"{base}/restore", RestoreCapsule.Request(name="nope"))
    assert not unknown.success and unknown.message == "no capsule named 'nope' (have: 'warm')"
    peer.wait_for_counter(f"{base}/restore", "unknown_capsule", above=0)

    fork = peer.call(ForkCapsule, f"{base}/fork", ForkCapsule.Request(source="warm", target="copy"))
    assert fork.success, fork.message
    exists = peer.call(ForkCapsule, f"{base}/fork", ForkCapsule.Request(source="warm", target="copy"))
    assert not exists.success and "already exists" in exists.message
    peer.wait_for_counter(f"{base}/fork", "invalid_request", above=0)
    missing = peer.call(ForkCapsule, f"{base}/fork", ForkCapsule.Request(source="nope", target="x"))
    assert not missing.success and missing.message == "no capsule named 'nope' (have: 'copy', 'warm')"
    peer.wait_for_counter(f"{base}/fork", "unknown_capsule", above=0)
    unnamed = peer.call(SnapshotCapsule, f"{base}/snapshot", SnapshotCapsule.Request(name=""))
    assert not unnamed.success
    assert unnamed.message == "capsule name must be a non-empty string of at most 256 characters, got ''"
    peer.wait_for_counter(f"{base}/snapshot", "invalid_request", above=0)
    assert peer.call(DropCapsule, f"{base}/drop", DropCapsule.Request(name="warm")).success
    assert not peer.call(DropCapsule, f"{base}/drop", DropCapsule.Request(name="warm")).success
    peer.wait_for_counter(f"{base}/drop", "unknown_capsule", above=0)
    assert list(peer.call(ListCapsules, f"{base}/list", ListCapsules.Request()).names) == ["copy"]

    assert peer.pump(3.0, until=lambda: peer.chunks[-1].chunk_id > next_id + 2)  # move on
    start = len(peer.chunks)
    restored = peer.call(RestoreCapsule, f"{base}/restore", RestoreCapsule.Request(name="copy"))
    assert restored.success, restored.message
    # The chunk counter went back: the id the snapshot would have given next comes again.
    assert peer.pump(3.0, until=lambda: any(c.chunk_id == next_id for c in peer.chunks[start:]))
    assert "prefix_trigger period" not in restored.message, restored.message
    # under "period" a replay depends on where the first run built its prefix: the reply says so
    assert peer.set_parameters(prefix_trigger="period")[0].successful
    restored = peer.call(RestoreCapsule, f"{base}/restore", RestoreCapsule.Request(name="copy"))
    assert restored.success and restored.message.endswith(FlashRTNode.PERIOD_RESTORE), restored.message
    assert peer.set_parameters(prefix_trigger="new_inputs")[0].successful

    # The node keeps at most 100 capsules: a new name past them is refused and counted.
    more = [SnapshotCapsule.Request(name=f"n{i:02d}") for i in range(99)]
    assert all(r.success for r in peer.call_each(SnapshotCapsule, f"{base}/snapshot", more))
    full = peer.call(SnapshotCapsule, f"{base}/snapshot", SnapshotCapsule.Request(name="one_more"))
    assert not full.success and "the store holds its limit of 100 capsules" in full.message, full.message
    peer.wait_for_counter(f"{base}/snapshot", "capsule_store_full", above=0)
    again = peer.call(SnapshotCapsule, f"{base}/snapshot", SnapshotCapsule.Request(name="copy"))
    assert again.success and again.message.startswith("replaced capsule 'copy': "), again.message


def test_chunk_is_the_policy_applied_to_the_messages_it_names(running):
    """The published actions are the policy's output for exactly the frames and joint values the
    chunk names (cameras in order, joints picked by name from a message that lists them in
    another order, the prompt set at run time), recomputed here from what this process published
    with a pipeline built from the same parameters and seed: a node that swapped or blanked a
    camera, mis-mapped a joint or kept the old prompt publishes other numbers."""
    from std_srvs.srv import Trigger

    from flashrt_ros.policies.policy import Observation
    from flashrt_ros.ros.params import NodeConfig
    from flashrt_ros.ros.startup import build_pipeline_state

    node, peer = running
    (old_prompt,) = peer.get_parameters("prompt")
    prompt = "stack the blue blocks"
    assert peer.set_parameters(prompt=prompt)[0].successful
    rng = np.random.default_rng(7)
    frames: dict[tuple[str, int], np.ndarray] = {}
    positions: dict[int, dict[str, float]] = {}
    names = JOINTS[::-1]

    def publish() -> None:  # distinct random frames per camera, random joints in reversed order
        for i, topic in enumerate(CAMERAS):
            rgb = rng.integers(0, 256, (*HW, 3), dtype=np.uint8)
            frames[(peer.topic(topic), peer.publish_camera(i, peer.image(data=rgb.tobytes())))] = rgb
        values = (rng.normal(size=len(names)) * 0.3).tolist()
        stamp = peer.publish_joints(peer.joints(positions=values, names=names))
        positions[stamp] = dict(zip(names, values, strict=True))

    peer.pump(0.5, publish=False, extra=publish)  # every input held from here on is one of these
    start = len(peer.chunks)
    assert peer.call(Trigger, f"{peer.namespace}/{NODE}/reset", Trigger.Request()).success  # seed, ids from 1
    assert peer.pump(5.0, publish=False, extra=publish, until=lambda: any(c.chunk_id == 1 for c in peer.chunks[start:]))
    chunk = next(c for c in peer.chunks[start:] if c.chunk_id == 1)
    sources = peer.chunk_sources(chunk)
    images = [frames[(peer.topic(t), sources[peer.topic(t)])] for t in CAMERAS]
    joint_values = positions[sources[peer.topic(JOINT_TOPIC)]]
    state = np.array([joint_values[n] for n in JOINTS], dtype=np.float32)

    holder, _ = build_pipeline_state(NodeConfig.from_values({**TEST_PARAMS, "prompt": prompt}))
    want = holder.decide(Observation(images, state, prompt)).actions
    got = np.frombuffer(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.action_dim)
    assert peer.set_parameters(prompt=old_prompt)[0].successful
    # the same bits: the tiny random policy barely looks at its cameras (two frames swapped move
    # its actions by ~4e-7), so any tolerance would let a swapped camera through
    np.testing.assert_array_equal(got, want)
    other = build_pipeline_state(NodeConfig.from_values(TEST_PARAMS))[0].decide(Observation(images, state, old_prompt))
    assert not np.array_equal(other.actions, want)  # another prompt, other actions


def test_reset_service(running):
    from std_srvs.srv import Trigger

    node, peer = running
    # counters well above what a fresh start shows, so that seeing them low again means a reset
    assert peer.pump(10.0, until=lambda: bool(peer.statuses) and peer.statuses[-1].decisions >= 30)
    assert not peer.set_parameters(rate_h=1.0)[0].successful  # a counted refusal for reset to clear
    peer.wait_for_counter("", "unknown_parameter", above=0)
    asked_ns = peer.now().nanoseconds
    response = peer.call(Trigger, f"{peer.namespace}/{NODE}/reset", Trigger.Request())
    replied_ns = peer.now().nanoseconds
    assert response.success and "chunk ids restart at 1" in response.message
    start, status_start = len(peer.chunks), len(peer.statuses)

    def fresh() -> list:  # statuses assembled after the reply: the reset is behind them
        return [s for s in peer.statuses[status_start:] if stamp_ns(s.header.stamp) > replied_ns]

    # wait for both: the chunk ids restarting and a status published after the reset
    assert peer.pump(5.0, until=lambda: any(c.chunk_id == 1 for c in peer.chunks[start:]) and bool(fresh()))
    # the counters start again from 0: at most the decisions (made or skipped) at 10 Hz since the
    # reset, however late that status came (from 30 and more before it)
    status = fresh()[0]
    since_s = (stamp_ns(status.header.stamp) - asked_ns) / 1e9
    few = 2 + int(10 * since_s)
    assert status.decisions <= min(few, 29), (status.decisions, since_s)
    # every counter too: the unknown parameter counted above is gone. The reset also cleared the
    # held inputs, so a decision tick that comes before the next camera / joint message is
    # skipped and counted (absent, dropped_decision): counted after the reset, once per skip
    counts = {(c.topic, c.reason): c.count for c in status.invalid_inputs}
    assert counts.get(("", "unknown_parameter"), 0) == 0, counts
    dropped = counts.get(("", "dropped_decision"), 0)
    assert dropped <= few, counts
    assert all(n <= dropped for (_, reason), n in counts.items() if reason == "absent"), counts
    assert {reason for (_, reason), n in counts.items() if n} <= {"absent", "dropped_decision"}, counts
    peer.assert_chunks_from_good_data()
    # a skip while the emptied inputs refill is logged as waiting, at INFO: not as a sensor fault
    mark = node.mark()
    assert peer.call(Trigger, f"{peer.namespace}/{NODE}/reset", Trigger.Request()).success
    peer.pump(0.3, publish=False)  # nothing arrives: the next decisions skip
    line = node.wait_for_line("decision skipped: [absent]", since=mark)
    check_wait_after_reset(line)


def test_the_prefix_period_runs_on_the_decision_timers_clock(rclpy_context):
    """Under use_sim_time the prefix's age is read on ROS time, as the decisions are: with no
    /clock yet that is 0, where the wall clock would be far from it."""
    node = in_process_node(rclpy_context, use_sim_time=True, prefix_trigger="period")
    try:
        assert node.state.pipeline.prefix_cache.clock() == 0.0
        assert node.state.pipeline.prefix_cache.trigger == "period"
    finally:
        node.destroy_node()


def test_after_the_stop_signal_nothing_is_published_or_changed(rclpy_context):
    """Once a signal arrived (begin_shutdown), a decision in flight or queued publishes nothing,
    and reset / capsule calls still waiting are refused without changing anything."""
    from flashrt_ros.srv import SnapshotCapsule
    from std_srvs.srv import Trigger

    node = in_process_node(rclpy_context)
    try:
        node.begin_shutdown()
        before = (node.decisions, node.dropped_decisions)
        node._on_decision()  # no inputs held: a running decision would count a skipped one
        assert (node.decisions, node.dropped_decisions) == before
        reset = node._on_reset(Trigger.Request(), Trigger.Response())
        assert not reset.success and "shutting down" in reset.message
        snap = node._on_snapshot(SnapshotCapsule.Request(name="late"), SnapshotCapsule.Response())
        assert not snap.success and "shutting down" in snap.message
        assert node.capsules.list() == []
    finally:
        node.destroy_node()


def test_a_joint_state_older_than_the_one_held_is_refused_as_stale(rclpy_context):
    """Two publishers on one joint topic: a message stamped before the sample already held does
    not replace it (the policy would act on older data than it had); it is counted as stale."""
    from rclpy.time import Time
    from sensor_msgs.msg import JointState

    node = in_process_node(rclpy_context)
    try:
        slot = node.slots[-1]
        now = node.get_clock().now().nanoseconds

        def joints(age_s: float) -> JointState:
            msg = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
            msg.header.stamp = Time(nanoseconds=now - int(age_s * 1e9)).to_msg()
            return msg

        node._on_joint_state(slot, joints(0.01))
        held = slot.latest
        node._on_joint_state(slot, joints(0.3))  # within max_age_s, but older than the held one
        assert slot.latest is held
        assert node.invalid[(slot.topic, "stale")] == 1
        node._on_joint_state(slot, joints(0.0))
        assert slot.latest is not held and node.invalid[(slot.topic, "stale")] == 1
        # a publisher whose clock runs a little early (within max_age_s ahead, let in): its sample
        # is still the newer one, and the other publisher's is still refused as older
        node._on_joint_state(slot, joints(-0.3))
        held = slot.latest
        node._on_joint_state(slot, joints(0.0))
        assert slot.latest is held and node.invalid[(slot.topic, "stale")] == 2
        # held further ahead than any stamp is let in: the clock went back (sim time), and the
        # new sample, which fits the clock, replaces it
        slot.latest = dataclasses.replace(held, stamp=joints(-10.0).header.stamp)
        node._on_joint_state(slot, joints(0.0))
        assert slot.latest is not held and node.invalid[(slot.topic, "stale")] == 2
        # the hint: under sim time, a reset's first message can come before the /clock moving back
        older = dataclasses.replace(slot.latest, stamp=joints(0.2).header.stamp)
        assert node._older_than_held(slot, older).detail.endswith("or a reordered message?)")
        clock = sim_clock(node)
        clock.set_ros_time_override(Time(nanoseconds=now))
        assert node._older_than_held(slot, older).detail.endswith(", or ROS time about to go back: a simulator reset?)")
    finally:
        node.destroy_node()


@pytest.mark.parametrize("in_flight", [False, True])
def test_ros_time_going_back_drops_the_held_prefix(rclpy_context, in_flight):
    """prefix_trigger period, ROS time back by less than max_age_s: the first decision on the new
    timeline re-used the prefix of frames from before the jump (its own decision's, or that of the
    decision the jump dropped), once the clock had caught up with the prefix's build time."""
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, prefix_trigger="period", prefix_period_s=0.3)
    try:
        clock = sim_clock(node)
        published = []
        node._publish = lambda decision, *a, **k: published.append(decision) or True
        arrival = [0]

        def fill(sec: float, value: int) -> None:
            stamp = Time(nanoseconds=round(sec * 1e9)).to_msg()
            for cam in node.slots[:-1]:
                arrival[0] += 1
                cam.latest = Sample(np.full((*HW, 3), value, np.uint8), stamp, arrival[0], arrival[0])
            node.slots[-1].latest = Sample(np.full(len(JOINTS), 0.1, np.float32), stamp, 0, 0)

        decide = node.state.decide

        def decide_across_a_jump(*args, **kwargs):
            out = decide(*args, **kwargs)
            clock.set_ros_time_override(Time(seconds=99.95))  # a simulator reset while it ran
            return out

        clock.set_ros_time_override(Time(seconds=100.0))
        fill(100.0, 10)
        node.state.decide = decide_across_a_jump if in_flight else decide
        node._decide()
        node.state.decide = decide
        assert len(published) == (0 if in_flight else 1)
        clock.set_ros_time_override(Time(seconds=99.95))
        with node._lock:
            node._settle_jump_inputs()
        clock.set_ros_time_override(Time(seconds=100.02))
        fill(100.01, 200)  # the new timeline's frames
        node._decide()
        after = published[-1]
        assert not after.prefix_reused and after.prefix_frames[0][0] == 100_010_000_000, after.prefix_frames
    finally:
        node.destroy_node()


def test_ros_time_going_back_drops_held_inputs_and_the_decision_under_way(rclpy_context, monkeypatch):
    """Sim time jumps back (a simulator reset) by less than max_age_s: the held samples, stamped on
    the old timeline, would still pass as fresh. They are dropped and counted, the slot says why it
    is empty, a message still queued from before the jump is refused, one on the new timeline is
    taken, a forward jump changes nothing, the command stream and the executing chunk go, and a
    decision that took inputs before the jump does not publish its chunk."""
    from types import SimpleNamespace

    from builtin_interfaces.msg import Time as TimeMsg
    from rclpy.time import Time
    from sensor_msgs.msg import JointState

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, command_rate_hz=40.0)
    try:
        clock = sim_clock(node, 100)
        slot = node.slots[-1]

        def joints(sec: float) -> JointState:
            msg = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
            msg.header.stamp = Time(nanoseconds=round(sec * 1e9)).to_msg()
            return msg

        node._on_joint_state(slot, joints(100.0))
        assert slot.latest is not None
        clock.set_ros_time_override(Time(seconds=100.5))  # forward: nothing dropped
        node._on_joint_state(slot, joints(100.5))
        assert slot.latest.stamp == TimeMsg(sec=100, nanosec=500_000_000)
        node.commands.push(np.zeros((10, len(JOINTS))), 100 * 10**9, 50_000_000, chunk_id=1)
        node._executing = node._last_trajectory = "the chunk before the jump"
        clock.set_ros_time_override(Time(seconds=100.3))  # back 0.2 s, within max_age_s (0.4)
        node._publish_command(clock.now().nanoseconds)  # the command tick settles the commands
        assert node.commands.command(clock.now().nanoseconds) is None and node._executing is None
        assert node._last_trajectory is None  # a pause would hold the arm to a pose from before the reset
        with node._lock:
            node._settle_jump_inputs()
        assert slot.latest is None and node.invalid[("", "clock_jumped_back")] == 1
        detail = node._absent_detail(slot, slot.rejected_since_good)
        assert detail.startswith("no good message since ROS time went back 0.0 s ago"), detail
        node._on_joint_state(slot, joints(100.45))  # sent before the jump, delivered after it
        assert slot.latest is None and node.invalid[(slot.topic, "stale")] == 1
        node._on_joint_state(slot, joints(100.3))  # on the new timeline
        assert slot.latest is not None and node.invalid[("", "clock_jumped_back")] == 1
        clock.set_ros_time_override(Time(seconds=100.2))  # a second jump, first noticed by a message
        node._on_joint_state(slot, joints(100.2))  # on the newest timeline: kept, not dropped as before it
        assert slot.latest.stamp == TimeMsg(sec=100, nanosec=200_000_000)
        assert node.invalid[("", "clock_jumped_back")] == 2
        clock.set_ros_time_override(Time(seconds=100.3))

        # a publication whose decision took its inputs before the jump: no executing chunk, no commands
        decision = SimpleNamespace(actions=np.ones((10, len(JOINTS)), np.float32), chunk_id=7, prefix_frames=None)
        decision.prefix_reused = False
        stamp = TimeMsg(sec=100, nanosec=300_000_000)
        samples = [Sample(None, stamp, 0, 0) for _ in node.slots[:-1]] + [Sample(np.zeros(len(JOINTS)), stamp, 0, 0)]
        node._publish(decision, samples, 1.0, node.cfg, epoch=node._time_epoch - 1)
        assert node._executing is None and node.commands.command(clock.now().nanoseconds + 10**8) is None
        node._publish(decision, samples, 1.0, node.cfg, epoch=node._time_epoch)
        assert node._executing is not None and node.commands.command(clock.now().nanoseconds + 10**8) is not None

        def fill_inputs() -> None:
            stamp = TimeMsg(sec=100, nanosec=300_000_000)
            for cam in node.slots[:-1]:
                cam.latest = Sample(np.zeros((24, 32, 3), np.uint8), stamp, 0, 0)
            node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)

        published = []
        monkeypatch.setattr(node, "_publish", lambda decision, *args, **kwargs: published.append(decision))
        fill_inputs()
        node._decide()
        assert len(published) == 1  # the same inputs, no jump: published
        decide = node.state.decide

        def decide_across_a_jump(*args, **kwargs):
            out = decide(*args, **kwargs)
            clock.set_ros_time_override(Time(seconds=100.31))
            return out

        monkeypatch.setattr(node.state, "decide", decide_across_a_jump)
        clock.set_ros_time_override(Time(seconds=100.32))
        fill_inputs()
        node._decide()
        assert len(published) == 1
        with node._lock:
            node._settle_jump_inputs()
        assert node.invalid[("", "clock_jumped_back")] == 3
    finally:
        node.destroy_node()


def test_a_decision_across_a_jump_forward_that_makes_its_inputs_stale_is_not_published(rclpy_context, monkeypatch):
    """Sim time leaps an hour while a decision runs (a simulator that skipped, a bag played on):
    stamped at its publication, the chunk went out as fresh from observations the jump made an
    hour old. Dropped, and counted as a skipped tick for each input now stale; a jump that leaves
    them within max_age_s (0.4 s) publishes."""
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, rate_hz=0.1, trajectory_stamp="publication")
    try:
        clock = sim_clock(node)
        published = []
        monkeypatch.setattr(node, "_publish", lambda decision, *args, **kwargs: published.append(decision) or True)
        decide = node.state.decide
        for start_s, jump_to_s, want in ((100.0, 3700.0, 0), (5000.0, 5000.2, 1)):
            clock.set_ros_time_override(Time(seconds=start_s))
            stamp = Time(seconds=start_s).to_msg()
            for cam in node.slots[:-1]:
                cam.latest = Sample(np.zeros((*HW, 3), np.uint8), stamp, 0, 0)
            node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)

            def decide_across_a_jump(*args, to=jump_to_s, **kwargs):
                out = decide(*args, **kwargs)
                clock.set_ros_time_override(Time(seconds=to))
                return out

            monkeypatch.setattr(node.state, "decide", decide_across_a_jump)
            node._decide()
            assert len(published) == want, (start_s, published)
            # booked as any skipped tick: the streak the resume line reports, and the inputs that blocked
            assert node._dropped_streak == 1 - want and len(node._blocking) == (1 - want) * len(node.slots)
        assert node.dropped_decisions == 1
        assert all(node.invalid[(slot.topic, "stale")] == 1 for slot in node.slots), dict(node.invalid)
    finally:
        node.destroy_node()


def test_under_period_a_jump_forward_that_makes_the_reused_prefix_s_frames_stale_is_not_published(rclpy_context):
    """Under "period" a decision acts on the frames its re-used prefix saw, older than the ones
    held: only the held ones were judged after a jump forward, and a chunk went out acting on
    frames the jump had made older than max_age_s."""
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    params = dict(rate_hz=0.1, prefix_trigger="period", prefix_period_s=10.0, max_age_s=0.4)
    node = in_process_node(rclpy_context, trajectory_stamp="publication", **params)
    try:
        clock = sim_clock(node)
        published = []
        publish = node._publish
        node._publish = lambda decision, *args: published.append(decision) or publish(decision, *args)

        def hold(at_s: float, frames_s: float) -> None:
            for i, cam in enumerate(node.slots[:-1]):
                cam.latest = Sample(np.full((*HW, 3), 9 * i, np.uint8), Time(seconds=frames_s).to_msg(), 0, 0)
            node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), Time(seconds=at_s).to_msg(), 0, 0)

        clock.set_ros_time_override(Time(seconds=100.0))
        hold(100.0, 99.75)  # frames 0.25 s old: the prefix is built on them
        node._decide()
        clock.set_ros_time_override(Time(seconds=100.05))  # a step, not a jump
        hold(100.05, 100.05)
        decide = node.state.decide

        def across_a_jump(*args, **kwargs):
            out = decide(*args, **kwargs)
            clock.set_ros_time_override(Time(seconds=100.25))  # the held inputs 0.2 s old, the prefix's frames 0.5
            return out

        node.state.decide = across_a_jump
        node._decide()
        assert [d.prefix_reused for d in published] == [False], published
        assert node.dropped_decisions == 1
        assert all(node.invalid[(slot.topic, "stale")] == 1 for slot in node.slots[:-1]), dict(node.invalid)
        assert node.invalid[(node.slots[-1].topic, "stale")] == 0
    finally:
        node.destroy_node()


def test_a_chunk_computed_on_the_prompt_before_a_change_is_not_published(rclpy_context, monkeypatch):
    """A new instruction accepted (and logged) while a decision ran: that chunk, computed on the
    old one, went out after it, and nothing in it could show which prompt it acted on."""
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, rate_hz=0.1, max_age_s=30.0)  # a slow first decision: still fresh
    try:
        published, said = [], []
        monkeypatch.setattr(node, "_publish", lambda decision, *args, **kwargs: published.append(decision) or True)
        monkeypatch.setattr(node.get_logger(), "info", lambda text, **_: said.append(text))
        stamp = node.get_clock().now().to_msg()
        for cam in node.slots[:-1]:
            cam.latest = Sample(np.zeros((*HW, 3), np.uint8), stamp, 0, 0)
        node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)
        decide = node.state.decide

        def decide_while_the_prompt_changes(*args, **kwargs):
            out = decide(*args, **kwargs)
            assert node.set_parameters([Parameter("prompt", value="fold the towel")])[0].successful
            return out

        monkeypatch.setattr(node.state, "decide", decide_while_the_prompt_changes)
        node._decide()
        assert not published and any("prompt changed: chunk 1, computed on the one before" in t for t in said), said

        def decide_while_the_prompt_changes_to(text: str):
            def decide_then_change(*args, **kwargs):
                out = decide(*args, **kwargs)
                assert node.set_parameters([Parameter("prompt", value=text)])[0].successful
                return out

            return decide_then_change

        # at most one in a row: a planner rewording faster than the node decides stops no chunk
        monkeypatch.setattr(node.state, "decide", decide_while_the_prompt_changes_to("fold the shirt"))
        node._decide()
        # the same prompt tokens set another way (a trailing newline) is no change
        monkeypatch.setattr(node.state, "decide", decide_while_the_prompt_changes_to("fold the shirt\n"))
        node._decide()
        assert [d.chunk_id for d in published] == [2, 3], published
    finally:
        node.destroy_node()


def test_ros_time_going_back_while_the_chunk_is_made_publishes_nothing(rclpy_context, monkeypatch):
    """A /clock step back between _publish's first check and its publish calls (the jump takes no
    lock): the chunk and its trajectory went out stamped on the timeline before the jump."""
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, rate_hz=0.1, command_rate_hz=50.0)
    try:
        clock = sim_clock(node, 1000.0)
        sent = []
        monkeypatch.setattr(node._chunk_pub, "publish", sent.append)
        monkeypatch.setattr(node._traj_pub, "publish", sent.append)
        stamp = Time(seconds=1000.0).to_msg()
        for cam in node.slots[:-1]:
            cam.latest = Sample(np.zeros((*HW, 3), np.uint8), stamp, 0, 0)
        node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)
        acted_on = node._acted_on

        def jump_back_then(*args):  # a simulator reset 0.2 s back arrives while the messages are made
            clock.set_ros_time_override(Time(seconds=999.8))
            return acted_on(*args)

        monkeypatch.setattr(node, "_acted_on", jump_back_then)
        node._decide()
        assert sent == [] and node._executing is None and not node.commands._chunks
        assert node.invalid[("", "chunk_ended")] == 0  # nothing went out: nothing ended on arrival
    finally:
        node.destroy_node()


def test_a_lerobot_n_action_steps_is_said_against_the_decision_rate(rclpy_context, monkeypatch):
    """LeRobot executes n_action_steps of a chunk, then decides again: a rate_hz that replans less
    often runs the policy differently, which the start-up log says (with the rate that would not)."""
    from types import SimpleNamespace

    node = in_process_node(rclpy_context)  # rate_hz 10, step_duration_s 0.05: a chunk every 2 actions
    try:
        said: list[tuple[str, str]] = []
        logger = SimpleNamespace(**{level: partial_log(said, level) for level in ("info", "warning")})
        monkeypatch.setattr(node, "get_logger", lambda: logger)
        policy = node.state.pipeline.policy
        policy.cfg = policy.cfg.replace(extra={"n_action_steps": 1})
        node._say_how_often_lerobot_replans(node.cfg)
        assert said[-1][0] == "warning" and said[-1][1].endswith(
            "a chunk comes every 2 actions: more than LeRobot runs it with; expected rate_hz >= 20"
        ), said
        policy.cfg = policy.cfg.replace(extra={"n_action_steps": 5})
        node._say_how_often_lerobot_replans(node.cfg)
        assert said[-1][0] == "info" and "n_action_steps is 5 of its" in said[-1][1], said
        policy.cfg = policy.cfg.replace(extra={})
        node._say_how_often_lerobot_replans(node.cfg)
        assert len(said) == 2  # not a LeRobot checkpoint: nothing to say
    finally:
        node.destroy_node()


def partial_log(lines: list, level: str):
    return lambda text: lines.append((level, text))


def test_a_prompt_from_the_topic_is_checked_in_the_nodes_own_namespace(rclpy_context):
    """Topics judged in the root namespace can clash where the node's own do not (a relative and an
    absolute name): a prompt from prompt_topic is checked as `ros2 param set` checks it."""
    from rclpy.parameter import Parameter
    from std_msgs.msg import String

    from flashrt_ros.ros.node import FlashRTNode

    params = {**TEST_PARAMS, "camera_topics": ["cam0/image_raw", "/cam0/image_raw"], "prompt_topic": "task"}
    overrides = [Parameter(name, value=value) for name, value in params.items()]
    node = FlashRTNode(context=rclpy_context, namespace="/robot1", parameter_overrides=overrides)
    try:
        node._on_prompt(String(data="open the drawer"))
        assert node.cfg.prompt == "open the drawer", node._refused_prompt
        assert node.invalid[("/robot1/task", "invalid_prompt")] == 0
    finally:
        node.destroy_node()


def test_a_reset_while_a_joint_state_is_converted_drops_it(rclpy_context, monkeypatch):
    """~/reset clears the held inputs: a joint state whose conversion began before the reset is
    not stored after it (as for a camera frame), or the reset would leave pre-reset data held."""
    from rclpy.time import Time
    from sensor_msgs.msg import JointState
    from std_srvs.srv import Trigger

    import flashrt_ros.ros.node_inputs as node_inputs

    node = in_process_node(rclpy_context)
    try:
        slot = node.slots[-1]
        convert = node_inputs.joint_state_to_vector

        def convert_across_a_reset(*args, **kwargs):
            out = convert(*args, **kwargs)
            assert node._on_reset(Trigger.Request(), Trigger.Response()).success
            return out

        monkeypatch.setattr(node_inputs, "joint_state_to_vector", convert_across_a_reset)
        msg = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
        msg.header.stamp = Time(nanoseconds=node.get_clock().now().nanoseconds).to_msg()
        node._on_joint_state(slot, msg)
        assert slot.latest is None
        monkeypatch.setattr(node_inputs, "joint_state_to_vector", convert)
        node._on_joint_state(slot, msg)
        assert slot.latest is not None
    finally:
        node.destroy_node()


def test_under_sim_time_idle_is_measured_on_the_ros_clock(rclpy_context):
    """A simulator slower than real time spaces decisions far apart in wall time: the health
    check reads the idle time on the timer's (ROS) clock, so it does not report ERROR."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.time import Time

    node = past_start(in_process_node(rclpy_context))
    try:
        clock = sim_clock(node, 100)
        node._last_decision_ros_ns = Time(seconds=100).nanoseconds - 50_000_000  # 0.05 s of sim time
        node._last_decision_at = time.monotonic() - 30.0  # 30 s of wall time
        assert node._idle_s() == pytest.approx(0.05)
        assert node.state.pipeline.stats.clock() == pytest.approx(100.0)  # stage rates on the ROS clock too
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level != DiagnosticStatus.ERROR, message
        clock.set_ros_time_override(Time(seconds=103))  # 3 s of sim time with no decision
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.ERROR and message.startswith("no decision for 3.0 s"), message
    finally:
        node.destroy_node()


def test_diagnostics_name_only_what_can_stop_a_decision(rclpy_context):
    """/diagnostics' ERROR says why no decision ran: the inputs that stop them and node-wide
    failures (a policy error), not a refused parameter, prompt or capsule call or the commands'
    own events during the outage. With the inputs good again and the first decision computing, it
    says so rather than "no decision ran"."""
    from diagnostic_msgs.msg import DiagnosticStatus

    node = past_start(in_process_node(rclpy_context))
    try:
        cam = node.slots[0].topic
        node._last_decision_at = time.monotonic() - 30.0
        node._invalid_at_decision = dict(node.invalid)
        node._blocking, node._dropped_streak, node._outage = frozenset({cam}), 300, True  # 30 s of skipped ticks
        for key in [
            (cam, "stale"),
            ("", "invalid_parameter"),
            ("", "chunk_exhausted"),
            ("", "command_limited"),
            ("/prompt", "invalid_prompt"),
            ("/flashrt_node/capsule/restore", "unknown_capsule"),
            ("", "policy_error"),
        ]:
            node.invalid[key] += 1
        node._our_failure("command_failed", "a command stream failure stops no decision")
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.ERROR, message
        assert message.endswith(f"(policy_error, stale {cam})"), message
        node._our_failure("decision_failed", "a decision tick's own failure stops it")
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert message.endswith(f"(policy_error, stale {cam}, node_error (decision tick))"), message
        node._invalid_at_decision = dict(node.invalid)  # the cause's counts as of a decision
        node._tick_failures_at_decision = node._tick_failures
        node._blocking, node._deciding = frozenset(), True
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert message.endswith("(the inputs are good again; a decision is computing)"), message
        node._deciding = False
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert message.endswith("(no decision ran)"), message
    finally:
        node.destroy_node()


def test_late_decisions_and_the_start_s_wait_are_warnings_and_a_hang_an_error(rclpy_context, monkeypatch):
    """/diagnostics' ERROR is for decisions that do not run. It said ERROR "no decision for 0.2 s
    (the inputs are good again...)" while one slow decision computed on inputs good all along, and
    ERROR while the cameras came up a moment after the node (the log called that wait expected);
    statuses faster than decisions said OK between decisions that all missed their deadline."""
    from types import SimpleNamespace

    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.time import Time

    from flashrt_ros.ros import node_status
    from flashrt_ros.ros.inputs import Sample
    from flashrt_ros.ros.node_status import HUNG_FACTOR

    # the status's clock stands still: the seconds it prints are the ones set here, whatever
    # a loaded machine's pauses between these lines
    frozen = time.monotonic()
    monkeypatch.setattr(node_status, "time", SimpleNamespace(monotonic=lambda: frozen))

    def health() -> tuple[bytes, str]:
        return node._health(*node._snapshot_with_baseline(advance=True))

    node = in_process_node(rclpy_context)  # just started: no input yet, DDS discovery's wait
    try:
        node._last_decision_at = frozen - 30.0
        node._started_at = node._timer_seconds()  # the first tick: within DISCOVERY_S of the subscriptions
        level, message = health()
        assert level == DiagnosticStatus.WARN and message.startswith("running, not ready (absent "), message
        past_start(node)  # the wait is over: absent inputs are an outage
        assert health() == (DiagnosticStatus.ERROR, "no decision for 30.0 s (no decision ran)")
        node._started_at = None  # as ~/enable true sets it, from its own thread: a status then failed
        assert node._just_emptied(node.slots[0]) and health()[0] == DiagnosticStatus.WARN
        past_start(node)

        stamp = Time(nanoseconds=node.get_clock().now().nanoseconds).to_msg()
        for cam in node.slots[:-1]:
            cam.latest = Sample(np.zeros((24, 32, 3), np.uint8), stamp, 0, 0)
        node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)
        # the first decision after the start's wait (only expected skips): computing, not an outage
        node._deciding, node._dropped_streak = True, 17
        node._last_decision_at = node._decision_began = frozen - 0.5
        level, message = health()
        assert level == DiagnosticStatus.WARN, message
        warm_s = node.state.pipeline.warm_up_ms / 1e3  # no decision yet: the warm-up is the yardstick
        assert f"a decision computing for 0.5 s (the warm-up decision took {warm_s:.2f} s)" in message, message
        node._decision_s.extend([0.05] * 8)  # idle limit: max(2 periods, a status period, 0.1 s) = 0.2 s
        level, message = health()
        assert level == DiagnosticStatus.WARN, message
        assert "a decision computing for 0.5 s (the slowest of the last ones took 0.05 s)" in message, message
        # hung past HUNG_FACTOR x max(2 periods, the slowest): 2 s, whatever the status rate
        assert node._hung_after_s() == pytest.approx(HUNG_FACTOR * 0.2)
        hung_s = node._hung_after_s() + 1.0
        node._last_decision_at = node._decision_began = frozen - hung_s
        level, message = health()
        assert level == DiagnosticStatus.ERROR, message
        assert message.endswith(f"(a decision computing for {hung_s:.1f} s: does the policy hang?)"), message
        node._outage = True  # skips past the expected wait before it: an outage, and it is over
        assert health()[1].endswith("(the inputs are good again; a decision is computing)")
        node._outage = False
        node._last_decision_at = node._decision_began = frozen - 0.5
        node.invalid[("", "non_finite_action")] += 5  # ticks whose chunks the node refused: not slow
        assert health() == (DiagnosticStatus.ERROR, "no decision for 0.5 s (non_finite_action)")
        node._invalid_at_decision = dict(node.invalid)

        node._deciding, node._last_decision_at = False, frozen
        node._last_missed = 0.3  # the last decision took 0.3 s of a 0.1 s period; this status saw no new one
        level, message = health()
        assert level == DiagnosticStatus.WARN, message
        assert message.endswith("the last decision missed its deadline (0.300 s for a 0.100 s period)"), message
        node._last_missed = None  # the next decision kept its deadline
        assert health() == (DiagnosticStatus.OK, "running at 10 Hz")
    finally:
        node.destroy_node()


def test_a_stale_input_whose_publisher_is_gone_says_so(rclpy_context):
    """A camera driver that crashed left "[stale] ...: data is 46.279 s old" for as long as it was
    down, with nothing about its publisher (the absent case checks the graph)."""
    from collections import Counter

    from flashrt_ros.ros.input_error import STALE, InputError

    node = in_process_node(rclpy_context)  # nothing publishes its inputs here
    try:
        slot = node.slots[0]
        err = InputError(STALE, slot.topic, "data is 46.279 s old; expected at most 0.5 s")
        said = node._stale_detail(slot, err, Counter())
        assert (
            said
            == "data is 46.279 s old; expected at most 0.5 s; no publisher on this topic any more (its driver stopped?)"
        )
        # refused since (a driver that publishes, badly): that is the news, not the graph
        assert node._stale_detail(slot, err, Counter(bad_size=4)).endswith(
            "(newer messages were rejected: bad_size x4)"
        )
    finally:
        node.destroy_node()


def test_a_chunk_that_can_end_before_the_next_arrives_is_warned_at_start(rclpy_context, monkeypatch):
    """the tiny policy at the default max_age_s: 10 actions of 0.02 s from an observation up to 0.5 s old,
    decided every 0.1 s - chunks ended before the next came (chunk_ended, chunk_exhausted) with no
    word at start; only a period longer than a chunk was said."""
    import dataclasses
    from types import SimpleNamespace

    node = in_process_node(rclpy_context)  # TEST_PARAMS: 0.5 s chunks, 0.1 s + max_age_s 0.4: at the edge
    try:
        said: list[str] = []
        monkeypatch.setattr(node, "get_logger", lambda: SimpleNamespace(warning=said.append))
        node._warn_chunk_gap(node.cfg)
        assert said == []
        tight = dataclasses.replace(node.cfg, max_age_s=0.5, step_duration_s=0.02)
        node._warn_chunk_gap(tight)
        assert said == [
            "a chunk lasts 0.2 s (10 actions x step_duration_s 0.02) from its observation, which may be max_age_s "
            "0.5 s old, and the next comes a period (0.1 s) and a decision later: chunks can end before the next "
            "arrives (counted as chunk_ended, chunk_exhausted); expected max_age_s + 1 / rate_hz below 0.2 s"
        ]
        said.clear()  # stamped at publication, a chunk starts when it is sent: its inputs' age is no matter
        node._warn_chunk_gap(dataclasses.replace(tight, trajectory_stamp="publication"))
        assert said == []
        # at a runtime change only as it turns on or changes kind: a rate_hz slider said it at every step
        slower = dataclasses.replace(tight, rate_hz=8.0)
        node._warn_chunk_gap(slower, tight)
        assert said == []
        node._warn_chunk_gap(tight, dataclasses.replace(tight, max_age_s=0.05))
        assert len(said) == 1 and said[0].startswith("a chunk lasts 0.2 s")
        node._warn_chunk_gap(dataclasses.replace(tight, rate_hz=2.0), tight)
        assert len(said) == 2 and said[1].startswith("rate_hz 2 decides every 0.5 s, but a chunk lasts 0.2 s")
    finally:
        node.destroy_node()


def test_a_capsule_name_stored_in_another_spelling_is_said(rclpy_context):
    """ "cafe" + a combining accent is stored as "café" (one name, NFC): the reply says so, and the
    list names it that way (a client looking for its own spelling in the list found nothing)."""
    from flashrt_ros.srv import ListCapsules, SnapshotCapsule

    node = in_process_node(rclpy_context)
    try:
        reply = node._on_snapshot(SnapshotCapsule.Request(name="cafe\u0301"), SnapshotCapsule.Response())
        assert reply.success and reply.message.endswith("(stored as 'caf\u00e9', its NFC spelling)"), reply.message
        listing = node._on_list(ListCapsules.Request(), ListCapsules.Response())
        assert list(listing.names) == ["caf\u00e9"]
        reply = node._on_snapshot(SnapshotCapsule.Request(name="plain"), SnapshotCapsule.Response())
        assert reply.success and "stored as" not in reply.message
    finally:
        node.destroy_node()


def test_a_robot_wide_section_s_keys_for_other_nodes_are_not_counted_as_typos(rclpy_context, tmp_path):
    """A `/**` section holding other nodes' parameters (robot_description, update_rate) is
    ordinary ROS practice: those are said at INFO, not warned about and counted as
    unknown_parameter for the whole run; a misspelt name in the node's own section still is, and
    one close to ours in `/**` too (a single-node file of only `/**`: a limit dropped unsaid), unless
    it is the package's other node's (synthetic_sensors' camera_rate_hz)."""
    import yaml
    from node_harness import TEST_PARAMS

    from flashrt_ros.ros.node import FlashRTNode

    path = tmp_path / "robot.yaml"
    sections = {
        "/**": {
            "ros__parameters": {
                "use_sim_time": False,
                "robot_description": "<robot/>",
                "update_rate": 100,
                "action_max_stpe": [0.05],
                "camera_rate_hz": 30.0,  # synthetic_sensors': close to command_rate_hz, and no typo
            }
        },
        "/**/flashrt_node": {"ros__parameters": {**TEST_PARAMS, "rate_hzz": 5.0}},
    }
    path.write_text(yaml.safe_dump(sections))
    node = FlashRTNode(
        context=rclpy_context, sources=[("file", str(path))], cli_args=["--ros-args", "--params-file", str(path)]
    )
    try:
        assert node._unknown == ["action_max_stpe", "rate_hzz"]
        assert node.invalid[("", "unknown_parameter")] == 2
    finally:
        node.destroy_node()


def test_under_sim_time_idle_counts_from_the_first_clock_not_from_ros_time_0(rclpy_context):
    """Started before /clock's first message, the node took its "last decision" at ROS time 0:
    /diagnostics then said "no decision for 1003.1 s (clock_stalled, ...)" three seconds into a
    simulation started at 1000 s, naming a stall that had ended."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.time import Time

    node = past_start(in_process_node(rclpy_context))
    try:
        clock = sim_clock(node)
        node._last_decision_ros_ns = 0  # as taken before any /clock message
        node._invalid_at_decision = dict(node.invalid)
        node.invalid[("", "clock_stalled")] += 1  # the wait for /clock, over now
        clock.set_ros_time_override(Time(seconds=1000))
        assert node._idle_s() == pytest.approx(0.0)
        clock.set_ros_time_override(Time(seconds=1003))
        assert node._idle_s() == pytest.approx(3.0)
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.ERROR and message.startswith("no decision for 3.0 s"), message
        assert "clock_stalled" not in message, message
    finally:
        node.destroy_node()


def test_under_sim_time_a_deadline_is_judged_in_sim_time_and_a_reset_does_not_hide_idleness(rclpy_context, monkeypatch):
    """rate_hz's periods are on the decision timer's clock: under sim time a decision that takes
    longer than a period in wall time but not in sim time (a slow simulator) is no deadline miss,
    and one that takes more sim time than a period (a fast one) is. After ROS time went back past
    the last decision, idleness counts from where it landed (it was negative, so never an ERROR)."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    node = past_start(in_process_node(rclpy_context))
    try:
        clock = sim_clock(node)
        sim_ns = [100 * 10**9]
        clock.set_ros_time_override(Time(nanoseconds=sim_ns[0]))
        decide = node.state.decide

        def decide_taking(sim_s: float, wall_s: float):
            def run(*args, **kwargs):
                out = decide(*args, **kwargs)
                time.sleep(wall_s)
                for _ in range(10):  # /clock's ticks: one step of sim_s would be a jump forward
                    sim_ns[0] += round(sim_s * 1e8)
                    clock.set_ros_time_override(Time(nanoseconds=sim_ns[0]))
                return out

            return run

        def one_decision(sim_s: float, wall_s: float) -> None:
            stamp = Time(nanoseconds=sim_ns[0]).to_msg()
            for cam in node.slots[:-1]:
                cam.latest = Sample(np.zeros((24, 32, 3), np.uint8), stamp, 0, 0)
            node.slots[-1].latest = Sample(np.zeros(len(JOINTS), np.float32), stamp, 0, 0)
            monkeypatch.setattr(node.state, "decide", decide_taking(sim_s, wall_s))
            node._on_decision()  # the timer's callback: the decision, then nothing computing

        one_decision(sim_s=0.05, wall_s=0.15)  # a slow simulator: 0.15 s of wall time, half a period of sim time
        assert node.decisions == 1 and node.deadline_misses == 0
        one_decision(sim_s=0.2, wall_s=0.0)  # a fast one: two periods of sim time in no wall time
        assert node.decisions == 2 and node.deadline_misses == 1
        clock.set_ros_time_override(Time(seconds=1))  # a simulator reset, far behind the last decision
        assert node._idle_s() == pytest.approx(0.0)  # counted from where ROS time landed
        clock.set_ros_time_override(Time(seconds=31))  # 30 s of sim time since, no decision
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.ERROR and message.startswith("no decision for 30.0 s"), message
    finally:
        node.destroy_node()


def test_a_reset_between_a_status_snapshot_and_its_health_hides_nothing_after(rclpy_context):
    """The status timer takes a snapshot, then judges its health against the last one: a ~/reset
    in between must not make the old counts the next baseline (the misses after it were hidden)."""
    from std_srvs.srv import Trigger

    node = in_process_node(rclpy_context)
    try:
        node._last_decision_at = time.monotonic()
        node.deadline_misses = 20
        node._health(*node._snapshot_with_baseline(advance=True))  # a status before: 20 reported
        node.deadline_misses = 50
        snap, baseline = node._snapshot_with_baseline(advance=True)
        assert node._on_reset(Trigger.Request(), Trigger.Response()).success
        node._last_decision_at = time.monotonic()
        _, message = node._health(snap, baseline)
        assert "30 deadline misses since the last status" in message, message  # not every one since the start
        node.deadline_misses += 3
        _, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert "3 deadline misses since the last status" in message, message
    finally:
        node.destroy_node()


def test_the_error_names_the_inputs_that_still_stop_decisions(rclpy_context):
    """Every input is absent on the first tick; then the joints arrive and the cameras do not. The
    ERROR names the cameras, not the joints that were absent only for a moment."""
    import numpy as np
    from diagnostic_msgs.msg import DiagnosticStatus

    from flashrt_ros.ros.inputs import Sample

    node = past_start(in_process_node(rclpy_context))
    try:
        now = node.get_clock().now()
        assert node._fresh_samples(now.nanoseconds, node.cfg) is None  # all absent
        joints = node.slots[-1]
        joints.latest = Sample(np.zeros(len(JOINTS), np.float32), now.to_msg(), 0, 0)
        assert node._fresh_samples(now.nanoseconds, node.cfg) is None  # the cameras still are
        node._last_decision_at = time.monotonic() - 30.0
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        cameras = ", ".join(f"absent {s.topic}" for s in sorted(node.slots[:-1], key=lambda s: s.topic))
        assert level == DiagnosticStatus.ERROR and message.endswith(f"({cameras})"), message
        assert joints.topic not in message
        # the cameras arrive, and the policy fails on every decision: the inputs are no longer blamed
        for slot in node.slots[:-1]:
            slot.latest = Sample(np.zeros((*HW, 3), np.uint8), now.to_msg(), 0, 0)
        assert node._fresh_samples(now.nanoseconds, node.cfg) is not None
        node._count_node_wide("non_finite_action")
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.ERROR and message.endswith("(non_finite_action)"), message
    finally:
        node.destroy_node()


def test_inputs_replaced_while_the_policy_runs_were_used_not_dropped(rclpy_context):
    """Sensors faster than a decision: each decision takes the held samples, and new ones replace
    them while the policy runs. Those were used (they fed the decision); dropped_inputs counted
    them because a sample was marked used only at publication. A sample replaced before any
    decision took it is still a drop."""
    from rclpy.time import Time
    from sensor_msgs.msg import Image, JointState

    from flashrt_ros.ros.image_convert import image_to_rgb

    node = in_process_node(rclpy_context)
    try:

        def feed() -> None:
            stamp = Time(nanoseconds=node.get_clock().now().nanoseconds).to_msg()
            for i, slot in enumerate(node.slots[:-1]):
                img = Image(height=HW[0], width=HW[1], encoding="rgb8", step=HW[1] * 3)
                img.data = bytes([40 + i]) * (HW[0] * HW[1] * 3)
                img.header.stamp = stamp
                node._on_image(image_to_rgb, slot, img)
            joints = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
            joints.header.stamp = stamp
            node._on_joint_state(node.slots[-1], joints)

        decide = node.state.decide

        def decide_while_inputs_arrive(observation, hold=None):
            decision = decide(observation, hold=hold)
            feed()  # the cameras and joints publish during the policy's call
            return decision

        node.state.decide = decide_while_inputs_arrive
        feed()
        for _ in range(3):
            node._on_decision()
        assert (node.decisions, node.dropped_inputs) == (3, 0)
        feed()  # replaces the samples fed during the last decision, which no decision took
        assert node.dropped_inputs == len(node.slots)
    finally:
        node.destroy_node()


def test_diagnostics_say_not_ready_while_engaged_between_skipped_ticks(rclpy_context):
    """Statuses come faster than decisions: between two ticks skipped for stale inputs, the
    enabled branch judged only counts that rose since the last status and said OK ("running at
    N Hz") while no input was usable (for seconds at a slow rate_hz, or before the first tick)."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.time import Time

    from flashrt_ros.ros.inputs import Sample

    node = in_process_node(rclpy_context, rate_hz=0.2)  # idle ERROR after 10 s: never first here
    try:
        clock = sim_clock(node, 100.0)
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.WARN and message.startswith("running, not ready (absent "), message
        stamp = Time(seconds=100.0).to_msg()
        for cam in node.slots[:-1]:
            cam.latest = Sample(np.zeros((*HW, 3), np.uint8), stamp, 1, 1)
        node.slots[-1].latest = Sample(np.full(len(JOINTS), 0.1, np.float32), stamp, 0, 0)
        node._on_decision()
        assert node._health(*node._snapshot_with_baseline(advance=True)) == (DiagnosticStatus.OK, "running at 0.2 Hz")
        clock.set_ros_time_override(Time(seconds=100.6))  # past max_age_s (0.4), before the next tick
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level == DiagnosticStatus.WARN and message.startswith("running, not ready (stale "), message
    finally:
        node.destroy_node()


def test_diagnostics_say_when_nothing_subscribes_to_the_controllers_outputs(rclpy_context):
    """A joint_trajectory_controller on /arm/joint_trajectory and the node's group on a mistyped
    topic, or the command stream with no controller on it: the robot got nothing and /diagnostics
    said OK. The optional outputs (~/joint_trajectory, ~/action_chunk) need no subscriber."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.node import Node
    from rclpy.time import Time
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory

    from flashrt_ros.ros.inputs import Sample

    # a slow rate: its idle ERROR (two periods) must not come first on a loaded machine
    node = in_process_node(rclpy_context, rate_hz=0.1, command_rate_hz=20.0, trajectory_groups=[f"/arm/jt={JOINTS[0]}"])
    listener = Node("controllers", context=rclpy_context)
    try:
        sim_clock(node, 100.0)
        stamp = Time(seconds=100.0).to_msg()
        for cam in node.slots[:-1]:
            cam.latest = Sample(np.zeros((*HW, 3), np.uint8), stamp, 1, 1)
        node.slots[-1].latest = Sample(np.full(len(JOINTS), 0.1, np.float32), stamp, 0, 0)
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        want = "nothing subscribes to /arm/jt, /flashrt_node/joint_command (the controller's topic? a remap?)"
        assert level == DiagnosticStatus.WARN and message.endswith(want), message
        listener.create_subscription(JointTrajectory, "/arm/jt", lambda _: None, 10)
        listener.create_subscription(Float64MultiArray, "/flashrt_node/joint_command", lambda _: None, 10)
        deadline = time.monotonic() + 10.0  # discovery, in this process: quick
        while node._health(*node._snapshot_with_baseline(advance=True))[0] != DiagnosticStatus.OK:
            assert time.monotonic() < deadline, node._health(*node._snapshot_with_baseline(advance=True))
            time.sleep(0.05)
    finally:
        listener.destroy_node()
        node.destroy_node()


def test_a_second_node_of_this_name_is_said_in_diagnostics(rclpy_context):
    """A launch plus a forgotten `ros2 run`: two /flashrt_node, both engaged by one ~/enable, their
    trajectories interleaved on the controllers' topic, and neither said a word."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from flashrt_ros.msg import ActionChunk
    from rclpy.node import Node

    node = in_process_node(rclpy_context, rate_hz=0.1)
    other = Node("flashrt_node", context=rclpy_context)
    try:
        assert node._health(*node._snapshot_with_baseline(advance=True))[1].find("other publisher") < 0
        other.create_publisher(ActionChunk, "/flashrt_node/action_chunk", 10)
        deadline = time.monotonic() + 10.0  # discovery, in this process: quick
        while True:
            level, message = node._health(*node._snapshot_with_baseline(advance=True))
            if "other publisher" in message or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert level == DiagnosticStatus.WARN, message
        assert "1 other publisher(s) of /flashrt_node/action_chunk: another /flashrt_node?" in message, message
    finally:
        other.destroy_node()
        node.destroy_node()


def test_inputs_held_through_a_pause_are_not_counted_dropped_after_it(rclpy_context):
    """A sample stored while paused waits for no decision; once ~/enable true came, the first newer
    sample on each topic counted it as dropped: every pause and resume added one drop per input
    (an operator's dead-man switch grew dropped_inputs with no sensor at fault)."""
    from rclpy.time import Time
    from sensor_msgs.msg import Image, JointState

    from flashrt_ros.ros.image_convert import image_to_rgb

    node = in_process_node(rclpy_context)
    try:

        def feed() -> None:
            stamp = Time(nanoseconds=node.get_clock().now().nanoseconds).to_msg()
            for slot in node.slots[:-1]:
                img = Image(height=HW[0], width=HW[1], encoding="rgb8", step=HW[1] * 3)
                img.data = bytes([40]) * (HW[0] * HW[1] * 3)
                img.header.stamp = stamp
                node._on_image(image_to_rgb, slot, img)
            joints = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
            joints.header.stamp = stamp
            node._on_joint_state(node.slots[-1], joints)

        feed()
        node._on_decision()
        feed()  # held when the pause comes, no decision took it: owed none from then on
        assert node.set_enabled(False, "~/enable true").startswith("paused")
        assert node.set_enabled(True, None).startswith("enabled")
        feed()
        assert node.set_enabled(False, "~/enable true").startswith("paused")
        feed()
        feed()
        assert node.set_enabled(True, None).startswith("enabled")
        feed()
        assert (node.decisions, node.dropped_inputs) == (1, 0)
        feed()  # enabled: replaced before a decision took it, a drop
        assert node.dropped_inputs == len(node.slots)
    finally:
        node.destroy_node()


def test_a_reset_that_waited_for_a_decision_is_refused_once_the_stop_signal_came(rclpy_context):
    """A ~/reset waiting for the decision in flight when SIGINT arrives: it must not run after the
    signal (the final stats line counts everything that ran)."""
    import threading

    from std_srvs.srv import Trigger

    node = in_process_node(rclpy_context)
    try:
        node.decisions = 42
        replies = []
        node._state_lock.acquire()  # a decision in flight
        waiting = threading.Thread(target=lambda: replies.append(node._on_reset(Trigger.Request(), Trigger.Response())))
        waiting.start()
        time.sleep(0.2)  # the reset is past its first check, waiting for the lock
        node.begin_shutdown()
        node._state_lock.release()
        waiting.join(5.0)
        assert not replies[0].success and "shutting down" in replies[0].message
        assert node.decisions == 42
    finally:
        node.destroy_node()


def test_a_policy_slower_than_the_rate_is_no_error_and_an_error_names_its_cause(rclpy_context):
    """rate_hz 100 with a policy taking 0.5 s: between two decisions the node is busy, not stopped
    (WARN with deadline misses is the docs' word for it). Once decisions do stop, every ERROR names
    why, counted since the last decision, not only since the last status."""
    from diagnostic_msgs.msg import DiagnosticStatus

    node = past_start(in_process_node(rclpy_context, rate_hz=100.0, status_rate_hz=50.0))
    try:
        node._decision_s.extend([0.5] * 8)  # long: a loaded machine's pause is far shorter
        node._last_decision_at = time.monotonic() - 0.8  # inside the next 0.5 s decision (limit 1 s)
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level != DiagnosticStatus.ERROR, message
        topic = node.slots[0].topic
        node.invalid[(topic, "stale")] += 3
        node._blocking = frozenset({topic})  # as the three skipped ticks leave it
        node._last_decision_at = time.monotonic() - 5.0  # ten decisions' time: stopped
        for _ in range(2):  # the second status sees no new count since the first: the cause stays
            level, message = node._health(*node._snapshot_with_baseline(advance=True))
            assert level == DiagnosticStatus.ERROR and f"(stale {topic})" in message, message
    finally:
        node.destroy_node()


def test_a_failing_status_is_logged_and_the_timer_goes_on(rclpy_context, monkeypatch):
    """An error while the status is assembled (a bug of ours) must not end the executor, which
    would stop the decisions too: it is logged, and the next period publishes again."""
    import flashrt_ros.ros.node as node_module

    node = in_process_node(rclpy_context)
    try:
        errors = []
        monkeypatch.setattr(node._throttle, "logger", type("L", (), {"error": lambda _, text: errors.append(text)})())
        real = node_module.messages.pipeline_status

        def fail(_snap):
            raise RuntimeError("deque mutated during iteration")

        monkeypatch.setattr(node_module.messages, "pipeline_status", fail)
        node._on_status()
        assert errors == ["[node_error] status not published: RuntimeError('deque mutated during iteration')"]
        monkeypatch.setattr(node_module.messages, "pipeline_status", real)
        node._on_status()  # publishes again, with the failure counted
        assert len(errors) == 1 and node.invalid[("", "node_error")] == 1
    finally:
        node.destroy_node()


def test_a_failing_decision_tick_is_logged_counted_and_the_timer_goes_on(rclpy_context, monkeypatch):
    """A failure of ours in a decision tick outside the policy (which has its own guard), e.g.
    while the skip reasons are logged: raised, it would end the executor and every decision after
    it; it is logged, counted as node_error, and the next tick decides."""
    errors, skipped = [], []
    node = in_process_node(rclpy_context)
    try:
        logger = {"error": lambda _, text: errors.append(text), "info": lambda _, text: skipped.append(text)}
        monkeypatch.setattr(node._throttle, "logger", type("L", (), logger)())
        real = node._fresh_samples

        def fail(*args):
            raise RuntimeError("dictionary changed size during iteration")

        node._fresh_samples = fail
        node._on_decision()
        assert errors == ["[node_error] decision tick failed: RuntimeError('dictionary changed size during iteration')"]
        assert node.invalid[("", "node_error")] == 1
        node._fresh_samples = real
        node._on_decision()  # all inputs absent: skipped as such, no error
        assert len(errors) == 1 and node.invalid[("", "node_error")] == 1
        assert len(skipped) == 3 and all(line.startswith("decision skipped: [absent]") for line in skipped)
    finally:
        node.destroy_node()


def test_a_rate_change_keeps_the_next_decision_unless_the_new_period_is_shorter(rclpy_context):
    """Every rate_hz change restarted the decision timer's period: a client setting it every 0.2 s
    at 2 Hz (a slider in rqt_reconfigure) let 1 decision through in 5 s instead of 10. The next
    call now stays where it was, unless the new period ends sooner."""
    from flashrt_ros.ros.node_parameters import _set_period

    node = in_process_node(rclpy_context, rate_hz=2.0)
    try:
        timer = node._decision_timer
        time.sleep(0.3)
        until = timer.time_until_next_call()
        assert until < 0.25e9
        _set_period(timer, round(1e9 / 2.01))  # a little faster: the next call stays put
        assert timer.time_until_next_call() <= until and timer.timer_period_ns == round(1e9 / 2.01)
        _set_period(timer, round(1e9 / 0.1))  # slower: the next call stays put, later ones 10 s apart
        assert timer.time_until_next_call() <= until
        timer.reset()  # 10 s to go; then 100 Hz: the period restarts now, the next call within 10 ms
        _set_period(timer, round(1e9 / 100))
        assert timer.time_until_next_call() <= 10_000_000
    finally:
        node.destroy_node()


def test_the_trajectory_stamp_parameter_picks_where_a_chunk_starts(rclpy_context):
    """observation (default): the joint state's stamp, the time the policy computed the chunk for
    (a controller then skips what the latency passed); publication: now; zero: the controller's
    own "start now". Anything else is refused at start with the choices."""
    from types import SimpleNamespace

    from builtin_interfaces.msg import Time as TimeMsg

    from flashrt_ros.ros.inputs import Sample
    from flashrt_ros.ros.params import NodeConfig

    node = in_process_node(rclpy_context)
    try:
        joints = Sample(np.zeros(len(JOINTS), np.float32), TimeMsg(sec=12, nanosec=345), 0, 0)
        assert node.cfg.trajectory_stamp == "observation"
        assert node._chunk_stamp(joints, node.cfg) == TimeMsg(sec=12, nanosec=345)
        before = node.get_clock().now().nanoseconds
        published = stamp_ns(node._chunk_stamp(joints, node.cfg.with_values({"trajectory_stamp": "publication"})))
        assert before <= published <= node.get_clock().now().nanoseconds
        assert node._chunk_stamp(joints, node.cfg.with_values({"trajectory_stamp": "zero"})) == TimeMsg()
    finally:
        node.destroy_node()
    warned: list[str] = []
    node = in_process_node(rclpy_context)
    try:  # a joint state older than the chunk lasts: the whole chunk is past, a controller refuses it
        node._throttle.logger = SimpleNamespace(warning=warned.append)
        now = node.get_clock().now().nanoseconds
        old = TimeMsg(sec=(now - 700_000_000) // 1_000_000_000, nanosec=(now - 700_000_000) % 1_000_000_000)
        assert node._warn_if_ended(old, 500_000_000, node.cfg)  # 0.5 s of actions from 0.7 s ago
        assert len(warned) == 1 and warned[0].startswith("[chunk_ended] published a chunk that ended 2"), warned
        assert "a controller refuses it" in warned[0] and node.invalid[("", "chunk_ended")] == 1
        assert not node._warn_if_ended(old, 900_000_000, node.cfg)  # still running: nothing said
        assert not node._warn_if_ended(TimeMsg(), 500_000_000, node.cfg.with_values({"trajectory_stamp": "zero"}))
        assert len(warned) == 1 and node.invalid[("", "chunk_ended")] == 1
        # published whole, the ended chunk: the arm goes on with the one before, which stays the
        # chunk a pause holds the controllers in and rtc guides the next one to
        running = SimpleNamespace(actions=np.zeros((10, len(JOINTS)), np.float32), chunk_id=1, prefix_frames=None)
        running.prefix_reused = False
        fresh = TimeMsg(sec=now // 10**9, nanosec=now % 10**9)
        joints = Sample(np.zeros(len(JOINTS), np.float32), fresh, 0, 0)
        node._publish(running, [Sample(None, fresh, 0, 0)] * (len(node.slots) - 1) + [joints], 1.0, node.cfg)
        before = node._executing
        assert before is not None and node._last_trajectory is before
        ended = SimpleNamespace(actions=np.ones((10, len(JOINTS)), np.float32), chunk_id=2, prefix_frames=None)
        ended.prefix_reused = False
        old_joints = Sample(np.zeros(len(JOINTS), np.float32), old, 0, 0)
        node._publish(ended, [Sample(None, old, 0, 0)] * (len(node.slots) - 1) + [old_joints], 1.0, node.cfg)
        assert node.invalid[("", "chunk_ended")] == 2
        assert node._executing is before and node._last_trajectory is before
    finally:
        node.destroy_node()
    problems = NodeConfig(trajectory_stamp="now").validate(check_paths=False)
    assert problems == ["trajectory_stamp must be one of observation, publication, zero, got 'now'"]


def test_trajectory_groups_publish_each_controllers_joints(rclpy_context):
    """A controller that owns some of the joints (one per arm) refuses a trajectory naming others:
    each group's topic gets its joints' columns, in the group's order, with the chunk's stamp and
    times; ~/joint_trajectory keeps them all."""
    from types import SimpleNamespace

    import rclpy
    from builtin_interfaces.msg import Time as TimeMsg
    from rclpy.executors import SingleThreadedExecutor
    from trajectory_msgs.msg import JointTrajectory

    from flashrt_ros.ros.inputs import Sample

    groups = ["/arm_a/joint_trajectory=j2, j0", "/arm_b/joint_trajectory=j3"]
    node = in_process_node(rclpy_context, trajectory_groups=groups)
    listener = rclpy.create_node("group_listener", context=rclpy_context)
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(listener)
    got: dict[str, list] = {"/arm_a/joint_trajectory": [], "/arm_b/joint_trajectory": []}
    try:
        for topic, store in got.items():
            listener.create_subscription(JointTrajectory, topic, store.append, 10)
        actions = np.arange(10 * len(JOINTS), dtype=np.float32).reshape(10, len(JOINTS))
        stamp = TimeMsg(sec=7)
        samples = [Sample(None, stamp, 0, 0) for _ in node.slots[:-1]] + [Sample(np.zeros(len(JOINTS)), stamp, 0, 0)]
        deadline = time.monotonic() + 10.0
        while not all(got.values()) and time.monotonic() < deadline:  # until both subscriptions matched
            decision = SimpleNamespace(actions=actions, chunk_id=1, prefix_reused=False, prefix_frames=None)
            node._publish(decision, samples, 1.0, node.cfg)
            executor.spin_once(timeout_sec=0.1)
        (a, *_), (b, *_) = got.values()
        assert list(a.joint_names) == ["j2", "j0"] and list(b.joint_names) == ["j3"]
        assert a.header.stamp == stamp == b.header.stamp
        np.testing.assert_array_equal([p.positions for p in a.points], actions[:, [2, 0]])
        np.testing.assert_array_equal([p.positions for p in b.points], actions[:, [3]])
        assert [stamp_ns(p.time_from_start) for p in b.points] == [(i + 1) * 50_000_000 for i in range(10)]
    finally:
        executor.shutdown()
        listener.destroy_node()
        node.destroy_node()


def test_the_warm_up_is_said_and_one_that_broke_the_gpu_stops_the_start(monkeypatch) -> None:
    """`warm_up` (the node's, in `build_pipeline_state`): its time on the configured cameras and
    size; a failure said, not raised (the live decisions are refused by name); one that left the
    GPU broken a StartupError, since every decision after it would fail."""
    from flashrt_ros.engine.pipeline import DeviceUnusable, Pipeline
    from flashrt_ros.policies.policy import default_policy
    from flashrt_ros.ros.params import NodeConfig
    from flashrt_ros.ros.startup import StartupError, warm_up

    cfg = dataclasses.replace(NodeConfig(), image_height=24, image_width=32)
    pipeline = Pipeline(default_policy(num_views=len(cfg.camera_topics), action_dof=len(cfg.output_joint_names)))
    assert re.fullmatch(r"\d+\.\d ms on 3 black 24x32 frames", warm_up(pipeline, cfg))

    def refused(*_):
        raise ValueError("state must be a vector of at most 32 values")

    monkeypatch.setattr(pipeline, "warm_up", refused)
    said = warm_up(pipeline, cfg)
    assert said.startswith("failed (ValueError: state must be a vector of at most 32 values)"), said

    def broke(*_):
        raise DeviceUnusable("the warm-up decision failed (...) and left the GPU unusable (...): restart the process")

    monkeypatch.setattr(pipeline, "warm_up", broke)
    with pytest.raises(StartupError, match="left the GPU unusable"):
        warm_up(pipeline, cfg)


def test_hung_is_ten_times_two_periods_as_documented(rclpy_context):
    """docs/ros.md: 'past 10 times the longer of two periods and the slowest recent decision'.
    The factor itself, not HUNG_FACTOR times something (any value of the constant passed that)."""
    node = in_process_node(rclpy_context)  # rate_hz 10
    try:
        node._decision_s.extend([0.05] * 8)
        assert node._hung_after_s() == pytest.approx(2.0)
        node._decision_s.extend([0.5] * 8)
        assert node._hung_after_s() == pytest.approx(5.0)
    finally:
        node.destroy_node()


def test_no_decision_error_waits_one_status_period(rclpy_context):
    """docs/ros.md: the idle ERROR comes once no decision ran for the longest of two periods, ONE
    status period, and twice the slowest decision: at 0.5 Hz status, not 0.2 s."""
    from diagnostic_msgs.msg import DiagnosticStatus

    node = in_process_node(rclpy_context, status_rate_hz=0.5)  # rate_hz 10: two periods 0.2 s, status period 2 s
    try:
        assert node._idle_limit_s() == pytest.approx(2.0)
        past_start(node)
        node._last_decision_at = time.monotonic() - 1.0
        level, message = node._health(*node._snapshot_with_baseline(advance=True))
        assert level != DiagnosticStatus.ERROR, message
    finally:
        node.destroy_node()
