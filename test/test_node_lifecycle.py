"""``flashrt_lifecycle_node`` over real DDS, driven through its lifecycle services as ``ros2
lifecycle set`` drives it: unconfigured it publishes nothing; configured (inactive) it checks
inputs and reports status but decides nothing; active it publishes chunks from good data;
deactivated it stops the trajectory controllers and decides nothing more; cleanup takes the
pipeline away; a failed configure names the bad parameter and leaves it unconfigured; shutdown
ends the process with code 0."""

from __future__ import annotations

import re
import time

import pytest
from node_harness import JOINTS, NODE, TEST_PARAMS, NodeProcess, Peer, new_namespace, stamp_ns

from flashrt_ros.ros.node import NOT_CONFIGURED
from flashrt_ros.ros.params import NodeConfig

pytestmark = pytest.mark.ros

LIFECYCLE = "flashrt_ros.ros.lifecycle_node"


@pytest.fixture
def lifecycle_node(ros_env, ros_module_context, tmp_path):
    namespace = new_namespace()
    node = NodeProcess(ros_env, tmp_path, namespace, TEST_PARAMS, module=LIFECYCLE)
    peer = None
    try:
        peer = Peer(ros_module_context, namespace)
        node.wait_for_line("unconfigured, no policy loaded", timeout=60.0)
        yield node, peer
    finally:
        if peer is not None:
            peer.close()
        code = node.stop()  # SIGINT where the test left it running: a clean stop in any state
    assert code == 0, f"exit code {code}\n{node.tail()}"


def state(peer) -> str:
    from lifecycle_msgs.srv import GetState

    return peer.call(GetState, f"{peer.namespace}/{NODE}/get_state", GetState.Request()).current_state.label


def change(peer, transition: str) -> bool:
    """Trigger a transition by its label (configure, activate, ...), as `ros2 lifecycle set` does."""
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    ids = {
        "configure": Transition.TRANSITION_CONFIGURE,
        "activate": Transition.TRANSITION_ACTIVATE,
        "deactivate": Transition.TRANSITION_DEACTIVATE,
        "cleanup": Transition.TRANSITION_CLEANUP,
        "unconfigured_shutdown": Transition.TRANSITION_UNCONFIGURED_SHUTDOWN,
        "inactive_shutdown": Transition.TRANSITION_INACTIVE_SHUTDOWN,
        "active_shutdown": Transition.TRANSITION_ACTIVE_SHUTDOWN,
    }
    request = ChangeState.Request(transition=Transition(id=ids[transition]))
    return peer.call(ChangeState, f"{peer.namespace}/{NODE}/change_state", request, timeout=60.0).success


def service_available(peer, relative: str, timeout: float) -> bool:
    from std_srvs.srv import SetBool, Trigger

    srv = SetBool if relative == "enable" else Trigger
    client = peer.node.create_client(srv, f"{peer.namespace}/{NODE}/{relative}")
    try:
        return client.wait_for_service(timeout_sec=timeout)
    finally:
        peer.node.destroy_client(client)


def diagnostics_with(peer, start: int, text: str) -> list:
    return [d.status[0] for d in peer.diagnostics[start:] if text in d.status[0].message]


