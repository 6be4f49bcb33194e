"""Naming the endpoints behind an incompatible-QoS event (ros/qos_mismatch.py): which QoS keeps
an endpoint out, and each endpoint said once as the graph lists it. The node's use of it over
real DDS is in test_node.py (outputs) and test_node_prompt.py (the prompt)."""

from __future__ import annotations

import time

import pytest
from rclpy.duration import Duration
from rclpy.qos import (
    DurabilityPolicy,
    LivelinessPolicy,
    QoSPolicyKind,
    QoSProfile,
    ReliabilityPolicy,
)

from flashrt_ros.ros.qos_mismatch import (
    MismatchNamer,
    output_subscriber_mismatch,
    prompt_publisher_mismatch,
)


@pytest.mark.parametrize(
    ("qos", "expected"),
    [
        (QoSProfile(depth=1), None),
        (QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT), None),
        (QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL), QoSPolicyKind.DURABILITY),
        (QoSProfile(depth=1, deadline=Duration(seconds=1)), QoSPolicyKind.DEADLINE),
        (QoSProfile(depth=1, liveliness_lease_duration=Duration(seconds=2)), QoSPolicyKind.LIVELINESS),
        (QoSProfile(depth=1, liveliness=LivelinessPolicy.MANUAL_BY_TOPIC), QoSPolicyKind.LIVELINESS),
    ],
)
def test_what_keeps_a_subscriber_from_the_outputs(qos, expected):
    assert output_subscriber_mismatch(qos) == expected


def test_what_keeps_a_publisher_from_the_prompt():
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    volatile = QoSProfile(depth=1)
    best_effort = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
    assert prompt_publisher_mismatch(volatile, volatile) is None
    assert prompt_publisher_mismatch(latched, latched) is None
    assert prompt_publisher_mismatch(volatile, latched) is None  # a latched publisher serves a volatile reader
    assert prompt_publisher_mismatch(latched, volatile) == QoSPolicyKind.DURABILITY
    assert prompt_publisher_mismatch(volatile, best_effort) == QoSPolicyKind.RELIABILITY
    assert prompt_publisher_mismatch(latched, best_effort) == QoSPolicyKind.RELIABILITY


class _Timer:
    def __init__(self) -> None:
        self.canceled = True

    def reset(self) -> None:
        self.canceled = False

    def cancel(self) -> None:
        self.canceled = True


def test_each_endpoint_is_said_once_as_listed_and_the_rest_unnamed_after_the_wait():
    graph: dict[str, dict[bytes, tuple[str, QoSPolicyKind]]] = {"/a": {}, "/b": {}}
    said: list[tuple[str, str | None, QoSPolicyKind, int]] = []
    namer = MismatchNamer(lambda topic: dict(graph[topic]), lambda *line: said.append(line))
    namer.relook = _Timer()

    graph["/a"][b"1"] = ("/ctrl", QoSPolicyKind.DURABILITY)
    namer.on_event("/a", 2, QoSPolicyKind.DEADLINE)  # counts one the graph does not list yet
    assert said == [("/a", "/ctrl", QoSPolicyKind.DURABILITY, 2)] and not namer.relook.canceled
    namer.look()  # nothing new listed: nothing said again
    assert len(said) == 1 and not namer.relook.canceled
    graph["/a"][b"2"] = ("/viz", QoSPolicyKind.DEADLINE)
    namer.look()
    assert said[1:] == [("/a", "/viz", QoSPolicyKind.DEADLINE, 2)] and namer.relook.canceled

    # another topic's count the graph never explains: said once, unnamed, after DISCOVERY_S
    namer.on_event("/b", 1, QoSPolicyKind.LIVELINESS)
    assert len(said) == 2 and not namer.relook.canceled
    namer._topics["/b"].deadline = time.monotonic()
    namer.look()
    namer.look()
    assert said[2:] == [("/b", None, QoSPolicyKind.LIVELINESS, 1)] and namer.relook.canceled

    # a settled topic is not looked at again until its next event (another's look passes it by)
    graph["/a"][b"3"] = ("/late", QoSPolicyKind.DURABILITY)
    namer.on_event("/b", 1, QoSPolicyKind.LIVELINESS)
    assert said[3:] == [] and namer.relook.canceled
    namer.on_event("/a", 3, QoSPolicyKind.DURABILITY)
    assert said[3:] == [("/a", "/late", QoSPolicyKind.DURABILITY, 3)] and namer.relook.canceled
