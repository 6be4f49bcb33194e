"""Notices when ROS time stops moving: `use_sim_time` with nothing on /clock, or a paused
simulator. Decisions run on ROS time, so they stop too; the status timer runs on the steady
clock and says why, instead of going silent with them. No rclpy here: the node passes times in.
"""

from __future__ import annotations

from dataclasses import dataclass

CLOCK_STALLED = "clock_stalled"
"""Node-wide reason, counted once per stall: ROS time (simulated) stopped advancing."""
CLOCK_JUMPED_BACK = "clock_jumped_back"
"""Node-wide reason, counted per jump: ROS time (simulated) went back, a simulator reset or a bag
loop; the held inputs and chunks, stamped on the old timeline, were dropped."""


@dataclass
class ClockWatch:
    """Tracks the last ROS time seen and the steady time at which it last moved."""

    stall_after_s: float = 1.0
    _seen_ns: int | None = None
    _moved_at_s: float = 0.0
    stalled: bool = False

    def update(self, ros_ns: int, steady_s: float) -> bool:
        """Record one reading; True when this reading starts a stall (count it once)."""
        if ros_ns != self._seen_ns:
            self._seen_ns, self._moved_at_s, self.stalled = ros_ns, steady_s, False
            return False
        if not self.stalled and steady_s - self._moved_at_s >= self.stall_after_s:
            self.stalled = True
            return True
        return False

    def stalled_for_s(self, steady_s: float) -> float:
        return steady_s - self._moved_at_s if self.stalled else 0.0

    def describe(self, steady_s: float) -> str:
        never = self._seen_ns == 0
        return f"ROS time (use_sim_time) has not advanced for {self.stalled_for_s(steady_s):.1f} s" + (
            " and was never set: is anything publishing /clock?" if never else ": simulator paused or /clock stopped?"
        )
