"""Rolling stage statistics: percentiles over the window, and a rate that falls when a stage stops."""

from __future__ import annotations

import pytest

from flashrt_ros.engine.stats import RATE_SPAN_S, PipelineStats


def test_percentiles_and_steady_rate() -> None:
    stats = PipelineStats(window=100)
    for i in range(50):
        stats.add({"prefix": float(i), "denoise": 2.0 * i}, now=10.0 + 0.1 * i)  # 10 Hz
    prefix, denoise = stats.summaries(now=10.0 + 0.1 * 49 + 0.05)
    assert (prefix.name, prefix.count, denoise.name) == ("prefix", 50, "denoise")
    # 0..49 with linear interpolation: p50 between 24 and 25, p90 at 44.1, p99 at 48.51
    assert (prefix.p50_ms, prefix.p90_ms, prefix.p99_ms) == pytest.approx((24.5, 44.1, 48.51))
    assert prefix.rate_hz == pytest.approx(10.0) and denoise.rate_hz == pytest.approx(10.0)


def test_rate_falls_when_the_stage_stops() -> None:
    stats = PipelineStats(window=100)
    for i in range(11):
        stats.add({"denoise": 1.0}, now=0.1 * i)  # 10 Hz for 1 s, then nothing
    rates = [stats.summaries(now=t)[0].rate_hz for t in (1.05, 2.0, 10.9, 11.1)]
    assert rates[0] == pytest.approx(10.0)
    assert rates[1] == pytest.approx(10 / 1.9) and rates[2] == pytest.approx(10 / 10.8)
    assert rates[3] == 0.0  # nothing completed in the last 10 s


def test_window_keeps_the_latest() -> None:
    stats = PipelineStats(window=4)
    for i in range(10):
        stats.add({"x": float(i)}, now=float(i))
    (x,) = stats.summaries(now=9.5)
    assert x.count == 10 and x.p50_ms == pytest.approx(7.5) and x.rate_hz == pytest.approx(1.0)


def test_rates_are_read_on_the_given_clock():
    """A node under sim time rates its stages on ROS time: 10 completions 0.1 s apart on the
    given clock are 10 Hz, however much wall time passed."""
    now = [100.0]
    stats = PipelineStats(window=50, clock=lambda: now[0])
    for _ in range(10):
        stats.add({"prefix": 1.0})
        now[0] += 0.1
    now[0] -= 0.1  # read at the last completion
    (summary,) = stats.summaries()
    assert summary.rate_hz == pytest.approx(10.0)


def test_a_clock_that_goes_back_starts_the_rate_afresh() -> None:
    """Sim time reset to 0 (or a bag loop) after 20 s at 10 Hz: the completions from before are on
    another timeline. The rate read 0 Hz (a negative span) or mixed both timelines (17 Hz two
    seconds after a 7 s jump) until they left the window; it must read the new 10 Hz at once, and
    0 between the jump and the first completions after it. Latencies keep their window."""
    now = [0.0]
    stats = PipelineStats(window=200, clock=lambda: now[0])
    for _ in range(200):
        now[0] += 0.1
        stats.add({"decision": 1.0})
    assert stats.summaries()[0].rate_hz == pytest.approx(10.0)
    now[0] = 13.0  # jumped back 7 s, no completion yet
    assert stats.summaries()[0].rate_hz == 0.0
    for _ in range(20):
        now[0] += 0.1
        stats.add({"decision": 2.0})
    (summary,) = stats.summaries()
    assert summary.rate_hz == pytest.approx(10.0)
    assert summary.count == 220 and summary.p50_ms == 1.0


def test_a_new_rate_shows_within_the_rate_span() -> None:
    """10 Hz for 100 s, then 2 Hz: the rate reads 2 Hz once RATE_SPAN_S of the new rate has
    passed, although the 200-decision window still holds 10 Hz completions (it would take 100 s
    at 2 Hz to flush them), and the latencies keep their whole window."""
    stats = PipelineStats(window=200)
    t = 0.0
    for _ in range(1000):
        stats.add({"decision": 1.0}, now=t)
        t += 0.1
    for _ in range(int(RATE_SPAN_S * 2) + 1):
        stats.add({"decision": 3.0}, now=t)
        t += 0.5
    (summary,) = stats.summaries(now=t - 0.5)
    assert summary.rate_hz == pytest.approx(2.0)
    assert summary.p50_ms == 1.0  # 179 of the 200 latencies are still the 10 Hz ones


def test_slow_rates_use_the_last_completions() -> None:
    """At 0.05 Hz the rate span holds one completion: the last three give the rate."""
    stats = PipelineStats(window=200)
    for i in range(5):
        stats.add({"decision": 1.0}, now=20.0 * i)
    (summary,) = stats.summaries(now=80.0)
    assert summary.rate_hz == pytest.approx(0.05)
    # between two runs, past RATE_SPAN_S, it still runs at 0.05 Hz; three intervals late it stopped
    for now in (90.0, 95.0, 99.9):
        (summary,) = stats.summaries(now=now)
        assert summary.rate_hz == pytest.approx(0.05), now
    (summary,) = stats.summaries(now=141.0)
    assert summary.rate_hz == 0.0


def test_completions_sharing_a_stamp_keep_the_rate() -> None:
    """A coarse sim /clock stamps two completions alike: that is no clock going back."""
    stats = PipelineStats(window=10)
    for now in (5.0, 5.0, 5.1, 5.1, 5.2, 5.2):
        stats.add({"decision": 1.0}, now=now)
    assert stats.summaries(now=5.2)[0].rate_hz == pytest.approx(5 / 0.2)