def test_lifecycle_transitions(lifecycle_node):
    from std_srvs.srv import Trigger

    node, peer = lifecycle_node
    assert state(peer) == "unconfigured"
    peer.pump(1.5)  # inputs arrive, but nothing is subscribed to them yet
    assert not peer.statuses and not peer.chunks and not peer.trajectories
    reset = peer.call(Trigger, f"{peer.namespace}/{NODE}/reset", Trigger.Request())
    assert not reset.success and reset.message == NOT_CONFIGURED  # the services answer from the start
    from flashrt_ros.srv import ListCapsules  # no capsules and no policy: said apart from an empty store

    listing = peer.call(ListCapsules, f"{peer.namespace}/{NODE}/capsule/list", ListCapsules.Request())
    assert (listing.success, listing.message, list(listing.names)) == (False, NOT_CONFIGURED, [])
    # a transition this state has not (by id, as a lifecycle manager sends them): refused, and the
    # node goes on (rclpy's RCLError ended the process)
    mark = node.mark()
    assert not change(peer, "activate") and state(peer) == "unconfigured"
    node.wait_for_line("change_state: transition 3 (by id) is not one of state unconfigured's: refused", since=mark)

    mark = node.mark()
    assert change(peer, "configure")
    assert state(peer) == "inactive"
    line = node.wait_for_line("configured (inactive)", since=mark)
    assert f"ros2 lifecycle set {peer.namespace}/{NODE} activate" in line, line
    start = len(peer.diagnostics)
    ready = "inactive (lifecycle) (no decisions): ready"
    assert peer.pump(10.0, until=lambda: bool(diagnostics_with(peer, start, ready)))
    values = {kv.key: kv.value for kv in diagnostics_with(peer, start, ready)[-1].values}
    assert values["enabled"] == "no (inactive: activate it)", values  # not ~/enable: it has none
    assert not peer.chunks and peer.statuses[-1].enabled is False and peer.statuses[-1].decisions == 0
    # activate / deactivate take the place of ~/enable, which this node does not offer
    assert service_available(peer, "reset", 10.0) and not service_available(peer, "enable", 1.0)
    refused = peer.set_parameters(camera_topics=["other/image_raw", "cam1/image_raw"])[0]
    assert not refused.successful and "on this lifecycle node: cleanup, set it, configure" in refused.reason

    assert change(peer, "activate") and state(peer) == "active"
    assert peer.pump(10.0, until=lambda: len(peer.chunks) >= 3)
    assert peer.pump(5.0, until=lambda: peer.statuses[-1].enabled is True)
    peer.assert_chunks_from_good_data()
    assert list(peer.chunks[0].joint_names) == JOINTS and peer.chunks[0].chunk_id == 1
    assert not change(peer, "configure") and state(peer) == "active"  # configure once autostarted, say

    trajectories = len(peer.trajectories)
    assert change(peer, "deactivate") and state(peer) == "inactive"
    deactivated_ns = peer.now().nanoseconds
    peer.pump(2.0)
    # no chunk decided on a joint state stamped after the reply; one hold point for the controllers
    assert not [c for c in peer.chunks if stamp_ns(c.header.stamp) > deactivated_ns]
    holds = [t for t in peer.trajectories[trajectories:] if len(t.points) == 1]
    assert len(holds) == 1, [len(t.points) for t in peer.trajectories[trajectories:]]
    assert peer.statuses[-1].enabled is False

    assert change(peer, "cleanup") and state(peer) == "unconfigured"
    node.wait_for_line("cleaned up (unconfigured)", since=mark)
    statuses = len(peer.statuses)
    peer.pump(1.5)
    assert len(peer.statuses) <= statuses + 1  # one may have been on its way
    reset = peer.call(Trigger, f"{peer.namespace}/{NODE}/reset", Trigger.Request())
    assert not reset.success and reset.message == NOT_CONFIGURED  # the services stay, and say so

    # unconfigured, any parameter may change; configure checks them and names what is wrong
    assert all(r.successful for r in peer.set_parameters(policy="nope", rate_hz=20.0))
    mark = node.mark()
    assert not change(peer, "configure")
    node.wait_for_line("configure failed, still unconfigured: invalid parameters", since=mark)
    node.wait_for_line("policy must be one of pi05, pi0, pi05_tiny, pi0_tiny, got 'nope'", since=mark)
    assert state(peer) == "unconfigured"

    assert peer.set_parameters(policy=NodeConfig().policy)[0].successful
    chunks = len(peer.chunks)
    assert change(peer, "configure") and change(peer, "activate")
    assert peer.pump(10.0, until=lambda: len(peer.chunks) >= chunks + 3)
    assert peer.chunks[chunks].chunk_id == 1  # a new pipeline: its ids start again (its warm-up used none)
    node.wait_for_line("deciding at 20 Hz", since=mark)
    warmed = node.wait_for_line("warm-up decision: ", since=mark)  # on the configured cameras and size
    assert re.search(r"warm-up decision: \d+\.\d ms on 2 black 24x32 frames$", warmed), warmed

    mark = node.mark()
    assert change(peer, "active_shutdown")
    assert node.proc.wait(15.0) == 0, node.tail()
    line = node.wait_for_line("deactivated for the shutdown: paused", since=mark)
    assert "the trajectory controllers are sent one point" in line and " from now on; " in line, line
    node.wait_for_line("shutting down from active; stats:", since=mark)


def test_shutdown_unconfigured_exits_cleanly(lifecycle_node):
    node, peer = lifecycle_node
    assert change(peer, "unconfigured_shutdown")
    assert node.proc.wait(15.0) == 0, node.tail()
    node.wait_for_line("shutting down from unconfigured")


