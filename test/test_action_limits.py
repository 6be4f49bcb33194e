"""Action limits: positions clamped into their limits, steps bounded from the joint state on, and
what changed said in words."""

from __future__ import annotations

import numpy as np
import pytest

from flashrt_ros.engine.action_limits import ActionLimits

NAMES = ("a", "b")


def test_positions_are_clamped_into_their_limits_and_the_worst_is_named():
    limits = ActionLimits.from_lists(NAMES, lower=[-1.0, -2.0], upper=[1.0, 2.0], max_step=[])
    actions = np.array([[0.5, 0.0], [1.5, -2.5], [3.0, 1.0]], dtype=np.float32)
    out, clamped = limits.apply(actions, np.full(2, np.nan))
    np.testing.assert_array_equal(out, [[0.5, 0.0], [1.0, -2.0], [1.0, 1.0]])
    assert out.dtype == np.float32
    assert (clamped.values, clamped.joints) == (3, 2)
    assert clamped.worst == "a 3 above its upper limit 1"


def test_within_the_limits_nothing_changes():
    limits = ActionLimits.from_lists(NAMES, lower=[-1.0], upper=[1.0], max_step=[0.5])
    actions = np.array([[0.1, 0.2], [0.4, 0.3]], dtype=np.float32)
    out, clamped = limits.apply(actions, np.array([0.0, 0.0]))
    assert out is actions and clamped is None


def test_steps_are_bounded_from_the_joint_state_and_between_actions():
    """One value for every joint; the chunk lags its plan rather than jump."""
    limits = ActionLimits.from_lists(NAMES, lower=[], upper=[], max_step=[0.1])
    actions = np.array([[0.5, 0.05], [0.5, 0.1], [0.5, 0.15]])
    out, clamped = limits.apply(actions, np.array([0.0, 0.0]))
    np.testing.assert_allclose(out, [[0.1, 0.05], [0.2, 0.1], [0.3, 0.15]])
    assert (clamped.values, clamped.joints) == (3, 1)
    assert clamped.worst == "a moves +0.5 from the joint state to action 0, more than action_max_step 0.1"


def test_a_joint_the_state_lacks_has_a_free_first_action():
    limits = ActionLimits.from_lists(NAMES, lower=[], upper=[], max_step=[0.1, 0.1])
    actions = np.array([[0.5, 0.9], [0.9, 1.3]])  # b's action 0 would be the worst from a state of 0
    out, clamped = limits.apply(actions, np.array([0.0, np.nan]))
    np.testing.assert_allclose(out, [[0.1, 0.9], [0.2, 1.0]])
    assert (clamped.values, clamped.joints) == (3, 2)
    # named from the policy's own chunk: a's +0.5 from the state, not the +0.8 left after limiting,
    # and not b's action 0, which has no joint state to move from
    assert clamped.worst == "a moves +0.5 from the joint state to action 0, more than action_max_step 0.1"


def test_after_limiting_both_limits_hold_whatever_the_actions():
    rng = np.random.default_rng(0)
    lower, upper, step = np.array([-1.0, 0.0, -3.0]), np.array([1.0, 0.5, 3.0]), np.array([0.2, 0.05, 1.0])
    limits = ActionLimits.from_lists(("x", "y", "z"), lower=lower, upper=upper, max_step=step)
    for _ in range(200):
        actions = rng.normal(0, 3, size=(50, 3)).astype(np.float32)
        state = rng.uniform(lower, upper)
        out, _ = limits.apply(actions, state)
        assert (out >= lower - 1e-6).all() and (out <= upper + 1e-6).all()
        steps = np.abs(np.diff(np.vstack([state, out.astype(np.float64)]), axis=0))
        assert (steps <= step + 1e-5).all()


def test_a_state_outside_the_limits_is_stepped_back_in_and_named_first():
    """An arm parked past a limit: no jump to the limit, but max_step per action back inside."""
    limits = ActionLimits.from_lists(NAMES, lower=[-1.0], upper=[1.0], max_step=[0.1])
    actions = np.array([[0.9, 0.0], [0.9, 0.0], [0.9, 0.0]])
    out, clamped = limits.apply(actions, np.array([1.25, 0.0]))
    np.testing.assert_allclose(out[:, 0], [1.15, 1.05, 0.95])
    assert clamped.worst == "a's joint state 1.25 above its upper limit 1 (stepped back in)"


def test_a_state_outside_is_named_only_for_a_joint_whose_actions_changed():
    """j0 parked below its limit with its actions inside, j1's actions clamped, no step limit:
    the warning named j0 "(stepped back in)", a joint not changed, and a step never taken."""
    limits = ActionLimits.from_lists(["j0", "j1"], lower=[0.0], upper=[1.0], max_step=[])
    out, clamped = limits.apply(np.array([[0.5, -0.2], [0.5, -0.1]], np.float32), np.array([-0.5, 0.5]))
    np.testing.assert_array_equal(out, [[0.5, 0.0], [0.5, 0.0]])
    assert clamped.worst == "j1 -0.2 below its lower limit 0", clamped
    out, clamped = limits.apply(np.array([[-0.1, 0.5]], np.float32), np.array([-0.5, 0.5]))
    assert clamped.worst == "j0's joint state -0.5 below its lower limit 0 (its actions clamped to the limit)"


