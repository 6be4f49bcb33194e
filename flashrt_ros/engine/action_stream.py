"""The command due now, from the action chunks published so far: DESIGN's action stream at the
controller's rate.

A controller that takes one position command per tick (ros2_control's
forward_position_controller, a LeRobot-style robot loop) cannot consume a chunk: something must
say, at each tick, which action is due. Action ``k`` of a chunk that starts at ``start_ns`` is due
during ``[start + k * step, start + (k + 1) * step)``: it is the target the chunk's trajectory
reaches at ``start + (k + 1) * step``. With ``interpolation="hold"`` it is commanded as it is
until then (zero-order hold, as LeRobot executes its action queue); with ``"linear"`` the command
follows the chunk's trajectory, a straight line from action ``k - 1`` to action ``k`` over that
interval, for controllers that tick faster than the actions come. Action 0 is approached from
the command in force when the chunk took over, along a line from when that command was sent (at
most a tick before; a take-over late in the first step does not jump most of the way at once, as
joint_trajectory_controller goes on from its desired state); with none in force (the first
chunk, or after a ``clear()``), from where the robot is at the chunk's start (``push``'s
``robot_at``: the joint state the chunk was decided on), else from action 0 itself.

The newest chunk that has started governs; one whose last action has passed by the first tick
after it arrived is skipped, as a trajectory controller refuses it. The first tick past the
governing chunk's end commands its last action (the trajectory's end point), and from then on
the stream commands nothing rather than extrapolate: the controller holds its last command. A
chunk that starts before the ones held means the clock went back (a simulator reset): those are
dropped.

Two chunks computed at different times disagree where they overlap, so a switch to a newer one
is a jump. ``blend_steps`` (n) spreads it: the command moves from what the older chunks command
(themselves blended, so a chunk that arrives during a blend starts from the blend; one that has
run out holds its last action) to the newer chunk's own, with weights 1/(n+1), 2/(n+1), ... on
the first n actions it commands, from the one due at the take-over ("hold"), or growing from 0 to
1 over n steps' time from the take-over
("linear", continuous). A chunk with no older one to blend from (the first, or after a
``clear()``) is its own values from its first command, and ends at its end.
``blend_steps`` and ``interpolation`` are read when a chunk takes over:
a change applies from the next chunk on.

``max_move`` (per joint, action_max_step) bounds how fast the commands move: a chunk's own steps
are limited when it is made (engine/action_limits.py), but a switch to a newer chunk, which was
limited against an older joint state, is not; with ``max_move`` the stream gets there at
``max_move`` per step instead (``Command.limited``). It is a budget per joint that refills at
``max_move`` per step of time, up to one step's move (a tick longer than a step: that many steps'),
and each command spends what it moves: a linear action's share per tick passes, but at any command
rate a switch moves at most ``max_move`` at once and then ``max_move`` per step. A chunk's own
steps, once the commands have been on its values for a step (after the switch is made up), may also
move ``max_move`` per action that fell due since the last tick ("hold": held actions move in whole
steps, and where the ticks fall at other times than the steps, 60 Hz commands on 50 Hz actions, two
can fall due a tick apart, which the time's refill would hold back), or per step of the time since
the last tick ("linear"), over up to two steps or two ticks, whichever is longer (the two ticks'
cap below is for switches: a /clock slower than the command rate ticks late at every tick, and
capped there, the commands fell further behind a chunk moving at ``max_move`` per step; a longer
gap is a gap). The first command with none in force moves at most ``max_move`` from ``robot_at``
(joints it has: a chunk stamped at its observation may be due several actions in by then). The time
a refill counts is at most two ticks of ``tick_ns`` (the command timer's period): after a gap with
no command (a chunk ran out and decisions were skipped, a stalled timer, ROS time jumping ahead)
the robot stood where the last command left it, and the next switch may not move a gap's worth of
steps at once. Interpolated and blended values are clipped to the values they are made from: a
chunk within joint limits gives commands within them, to the last bit.

Plain numpy and a lock: the node pushes chunks from its decision thread and asks for commands
from its command timer's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

INTERPOLATIONS = ("hold", "linear")
MAX_PENDING = 64
"""Chunks held that have not governed yet: more come only if nobody asks for commands."""


@dataclass(frozen=True)
class Command:
    values: np.ndarray  # [dof] float64, robot units
    chunk_id: int  # the chunk that governs
    index: int  # its action that is due
    weight: float  # the governing chunk's share of `values`: below 1 during a blend
    limited: bool = False  # max_move held the command back from the chunk's value
    start_ns: int = 0  # the governing chunk's start: with chunk_id, which chunk (a restore repeats ids)


@dataclass(frozen=True)
class Exhausted:
    """The governing chunk's last action has passed and no newer chunk has started."""

    chunk_id: int
    ended_ns: int


