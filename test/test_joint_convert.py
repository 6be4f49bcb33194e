"""joint_state_to_vector, stamps and freshness, and the InputError they raise."""

from __future__ import annotations

import array
import math
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from flashrt_ros.ros import input_error as ie
from flashrt_ros.ros.input_error import InputError
from flashrt_ros.ros.joint_convert import check_fresh, joint_state_to_vector, stamp_to_ns

ARM = ["shoulder", "elbow", "wrist", "gripper"]


def joint_state(names: list[str], positions) -> SimpleNamespace:
    return SimpleNamespace(header=None, name=list(names), position=positions, velocity=[], effort=[])


def _refusal(msg, names=ARM) -> InputError:
    with pytest.raises(InputError) as err:
        joint_state_to_vector(msg, names, source="/robot/joint_states")
    assert err.value.source == "/robot/joint_states" and "/robot/joint_states" in str(err.value)
    return err.value


# --- joint_state_to_vector ----------------------------------------------------------


def test_same_order() -> None:
    vec = joint_state_to_vector(joint_state(ARM, [0.1, 0.2, 0.3, 0.4]), ARM)
    assert vec.dtype == np.float32 and vec.shape == (4,)
    np.testing.assert_array_equal(vec, np.float32([0.1, 0.2, 0.3, 0.4]))


def test_reordered_with_extra_joints() -> None:
    names = ["wheel_l", "gripper", "wrist", "head_pan", "elbow", "shoulder", "wheel_r"]
    positions = array.array("d", [9.0, 0.4, 0.3, 8.0, 0.2, 0.1, 7.0])  # rclpy stores float64[] so
    vec = joint_state_to_vector(joint_state(names, positions), ARM)
    np.testing.assert_array_equal(vec, np.float32([0.1, 0.2, 0.3, 0.4]))


