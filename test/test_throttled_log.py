"""ThrottledLog (ros/inputs.py) with rclpy's real logger: lines at both levels from one node
logger, the per-key throttle and its held-back count, and an unknown level refused. rclpy keys
a logger's state by the calling line and raises ValueError when one line logs at two severities;
the node once died of that (a stale camera's warning, then a policy error)."""

from __future__ import annotations

import uuid

import pytest

from flashrt_ros.ros.inputs import ThrottledLog


@pytest.fixture
def clock(monkeypatch):
    """ThrottledLog's clock, moved by the test (``clock.t += s``): a loaded machine's pauses between
    calls do not move it."""
    from types import SimpleNamespace

    from flashrt_ros.ros import inputs

    fake = SimpleNamespace(t=1000.0)
    fake.monotonic = lambda: fake.t
    monkeypatch.setattr(inputs, "time", fake)
    return fake


def _logger():
    from rclpy.logging import get_logger

    return get_logger(f"throttle_test_{uuid.uuid4().hex[:8]}")  # a fresh logger: no call-site state yet


def test_warning_then_error_then_warning_through_one_throttle(capfd):
    throttle = ThrottledLog(0.0, _logger())
    throttle(("skipped", "/cam0", "stale"), "warning", "decision skipped: [stale] /cam0")
    throttle(("non_finite_action",), "error", "no chunk published: [non_finite_action]")
    throttle(("rejected", "/cam1", "bad_size"), "warning", lambda: "input rejected: [bad_size] /cam1")
    throttle(("skipped", "/cam2", "absent"), "info", "decision skipped: [absent] /cam2: waiting")
    err = capfd.readouterr().err
    assert "[INFO]" in err and "decision skipped: [absent] /cam2: waiting" in err, err
    assert "[WARN]" in err and "decision skipped: [stale] /cam0" in err, err
    assert "[ERROR]" in err and "no chunk published: [non_finite_action]" in err, err
    assert "input rejected: [bad_size] /cam1" in err, err


def test_a_key_is_held_back_within_the_period_and_counted_on_its_next_line(capfd, clock):
    throttle = ThrottledLog(0.2, _logger())
    key = ("skipped", "/cam0", "stale")
    calls = []

    def text(n: int):
        return lambda: calls.append(n) or f"stale line {n}"

    throttle(key, "warning", text(1))
    throttle(key, "warning", text(2))  # held: its text is never built
    clock.t += 0.15
    throttle(key, "warning", text(3))
    throttle(("other",), "error", text(4))  # another key is not held by the first
    clock.t += 0.35
    throttle(key, "warning", text(5))
    err = capfd.readouterr().err
    assert calls == [1, 4, 5], calls
    assert "stale line 1" in err and "stale line 4" in err, err
    assert "stale line 2" not in err and "stale line 3" not in err, err
    line5 = next(line for line in err.splitlines() if "stale line 5" in line)
    assert line5.endswith("(+2 more like this in the last 0.5 s)"), line5  # since line 1, not the period


def test_clear_forgets_the_held_keys(capfd):
    throttle = ThrottledLog(60.0, _logger())
    throttle(("k",), "warning", "first")
    throttle(("k",), "warning", "held")
    throttle.clear()
    throttle(("k",), "warning", "after clear")
    err = capfd.readouterr().err
    assert "first" in err and "after clear" in err and "held" not in err, err
    assert "more like this" not in err, err


def test_forget_held_drops_the_counts_and_keeps_the_throttle(capfd, clock):
    """When decisions resume the node forgets the held decision-skip lines: the next outage's
    first line counted the last one's ticks ("+36 more like this" from an episode long over). The
    throttle itself stays: a camera flapping round max_age_s logs one warning a period, not one
    per outage."""
    throttle = ThrottledLog(0.3, _logger())
    skipped, rejected = ("skipped", "/cam0", "stale"), ("rejected", "/cam0", "bad_size")
    for key in (skipped, rejected):
        throttle(key, "warning", f"first {key[0]}")
        throttle(key, "warning", f"held {key[0]}")
    throttle.forget_held("skipped")
    clock.t += 0.25
    throttle(skipped, "warning", "still throttled")  # within the period: held, counted from here
    clock.t += 0.1
    throttle(skipped, "warning", "after skipped")
    throttle(rejected, "warning", "after rejected")
    err = capfd.readouterr().err
    assert "still throttled" not in err and "held" not in err, err
    line = next(row for row in err.splitlines() if "after skipped" in row)
    assert "(+1 more like this in the last" in line, line  # the one after forget_held, not three
    line = next(row for row in err.splitlines() if "after rejected" in row)
    assert "(+1 more like this in the last" in line, line


def test_an_unknown_level_is_refused_with_what_was_expected():
    throttle = ThrottledLog(0.0, _logger())
    expected = r"log level 'debug' for \('k',\): expected one of \('info', 'warning', 'error'\)"
    with pytest.raises(ValueError, match=expected):
        throttle(("k",), "debug", "text")


def test_a_persistent_problem_is_said_once_per_period_with_its_own_count(capfd, clock):
    """A key hit more often than the period: a line each period (not silenced for as long as the
    problem lasts), each counting what was held since the line before (not since the first)."""
    throttle = ThrottledLog(0.25, _logger())
    for _ in range(16):  # a call every 1/16 s (exact in binary) for 1 s
        throttle(("k",), "warning", "stale")
        clock.t += 0.0625
    lines = [line for line in capfd.readouterr().err.splitlines() if "stale" in line]
    assert len(lines) == 4, lines  # at 0, 0.25, 0.5 and 0.75 s
    counts = [int(line.split("(+")[1].split(" ")[0]) for line in lines[1:]]
    assert counts == [3, 3, 3], lines