def test_shutdown_from_inactive_exits_cleanly(lifecycle_node):
    node, peer = lifecycle_node
    assert change(peer, "configure")
    assert change(peer, "inactive_shutdown")
    assert node.proc.wait(15.0) == 0, node.tail()
    node.wait_for_line("shutting down from inactive; stats:")


@pytest.mark.parametrize("good", [True, False], ids=["configures-and-activates", "bad-parameter-stays-unconfigured"])
def test_autostart(ros_env, ros_module_context, tmp_path, good):
    """autostart: the node configures and activates itself (chunks flow, no transition called);
    a bad parameter stops it unconfigured with the reason, and a fixed one configures by hand."""
    params = {**TEST_PARAMS, "autostart": True, **({} if good else {"policy": "nope"})}
    node = NodeProcess(ros_env, tmp_path, new_namespace(), params, module=LIFECYCLE)
    peer = Peer(ros_module_context, node.namespace)
    try:
        node.wait_for_line("autostart: configure and activate follow", timeout=60.0)
        if good:
            assert peer.pump(60.0, until=lambda: len(peer.chunks) >= 3)
            assert state(peer) == "active"
            node.wait_for_line("configured (inactive): autostart activates it next")  # not the operator's to do
            assert not any("until activated" in line for line in node.lines), node.tail()
            peer.assert_chunks_from_good_data()
        else:
            node.wait_for_line("policy must be one of pi05, pi0, pi05_tiny, pi0_tiny, got 'nope'", timeout=60.0)
            node.wait_for_line("autostart: configure failed, staying unconfigured", timeout=10.0)
            assert state(peer) == "unconfigured"
            assert peer.set_parameters(policy=NodeConfig().policy)[0].successful
            assert change(peer, "configure") and state(peer) == "inactive"
    finally:
        peer.close()
        code = node.stop()
    assert code == 0, f"exit code {code}\n{node.tail()}"
    if good:  # stopped active by SIGINT: the arm held as on deactivate, before the stats line
        stopping = node.wait_for_line("stopping: the trajectory controllers are sent one point")
        assert node.lines.index(stopping) < node.lines.index(node.wait_for_line("shutting down; stats")), node.tail()


def test_autostart_with_start_enabled_false_configures_and_stays_inactive(ros_env, ros_module_context, tmp_path):
    """A paused start asked for (start_enabled false, as the launch argument gives it) is kept by
    autostart: configured and warm, inactive, nothing published, until the operator activates."""
    params = {**TEST_PARAMS, "autostart": True, "start_enabled": False}
    node = NodeProcess(ros_env, tmp_path, new_namespace(), params, module=LIFECYCLE)
    peer = Peer(ros_module_context, node.namespace)
    try:
        first = node.wait_for_line("unconfigured, no policy loaded; autostart:", timeout=60.0)
        assert first.endswith("configure follows (start_enabled false: it stays inactive until activated)"), first
        line = node.wait_for_line("autostart: start_enabled false: configured, staying inactive until", timeout=60.0)
        assert line.endswith(f"ros2 lifecycle set {node.namespace}/{NODE} activate"), line
        assert state(peer) == "inactive"
        assert not peer.pump(2.0, until=lambda: len(peer.chunks) > 0)
        assert change(peer, "activate")
        assert peer.pump(30.0, until=lambda: len(peer.chunks) >= 2)
    finally:
        peer.close()
        code = node.stop()
    assert code == 0, f"exit code {code}\n{node.tail()}"


def test_an_autostart_that_is_not_a_bool_is_refused_at_start(ros_env, tmp_path):
    """`autostart: 1` in a params file left the node unconfigured without a word: it is refused
    at start, exit 2, naming the value, as flashrt_node refuses a parameter of the wrong type."""
    node = NodeProcess(ros_env, tmp_path, new_namespace(), {**TEST_PARAMS, "autostart": 1}, module=LIFECYCLE)
    try:
        code = node.proc.wait(60.0)
    finally:
        node.stop()
    assert code == 2, node.tail()
    tail = node.tail()
    assert "not starting: invalid parameters:" in tail and "autostart must be true or false, got 1 (int)" in tail


