"""The action stream: which action of which chunk is due at a time, and the blend between chunks."""

from __future__ import annotations

import numpy as np
import pytest

from flashrt_ros.engine.action_stream import INTERPOLATIONS, ActionStream, Command, Exhausted

MS = 1_000_000
STEP = 20 * MS


def chunk(first: float, horizon: int = 5, dof: int = 2) -> np.ndarray:
    """Action k is [first + k, -(first + k)]: every value names its chunk and index."""
    column = first + np.arange(horizon, dtype=np.float64)
    return np.stack([column, -column], axis=1)[:, :dof]


def test_each_action_is_held_for_its_step_and_nothing_is_extrapolated():
    """Past the end: the last action once more (the trajectory's end point), then nothing."""
    stream = ActionStream()
    assert stream.command(0) is None  # nothing pushed
    stream.push(chunk(10.0), start_ns=100 * MS, step_ns=STEP, chunk_id=1)
    assert stream.command(99 * MS) is None  # not started
    for now_ms, k in [(100, 0), (119, 0), (120, 1), (185, 4), (199, 4)]:
        cmd = stream.command(now_ms * MS)
        assert isinstance(cmd, Command) and (cmd.chunk_id, cmd.index, cmd.weight) == (1, k, 1.0)
        np.testing.assert_array_equal(cmd.values, [10.0 + k, -(10.0 + k)])
    end = stream.command(200 * MS)
    assert (end.chunk_id, end.index, end.values[0]) == (1, 4, 14.0)
    assert stream.command(200 * MS) == Exhausted(chunk_id=1, ended_ns=200 * MS)
    assert stream.command(900 * MS) == Exhausted(chunk_id=1, ended_ns=200 * MS)


def test_a_newer_chunk_governs_once_it_starts_and_skips_what_has_passed():
    """A chunk stamped at its observation starts in the past: the actions its decision's
    latency passed are skipped, as joint_trajectory_controller skips them."""
    stream = ActionStream()
    stream.push(chunk(10.0), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.push(chunk(50.0), start_ns=30 * MS, step_ns=STEP, chunk_id=2)  # starts while chunk 1 runs
    cmd = stream.command(25 * MS)
    assert (cmd.chunk_id, cmd.index) == (1, 1)
    cmd = stream.command(55 * MS)
    assert (cmd.chunk_id, cmd.index) == (2, 1) and cmd.values[0] == 51.0
    stream.push(chunk(90.0), start_ns=40 * MS, step_ns=STEP, chunk_id=3)  # arrives late: 2 steps passed
    cmd = stream.command(81 * MS)
    assert (cmd.chunk_id, cmd.index) == (3, 2) and cmd.values[0] == 92.0


def test_a_switch_is_blended_over_blend_steps_actions_from_what_was_commanded():
    stream = ActionStream(blend_steps=3)
    stream.push(chunk(0.0, horizon=10), start_ns=0, step_ns=STEP, chunk_id=1)
    assert stream.command(0).values[0] == 0.0
    stream.push(chunk(100.0, horizon=10), start_ns=2 * STEP, step_ns=STEP, chunk_id=2)
    got = [stream.command(k * STEP + MS) for k in range(2, 8)]
    # chunk 1 commands k, chunk 2 commands 100 + (k - 2); the weights 1/4, 2/4, 3/4, then 1
    expected = [k + w * (100 + k - 2 - k) for k, w in zip(range(2, 8), [0.25, 0.5, 0.75, 1, 1, 1], strict=True)]
    np.testing.assert_allclose([c.values[0] for c in got], expected)
    np.testing.assert_allclose([c.values[1] for c in got], [-e for e in expected])
    assert [c.weight for c in got] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert all(c.chunk_id == 2 for c in got)


def test_a_chunk_arriving_during_a_blend_starts_from_the_blend_not_from_a_jump():
    stream = ActionStream(blend_steps=3)
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((10, 1), 8.0), start_ns=STEP, step_ns=STEP, chunk_id=2)
    assert stream.command(STEP).values[0] == 2.0  # 0 + 1/4 * 8
    stream.push(np.full((10, 1), 16.0), start_ns=2 * STEP, step_ns=STEP, chunk_id=3)
    # chunk 2's blend is at 2/4 (4.0); chunk 3 moves a quarter of the way from it
    assert stream.command(2 * STEP).values[0] == 4.0 + 0.25 * (16.0 - 4.0)
    assert stream.command(3 * STEP).values[0] == pytest.approx(6.0 + 0.5 * (16.0 - 6.0))
    assert stream.command(5 * STEP).values[0] == 16.0  # chunk 3's blend ended: chunks 1, 2 dropped
    assert len(stream._chunks) == 1


