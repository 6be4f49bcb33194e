"""The node's sensor and prompt callbacks: each message converted and judged where it arrives,
the good ones held per topic for the next decision, the bad ones counted and logged."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from builtin_interfaces.msg import Time
from rclpy.parameter import Parameter
from rclpy.qos import QoSPolicyKind
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

from flashrt_ros.ros.image_convert import check_frame_size
from flashrt_ros.ros.input_error import STALE, InputError
from flashrt_ros.ros.inputs import InputSlot, Sample
from flashrt_ros.ros.joint_convert import joint_state_to_vector, stamp_to_ns
from flashrt_ros.ros.params import check_update, node_resolver
from flashrt_ros.ros.qos_mismatch import Found, incompatible, output_subscriber_mismatch, prompt_publisher_mismatch
from flashrt_ros.ros.reasons import INCOMPATIBLE_SUBSCRIBER, INVALID_PROMPT, MAX_PROMPT_CHARS


class InputCallbacks:
    """A part of FlashRTNode (ros/node.py): its attributes are the node's."""

    def _on_image(self, convert: Callable, slot: InputSlot, msg: Image | CompressedImage) -> None:
        arrived = time.perf_counter_ns()
        cfg = self.cfg
        generation = self._generation(slot)  # a ~/reset while this frame is converted drops it (_accept)
        try:
            now_ns = self._check_stamp(msg.header.stamp, slot.topic, cfg.max_age_s)
            gap_s, held_hw = self._held_frame_size(slot, msg.header.stamp, now_ns)
            # the held size goes to the converter so that another size is refused from the header,
            # before a compressed frame is decoded (8000x8000 PNGs at 10 Hz cut the decisions 5x)
            rgb = convert(msg, expected_hw=cfg.expected_hw, held_hw=held_hw, source=slot.topic)
            hw = rgb.shape[:2]
            check_frame_size(hw, held_hw, self.state.pipeline.policy.frame_problem(*hw), slot.topic)
        except InputError as err:
            self._reject(slot, err)
            return
        pool = self.state.pipeline.frame_pool  # on a GPU: the decision's upload becomes a queued copy
        if pool is not None:
            rgb = pool.copy(rgb)
        sample = Sample(rgb, msg.header.stamp, arrived, time.perf_counter_ns())
        previous = self._accept(slot, sample, frame_hw=hw, generation=generation)
        if previous not in (None, hw):
            self.get_logger().info(
                f"{slot.topic}: frames are now {hw[0]}x{hw[1]} (were {previous[0]}x{previous[1]}), stamped "
                f"{gap_s:.1f} s after its previous frame: taken as a camera restart"
            )

    def _held_frame_size(self, slot: InputSlot, stamp: Time, now_ns: int) -> tuple[float, tuple[int, int] | None]:
        """How long after the newest frame the camera sent before this one is stamped, and the
        size this one must have (None: any). A camera keeps the size it has been sending: a change
        mid-stream is a fault; a frame stamped more than max_age_s after every earlier one is a
        restart (e.g. a new driver profile) and may bring a new size. Judged by the publisher's
        stamps, not by arrival: the node's own slow processing delays arrivals while the camera
        goes on. Every frame with a usable stamp checked against the held size counts, taken or
        refused (a camera that goes on sending a wrong size has no gap); after a gap, only a frame
        taken closes it (`_accept`): a restarted camera's first frame, refused as truncated, must not
        hold the next ones to the old size. Only the newest counts (a frame stamped in the past
        opens no gap); unusable stamps were refused by check_fresh before this. A newest stamp further
        ahead of the clock than any stamp is let in (sim time jumped back: a simulator reset, a bag
        loop) is no history; one ahead by less is a camera whose clock runs a little early."""
        stamp_ns = stamp_to_ns(stamp)
        newest_ns = slot.newest_frame_stamp_ns  # the newest such stamp; 0 since start or ~/reset
        if self._clock_jumped_back(newest_ns, now_ns):
            newest_ns = 0
        gap_s = (stamp_ns - newest_ns) / 1e9 if newest_ns else math.inf
        if gap_s > self.cfg.max_age_s:  # any size; open until a frame is taken
            slot.newest_frame_stamp_ns = newest_ns  # 0 where the clock went back: no history
            return gap_s, None
        slot.newest_frame_stamp_ns = max(newest_ns, stamp_ns)  # one callback at a time per topic
        return gap_s, slot.frame_hw

    def _on_joint_state(self, slot: InputSlot, msg: JointState) -> None:
        arrived = time.perf_counter_ns()
        generation = self._generation(slot)  # a ~/reset from here on drops this sample, as for a frame
        cfg = self.cfg
        try:
            self._check_stamp(msg.header.stamp, slot.topic, cfg.max_age_s)
            state = joint_state_to_vector(msg, cfg.joint_names, source=slot.topic)
        except InputError as err:
            self._reject(slot, err)
            return
        self._accept(slot, Sample(state, msg.header.stamp, arrived, time.perf_counter_ns()), generation=generation)

    def _generation(self, slot: InputSlot) -> int:
        """The slot's generation as a message's handling starts, after any jump of ROS time back
        is settled: settled later, in `_accept`, it would drop this message as from before it."""
        if self._inputs_epoch != self._time_epoch:  # rare: not a lock per message for it
            with self._lock:
                self._settle_jump_inputs()
        return slot.generation

    def _accept(
        self,
        slot: InputSlot,
        sample: Sample,
        frame_hw: tuple[int, int] | None = None,
        generation: int | None = None,
    ) -> tuple[int, int] | None:
        """Store a good sample as its topic's latest, unless it is older than the one held. A
        camera's frame size (`frame_hw`) is taken with its sample, in one step under the lock, so
        that a frame refused here changes nothing; a frame whose conversion began before a
        `~/reset` (`generation`) is dropped, so the reset clears what it says. Returns the size the
        camera had before (None when nothing was stored, or no size was held)."""
        with self._lock:
            self._settle_jump_inputs()  # first: a sample held from before ROS time went back goes
            older = self._older_than_held(slot, sample)
            if older is None:
                if generation is not None and generation != slot.generation:
                    return None
                if not slot.used and self.enabled:  # paused, no decision is there to take it
                    self.dropped_inputs += 1
                slot.latest, slot.used = sample, not self.enabled  # held while paused: no decision is owed it
                previous = slot.frame_hw
                if frame_hw is not None:  # a camera's frame: its size, and the end of a gap (_held_frame_size)
                    slot.frame_hw = frame_hw
                    slot.newest_frame_stamp_ns = max(slot.newest_frame_stamp_ns, stamp_to_ns(sample.stamp))
                slot.rejected_since_good.clear()
                self.conversion_stats.add({slot.topic: (sample.ready_ns - sample.arrived_ns) / 1e6})
                return previous
        self._reject(slot, older)
        return None

    def _older_than_held(self, slot: InputSlot, sample: Sample) -> InputError | None:
        """A sample stamped before the one already held (two publishers on a topic, or a
        reordered message): replacing the held one would feed the policy older data than it had.
        A held stamp further ahead of the clock than any stamp is let in (sim time jumped back, a
        bag loop) does not count: the new sample is then the one that fits the clock."""
        held = slot.latest
        if held is None:
            return None
        held_ns, new_ns = stamp_to_ns(held.stamp), stamp_to_ns(sample.stamp)
        if new_ns >= held_ns or self._clock_jumped_back(held_ns, self.get_clock().now().nanoseconds):
            return None
        # under sim time, a simulator reset's first messages can come before the /clock that moves
        # the clock back: then the held sample goes with the jump, and this is the only one refused
        reset = ", or ROS time about to go back: a simulator reset" if self.get_clock().ros_time_is_active else ""
        return InputError(
            STALE,
            slot.topic,
            f"stamp is {(held_ns - new_ns) / 1e9:.3f} s older than the sample already held; the newer one is "
            f"kept (two publishers on this topic, or a reordered message{reset}?)",
        )

    def _clock_jumped_back(self, stamp_ns: int, now_ns: int) -> bool:
        """Whether a stamp taken earlier is now further ahead of the clock than check_fresh lets
        any stamp be (max_age_s): only a clock that went back (sim time) puts it there. A stamp
        ahead by less is a publisher's clock running early, and its history still counts."""
        return stamp_ns > now_ns + self.cfg.max_age_s * 1e9

    def _reject(self, slot: InputSlot, err: InputError) -> None:
        with self._lock:
            self.invalid[(slot.topic, err.reason)] += 1
            slot.rejected_since_good[err.reason] += 1
            held = slot.latest
        keep = (
            "no good message held yet"
            if held is None
            else f"keeping the previous good message ({_stamp_str(held.stamp)})"
        )
        self._throttle(("rejected", slot.topic, err.reason), "warning", f"input rejected: {err}; {keep}")

    def _incompatible_prompt_publishers(self, topic: str) -> Found:
        ours = self._prompt_sub.qos_profile
        return incompatible(self.get_publishers_info_by_topic(topic), partial(prompt_publisher_mismatch, ours))

    def _on_incompatible_prompt_publisher(self, topic: str, event: Any) -> None:
        """Publishers on prompt_topic that this subscription cannot match: their prompts never
        arrive, so each is said with the policy that differs (qos_mismatch.py)."""
        self._prompt_mismatches.on_event(topic, event.total_count, QoSPolicyKind(event.last_policy_kind))

    def _say_prompt_mismatch(self, topic: str, node: str | None, policy: QoSPolicyKind, total: int) -> None:
        if policy == QoSPolicyKind.DURABILITY:
            fix = "publish them transient_local, or set prompt_durability volatile"
            what = f"its durability does not match prompt_durability {self.cfg.prompt_durability!r}"
        elif policy == QoSPolicyKind.RELIABILITY:
            fix, what = "publish them reliable (an instruction must not be lost)", "it is best effort"
        else:
            fix, what = "match the subscription's QoS", f"its {policy.name.lower()} policy does not match"
        who = f"{node}'s: " if node else ""
        self.get_logger().warning(
            f"a publisher on {topic} cannot be received ({who}{what}; {total} such so far): its "
            f"prompts do not arrive; {fix}"
        )

    def _on_incompatible_subscriber(self, topic: str, event: Any) -> None:
        """A subscriber on an output that cannot match its publisher (reliable, volatile, no
        deadline): it receives nothing - a controller latched on transient_local gets no chunk, no
        trajectory, no command. Counted on the topic, and each such subscriber named with the fix."""
        if event.total_count_change <= 0:
            return
        with self._lock:
            if self.is_set_up:
                self.invalid[(topic, INCOMPATIBLE_SUBSCRIBER)] += event.total_count_change
        self._subscriber_mismatches.on_event(topic, event.total_count, QoSPolicyKind(event.last_policy_kind))

    def _incompatible_subscribers(self, topic: str) -> Found:
        return incompatible(self.get_subscriptions_info_by_topic(topic), output_subscriber_mismatch)

    def _say_subscriber_mismatch(self, topic: str, node: str | None, policy: QoSPolicyKind, total: int) -> None:
        if node is None:
            why = f"its {policy.name.lower()} policy does not match"
            fix = "subscribe reliable or best effort, volatile, with no deadline or liveliness lease"
        elif policy == QoSPolicyKind.DURABILITY:
            why, fix = (
                f"{node} subscribes transient_local",
                "subscribe volatile (each message is published once, for now)",
            )
        elif policy == QoSPolicyKind.DEADLINE:
            why, fix = f"{node} asks for a deadline", "subscribe with no deadline (decisions come at rate_hz)"
        else:
            why, fix = f"{node} asks for a liveliness lease", "subscribe with automatic liveliness and no lease"
        self.get_logger().warning(
            f"[{INCOMPATIBLE_SUBSCRIBER}] a subscriber on {topic} receives nothing ({why}; {total} such so far): {fix}"
        )

    def _on_prompt(self, msg: String) -> None:
        """A task instruction on prompt_topic: set as the prompt parameter, so that it is checked,
        logged and shown by ros2 param get as any change; one that cannot be the prompt is
        refused with the reason and counted on the topic, and the prompt in force stays. Text the
        policy writes into the same prompt tokens (a planner's trailing newline) changes nothing;
        the same refused text again is counted without being checked again."""
        text = msg.data
        if self.stopping.is_set() or text == self.cfg.prompt:
            return
        topic = self._prompt_sub.topic_name
        if text == self._refused_prompt[0]:
            reason = self._refused_prompt[1]
        elif len(text) > MAX_PROMPT_CHARS:  # before tokenizing it (a 1 M-character message took ~0.5 s)
            reason = f"it is {len(text)} characters; expected at most {MAX_PROMPT_CHARS}"
        elif self.state.pipeline.policy.same_prompt(text, self.cfg.prompt):
            return
        else:
            reason = check_update(self.cfg, {"prompt": text}, resolve=node_resolver(self))
            reason = reason or self.state.pipeline.policy.prompt_problem(text, len(self.cfg.joint_names))
        if reason is None:
            result = self.set_parameters([Parameter("prompt", Parameter.Type.STRING, text)])[0]
            reason = None if result.successful else result.reason
        if reason is None:
            return
        self._refused_prompt = (text, reason)
        with self._lock:
            self.invalid[(topic, INVALID_PROMPT)] += 1
        shown_text = repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(text)} characters)"
        self._throttle(
            (INVALID_PROMPT, topic),
            "warning",
            f"prompt {shown_text} from {topic} refused: {reason}; the prompt stays {self.cfg.prompt!r}",
        )


def _stamp_str(stamp: Time) -> str:
    return f"stamp {stamp_to_ns(stamp) / 1e9:.3f}"