def in_process_lifecycle_node(context, **params):
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.lifecycle_node import FlashRTLifecycleNode

    overrides = [Parameter(name, value=value) for name, value in {**TEST_PARAMS, **params}.items()]
    return FlashRTLifecycleNode(context=context, parameter_overrides=overrides)


def test_params_file_problems_are_judged_as_rcl_read_them_at_start(rclpy_context, tmp_path):
    """A configure that failed on the params files: each configure re-read the files from disk
    (never applied again by rcl) and judged the start's values against them. Setting the lost
    value never cleared it; fixing the file did, and the node then configured on the start's
    values (for a file with no section for it: the embedded defaults, random weights)."""
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.lifecycle_node import FlashRTLifecycleNode

    overlay, misspelt = tmp_path / "robot.yaml", tmp_path / "typo.yaml"
    overlay.write_text("/**/flashrt_node:\n  ros__parameters:\n    max_age_s: 0.25\n")
    misspelt.write_text("flashrt_nod:\n  ros__parameters:\n    rate_hz: 2.0\n")
    overrides = [Parameter(n, value=v) for n, v in {**TEST_PARAMS, "max_age_s": 1}.items()]  # the base file's 1
    node = FlashRTLifecycleNode(context=rclpy_context, parameter_overrides=overrides, sources=[("file", str(overlay))])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        ((name, problem),) = node._start_source_problems
        hint = "(or `ros2 param set /flashrt_node max_age_s <value>`, then configure)"
        assert name == "max_age_s" and problem.endswith(hint), problem
        overlay.write_text("/**/flashrt_node:\n  ros__parameters:\n    max_age_s: 1\n")  # rcl will not read it
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.set_parameters([Parameter("max_age_s", value=0.25)])[0].successful
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.cfg.max_age_s == 0.25
    finally:
        node.destroy_node()
    node = FlashRTLifecycleNode(context=rclpy_context, parameter_overrides=overrides, sources=[("file", str(misspelt))])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        ((_, problem),) = node._start_source_problems
        assert "has no section for this node /flashrt_node" in problem and "restart it with the file fixed" in problem
        misspelt.write_text("flashrt_node:\n  ros__parameters:\n    rate_hz: 2.0\n")
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE  # the start's defaults stay refused
    finally:
        node.destroy_node()