def test_a_chunk_that_never_governed_is_not_blended_from():
    """Two decisions between two command ticks: the first chunk's actions were never commanded,
    so the blend runs from what was (chunk 1) to the newest."""
    stream = ActionStream(blend_steps=1)
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((10, 1), 100.0), start_ns=STEP, step_ns=STEP, chunk_id=2)
    # a later start than chunk 2's: with the same start push() would drop chunk 2 itself
    stream.push(np.full((10, 1), 4.0), start_ns=STEP + MS, step_ns=STEP, chunk_id=3)
    cmd = stream.command(STEP + MS)
    assert cmd.chunk_id == 3 and cmd.values[0] == 2.0


def test_an_older_chunk_that_ran_out_holds_its_last_action_in_the_blend():
    """As the controller would hold it: the blend goes on from there instead of jumping."""
    stream = ActionStream(blend_steps=4)
    stream.push(np.array([[0.0], [1.0]]), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((10, 1), 6.0), start_ns=STEP, step_ns=STEP, chunk_id=2)
    got = [stream.command(k * STEP) for k in range(1, 6)]
    assert [c.weight for c in got] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert [c.values[0] for c in got] == pytest.approx([1 + w * 5 for w in (0.2, 0.4, 0.6, 0.8, 1.0)])


def test_clear_forgets_every_chunk_and_the_blend():
    stream = ActionStream(blend_steps=2)
    stream.push(chunk(0.0), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.clear()
    assert stream.command(STEP) is None
    stream.push(chunk(7.0), start_ns=STEP, step_ns=STEP, chunk_id=1)
    cmd = stream.command(STEP)
    assert (cmd.values[0], cmd.weight) == (7.0, 1.0)  # nothing to blend from


@pytest.mark.parametrize("interpolation", ["hold", "linear"])
def test_a_chunk_with_nothing_to_blend_from_ends_at_its_end(interpolation):
    """The first chunk (or the first after a clear) commands its own values at once; its weight
    still ran the blend's ramp, so the stream went on past its end for up to blend_steps more
    actions and counted chunk_exhausted late."""
    for blend in (5, 0):
        stream = ActionStream(blend_steps=blend, interpolation=interpolation)
        stream.push(np.array([[0.0], [1.0]]), start_ns=0, step_ns=STEP, chunk_id=1)
        kinds = [type(stream.command(k * STEP)).__name__ for k in range(6)]
        assert kinds == ["Command", "Command", "Command", "Exhausted", "Exhausted", "Exhausted"], (blend, kinds)


def test_the_stream_keeps_its_own_copy_of_the_actions():
    stream = ActionStream()
    actions = chunk(1.0)
    stream.push(actions, start_ns=0, step_ns=STEP, chunk_id=1)
    actions[:] = 99.0
    assert stream.command(0).values[0] == 1.0


@pytest.mark.parametrize(
    ("actions", "step_ns", "message"),
    [
        (np.zeros(5), STEP, r"\[horizon, dof\].*shape \(5,\)"),
        (np.zeros((0, 2)), STEP, r"both > 0, got shape \(0, 2\)"),
        (np.array([[1.0, np.nan]]), STEP, "chunk 4 has non-finite actions"),
        (np.zeros((5, 2)), 0, "step_ns must be at least 1 ns, got 0"),
        (np.zeros((5, 2)), 0.5, "step_ns must be at least 1 ns, got 0"),
        (np.zeros((5, 3)), STEP, "chunk 4 has 3 action dims, the stream 2"),
    ],
)
def test_a_bad_chunk_is_refused_and_the_stream_goes_on(actions, step_ns, message):
    stream = ActionStream()
    stream.push(chunk(0.0), start_ns=0, step_ns=STEP, chunk_id=3)
    with pytest.raises(ValueError, match=message):
        stream.push(actions, start_ns=0, step_ns=step_ns, chunk_id=4)
    assert stream.command(STEP).chunk_id == 3


@pytest.mark.parametrize("steps", [-1, 1.5, True, "2"])
def test_blend_steps_must_be_a_whole_number_of_actions(steps):
    with pytest.raises(ValueError, match="blend_steps must be an integer >= 0"):
        ActionStream(blend_steps=steps)


def test_frequent_chunks_during_blends_hold_only_what_the_blend_reads():
    """A chunk every 2 actions with blends of 3: a new blend always starts before the last ends,
    yet only the chunks the blend still reads are held, not every chunk since the start."""
    stream = ActionStream(blend_steps=3)
    for i in range(1000):
        stream.push(np.full((50, 1), float(i)), start_ns=2 * i * STEP, step_ns=STEP, chunk_id=i)
        for tick in (2 * i, 2 * i + 1):
            assert isinstance(stream.command(tick * STEP), Command)
        assert len(stream._chunks) <= stream.blend_steps + 2, len(stream._chunks)


def test_a_chunk_over_before_it_could_govern_is_skipped_and_the_governing_one_goes_on():
    """A chunk whose last action has passed by the first tick after it arrives (published late):
    a trajectory controller refuses it, and so does the stream, rather than stop the chunk that
    is running."""
    stream = ActionStream()
    stream.push(chunk(10.0, horizon=50), start_ns=0, step_ns=STEP, chunk_id=1)
    assert stream.command(0).chunk_id == 1
    stream.push(chunk(50.0, horizon=2), start_ns=10 * MS, step_ns=STEP, chunk_id=2)  # ended at 50 ms
    cmd = stream.command(100 * MS)
    assert isinstance(cmd, Command) and (cmd.chunk_id, cmd.index) == (1, 5)
    assert len(stream._chunks) == 1


def test_a_blend_of_extreme_finite_actions_stays_finite():
    stream = ActionStream(blend_steps=1)
    stream.push(np.full((5, 1), -1e308), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((5, 1), 1e308), start_ns=STEP, step_ns=STEP, chunk_id=2)
    assert np.isfinite(stream.command(STEP).values).all()


def test_chunks_from_before_the_clock_went_back_are_dropped():
    """A simulator reset takes ROS time back: the chunks stamped in the old timeline must not
    govern again when the new time reaches their stamps."""
    stream = ActionStream()
    stream.push(chunk(10.0, horizon=50), start_ns=900 * MS, step_ns=STEP, chunk_id=1)
    stream.command(900 * MS)
    stream.push(chunk(50.0, horizon=50), start_ns=10 * MS, step_ns=STEP, chunk_id=2)  # time went back
    assert stream.command(10 * MS).chunk_id == 2
    cmd = stream.command(950 * MS)
    assert (cmd.chunk_id, cmd.index) == (2, 47)


def test_after_the_clock_went_back_no_chunk_from_before_it_goes_on_unbounded():
    """A chunk that starts before those held (the clock went back) forgets the commands, so that
    nothing bounds a move from them; a chunk from before it, mid-blend, then went on governing
    with no bound when the new one ran out before it could take over (a 0.039 jump in a tick)."""
    stream = ActionStream(blend_steps=3, max_move=np.array([0.01]), tick_ns=2 * MS)
    stream.push(np.linspace(0.0, 0.09, 10)[:, None], start_ns=1000 * MS, step_ns=STEP, chunk_id=1)
    stream.command(1000 * MS)
    stream.push(np.full((10, 1), 0.5), start_ns=1100 * MS, step_ns=STEP, chunk_id=2)  # far: blended, bounded
    stream.command(1102 * MS)
    last = stream.command(1104 * MS).values
    stream.push(np.zeros((2, 1)), start_ns=1060 * MS, step_ns=STEP, chunk_id=3)  # earlier, over by the next tick
    cmd = stream.command(1106 * MS)
    assert cmd is None or np.abs(cmd.values - last).max() <= 0.01 * 2 / 20 + 1e-12, (cmd, last)


def test_a_change_of_blend_steps_applies_from_the_next_chunk():
    stream = ActionStream(blend_steps=1)
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((10, 1), 8.0), start_ns=STEP, step_ns=STEP, chunk_id=2)
    assert stream.command(STEP).weight == 0.5
    stream.blend_steps = 7  # mid-blend: chunk 2 keeps its blend of 1, and does not step back
    assert stream.command(2 * STEP).weight == 1.0
    stream.push(np.full((10, 1), 16.0), start_ns=3 * STEP, step_ns=STEP, chunk_id=3)
    assert stream.command(3 * STEP).weight == 0.125