def test_no_published_value_is_past_a_bound_by_a_rounding():
    """0.05 has no float32: the float32 nearest it is above it, so it must not be published."""
    limits = ActionLimits.from_lists(NAMES, lower=[-0.05], upper=[0.05], max_step=[])
    out, _ = limits.apply(np.array([[1.0, -1.0]], np.float32), np.full(2, np.nan))
    assert out.dtype == np.float32 and float(out[0, 0]) <= 0.05 and float(out[0, 1]) >= -0.05
    assert float(out[0, 0]) == float(np.nextafter(np.float32(0.05), np.float32(0)))


def test_a_float64_chunk_within_its_limits_is_unchanged_to_the_bit():
    """Kept steps are not recomputed (previous + (target - previous) need not give target back)."""
    rng = np.random.default_rng(1)
    limits = ActionLimits.from_lists(NAMES, lower=[-10.0], upper=[10.0], max_step=[100.0])
    for _ in range(100):
        actions = rng.normal(size=(20, 2))
        out, clamped = limits.apply(actions, rng.normal(size=2))
        assert clamped is None and out is actions


def test_no_limits_are_inactive():
    limits = ActionLimits.from_lists(NAMES, lower=[], upper=[], max_step=[])
    assert not limits.active and limits.describe() == "none"
    actions = np.ones((3, 2))
    assert limits.apply(actions, np.zeros(2)) == (actions, None)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (
            {"lower": [0.0], "upper": [1.0], "max_step": []},
            "positions within limits on 2 of 2 joints (a [0, 1], b [0, 1])",
        ),
        (
            {"lower": [], "upper": [2.0, 3.0], "max_step": [0.1]},
            "positions within limits on 2 of 2 joints; at most action_max_step per action from the joint state "
            "(a [-inf, 2] step 0.1, b [-inf, 3] step 0.1)",
        ),
        (  # b a continuous joint: no bound, and not counted as one
            {"lower": [-1.0, -np.inf], "upper": [1.0, np.inf], "max_step": []},
            "positions within limits on 1 of 2 joints (a [-1, 1], b [-inf, inf])",
        ),
    ],
)
def test_describe_says_which_limits_are_on(kwargs, words):
    limits = ActionLimits.from_lists(NAMES, **kwargs)
    assert limits.active and limits.describe() == words


def test_infinite_bounds_on_every_joint_are_no_limit_and_huge_ones_cast_quietly():
    """`action_upper_limits: [.inf]` bounds nothing: "none", not "within limits on 14 joints"; a
    1e300 stand-in for no bound (past float32's range) clamps with no overflow warning."""
    import warnings

    unbounded = ActionLimits.from_lists(NAMES, lower=[-np.inf], upper=[np.inf], max_step=[])
    assert not unbounded.active and unbounded.describe() == "none"
    huge = ActionLimits.from_lists(NAMES, lower=[-1e300], upper=[1e300], max_step=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, clamped = huge.apply(np.ones((2, 2), np.float32), np.zeros(2))
    assert clamped is None and (out == 1).all()


def test_a_state_below_the_lower_limit_is_stepped_back_in_too():
    """The lower side of the upper-side case: action 0 moves max_step from the state up, not straight
    to the limit (a jump of the whole distance outside)."""
    limits = ActionLimits.from_lists(NAMES, lower=[-1.0], upper=[1.0], max_step=[0.1])
    out, _ = limits.apply(np.array([[-0.9, 0.0]] * 3), np.array([-1.25, 0.0]))
    np.testing.assert_allclose(out[:, 0], [-1.15, -1.05, -0.95])


def test_the_limited_step_is_named_with_its_actions_and_sign():
    """The operator reads which step was too large, between which actions, and which way."""
    limits = ActionLimits.from_lists(NAMES, lower=[], upper=[], max_step=[0.1])
    _, clamped = limits.apply(np.array([[0.05, 0.0], [0.4, 0.0]]), np.zeros(2))
    assert clamped.worst == "a moves +0.35 from action 0 to 1, more than action_max_step 0.1"
    _, clamped = limits.apply(np.array([[-0.5, 0.0]]), np.zeros(2))
    assert clamped.worst == "a moves -0.5 from the joint state to action 0, more than action_max_step 0.1"


def test_the_joint_state_furthest_outside_is_named_not_the_first():
    limits = ActionLimits.from_lists(NAMES, lower=[0.0], upper=[1.0], max_step=[])
    _, clamped = limits.apply(np.array([[1.05, 1.2]]), np.array([1.1, 1.5]))
    assert clamped.worst.startswith("b's joint state 1.5"), clamped.worst