def test_subset_and_empty_selection() -> None:
    msg = joint_state(ARM, [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(joint_state_to_vector(msg, ["gripper", "shoulder"]), np.float32([0.4, 0.1]))
    assert joint_state_to_vector(msg, []).shape == (0,)


def test_non_selected_joints_may_be_nan() -> None:
    msg = joint_state(ARM + ["passive"], [0.1, 0.2, 0.3, 0.4, math.nan])
    np.testing.assert_array_equal(joint_state_to_vector(msg, ARM), np.float32([0.1, 0.2, 0.3, 0.4]))


def test_missing_joints_lists_every_one_and_what_the_message_had() -> None:
    err = _refusal(joint_state(["elbow", "head_pan"], [0.2, 0.0]))
    assert err.reason == ie.MISSING_JOINT
    text = str(err)
    for name in ["shoulder", "wrist", "gripper", "head_pan"]:
        assert name in text
    assert "['shoulder', 'wrist', 'gripper']" in text


def test_duplicate_selected_joint() -> None:
    err = _refusal(joint_state(ARM + ["elbow"], [0.1, 0.2, 0.3, 0.4, 0.5]))
    assert err.reason == ie.DUPLICATE_JOINT and "elbow" in str(err)


def test_duplicate_unselected_joint_is_fine() -> None:
    msg = joint_state(ARM + ["wheel", "wheel"], [0.1, 0.2, 0.3, 0.4, 1.0, 2.0])
    np.testing.assert_array_equal(joint_state_to_vector(msg, ARM), np.float32([0.1, 0.2, 0.3, 0.4]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e39])  # 1e39: finite, but not in float32
def test_non_finite_selected_joint(bad: float) -> None:
    err = _refusal(joint_state(ARM, [0.1, bad, 0.3, bad]))
    assert err.reason == ie.NON_FINITE_JOINT
    assert "elbow" in str(err) and "gripper" in str(err) and "shoulder" not in str(err)
    assert str(bad) in str(err)


@pytest.mark.parametrize("positions", [[0.1, 0.2, 0.3], []])
def test_fewer_positions_than_names(positions) -> None:
    err = _refusal(joint_state(ARM, positions))
    assert err.reason == ie.TRUNCATED_DATA
    assert f"{len(positions)} positions for 4 names" in str(err)


def test_more_positions_than_names() -> None:
    """sensor_msgs/JointState: one position per name; extra ones cannot be attributed."""
    err = _refusal(joint_state(ARM, [0.1, 0.2, 0.3, 0.4, math.nan]))
    assert err.reason == ie.BAD_SIZE
    assert "5 positions for 4 names" in str(err) and "expected one position per name" in str(err)


@pytest.mark.ros
def test_real_sensor_msgs_joint_state() -> None:
    from sensor_msgs import msg as msgs

    msg = msgs.JointState(name=["gripper", "elbow", "extra", "shoulder", "wrist"], position=[4.0, 2.0, 0, 1.0, 3.0])
    np.testing.assert_array_equal(joint_state_to_vector(msg, ARM), np.float32([1, 2, 3, 4]))


# --- stamps -------------------------------------------------------------------------


def stamp(sec: int, nanosec: int = 0) -> SimpleNamespace:
    return SimpleNamespace(sec=sec, nanosec=nanosec)


def test_stamp_to_ns_is_exact_for_epoch_times() -> None:
    assert stamp_to_ns(stamp(1_700_000_000, 123_456_789)) == 1_700_000_000_123_456_789
    assert stamp_to_ns(SimpleNamespace(nanoseconds=42)) == 42  # rclpy.time.Time


def test_fresh_returns_age() -> None:
    now = stamp_to_ns(stamp(100, 500_000_000))
    assert check_fresh(stamp(100, 400_000_000), now, 0.2, "/cam") == pytest.approx(0.1)
    assert check_fresh(stamp(100, 600_000_000), now, 0.2, "/cam") == pytest.approx(-0.1)  # small skew ok


def test_unstamped() -> None:
    with pytest.raises(InputError) as err:
        check_fresh(stamp(0, 0), 10**18, 0.5, "/cam/wrist")
    assert err.value.reason == ie.UNSTAMPED and err.value.source == "/cam/wrist"
    assert "header stamp is 0; expected the capture time" in str(err.value)


def test_stamp_with_nanosec_out_of_range() -> None:
    now = stamp_to_ns(stamp(100))
    with pytest.raises(InputError) as err:
        check_fresh(stamp(99, 1_500_000_000), now, 5.0, "/cam")  # would read as 100.5 s
    assert err.value.reason == ie.UNSTAMPED
    assert "header stamp nanosec is 1500000000; expected below 1e9" in str(err.value)


def test_stale_says_age_and_limit() -> None:
    now = stamp_to_ns(stamp(100))
    with pytest.raises(InputError) as err:
        check_fresh(stamp(99, 250_000_000), now, 0.5, "/cam/wrist")
    assert err.value.reason == ie.STALE
    assert "0.750 s" in str(err.value) and "0.5 s" in str(err.value)
    assert "clock" not in str(err.value)  # a held sample aged: the sensor, not a clock
    with pytest.raises(InputError) as err:  # just arrived, yet old: the sender's clock or the way
        check_fresh(stamp(99, 250_000_000), now, 0.5, "/cam/wrist", on_arrival=True)
    assert str(err.value).endswith(
        "data is 0.750 s old; expected at most 0.5 s (stamped that long before it arrived: the sender's clock "
        "behind this node's, NTP / chrony?, or a transport that held it)"
    ), str(err.value)
    with pytest.raises(InputError) as err:  # a simulator's 120 s against wall time: no drift is that long
        check_fresh(stamp(120), stamp_to_ns(stamp(1_796_660_096)), 0.5, "/cam", on_arrival=True)
    assert str(err.value).endswith("s old; expected at most 0.5 s (clocks disagree: use_sim_time on one side only?)")


def test_future_stamp_means_clocks_disagree() -> None:
    with pytest.raises(InputError) as err:
        check_fresh(stamp(1_700_000_000), stamp_to_ns(stamp(50)), 0.5, "/cam")  # wall stamp, sim clock
    assert err.value.reason == ie.FUTURE_STAMP
    assert "stamp is 1699999950.000 s ahead of the node clock; expected at most 0.5 s" in str(err.value)


def test_infinite_max_age_only_requires_a_stamp() -> None:
    assert check_fresh(stamp(1), 10**18, math.inf, "/cam") > 0


def test_non_positive_max_age_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="max_age_s must be > 0, got 0.0") as err:
        check_fresh(stamp(1), 2 * 10**9, 0.0, "/cam")
    assert not isinstance(err.value, InputError)


@pytest.mark.ros
def test_real_builtin_interfaces_time() -> None:
    from builtin_interfaces import msg as time_msg

    assert stamp_to_ns(time_msg.Time(sec=3, nanosec=7)) == 3_000_000_007


# --- InputError ---------------------------------------------------------------------


def test_input_error_fields_and_text() -> None:
    err = InputError(ie.STALE, "/cam", "data is 1.000 s old")
    assert isinstance(err, ValueError)
    assert (err.reason, err.source, err.detail) == (ie.STALE, "/cam", "data is 1.000 s old")
    assert str(err) == "[stale] /cam: data is 1.000 s old"


def test_input_error_rejects_unknown_reason() -> None:
    with pytest.raises(ValueError, match="unknown InputError reason"):
        InputError("stail", "/cam", "typo")


def test_input_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(InputError(ie.BAD_SIZE, "/cam", "too small")))
    assert (err.reason, err.source, str(err)) == (ie.BAD_SIZE, "/cam", "[bad_size] /cam: too small")