def test_chunks_nobody_asks_commands_for_are_not_held_without_bound():
    stream = ActionStream()
    for i in range(1000):
        stream.push(chunk(float(i)), start_ns=i * STEP, step_ns=STEP, chunk_id=i)
    assert len(stream._chunks) == 64
    assert stream.command(999 * STEP).chunk_id == 999


def test_linear_follows_each_chunks_trajectory_between_its_actions():
    """Action k is reached at start + (k + 1) * step, as on the chunk's JointTrajectory; the first
    chunk starts from its own action 0, the next from the command in force when it takes over, from
    that moment: its first tick is that command (it moved a quarter of the way to action 0 at
    once, as though it had come at its start), then a line to action 0 at start + step, as a
    joint_trajectory_controller goes from its desired state."""
    stream = ActionStream(interpolation="linear")
    stream.push(chunk(10.0), start_ns=0, step_ns=STEP, chunk_id=1)
    got = {t: stream.command(t * MS).values[0] for t in (0, 10, 30, 99)}
    assert got == pytest.approx({0: 10.0, 10: 10.0, 30: 10.5, 99: 13.95})
    stream.push(chunk(50.0), start_ns=40 * MS, step_ns=STEP, chunk_id=2)
    cmd = stream.command(45 * MS)  # taken over a quarter of a step in: the last command (13.95)
    assert (cmd.chunk_id, cmd.index) == (2, 0)
    np.testing.assert_allclose(cmd.values, [13.95, -13.95])
    half = stream.command(int(52.5 * MS)).values  # half the time from the take-over to action 0's
    np.testing.assert_allclose(half, [(13.95 + 50.0) / 2, -(13.95 + 50.0) / 2])
    assert stream.command(60 * MS).values[0] == pytest.approx(50.0)
    assert stream.command(70 * MS).values[0] == pytest.approx(50.5)