@dataclass(eq=False)  # compared by identity: which chunk, not which numbers
class _Chunk:
    actions: np.ndarray  # [horizon, dof] float64
    start_ns: int
    step_ns: int
    chunk_id: int
    # set when it first governs, from the stream's settings then
    took_over_ns: int | None = None
    blend_steps: int = 0
    linear: bool = False
    robot_at: np.ndarray | None = None  # the joint state it was decided on (NaN: a joint without one)
    origin: np.ndarray | None = None  # where "linear" approaches action 0 from
    origin_ns: int = 0  # and from when: its start (the joint state then), or when the command in force was sent
    end_sent: bool = False  # its last action was commanded once past its end

    def index(self, now_ns: int) -> int:
        return (now_ns - self.start_ns) // self.step_ns

    def ran_out(self, now_ns: int) -> bool:
        return self.index(now_ns) >= len(self.actions)

    def value(self, now_ns: int) -> np.ndarray:
        """Its command at ``now_ns``; past its end its last action, held."""
        k = self.index(now_ns)
        if k >= len(self.actions):
            return self.actions[-1]
        if not self.linear:
            return self.actions[k]
        if k == 0 and self.origin_ns > self.start_ns:  # from the command in force, from when it was sent
            frac = (now_ns - self.origin_ns) / (self.start_ns + self.step_ns - self.origin_ns)
            return _between(self.origin, self.actions[0], min(max(frac, 0.0), 1.0))
        before = self.actions[k - 1] if k > 0 else self.origin
        frac = (now_ns - self.start_ns - k * self.step_ns) / self.step_ns
        return _between(before, self.actions[k], frac)

    def weight(self, now_ns: int) -> float:
        """Its share of the command, blended with the older chunks' (see the module docstring)."""
        n = self.blend_steps
        if n == 0:
            return 1.0
        if self.linear:
            return min(max(now_ns - self.took_over_ns, 0) / (n * self.step_ns), 1.0)
        actions_in = max(self.index(now_ns) - self.index(self.took_over_ns), 0) + 1
        return min(actions_in / (n + 1), 1.0)

    @property
    def ended_ns(self) -> int:
        return self.start_ns + len(self.actions) * self.step_ns