def test_reason_codes_are_snake_case_and_complete() -> None:
    constants = {v for k, v in vars(ie).items() if k.isupper() and isinstance(v, str)}
    assert constants == ie.REASONS
    assert all(r.replace("_", "").isalpha() and r == r.lower() for r in ie.REASONS)


def _stamp(sec: int, nanosec: int = 0) -> SimpleNamespace:
    return SimpleNamespace(sec=sec, nanosec=nanosec)


def test_a_stamp_ahead_by_more_than_max_age_is_refused() -> None:
    """`age_s < -2 * max_age_s` let stamps up to twice the bound ahead through; the only
    future test used a stamp 1.7e9 s ahead."""
    now = stamp_to_ns(_stamp(100, 500_000_000))
    with pytest.raises(InputError) as err:
        check_fresh(_stamp(100, 800_000_000), now, 0.2, "/cam")  # 0.3 s ahead, bound 0.2 s
    assert err.value.reason == ie.FUTURE_STAMP and "stamp is 0.300 s ahead" in str(err.value)


def test_ages_exactly_at_the_bound_are_accepted_both_ways() -> None:
    """`>=` / `<=` refused a stamp exactly max_age_s old or ahead ("older than" is the rule)."""
    now = stamp_to_ns(_stamp(100, 500_000_000))
    assert check_fresh(_stamp(100, 250_000_000), now, 0.25, "/cam") == pytest.approx(0.25)
    assert check_fresh(_stamp(100, 750_000_000), now, 0.25, "/cam") == pytest.approx(-0.25)


def test_nanosec_of_exactly_one_second_is_unstamped() -> None:
    """`nanosec > 1e9` took nanosec == 1_000_000_000 (not a valid builtin_interfaces/Time)."""
    with pytest.raises(InputError) as err:
        check_fresh(_stamp(99, 1_000_000_000), stamp_to_ns(_stamp(100)), 5.0, "/cam")
    assert err.value.reason == ie.UNSTAMPED


def test_a_held_sample_a_day_old_blames_the_sensor_not_the_clocks() -> None:
    """Without `on_arrival and`, a held sample that aged past a day read "clocks disagree"."""
    with pytest.raises(InputError) as err:
        check_fresh(_stamp(1), stamp_to_ns(_stamp(200_000)), 0.5, "/joint_states")
    assert err.value.reason == ie.STALE and "clock" not in str(err.value)