def test_a_linear_take_over_keeps_the_commands_moving_at_their_speed():
    """Two chunks that agree, commands every 2 ms, the newer one taking over 6 ms into its first
    step: the commands go on at 0.01 per tick. Anchored at the chunk's start the take-over tick
    jumped (0.244 after 0.22); from the take-over itself it stood still for a tick (0.22 twice)."""
    stream = ActionStream(interpolation="linear", tick_ns=2 * MS)
    ramp = lambda first: (first + 0.1 * np.arange(10))[:, None]  # noqa: E731
    stream.push(ramp(0.1), start_ns=0, step_ns=STEP, chunk_id=1, robot_at=np.zeros(1))  # 0.1 per 20 ms
    for t in range(0, 46, 2):
        stream.command(t * MS)
    stream.push(ramp(0.3), start_ns=40 * MS, step_ns=STEP, chunk_id=2)  # the same line from 40 ms on
    got = [stream.command(t * MS) for t in (46, 48, 50, 60, 62)]
    assert [c.chunk_id for c in got] == [2] * 5
    assert [c.values[0] for c in got] == pytest.approx([0.23, 0.24, 0.25, 0.30, 0.31])


def test_linear_blends_continuously_in_time():
    stream = ActionStream(blend_steps=1, interpolation="linear")
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((10, 1), 8.0), start_ns=STEP, step_ns=STEP, chunk_id=2)
    at = {s: stream.command(int(s * STEP)) for s in (1.0, 1.25, 1.5, 2.0)}
    # from 0 at the take-over, with no jump, to 1 one step later
    assert [at[s].weight for s in at] == [0.0, 0.25, 0.5, 1.0]
    # chunk 2 itself goes 0 -> 8 over its first step (from the last command, 0), and weighs in as it goes
    assert [at[s].values[0] for s in at] == pytest.approx([0.0, 0.25 * 2.0, 0.5 * 4.0, 8.0])


def test_the_last_linear_command_is_the_chunks_last_action():
    """The trajectory reaches its last point at the chunk's end; the tick after it commands it,
    not a point short of it."""
    stream = ActionStream(interpolation="linear")
    stream.push(chunk(10.0), start_ns=0, step_ns=STEP, chunk_id=1)
    assert stream.command(95 * MS).values[0] == pytest.approx(13.75)
    assert stream.command(101 * MS).values[0] == 14.0
    assert isinstance(stream.command(102 * MS), Exhausted)


