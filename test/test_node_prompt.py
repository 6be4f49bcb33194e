"""``prompt_topic`` over real DDS: a std_msgs/String message sets the prompt as ``ros2 param set``
does (the parameter shows it, the change is logged, decisions go on with it); one that cannot be
the prompt (empty, longer than the policy's prompt, or absurdly long) is refused with the reason,
counted as ``invalid_prompt`` on the topic, and the prompt in force stays."""

from __future__ import annotations

import pytest
from node_harness import running_node_and_peer

pytestmark = pytest.mark.ros

TOPIC = "task_instruction"


@pytest.fixture(scope="module")
def running(ros_env, ros_module_context, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node_prompt")
    with running_node_and_peer(ros_env, tmp, ros_module_context, prompt_topic=TOPIC) as (node, peer):
        from std_msgs.msg import String

        yield node, peer, peer.node.create_publisher(String, f"{peer.namespace}/{TOPIC}", 10)


def say(peer, publisher, text: str, until, seconds: float = 10.0) -> bool:
    """Publish ``text`` every pump tick (a publisher just made may not be matched yet) until ``until()``."""
    from std_msgs.msg import String

    return peer.pump(seconds, extra=lambda: publisher.publish(String(data=text)), until=until)


def test_a_message_sets_the_prompt_and_a_bad_one_is_refused(running):
    node, peer, publisher = running
    topic = peer.topic(TOPIC)
    line = node.wait_for_line("deciding at 10 Hz")
    assert f"prompt 'pick up the cube' (then each message on {topic})" in line, line

    mark = node.mark()
    changed = "parameters changed: prompt 'pick up the cube' -> 'fold the towel'"
    assert say(peer, publisher, "fold the towel", until=lambda: any(changed in ln for ln in node.lines[mark:]))
    assert peer.get_parameters("prompt") == ["fold the towel"]
    start = len(peer.chunks)
    assert peer.pump(5.0, until=lambda: len(peer.chunks) > start + 2), "decisions stopped after the change"
    mark = node.mark()
    say(peer, publisher, " fold the towel\n", until=lambda: False, seconds=0.5)  # a planner's spacing: the same tokens
    assert not [ln for ln in node.lines[mark:] if "parameters changed" in ln or "refused" in ln]
    assert peer.get_parameters("prompt") == ["fold the towel"]

    refusals = [
        ("", "prompt is empty"),
        ("stack " * 200, "expected a shorter instruction"),  # far beyond pi05_tiny's 96 prompt tokens
        ("x" * 5000, "it is 5000 characters; expected at most 4096"),
    ]
    for text, reason in refusals:
        peer.pump(0.6)  # past log_throttle_s (0.5 s): this refusal gets its own line
        before = peer.latest_counter(topic, "invalid_prompt")
        mark = node.mark()
        # until this refusal's own line: a late copy of the one before can take the throttle's turn
        said = lambda m=mark, r=reason: [ln for ln in node.lines[m:] if f"from {topic} refused: " in ln and r in ln]  # noqa: E731
        assert say(peer, publisher, text, until=lambda s=said: bool(s())), node.tail()
        line = said()[0]
        assert "the prompt stays 'fold the towel'" in line and "[WARN]" in line, line
        peer.wait_for_counter(topic, "invalid_prompt", above=before)
        assert peer.get_parameters("prompt") == ["fold the towel"]
    start = len(peer.chunks)
    assert peer.pump(5.0, until=lambda: len(peer.chunks) > start + 2), "decisions stopped after a refused prompt"
    peer.assert_chunks_from_good_data()


def test_a_best_effort_publisher_is_named(running):
    """The prompt subscription is reliable (an instruction must not be lost): a best-effort
    publisher cannot match it, whatever prompt_durability, and the node says why."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    node, peer, _ = running
    mark = node.mark()
    best_effort = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
    peer.node.create_publisher(String, f"{peer.namespace}/{TOPIC}", best_effort)
    line = node.wait_for_line(f"a publisher on {peer.topic(TOPIC)} cannot be received", since=mark)
    assert f"({peer.node.get_fully_qualified_name()}'s: it is best effort;" in line, line
    assert "publish them reliable" in line, line


def test_a_latched_prompt_reaches_a_node_started_after_it(ros_env, ros_module_context, tmp_path):
    """prompt_durability transient_local: the prompt a latched (transient_local) publisher sent
    before the node started is applied at start, as any message; a volatile publisher on the
    topic cannot match such a subscription, and the node says so."""
    import rclpy
    from node_harness import TEST_PARAMS, NodeProcess, Peer, new_namespace
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    namespace = new_namespace()
    planner = rclpy.create_node("planner", namespace=namespace, context=ros_module_context)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    planner.create_publisher(String, TOPIC, latched).publish(String(data="fold the towel"))
    params = {**TEST_PARAMS, "prompt_topic": TOPIC, "prompt_durability": "transient_local"}
    node = NodeProcess(ros_env, tmp_path, namespace, params)
    peer = Peer(ros_module_context, namespace)
    try:
        line = node.wait_for_line("deciding at 10 Hz", timeout=60.0)
        assert f"(then each message on {namespace}/{TOPIC}, a latched one too)" in line, line
        node.wait_for_line("parameters changed: prompt 'pick up the cube' -> 'fold the towel'")
        assert peer.get_parameters("prompt") == ["fold the towel"]
        mark = node.mark()
        volatile = planner.create_publisher(String, TOPIC, 10)
        best_effort = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
        planner.create_publisher(String, TOPIC, best_effort)
        # two causes at once: the middleware merges their events, whose last policy named one for both
        durability = node.wait_for_line("its durability does not match prompt_durability 'transient_local'", since=mark)
        assert f"a publisher on {namespace}/{TOPIC} cannot be received ({namespace}/planner's: " in durability
        assert "publish them transient_local" in durability and "[WARN]" in durability, durability
        reliability = node.wait_for_line(f"({namespace}/planner's: it is best effort;", since=mark)
        assert "publish them reliable" in reliability, reliability
        volatile.publish(String(data="open the drawer"))
        peer.pump(1.0)
        assert peer.get_parameters("prompt") == ["fold the towel"]
        said = [line for line in node.lines[mark:] if "cannot be received" in line]
        assert len(said) == 2, "\n".join(said)  # each publisher once, by name; no unnamed repeat
    finally:
        peer.close()
        code = node.stop()
        planner.destroy_node()
    assert code == 0, node.tail()


def test_a_mismatch_counted_before_the_graph_lists_it_is_named_when_listed_or_said_unnamed_once(
    rclpy_context, monkeypatch
):
    """One incompatible-QoS event can count a publisher the graph does not list yet: those listed
    are named at once, the node's timer looks again until the rest appear (named then, each
    once), and a count the graph never explains is said once, unnamed, by the event's policy,
    after DISCOVERY_S. The event here counts a publisher not made yet; the rest is real DDS."""
    import time
    from types import SimpleNamespace

    import rclpy
    from node_harness import in_process_node, new_namespace
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSPolicyKind, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    namespace = new_namespace()
    topic = f"{namespace}/{TOPIC}"
    node = in_process_node(rclpy_context, prompt_topic=topic, prompt_durability="transient_local")
    planner = rclpy.create_node("planner", namespace=namespace, context=rclpy_context)
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(node)
    said = []
    monkeypatch.setattr(node.get_logger(), "warning", lambda msg, **_: said.append(msg))

    def spin_until(done, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)

    try:
        planner.create_publisher(String, topic, 10)  # volatile: its durability cannot match
        spin_until(lambda: [i for i in node.get_publishers_info_by_topic(topic) if i.node_name == "planner"])
        event = SimpleNamespace(total_count=2, total_count_change=2, last_policy_kind=QoSPolicyKind.DURABILITY.value)
        node._on_incompatible_prompt_publisher(topic, event)
        assert len(said) == 1 and f"({namespace}/planner's: its durability does not match" in said[0], said
        assert not node._prompt_mismatches.relook.is_canceled()  # one counted is not listed: looking again
        planner.create_publisher(String, topic, QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
        spin_until(lambda: len(said) >= 2)  # the timer's look; the middleware's own event says nothing more
        assert len(said) == 2 and f"({namespace}/planner's: it is best effort;" in said[1], said
        spin_until(lambda: False, seconds=1.0)
        assert len(said) == 2 and node._prompt_mismatches.relook.is_canceled(), said

        # two listed before the event counting the first: both named at once, the second's own
        # event (the middleware's, while spinning) says nothing more
        planner.create_publisher(String, topic, 10)
        planner.create_publisher(String, topic, QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
        spin_until(lambda: len([i for i in node.get_publishers_info_by_topic(topic) if i.node_name == "planner"]) == 4)
        event = SimpleNamespace(total_count=3, total_count_change=1, last_policy_kind=QoSPolicyKind.DURABILITY.value)
        node._on_incompatible_prompt_publisher(topic, event)
        assert len(said) == 4 and "its durability" in said[2] + said[3] and "best effort" in said[2] + said[3], said
        spin_until(lambda: False, seconds=1.0)
        assert len(said) == 4 and node._prompt_mismatches.relook.is_canceled(), said

        event = SimpleNamespace(total_count=5, total_count_change=1, last_policy_kind=QoSPolicyKind.RELIABILITY.value)
        node._on_incompatible_prompt_publisher(topic, event)  # one the graph never lists
        assert len(said) == 4 and not node._prompt_mismatches.relook.is_canceled()
        node._prompt_mismatches._topics[topic].deadline = time.monotonic()  # DISCOVERY_S over
        spin_until(lambda: len(said) >= 5)
        assert len(said) == 5 and "cannot be received (it is best effort; 5 such so far)" in said[4], said
        node._on_incompatible_prompt_publisher(topic, event)
        spin_until(lambda: False, seconds=0.5)
        assert len(said) == 5 and node._prompt_mismatches.relook.is_canceled(), said
    finally:
        executor.shutdown()
        planner.destroy_node()
        node.destroy_node()
