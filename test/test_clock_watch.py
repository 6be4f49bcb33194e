"""ClockWatch: a stall of ROS time is noticed after stall_after_s of steady time, counted once,
and ends when ROS time moves again."""

from __future__ import annotations

from flashrt_ros.ros.clock_watch import ClockWatch


def test_a_stall_is_reported_once_and_ends_when_time_moves() -> None:
    watch = ClockWatch(stall_after_s=1.0)
    starts = [watch.update(0, t) for t in (0.0, 0.5, 0.99, 1.0, 1.5, 3.0)]
    assert starts == [False, False, False, True, False, False]
    assert watch.stalled and watch.stalled_for_s(3.0) == 3.0
    assert watch.describe(3.0) == (
        "ROS time (use_sim_time) has not advanced for 3.0 s and was never set: is anything publishing /clock?"
    )
    assert watch.update(5_000_000_000, 3.2) is False and not watch.stalled and watch.stalled_for_s(3.2) == 0.0
    assert [watch.update(5_000_000_000, t) for t in (3.5, 4.2, 4.5)] == [False, True, False]
    assert watch.describe(4.5).endswith("has not advanced for 1.3 s: simulator paused or /clock stopped?")


def test_moving_time_never_stalls() -> None:
    watch = ClockWatch(stall_after_s=0.5)
    assert not any(watch.update(i * 100, i * 0.4) for i in range(20)) and not watch.stalled