def test_a_change_of_interpolation_applies_from_the_next_chunk():
    stream = ActionStream()
    stream.push(chunk(10.0), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.interpolation = "linear"
    assert stream.command(30 * MS).values[0] == 11.0  # chunk 1 keeps "hold"
    stream.push(chunk(20.0), start_ns=40 * MS, step_ns=STEP, chunk_id=2)
    assert stream.command(70 * MS).values[0] == pytest.approx(20.5)


def test_interpolation_is_hold_or_linear():
    with pytest.raises(ValueError, match="interpolation must be one of hold, linear, got 'cubic'"):
        ActionStream(interpolation="cubic")


def test_max_move_holds_each_command_near_the_one_before():
    """A newer chunk limited against an older joint state can start far from the last command:
    the stream gets there at max_move per command instead of jumping, and says so."""
    stream = ActionStream(max_move=np.array([0.25]))
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    assert not stream.command(0).limited
    stream.push(np.ones((10, 1)), start_ns=STEP, step_ns=STEP, chunk_id=2)
    got = [stream.command(k * STEP) for k in range(1, 6)]
    assert [c.values[0] for c in got] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert [c.limited for c in got] == [True, True, True, False, False]
    stream.clear()  # nothing to move from after a clear: the first command is the chunk's
    stream.push(np.full((10, 1), 7.0), start_ns=0, step_ns=STEP, chunk_id=1)
    assert stream.command(0).values[0] == 7.0


@pytest.mark.parametrize("interpolation", ["hold", "linear"])
def test_max_move_is_a_speed_whatever_the_command_rate(interpolation):
    """Ticks at 500 Hz, actions at 50 Hz: a switch 0.5 away moves at most max_move at once and
    then max_move per step (it once moved max_move per tick: ten times the speed)."""
    tick = 2 * MS
    stream = ActionStream(max_move=np.array([0.05]), interpolation=interpolation)
    stream.push(np.zeros((50, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    for t in range(0, 10 * tick, tick):
        stream.command(t)
    stream.push(np.full((50, 1), 0.5), start_ns=10 * tick, step_ns=STEP, chunk_id=2)
    times = range(10 * tick, 400 * MS, tick)
    got = np.array([stream.command(t).values[0] for t in times])
    reached = times[int(np.argmax(got >= 0.5 - 1e-12))]
    assert reached - 10 * tick >= 9 * STEP, "faster than max_move per step"
    assert reached - 10 * tick <= 10 * STEP, "slower than max_move per step"
    window = STEP // tick  # over any step of time: one budget spent, one refilled
    assert (got[window:] - got[:-window]).max() <= 0.1 + 1e-9


@pytest.mark.parametrize("tick_ms", [10, 100])
def test_a_switch_after_a_gap_moves_no_more_than_two_ticks_allow(tick_ms):
    """A chunk runs out and the decisions stop (a stale camera): ticks send nothing, the robot
    stays at the last command. Two seconds later a new chunk, far away, takes over: the budget
    once counted the whole gap (a hundred steps' worth at once). With the command timer's period
    known it counts at most two ticks' time: max_move per step of that, at 100 Hz and at 10 Hz."""
    tick = tick_ms * MS
    stream = ActionStream(max_move=np.array([0.1]), tick_ns=tick)
    stream.push(np.zeros((5, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    t = 0
    while not isinstance(stream.command(t), Exhausted):
        t += tick
    gap_end = t + 2_000 * MS
    stream.push(np.full((50, 1), 5.0), start_ns=gap_end - 3 * STEP, step_ns=STEP, chunk_id=2)
    first = stream.command(gap_end)
    allowed = 0.1 * max(1.0, 2 * tick / STEP)  # exactly that, not less: slower would lag the commands
    assert first.limited and first.values[0] == pytest.approx(allowed), (first, allowed)
    unbounded = ActionStream(max_move=np.array([0.1]))  # no period known: the whole gap counts
    unbounded.push(np.zeros((5, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    unbounded.command(0)
    unbounded.push(np.full((50, 1), 5.0), start_ns=gap_end - 3 * STEP, step_ns=STEP, chunk_id=2)
    assert unbounded.command(gap_end).values[0] == 5.0


@pytest.mark.parametrize("tick", [2 * MS, 15 * MS, 50 * MS // 3, 25 * MS, 100 * MS / 3, 100 * MS])
@pytest.mark.parametrize("step", [STEP, 100 * MS // 3])
def test_a_held_chunk_within_its_steps_is_never_limited_at_any_rate(tick, step):
    """A float32 chunk whose steps are action_max_step (as action_limits makes them) passes whole:
    a held step in the tick it falls due, at 500 Hz, at 10 Hz (several actions a tick), and at rates
    that are no multiple or divisor of the step (60 Hz commands on 50 Hz actions): there the budget
    refilled in proportion to time lagged the held steps (43 of 66 commands limited)."""
    actions = (np.arange(40, dtype=np.float32) * np.float32(0.05)).reshape(-1, 1).astype(np.float64)
    stream = ActionStream(max_move=np.array([0.05]), tick_ns=round(tick))
    stream.push(actions, start_ns=0, step_ns=step, chunk_id=1)
    times = [round(i * tick) for i in range(int(40 * step / tick))]
    got = [stream.command(t) for t in times]
    assert not any(c.limited for c in got), [c.index for c in got if c.limited][:5]
    np.testing.assert_array_equal([c.values[0] for c in got], actions[[t // step for t in times], 0])


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_a_chunk_within_its_steps_passes_whole_when_ticks_come_late(interpolation):
    """100 Hz commands ticking every 25 ms (a 40 Hz /clock under use_sim_time, as bag playback
    gives) on a chunk at action_max_step per 20 ms action: the two ticks' cap that bounds a switch
    after a gap held the chunk's own steps back too, and the lag grew at every late tick (the
    commands 9 actions behind after a second)."""
    m, step, tick = 0.05, 20 * MS, 10 * MS
    actions = (np.arange(1, 61, dtype=np.float32) * np.float32(m)).reshape(-1, 1).astype(np.float64)
    stream = ActionStream(interpolation=interpolation, max_move=np.array([m]), tick_ns=tick)
    stream.push(actions, start_ns=0, step_ns=step, chunk_id=1, robot_at=np.zeros(1))
    times = range(0, 1200 * MS, 25 * MS)
    got = [stream.command(t) for t in times]
    assert not any(c.limited for c in got), [t for t, c in zip(times, got, strict=True) if c.limited][:5]
    chunk = [m * (t // step + 1) for t in times]  # hold: the action due
    if interpolation == "linear":  # on the line towards it, from the action before (from 0 for the first)
        chunk = [m * (t // step + (t % step) / step) for t in times]
    np.testing.assert_allclose([c.values[0] for c in got], chunk, rtol=1e-6, atol=1e-9)
    # a gap (a second with no command) is no late tick: the first command after it moves max_move
    gap = ActionStream(interpolation=interpolation, max_move=np.array([m]), tick_ns=tick)
    gap.push(actions, start_ns=0, step_ns=step, chunk_id=1, robot_at=np.zeros(1))
    before = [gap.command(t) for t in range(0, 100 * MS, tick)][-1]
    after = gap.command(1090 * MS)
    assert after.limited and after.values[0] - before.values[0] == pytest.approx(m), (before, after)
    # a switch after such a late tick is still held to max_move per step of two ticks at most
    stream.push(actions + 1.0, start_ns=1200 * MS, step_ns=step, chunk_id=2)
    switch = stream.command(1225 * MS)
    assert switch.limited and switch.values[0] - got[-1].values[0] <= m + 1e-9, switch


def test_a_switch_just_after_a_held_step_gets_no_second_step():
    """Held steps pass whole (the test above), but only the governing chunk's own: a chunk that
    takes over 5 ms after the old one's step, one action ahead, moves what 5 ms refill (a quarter
    step), not a second whole step within 5 ms (two steps' move in 10 ms, as one fix allowed)."""
    tick, m = 5 * MS, 0.05
    stream = ActionStream(max_move=np.array([m]), tick_ns=tick)
    stream.push(m * np.arange(40.0).reshape(-1, 1), start_ns=0, step_ns=STEP, chunk_id=1)
    got = [stream.command(t).values[0] for t in range(0, 101 * MS, tick)]
    assert got[-1] == pytest.approx(5 * m)  # its own held steps, whole
    stream.push(m * (np.arange(40.0) + 6).reshape(-1, 1), start_ns=105 * MS, step_ns=STEP, chunk_id=2)
    switch = stream.command(105 * MS)
    assert switch.limited and switch.values[0] == pytest.approx(5.25 * m), switch


def test_a_switch_that_spends_the_budget_gets_no_held_step_within_the_same_step():
    """The mirror of the test above: the command that reaches a chunk's values by spending the
    switch's whole max_move marked the chunk as followed, and its next held step then passed in
    full 10 ms later (two max_move within 10 ms of a 50 ms step, after a start as after a
    switch). Its own held steps pass whole only a step after the commands reached its values."""
    tick, step, m = 10 * MS, 50 * MS, 0.05
    stream = ActionStream(max_move=np.array([m]), tick_ns=tick)
    # after a start: the arm at 0, the chunk within its steps from there, stamped 45 ms before the tick
    stream.push(m * np.arange(1, 11.0).reshape(-1, 1), start_ns=0, step_ns=step, chunk_id=1, robot_at=np.zeros(1))
    got = [stream.command(t) for t in range(45 * MS, 300 * MS, tick)]
    values = [c.values[0] for c in got]
    assert values[0] == pytest.approx(m) and not got[0].limited  # action 0 reached with the whole budget
    assert values[1] == pytest.approx(m + m * tick / step) and got[1].limited  # a tick's refill, not a step
    moved = np.diff([0.0, *values])
    window = step // tick  # no step's time holds more than a switch's max_move plus a step's refill
    assert max(moved[i : i + window].sum() for i in range(len(moved))) <= 2 * m + 1e-9, values


def test_the_first_command_moves_from_where_the_robot_is():
    """A chunk stamped at its observation is due several actions in by the first tick (the state's
    age plus the decision): the first command after a start, pause or reset moved straight to it,
    four max_move from the robot here. With robot_at it moves max_move from the joint state, then
    max_move per step; a joint robot_at does not know is free, as without it."""
    actions = np.stack([0.05 * (1 + np.arange(20))] * 2, axis=1)  # within max_move of 0 at action 0
    robot = np.array([0.0, np.nan])
    stream = ActionStream(max_move=np.array([0.05, 0.05]))
    stream.push(actions, start_ns=0, step_ns=STEP, chunk_id=1, robot_at=robot)
    first = stream.command(3 * STEP + MS)  # due: action 3, 0.2
    assert first.limited and first.values.tolist() == [0.05, 0.2], first
    later = [stream.command(k * STEP + MS).values[0] for k in range(4, 8)]
    np.testing.assert_allclose(later, [0.1, 0.15, 0.2, 0.25])  # max_move per step behind the chunk
    # free only for its first command: a far chunk next moves the unknown joint max_move per step too
    stream.push(actions + 5.0, start_ns=8 * STEP, step_ns=STEP, chunk_id=2)
    jumped = [stream.command(k * STEP + MS).values[1] for k in range(8, 11)]
    np.testing.assert_allclose(jumped, [0.45, 0.5, 0.55])  # from 0.4 (chunk 1 at step 7), not 5.45
    stream.clear()  # a pause or reset: the next chunk starts from the robot again
    stream.push(actions + 1.0, start_ns=10 * STEP, step_ns=STEP, chunk_id=2, robot_at=np.array([1.0, 1.0]))
    np.testing.assert_allclose(stream.command(13 * STEP).values, [1.05, 1.05])
    unbounded = ActionStream(max_move=np.array([0.05, 0.05]))  # without robot_at: nothing to move from
    unbounded.push(actions, start_ns=0, step_ns=STEP, chunk_id=1)
    assert unbounded.command(3 * STEP).values.tolist() == [0.2, 0.2]


def test_linear_approaches_the_first_chunks_action_0_from_the_robot():
    """With no command in force, "linear" goes from the joint state to action 0 over its step (it
    jumped to action 0); a joint without a state starts at action 0, as before."""
    stream = ActionStream(interpolation="linear")
    stream.push(np.ones((5, 2)), start_ns=0, step_ns=STEP, chunk_id=1, robot_at=np.array([0.0, np.nan]))
    np.testing.assert_allclose(stream.command(STEP // 4).values, [0.25, 1.0])


@pytest.mark.parametrize("robot_at", [np.zeros(3), np.array([0.0, np.inf])])
def test_robot_at_must_be_a_position_per_action_dim(robot_at):
    with pytest.raises(ValueError, match=r"robot_at must be \[2\] finite or NaN \(unknown\)"):
        ActionStream().push(np.zeros((5, 2)), start_ns=0, step_ns=STEP, chunk_id=1, robot_at=robot_at)


@pytest.mark.parametrize("interpolation", ["hold", "linear"])
def test_a_blend_longer_than_the_chunk_ends_without_a_jump(interpolation):
    """Blend 8 on a chunk of 10 that takes over at its action 3: past its end the blend goes on
    (it holds its last action) until its weight is 1, then the end point and the stop."""
    stream = ActionStream(blend_steps=8, interpolation=interpolation)
    stream.push(np.zeros((40, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.ones((10, 1)), start_ns=0, step_ns=STEP, chunk_id=2)  # stamped at 0: late by 3 actions
    tick = 2 * MS
    got = []
    for t in range(3 * STEP, 20 * STEP, tick):
        cmd = stream.command(t)
        if isinstance(cmd, Exhausted):
            break
        got.append(cmd.values[0])
    assert got[-1] == 1.0 and isinstance(stream.command(20 * STEP), Exhausted)
    biggest = np.abs(np.diff(got)).max()
    assert biggest <= (1 / 9 if interpolation == "hold" else tick / (8 * STEP)) + 1e-9, biggest


def test_a_clock_gone_back_starts_afresh():
    """A simulator reset: the chunk stamped before the others is neither approached from the
    last command nor bounded by it (the robot was reset with the simulator)."""
    stream = ActionStream(max_move=np.array([0.05]), interpolation="linear")
    stream.push(np.full((10, 1), 2.0), start_ns=100 * STEP, step_ns=STEP, chunk_id=1)
    assert stream.command(100 * STEP).values[0] == 2.0
    stream.push(np.zeros((10, 1)), start_ns=STEP, step_ns=STEP, chunk_id=2)
    cmd = stream.command(STEP)
    assert (cmd.chunk_id, cmd.values[0], cmd.limited) == (2, 0.0, False)


def test_an_end_point_held_back_is_commanded_until_reached():
    stream = ActionStream(max_move=np.array([0.25]))
    stream.push(np.zeros((2, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.ones((2, 1)), start_ns=STEP, step_ns=STEP, chunk_id=2)
    got = [stream.command(k * STEP) for k in range(1, 8)]
    values = [c.values[0] for c in got if isinstance(c, Command)]
    assert values == [0.25, 0.5, 0.75, 1.0] and got[4] == Exhausted(chunk_id=2, ended_ns=3 * STEP)


def test_interpolated_and_blended_commands_stay_within_the_values_they_come_from():
    """Two chunks at a joint limit that float32 holds exactly: (1 - w) a + w b lands a rounding
    error above it for some w, the stream never does."""
    limit = 1.5
    rng = np.random.default_rng(0)
    for interpolation in ("hold", "linear"):
        stream = ActionStream(blend_steps=3, interpolation=interpolation)
        for i in range(20):
            actions = np.minimum(rng.uniform(1.4, 1.6, size=(10, 3)), limit)
            stream.push(actions, start_ns=i * 2 * STEP, step_ns=STEP, chunk_id=i + 1)
            for t in range(i * 2 * STEP, (i + 1) * 2 * STEP, 3 * MS):
                assert (stream.command(t).values <= limit).all()


def test_take_over_settings_change_together_or_not_at_all():
    stream = ActionStream(blend_steps=2, interpolation="hold")
    stream.set_take_over(5, "linear")
    assert (stream.blend_steps, stream.interpolation) == (5, "linear")
    with pytest.raises(ValueError, match="interpolation must be one of hold, linear"):
        stream.set_take_over(7, "cubic")
    assert (stream.blend_steps, stream.interpolation) == (5, "linear")


def test_a_chunk_starting_with_the_governing_one_blends_in():
    """Two decisions on one joint message share a start: the second replaces the first, but the
    first governed already, so the second blends in from it instead of jumping."""
    stream = ActionStream(blend_steps=1)
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    stream.command(0)
    stream.push(np.full((10, 1), 4.0), start_ns=0, step_ns=STEP, chunk_id=2)
    cmd = stream.command(MS)
    assert (cmd.chunk_id, cmd.weight, cmd.values[0]) == (2, 0.5, 2.0)


def test_a_stall_of_two_and_a_half_steps_is_a_gap_moving_max_move_once():
    m, tick = 0.05, 10 * MS
    stream = ActionStream(max_move=np.array([m]), tick_ns=tick)
    stream.push((np.arange(1, 61) * m).reshape(-1, 1), start_ns=0, step_ns=STEP, chunk_id=1, robot_at=np.zeros(1))
    before = [stream.command(t) for t in range(0, 101 * MS, tick)][-1]
    after = stream.command(150 * MS)
    assert after.limited and after.values[0] - before.values[0] == pytest.approx(m), (before, after)


def test_a_chunks_own_large_step_moves_max_move_per_tick():
    stream = ActionStream(max_move=np.array([0.1]), tick_ns=STEP)
    stream.push(np.array([[0.0], [0.1], [0.4], [0.4]]), start_ns=0, step_ns=STEP, chunk_id=1, robot_at=np.zeros(1))
    assert [stream.command(k * STEP).values[0] for k in range(3)] == pytest.approx([0.0, 0.1, 0.2])


def test_linear_after_a_gap_approaches_action_0_from_now():
    """After a gap the line to action 0 starts a tick ago, not where the last command was sent:
    from 1013 ms towards action 0 at 1020 ms, 2/7 of the way at 1015 ms (not 0.75)."""
    tick = 2 * MS
    stream = ActionStream(interpolation="linear", tick_ns=tick)
    stream.push(np.zeros((2, 1)), start_ns=0, step_ns=STEP, chunk_id=1)
    t = 0
    while not isinstance(stream.command(t), Exhausted):
        t += tick
    stream.push(np.ones((5, 1)), start_ns=1000 * MS, step_ns=STEP, chunk_id=2)
    assert stream.command(1015 * MS).values[0] == pytest.approx(2 / 7)


def test_a_later_chunk_is_bounded_from_the_last_command_not_its_joint_state():
    """The node pushes every chunk with the joint state it saw: only the first starts from it; a
    later one moves on from the command sent (a restart from robot_at would jump)."""
    stream = ActionStream(max_move=np.array([0.25]))
    stream.push(np.zeros((10, 1)), start_ns=0, step_ns=STEP, chunk_id=1, robot_at=np.zeros(1))
    stream.command(0)
    stream.push(np.ones((10, 1)), start_ns=STEP, step_ns=STEP, chunk_id=2, robot_at=np.array([0.9]))
    cmd = stream.command(STEP)
    assert cmd.limited and cmd.values[0] == 0.25, cmd
