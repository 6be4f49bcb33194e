"""ROS time going back (a simulator reset, a bag loop) or jumping forward, and a stalled /clock:
what the node drops, refuses and counts for them."""

from __future__ import annotations

import time

from builtin_interfaces.msg import Time
from rclpy.clock import TimeJump

from flashrt_ros.ros.clock_watch import CLOCK_JUMPED_BACK, CLOCK_STALLED, ClockWatch
from flashrt_ros.ros.input_error import STALE, InputError
from flashrt_ros.ros.joint_convert import check_fresh, stamp_to_ns
from flashrt_ros.ros.reasons import TICK_REPEAT_S


class RosTimeJumps:
    """A part of FlashRTNode (ros/node.py): its attributes are the node's."""

    def _on_time_jump(self, jump: TimeJump) -> None:
        """ROS time went back (use_sim_time: a simulator reset, a bag loop), or forward by
        MIN_JUMP_FORWARD_S or more (counted only: no decision's length spans it). The held samples, the
        chunk executing and the commands are stamped on the timeline before the jump: acted on,
        they would pass as fresh for as long as the jump (up to max_age_s ahead is let in). They
        are dropped, as by ~/reset but keeping the counters, chunk ids and noise, when the inputs
        and the commands are next used (`_settle_jump_inputs`, `_settle_jump_commands`); a decision
        under way is not published. rcl calls this while it walks the clock's callbacks, on the
        thread that sets the time: it takes no lock and waits on nothing, so that no other thread
        runs (and adds or removes a timer's callback) in the middle of the walk."""
        back_ns = -jump.delta.nanoseconds
        if back_ns <= 0:  # forward by MIN_JUMP_FORWARD_S or more: only the decisions' lengths care
            now_s, before, step_ns = time.monotonic(), self._last_step_forward, -back_ns
            self._last_step_forward = now_s, step_ns
            regular = before is not None and now_s - before[0] < TICK_REPEAT_S
            if not (regular and before[1] <= 2 * step_ns <= 4 * before[1]):  # else a coarse /clock's tick
                self._jumps_forward += 1
            return
        self._jump_back_ns = back_ns
        self._jump_to_ns = self.get_clock().now().nanoseconds
        self._jump_from_ns = self._jump_to_ns + back_ns
        self._jumps_back_ns.append(back_ns)
        self._time_epoch += 1  # last: whoever sees the new epoch sees the rest

    def _settle_jump_inputs(self) -> None:
        """After ROS time went back: the held samples go, the jumps are counted and logged. With
        self._lock held, by whatever reads or stores a sample next."""
        if self._inputs_epoch == self._time_epoch:
            return
        self._inputs_epoch = self._time_epoch
        for slot in self.slots:
            slot.clear(self._timer_seconds(), by="ROS time went back")
        while self._jumps_back_ns:
            back_s = self._jumps_back_ns.popleft() / 1e9
            self.invalid[("", CLOCK_JUMPED_BACK)] += 1
            self.get_logger().warning(
                f"[{CLOCK_JUMPED_BACK}] ROS time went back {back_s:.3f} s (a simulator reset or a bag loop?): "
                "held inputs, the executing chunk and the commands dropped; deciding again on messages "
                "stamped on the new timeline"
            )

    def _settle_jump_commands(self) -> None:
        """After ROS time went back: the command stream, the executing chunk (rtc) and the last
        trajectory (a pause's hold point) go. With self._command_lock held, by the command tick, a
        decision, a publication or a pause."""
        if self._commands_epoch == self._time_epoch:
            return
        self._commands_epoch = self._time_epoch
        self._clear_commands()
        # a pause's hold point too: interpolated on the new clock, the last chunk would send the
        # arm back towards where it was before a simulator reset
        self._last_trajectory = None
        self._ended_since_hold = False

    def _check_stamp(self, stamp: Time, topic: str, max_age_s: float) -> int:
        """A message's stamp judged on the node's clock (fresh, and on its timeline after ROS time
        went back), or InputError; the clock's reading it was judged at."""
        now_ns = self.get_clock().now().nanoseconds
        check_fresh(stamp, now_ns, max_age_s, topic, on_arrival=True)
        self._check_timeline(stamp, now_ns, topic)
        return now_ns

    def _check_timeline(self, stamp: Time, now_ns: int, topic: str) -> None:
        """Soon after ROS time went back, a message still queued from before the jump is stamped
        ahead of the clock by about the jump; check_fresh lets it in when the jump was below
        max_age_s. Until the clock is back where it jumped from, a stamp ahead by more than half
        the jump is refused as from the old timeline (one on the new timeline is at most a little
        ahead)."""
        if now_ns >= self._jump_from_ns:
            return
        ahead_ns = stamp_to_ns(stamp) - now_ns
        if ahead_ns > self._jump_back_ns / 2:
            raise InputError(
                STALE,
                topic,
                f"stamped {ahead_ns / 1e9:.3f} s ahead of the clock, which went back {self._jump_back_ns / 1e9:.3f} s: "
                "a message from before the jump (queued across a simulator reset?); expected one stamped on the "
                "new timeline",
            )

    def _watch_ros_time(self) -> None:
        clock = self.get_clock()
        if not clock.ros_time_is_active:  # wall time: it always moves (use_sim_time may be off again)
            if self._clock_watch.stalled:
                self._clock_watch = ClockWatch()
            return
        if self._clock_watch.update(clock.now().nanoseconds, time.monotonic()):
            self._count_node_wide(CLOCK_STALLED)
            self.get_logger().warning(self._clock_watch.describe(time.monotonic()) + "; decisions wait for it")
