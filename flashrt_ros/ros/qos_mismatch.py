"""Naming the endpoints behind an incompatible-QoS event: the planner whose prompts never arrive,
the controller that receives no chunk.

The middleware counts a topic's incompatible endpoints, merges events that come together (their
last policy then names one cause for all) and may raise one before this process's graph lists the
endpoint, or its node. So the endpoints are read from the graph and each is said once, by its
node and the policy that differs; while the graph lists fewer than the event counted, it is read
again on a steady timer (a callback that slept would hold its group: the parameter services,
the prompt), and after DISCOVERY_S the rest are said unnamed, by the event's last policy."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rclpy.duration import Duration, Infinite
from rclpy.qos import DurabilityPolicy, LivelinessPolicy, QoSPolicyKind, QoSProfile, ReliabilityPolicy

from flashrt_ros.ros.reasons import DISCOVERY_S

Found = dict[bytes, tuple[str, QoSPolicyKind]]
"""{endpoint gid: (its node's fully qualified name, the policy that differs)}."""


@dataclass
class _Topic:
    total: int = 0  # the middleware's count of incompatible endpoints
    last_policy: QoSPolicyKind = QoSPolicyKind.INVALID
    deadline: float = 0.0  # steady time after which the unnamed rest is said
    said: set[bytes] = field(default_factory=set)
    said_count: int = 0  # endpoints said, named or not; may run ahead of total (listed before counted)


class MismatchNamer:
    """Says each incompatible endpoint of some topics once. `find(topic)` lists the graph's
    incompatible endpoints whose node is known; `say(topic, node or None, policy, total)` logs
    one; `relook` is a canceled steady timer whose callback is `look`, set by the node once it
    has made the timer."""

    def __init__(self, find: Callable[[str], Found], say: Callable[[str, str | None, QoSPolicyKind, int], None]):
        self._find, self._say = find, say
        self._topics: dict[str, _Topic] = {}
        self.relook = None

    def on_event(self, topic: str, total: int, last_policy: QoSPolicyKind) -> None:
        state = self._topics.setdefault(topic, _Topic())
        state.total, state.last_policy = total, last_policy
        state.deadline = time.monotonic() + DISCOVERY_S
        self.look()

    def look(self) -> None:
        waiting = False
        for topic, state in self._topics.items():
            if state.said_count >= state.total:
                continue
            found = {gid: it for gid, it in self._find(topic).items() if gid not in state.said}
            state.said.update(found)
            state.said_count += len(found)
            for node, policy in found.values():
                self._say(topic, node, policy, state.total)
            if state.said_count < state.total and time.monotonic() >= state.deadline:
                state.said_count = state.total
                self._say(topic, None, state.last_policy, state.total)
            waiting = waiting or state.said_count < state.total
        if self.relook is None:
            return
        if waiting:
            self.relook.reset()
        else:
            self.relook.cancel()


def incompatible(endpoints: list, mismatch: Callable[[QoSProfile], QoSPolicyKind | None]) -> Found:
    """The graph's `endpoints` (TopicEndpointInfo) whose QoS `mismatch` finds a policy for, by
    gid; one listed before its node's name is left out (found again on the next look)."""
    found = {}
    for info in endpoints:
        policy, node = mismatch(info.qos_profile), _endpoint_node(info)
        if policy is not None and node is not None:
            found[bytes(info.endpoint_gid)] = (node, policy)
    return found


def prompt_publisher_mismatch(ours: QoSProfile, theirs: QoSProfile) -> QoSPolicyKind | None:
    """What keeps the prompt subscription (`ours`) from a publisher: a best-effort one's
    reliability; under transient_local, a volatile one's durability."""
    if theirs.reliability == ReliabilityPolicy.BEST_EFFORT and ours.reliability == ReliabilityPolicy.RELIABLE:
        return QoSPolicyKind.RELIABILITY
    if theirs.durability == DurabilityPolicy.VOLATILE and ours.durability == DurabilityPolicy.TRANSIENT_LOCAL:
        return QoSPolicyKind.DURABILITY
    return None


def output_subscriber_mismatch(theirs: QoSProfile) -> QoSPolicyKind | None:
    """What keeps a subscriber from the node's outputs (reliable, volatile, no deadline,
    automatic liveliness with no lease): a latched subscription, a deadline, a liveliness lease."""
    if theirs.durability == DurabilityPolicy.TRANSIENT_LOCAL:
        return QoSPolicyKind.DURABILITY
    if _limited(theirs.deadline):
        return QoSPolicyKind.DEADLINE
    if theirs.liveliness == LivelinessPolicy.MANUAL_BY_TOPIC or _limited(theirs.liveliness_lease_duration):
        return QoSPolicyKind.LIVELINESS
    return None


def _limited(period: Duration) -> bool:
    """A deadline or lease that is set: the graph lists an unset one as Infinite, a QoSProfile
    made here holds 0 (the middleware's default, also none)."""
    return period != Infinite and period.nanoseconds != 0


def _endpoint_node(info: object) -> str | None:
    """The fully qualified name of the node behind a graph endpoint; None while the graph lists the
    endpoint but not yet its node ("_NODE_NAME_UNKNOWN_")."""
    if "_UNKNOWN_" in info.node_name or "_UNKNOWN_" in info.node_namespace:
        return None
    return f"{info.node_namespace.rstrip('/')}/{info.node_name}"