class ActionStream:
    """See the module docstring. ``command(now_ns)`` is called with the clock the chunks'
    ``start_ns`` are on (the node's ROS clock). Chunks are held in push order, which is start
    order: the ones the blend still reads, the governing one, then those not started yet."""

    def __init__(
        self,
        blend_steps: int = 0,
        interpolation: str = "hold",
        max_move: np.ndarray | None = None,
        tick_ns: int | None = None,
    ):
        self.blend_steps = blend_steps
        self.interpolation = interpolation
        self.max_move = max_move
        self.tick_ns = tick_ns  # the command timer's period (None: a refill counts all the time since)
        self._chunks: list[_Chunk] = []
        self._last: np.ndarray | None = None  # the last command: where "linear" starts a chunk from
        self._last_ns = 0  # when it was sent
        self._budget: np.ndarray | None = None  # max_move's: how far the next command may move
        self._tracking: _Chunk | None = None  # the chunk whose own value the last command was
        self._tracking_since_ns = 0  # the first command of that run on its values
        self._lock = threading.Lock()

    @property
    def blend_steps(self) -> int:
        return self._blend_steps

    @blend_steps.setter
    def blend_steps(self, steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"blend_steps must be an integer >= 0, got {steps!r}")
        self._blend_steps = steps

    @property
    def interpolation(self) -> str:
        return self._interpolation

    @interpolation.setter
    def interpolation(self, mode: str) -> None:
        if mode not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {mode!r}")
        self._interpolation = mode

    def set_take_over(self, blend_steps: int, interpolation: str) -> None:
        """Both settings a chunk reads when it takes over, changed together: no chunk takes one
        old and one new."""
        with self._lock:
            before = self._blend_steps, self._interpolation
            try:
                self.blend_steps, self.interpolation = blend_steps, interpolation
            except ValueError:
                self._blend_steps, self._interpolation = before
                raise

    def push(
        self, actions: np.ndarray, start_ns: int, step_ns: int, chunk_id: int, robot_at: np.ndarray | None = None
    ) -> None:
        """A new chunk, ``actions[k]`` due from ``start_ns + k * step_ns``; it governs from the
        first ``command`` at or after ``start_ns``. ``robot_at`` [dof]: where the robot was when it
        was decided (NaN for a joint not known), the start of the commands if none is in force."""
        actions = np.array(actions, dtype=np.float64)  # a copy: the caller's buffer may be re-used
        start_ns, step_ns = int(start_ns), int(step_ns)
        if actions.ndim != 2 or actions.shape[0] == 0 or actions.shape[1] == 0:
            raise ValueError(f"actions must be [horizon, dof] with both > 0, got shape {actions.shape}")
        if robot_at is not None:
            robot_at = np.array(robot_at, dtype=np.float64)
            if robot_at.shape != actions.shape[1:] or np.isinf(robot_at).any():
                raise ValueError(
                    f"robot_at must be [{actions.shape[1]}] finite or NaN (unknown), got {robot_at.tolist()}"
                )
        if not np.isfinite(actions).all():
            raise ValueError(f"chunk {chunk_id} has non-finite actions: not streamed")
        if step_ns <= 0:
            raise ValueError(f"step_ns must be at least 1 ns, got {step_ns}")
        with self._lock:
            dof = self._chunks[-1].actions.shape[1] if self._chunks else actions.shape[1]
            if actions.shape[1] != dof:
                raise ValueError(f"chunk {chunk_id} has {actions.shape[1]} action dims, the stream {dof}")
            # chunks that start after this one are from before the clock went back (a simulator
            # reset); one that starts with it and has not governed never will. After a reset the
            # commands before it say nothing of where the robot is: nothing to start from or bound by,
            # and no chunk from before it goes on (one mid-blend would, unbounded, were this one to
            # run out before it governs)
            if any(c.start_ns > start_ns for c in self._chunks):
                self._forget_commands()
                self._chunks = []
            self._chunks = [
                c
                for c in self._chunks
                if c.start_ns < start_ns or (c.start_ns == start_ns and c.took_over_ns is not None)
            ]
            self._chunks.append(_Chunk(actions, start_ns, step_ns, chunk_id, robot_at=robot_at))
            pending = [c for c in self._chunks if c.took_over_ns is None]
            dropped = pending[: max(len(pending) - MAX_PENDING, 0)]
            self._chunks = [c for c in self._chunks if c not in dropped]

    def clear(self) -> None:
        """Forget every chunk and the last command: nothing until the next push."""
        with self._lock:
            self._chunks.clear()
            self._forget_commands()

    def _forget_commands(self) -> None:
        self._last, self._budget, self._tracking = None, None, None

    def command(self, now_ns: int) -> Command | Exhausted | None:
        """What is due at ``now_ns``; None before any chunk has started."""
        with self._lock:
            # a chunk over before it could govern (published late) is skipped, as a trajectory
            # controller refuses one: the chunk that governs goes on
            self._chunks = [c for c in self._chunks if c.took_over_ns is not None or not c.ran_out(now_ns)]
            live = [c for c in self._chunks if c.start_ns <= now_ns]
            pending = [c for c in self._chunks if c.start_ns > now_ns]
            if not live:
                return None
            newest = live[-1]
            if newest.took_over_ns is None:  # it governs from now; chunks that never governed drop out
                live = [c for c in live[:-1] if c.took_over_ns is not None] + [newest]
                self._take_over(newest, now_ns, alone=len(live) == 1)
            # past the end, a blend still under way goes on (the chunk holds its last action), then
            # the trajectory's end point once (hold has it, linear nearly): the end without a jump
            ended = newest.ran_out(now_ns) and newest.weight(now_ns) >= 1.0
            if ended and newest.end_sent:
                self._chunks = [newest, *pending]
                return Exhausted(newest.chunk_id, newest.ended_ns)
            values, weight, used = _blended(live, now_ns)
            # what the blend did not reach it never will: weights only grow with time
            self._chunks = live[len(live) - used :] + pending
            values, limited = self._bounded_move(values, now_ns, newest)
            tracking = newest if weight >= 1.0 and not limited else None  # on its own values
            if tracking is not self._tracking:  # a run on a chunk's values begins (read only while one lasts)
                self._tracking_since_ns = now_ns
            self._tracking = tracking
            newest.end_sent = ended and not limited  # an end point held back is sent again
            self._remember(now_ns, values)
            index = min(newest.index(now_ns), len(newest.actions) - 1)
            return Command(values.copy(), newest.chunk_id, index, weight, limited, newest.start_ns)

    def _bounded_move(self, values: np.ndarray, now_ns: int, governing: _Chunk) -> tuple[np.ndarray, bool]:
        """``values`` moved from the last command within the budget (see the module docstring);
        whether that held them back."""
        if self.max_move is None or self._last is None:
            return values, False
        since = max(now_ns - self._last_ns, 0)  # none when the clock went back
        elapsed = since if self.tick_ns is None else min(since, 2 * self.tick_ns)  # a gap: two ticks' worth
        steps = elapsed / governing.step_ns
        cap = self.max_move * max(1.0, steps)  # a tick longer than a step may move each step's worth
        self._budget = np.minimum(cap, self._budget + self.max_move * steps)
        allowed = self._budget
        late = self.tick_ns is None or since <= 2 * max(self.tick_ns, governing.step_ns)  # longer: a gap
        if late and self._on_own_steps(governing, now_ns):  # its own motion over the time since (docstring)
            if governing.linear:
                allowed = np.maximum(allowed, self.max_move * (since / governing.step_ns))
            else:
                due = governing.index(now_ns) - governing.index(now_ns - since)
                allowed = np.maximum(allowed, self.max_move * due)
        last = np.where(np.isnan(self._last), values, self._last)  # a joint robot_at did not know: free
        move = values - last
        # a hair of slack: a float32 chunk within its steps comes out a float32 rounding or two
        # over (chunks are float32 on the wire), and the refills add up a float64 one under
        slack = 1e-6 * allowed + 2.5e-7 * np.maximum(np.abs(last), np.abs(values))
        over = np.abs(move) > allowed + slack
        if over.any():
            values = np.where(over, last + np.sign(move) * allowed, values)
        self._budget = np.maximum(self._budget - np.abs(values - last), 0.0)
        return values, bool(over.any())

    def _on_own_steps(self, governing: _Chunk, now_ns: int) -> bool:
        """Whether the last command was on the governing chunk's own values for at least a step
        (the command that reached them may have spent a whole max_move on the switch, and one
        step's time must pass before the next): then its own steps pass whole, also on a late tick
        (a /clock slower than the command rate ticks 2.5 periods apart)."""
        if governing is not self._tracking:
            return False
        boundary_ns = governing.start_ns + governing.index(now_ns) * governing.step_ns
        return self._tracking_since_ns <= boundary_ns - governing.step_ns

    def _remember(self, now_ns: int, values: np.ndarray) -> None:
        if self._last is None and self.max_move is not None:
            self._budget = np.array(self.max_move, dtype=np.float64)  # the first command: a full step's
        self._last, self._last_ns = values, now_ns

    def _take_over(self, chunk: _Chunk, now_ns: int, alone: bool) -> None:
        """`alone`: no older chunk to blend from (the first, or after a clear): its own values
        at once, and its end is its last action's (an unfinished blend weight kept it going)."""
        chunk.took_over_ns = now_ns
        chunk.blend_steps = 0 if alone else self._blend_steps
        chunk.linear = self._interpolation == "linear"
        chunk.origin_ns = chunk.start_ns
        if self._last is None and chunk.robot_at is not None:  # no command in force: from the robot
            self._last, self._last_ns = chunk.robot_at, now_ns
            self._budget = None if self.max_move is None else np.array(self.max_move, dtype=np.float64)
        elif self._last is not None:  # from the command in force, from when it was sent (at most a tick
            # ago: after a gap, from now), on to action 0's time: no jump, and no tick standing still
            sent_ns = self._last_ns if self.tick_ns is None else max(self._last_ns, now_ns - self.tick_ns)
            chunk.origin_ns = min(max(sent_ns, chunk.start_ns), now_ns)  # not before the chunk's start
        if self._last is None:
            chunk.origin = chunk.actions[0]
        else:  # a joint robot_at did not know: from action 0
            chunk.origin = np.where(np.isnan(self._last), chunk.actions[0], self._last)


def _blended(live: list[_Chunk], now_ns: int) -> tuple[np.ndarray, float, int]:
    """The newest chunk's value, moved from the older ones' (blended in turn) by its weight;
    its weight; how many chunks, from the newest back, the blend read."""
    chain, weights = [live[-1]], [live[-1].weight(now_ns)]  # back to a weight of 1, or the oldest held
    while weights[-1] < 1.0 and len(chain) < len(live):
        chain.append(live[-len(chain) - 1])
        weights.append(chain[-1].weight(now_ns))
    values = np.array(chain[-1].value(now_ns))  # the oldest read governs alone (a copy)
    for chunk, w in zip(reversed(chain[:-1]), reversed(weights[:-1]), strict=True):
        values = _between(values, chunk.value(now_ns), w)
    return values, (weights[0] if len(chain) > 1 else 1.0), len(chain)


def _between(a: np.ndarray, b: np.ndarray, frac: float) -> np.ndarray:
    """``a`` moved ``frac`` of the way to ``b``, never outside them: (1 - f) a + f b can land a
    rounding error past both where they are equal, which is past a joint limit that they touch."""
    return np.clip((1.0 - frac) * a + frac * b, np.minimum(a, b), np.maximum(a, b))
