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

from rclpy.qos import QoSPolicyKind

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
        if self.relook is not None:
            self.relook.reset() if waiting else self.relook.cancel()