def test_a_configure_that_a_stop_signal_overtook_gives_no_activate_hint(rclpy_context):
    """Configured while SIGTERM came: the log said "stopping", then told the operator to activate
    a node on its way out."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    lines: list[str] = []
    logger = node.get_logger()

    class Recorder:
        def __getattr__(self, level):
            return lambda text, *a, **k: (lines.append(f"{level}: {text}"), getattr(logger, level)(text, *a, **k))

    node.get_logger = Recorder
    try:
        node.stopping.set()
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert any("a stop signal came meanwhile: stopping" in line for line in lines), lines
        assert not any("until activated" in line for line in lines), lines
    finally:
        node.destroy_node()


def test_a_shutdown_transition_that_comes_with_a_stop_signal_holds_the_arm_once(rclpy_context):
    """SIGINT with a shutdown transition under way (a launch's Ctrl-C and a lifecycle manager's
    shutdown): the transition's pause left the hold to the stop, and the stop, finding the node
    shut down, held nothing; the controllers played the rest of the last chunk out."""
    import threading

    import numpy as np
    from rclpy.lifecycle import TransitionCallbackReturn

    from flashrt_ros.engine.real_time_chunking import ExecutingChunk

    node = in_process_lifecycle_node(rclpy_context)
    try:
        assert node.trigger_configure() == node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        now_ns = node.get_clock().now().nanoseconds
        node._last_trajectory = ExecutingChunk(np.ones((10, len(JOINTS)), np.float32), now_ns, 50_000_000)
        holds = []
        node._publish_trajectories = lambda actions, *args: holds.append(actions)
        node._state_lock.acquire()  # a decision in flight
        shutdown = threading.Thread(target=node.trigger_shutdown)
        shutdown.start()
        time.sleep(0.3)  # the transition waits for the decision
        node.begin_shutdown()  # the signal: main's on_signal
        node._state_lock.release()
        shutdown.join(10.0)
        assert node.finalized.is_set()  # main's stop then holds nothing (lifecycle_node.main's on_stop)
        assert len(holds) == 1 and np.allclose(holds[0], 1.0), holds
    finally:
        node.destroy_node()


def test_an_rtc_setting_while_rtc_is_off_says_how_this_node_applies_rtc(rclpy_context, monkeypatch):
    """The warning told a lifecycle node's operator to restart the process; cleanup, set, configure
    does it (as the refusal of rtc itself says)."""
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    node = in_process_lifecycle_node(rclpy_context)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        said = []
        monkeypatch.setattr(node.get_logger(), "warning", lambda text, **_: said.append(text))
        assert node.state.pipeline.rtc is None  # TEST_PARAMS: rtc false
        assert node.set_parameters([Parameter("rtc_delay_steps", value=3)])[0].successful
        assert said == [
            "rtc_delay_steps changed, but real-time chunking is off (rtc false, read at start): they take effect once "
            "the node restarts with rtc true; on this lifecycle node: cleanup, set it, configure"
        ], said
    finally:
        node.destroy_node()


def test_cleanup_says_the_capsules_it_drops(rclpy_context, monkeypatch):
    """cleanup dropped the capsules without a word in its line (a restore after configure then
    found none)."""
    from rclpy.lifecycle import TransitionCallbackReturn

    node = in_process_lifecycle_node(rclpy_context)
    try:
        said = []
        monkeypatch.setattr(node.get_logger(), "info", lambda text, **_: said.append(text))
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        node.capsules.snapshot("before")
        assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
        assert said[-1] == (
            "cleaned up (unconfigured): the policy and its topics and timers are gone, and its 1 capsule(s)"
        ), said
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
        assert said[-1] == "cleaned up (unconfigured): the policy and its topics and timers are gone", said
    finally:
        node.destroy_node()


def counts(node) -> tuple[int, ...]:
    return tuple(len(list(entities)) for entities in (node.timers, node.subscriptions, node.publishers, node.services))


def test_a_failed_configure_lets_the_half_built_policy_go_before_memory_is_given_back(rclpy_context, monkeypatch):
    """A configure that fails after the weights are on the device (the fused build running out of
    memory): the error's traceback held the policy while the tear-down gave memory back, so the
    allocator kept it reserved afterwards. The policy is gone by then."""
    import gc
    import weakref

    from rclpy.lifecycle import TransitionCallbackReturn

    from flashrt_ros.engine import pipeline as pipeline_module
    from flashrt_ros.policies.policy import PolicySource

    built, alive_at_release = [], []
    build = PolicySource.build

    def tracked(self, *args, **kwargs):
        policy = build(self, *args, **kwargs)
        built.append(weakref.ref(policy))
        return policy

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    def release() -> None:
        gc.collect()
        alive_at_release.append([ref() is not None for ref in built])

    monkeypatch.setattr(PolicySource, "build", tracked)
    monkeypatch.setattr(pipeline_module, "Pipeline", out_of_memory)
    monkeypatch.setattr(pipeline_module, "release_device_memory", release)
    node = in_process_lifecycle_node(rclpy_context)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert alive_at_release == [[False]] and not node.is_set_up
    finally:
        node.destroy_node()


def test_cleanup_lets_the_policy_go_and_configure_builds_a_new_one(rclpy_context):
    """Nothing of ours keeps the pipeline after cleanup (its GPU memory can only come back if
    that holds; the GPU test in test_fused.py measures that part), and the callbacks the executor
    may still hold for the old topics and timers return without touching it."""
    import weakref

    from rclpy.lifecycle import TransitionCallbackReturn
    from std_srvs.srv import Trigger

    node = in_process_lifecycle_node(rclpy_context)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        policy = weakref.ref(node.state.pipeline.policy)
        decide, status = node._decision_timer.callback, node._status_timer.callback
        entities = counts(node)
        assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
        assert policy() is None and node.state is None
        decide(), status()  # a tick the executor took before the timers went: returns at once
        left = counts(node)
        # decision, status and the outputs' QoS re-look timers (no command timer, no prompt topic);
        # 2 cameras + joints; chunk, trajectory, status, diagnostics
        made = (3, 3, 4, 0)
        assert tuple(a - b for a, b in zip(entities, left, strict=True)) == made, (entities, left)
        (reset,) = [s for s in node.services if s.srv_name.endswith("/reset")]
        answer = reset.callback(Trigger.Request(), Trigger.Response())
        assert not answer.success and answer.message == NOT_CONFIGURED
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.state.pipeline.policy is not None and node.is_set_up
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS and node.enabled
    finally:
        node.destroy_node()