def test_an_uneven_slow_rate_is_read_over_the_last_three_completions() -> None:
    stats = PipelineStats(window=10)
    for now in (0.0, 20.0, 40.0, 50.0):
        stats.add({"decision": 1.0}, now=now)
    assert stats.summaries(now=50.0)[0].rate_hz == pytest.approx(2 / 30)  # 20 -> 50: not 40 -> 50, not 0 -> 50


def test_after_a_pause_the_rate_is_the_new_runs() -> None:
    """10 Hz for 20 s, a minute's pause (~/enable false), then 10 Hz again: the second and third
    decisions after it read ~0.03 Hz (two intervals over the pause) where they are 10 Hz; a pause
    shorter than RATE_SPAN_S lowers the rate over the span, as it should."""
    stats = PipelineStats(window=200)
    t = 0.0
    for _ in range(200):
        stats.add({"decision": 1.0}, now=t)
        t += 0.1
    t += 60.0
    stats.add({"decision": 1.0}, now=t)
    assert stats.summaries(now=t)[0].rate_hz == 0.0  # one completion of the new run: no rate yet
    for _ in range(2):
        t += 0.1
        stats.add({"decision": 1.0}, now=t)
        assert stats.summaries(now=t)[0].rate_hz == pytest.approx(10.0)
    t += 5.0  # a shorter pause: 2 more completions over the 5.2 s since the first of the run
    stats.add({"decision": 1.0}, now=t)
    assert stats.summaries(now=t)[0].rate_hz == pytest.approx(3 / 5.2)


def test_the_stats_line_tells_rejected_inputs_from_absent_ones_and_node_events() -> None:
    """Refused parameters, a stalled clock (topic "") and refused capsule calls (their service)
    are named, not counted as inputs;
    waits for a topic that has sent nothing are counted apart from rejected messages."""
    pytest.importorskip("flashrt_ros.msg", reason="needs the built interfaces (scripts/setup_env.sh)")
    from flashrt_ros.ros.messages import input_counts

    invalid = {
        ("/cam", "bad_encoding"): 3,
        ("/joints", "stale"): 2,
        ("/cam", "absent"): 5,
        ("/joints", "absent"): 5,
        ("", "invalid_parameter"): 2,
        ("", "clock_stalled"): 1,
        ("/flashrt_node/capsule/restore", "unknown_capsule"): 1,
        ("/flashrt_node/capsule/drop", "unknown_capsule"): 2,
    }
    line = input_counts(invalid, absent="absent", inputs=frozenset({"/cam", "/joints"}))
    # each service's refusals named with it (they read "unknown_capsule x2, unknown_capsule x1")
    services = "unknown_capsule (/flashrt_node/capsule/drop) x2, unknown_capsule (/flashrt_node/capsule/restore) x1"
    node_wide = f"clock_stalled x1, invalid_parameter x2, {services}"
    assert line == f"5 input refusals, 10 waits for absent inputs, node: {node_wide}"
    assert input_counts({}, absent="absent", inputs=frozenset()) == "0 input refusals, 0 waits for absent inputs"


def test_adding_while_another_thread_reads() -> None:
    """A node adds from its decision thread while its status timer reads from another; without
    the lock a summary iterates a deque being appended to and raises ('deque mutated during
    iteration'), which ends the node's executor. Thread switches every microsecond make the
    interleaving that the default 5 ms interval also reaches, only rarely. Both sides run for
    1.5 s and until each has done `rounds` (a lock may favour one side for a while: Python 3.12
    on the GPU machine let the reader hold it for most of 1.5 s)."""
    import sys
    import threading
    import time

    stats, rounds = PipelineStats(window=200), 300
    done = {"add": 0, "read": 0}
    stop, errors = threading.Event(), []

    def write() -> None:
        while not stop.is_set():
            stats.add({"prefix": 1.0, "denoise": 2.0})
            done["add"] += 1

    def read() -> None:
        while not stop.is_set():
            try:
                stats.summaries()
            except RuntimeError as exc:
                errors.append(repr(exc))
            done["read"] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for t in threads:
            t.start()
        start = time.monotonic()
        while time.monotonic() - start < 20.0 and (time.monotonic() - start < 1.5 or min(done.values()) < rounds):
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [], errors[:3]
    assert min(done.values()) >= rounds, done
    assert stats.summaries()[0].count == done["add"]


@pytest.mark.parametrize("window", [0, 1, -1, 2.5, True, "200"])
def test_a_window_that_cannot_hold_a_rate_is_refused_at_once(window: object) -> None:
    """Refused when made, naming it: the first decision would otherwise run and then fail (or a
    window of 0 or 1 report no rate at all)."""
    with pytest.raises(ValueError, match=f"stats_window {window!r}: expected an int >= 2"):
        PipelineStats(window=window)
    assert PipelineStats(window=2).window == 2


def test_two_completions_at_one_instant_read_as_no_rate():
    """A paused /clock under sim time: two decisions at one stats time, read then (no division by
    a zero span)."""
    stats = PipelineStats(window=10)
    stats.add({"d": 1.0}, now=5.0)
    stats.add({"d": 1.0}, now=5.0)
    assert stats.summaries(now=5.0)[0].rate_hz == 0.0


def test_the_line_shows_median_and_p99():
    stats = PipelineStats(window=200)
    for i in range(100):
        stats.add({"x": float(i)}, now=float(i))
    assert stats.line() == "x 49.50/98.01 ms"


def test_a_slow_stage_keeps_its_rate_until_three_of_its_intervals_pass():
    stats = PipelineStats(window=200)
    for i in range(5):
        stats.add({"d": 1.0}, now=20.0 * i)  # every 20 s, the last at 80 s
    assert stats.summaries(now=130.0)[0].rate_hz > 0.0
