"""Execution-state capsules: byte-exact snapshots of what a pipeline carries between decisions.

A decision is a function of its observation *and* of state the pipeline keeps from earlier
decisions: the noise generator, the chunk counter and the previous chunk, on both backends.
Saving that state under a name and putting it back later makes a run reproducible from any
point: replay a decision that went wrong, compare two prompts from the same state (fork), or
return to a known-good state after a fault.

Two pieces, one concept:

- :class:`PipelineState` names the persistent state of the reference
  :class:`~flashrt_ros.engine.pipeline.Pipeline` and reads/writes it as host arrays.
  It also keeps the last chunk, which the Pipeline itself does not.
- :class:`CapsuleStore` keeps named, immutable copies of such state (a :class:`Capsule`)
  and restores, forks, lists and drops them.

The state is read and written as host arrays (a few KB) on both backends, between decisions;
the store only needs ``read()`` / ``write()`` from whatever holds the state.

The cached prefix (engine/prefix_cache.py) is not part of a capsule. Under the "new_inputs"
trigger a decision re-uses it only where running the stage again would build the same K/V, so it
never changes a chunk, and a restored state replays the same chunks with it or without. Under the
"period" trigger a chunk depends on which frames the held prefix saw: a restore (and a reset)
forgets it, so the next decision builds it from its own frames, and a replay matches the first
run where that run built its prefix at the same decision.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np
import torch

from ..policies.listing import shown, some
from ..policies.policy import Observation
from .pipeline import Decision, Pipeline
from .real_time_chunking import Hold

StateDict = dict[str, np.ndarray]


class StateHolder(Protocol):
    """Anything whose persistent state can be read and written as named arrays."""

    def read(self) -> StateDict: ...

    def write(self, state: Mapping[str, np.ndarray]) -> None: ...


class PipelineState:
    """The persistent state of a reference Pipeline as named host arrays.

    ``rng``            uint8[n]   state of the generator the decision noise is drawn from
    ``next_chunk_id``  int64[1]   id the next decision will get
    ``last_actions``   float32[horizon, dof] the previous chunk ([0, dof] before the first),
                       restored with the rest; nothing decides from it (rtc holds to the node's
                       executing chunk)

    Route decisions through :meth:`decide` so the last chunk is kept.
    """

    NAMES = ("rng", "next_chunk_id", "last_actions")

    def __init__(self, pipeline: Pipeline, seed: int):
        self.pipeline = pipeline
        self.seed = seed
        self.last_actions = self._no_actions()

    def decide(self, obs: Observation, noise: torch.Tensor | None = None, hold: Hold | None = None) -> Decision:
        decision = self.pipeline.decide(obs, noise, hold)
        self.last_actions = np.array(decision.actions, dtype=np.float32, copy=True)
        return decision

    def read(self) -> StateDict:
        """Copies of every buffer (later decisions do not change them)."""
        return {
            "rng": self.pipeline.generator.get_state().numpy().copy(),
            "next_chunk_id": np.array([self.pipeline.next_chunk_id], dtype=np.int64),
            "last_actions": self.last_actions.copy(),
        }

    def write(self, state: Mapping[str, np.ndarray]) -> None:
        """Make ``state`` (as returned by :meth:`read`) the live state, byte for byte."""
        missing = [n for n in self.NAMES if n not in state]
        unknown = sorted(set(state) - set(self.NAMES))
        if missing or unknown:
            raise ValueError(f"pipeline state needs buffers {list(self.NAMES)}; missing {missing}, unknown {unknown}")
        rng, ids, actions = (np.asarray(state[n]) for n in self.NAMES)
        # every buffer checked before any is applied: a refused state changes nothing
        live, policy = self.pipeline.generator.get_state().numpy(), self.pipeline.policy
        problems = []
        if rng.dtype != live.dtype or rng.shape != live.shape:
            problems.append(f"rng must be {live.dtype}[{live.size}], got {rng.dtype}{list(rng.shape)}")
        else:
            problems += _rng_problems(rng, self.pipeline.generator.device)
        if ids.shape != (1,) or ids.dtype.kind not in "iu" or ids[0] < 1:
            value = f"={ids.tolist()}" if ids.size == 1 else ""
            problems.append(f"next_chunk_id must be one integer >= 1, got {ids.dtype}{list(ids.shape)}{value}")
        problems += _actions_problems(actions, policy.cfg.horizon, policy.action_dof)
        if problems:
            raise ValueError("pipeline state refused: " + "; ".join(problems))
        last = np.array(actions, dtype=np.float32, copy=True)  # converted before anything is applied
        self.pipeline.generator.set_state(torch.from_numpy(rng.copy()))
        self.pipeline.next_chunk_id = int(ids[0])
        self.last_actions = last
        self.pipeline.forget_prefix()  # its frames are from another line of decisions

    def reset(self) -> None:
        """Back to the state of a fresh pipeline: generator at its seed, ids from 1, no chunk."""
        self.pipeline.generator.manual_seed(self.seed)
        self.pipeline.next_chunk_id = 1
        self.last_actions = self._no_actions()
        self.pipeline.forget_prefix()

    def _no_actions(self) -> np.ndarray:
        return np.zeros((0, self.pipeline.policy.action_dof), dtype=np.float32)


def _rng_problems(rng: np.ndarray, device: torch.device) -> list[str]:
    """A generator state of the right size that the generator still refuses (the CPU's mt19937
    checks its bytes): found on a scratch generator, so a refused state changes nothing."""
    try:
        torch.Generator(device=device).set_state(torch.from_numpy(rng.copy()))
    except RuntimeError as exc:
        return [f"rng is not a state of this {device.type} generator ({exc})"]
    return []


def _actions_problems(actions: np.ndarray, horizon: int, dof: int) -> list[str]:
    """What makes `actions` unusable as ``last_actions``: a decision's chunk is a real float32
    matrix [horizon, dof] of finite values (or [0, dof]: no decision yet); another horizon is
    another pipeline's. Checked on the dtype, not by converting: strings or an object array
    (None would become NaN) must be refused before any buffer is applied."""
    if actions.ndim != 2 or actions.shape[0] not in (0, horizon) or actions.shape[1] != dof:
        return [f"last_actions must be [{horizon}, {dof}] (or [0, {dof}] before a decision), got {list(actions.shape)}"]
    if actions.dtype.kind not in "fiu":
        return [f"last_actions must be float32[{horizon}, {dof}] (real numbers), got dtype {actions.dtype}"]
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: refused below
        as_f32 = actions.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(as_f32))
    if bad.size:
        row, col = divmod(int(bad[0]), dof)
        return [
            f"last_actions must be finite in float32 (a decision's chunk is), got {actions[row, col]} at "
            f"[{row}, {col}] ({bad.size} such values)"
        ]
    return []


@dataclass(frozen=True)
class Capsule:
    """A named, immutable copy of execution state; ``created_ns``: when the state was taken
    (a fork keeps its source's), wall-clock (or node clock) time in nanoseconds."""

    name: str
    buffers: Mapping[str, np.ndarray]
    created_ns: int

    @property
    def size_bytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buffers.values())

    def summary(self) -> str:
        parts = ", ".join(
            f"{k} {v.dtype}{list(v.shape)}" + (f"={v.item()}" if v.size == 1 else "")  # counters show their value
            for k, v in self.buffers.items()
        )
        return f"capsule {self.name!r}: {self.size_bytes} bytes ({parts})"


class CapsuleNotFound(KeyError):
    """No capsule of that name. ``str()`` is the plain message (KeyError would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0])


class CapsuleStoreFull(ValueError):
    """The store holds its limit of capsules: a new name needs one dropped first."""


MAX_CAPSULES = 100
"""How many capsules a store keeps: a client snapshotting under fresh names in a loop would
otherwise grow the node's memory without bound (each holds the last chunk and the noise
generator: ~6 KB for the default policy on a CPU, whose generator state is 5 KB)."""


class CapsuleStore:
    """Named capsules of one state holder: snapshot, restore, fork, list, drop.

    Not thread-safe: call it between decisions (the node serialises it with them).
    """

    def __init__(self, state: StateHolder, clock_ns: Callable[[], int] = time.time_ns, limit: int = MAX_CAPSULES):
        self.state = state
        self.clock_ns = clock_ns
        self.limit = limit
        self._capsules: dict[str, Capsule] = {}

    def snapshot(self, name: str) -> Capsule:
        """Copy the live state into capsule ``name`` (replacing one of the same name)."""
        _check_name(name)
        name = _same_spelling(name)
        self._check_room(name)
        capsule = _frozen(name, self.state.read(), self.clock_ns())
        self._capsules[name] = capsule
        return capsule

    def restore(self, name: str) -> Capsule:
        """Make capsule ``name`` the live state; the capsule is kept."""
        capsule = self._get(name)
        self.state.write(capsule.buffers)
        return capsule

    def fork(self, source: str, target: str) -> Capsule:
        """Copy capsule ``source`` to a new capsule ``target``; the live state is not touched."""
        _check_name(target, "fork target (the new capsule's name)")
        target = _same_spelling(target)
        original = self._get(source)
        if target in self._capsules:
            raise ValueError(f"capsule {shown(target)} already exists; drop it first or pick another name")
        self._check_room(target)
        capsule = _frozen(target, dict(original.buffers), original.created_ns)  # when its state was taken
        self._capsules[target] = capsule
        return capsule

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _same_spelling(name) in self._capsules

    def list(self) -> list[Capsule]:
        """All capsules, sorted by name."""
        return [self._capsules[name] for name in sorted(self._capsules)]

    def drop(self, name: str) -> Capsule:
        capsule = self._get(name)
        del self._capsules[capsule.name]
        return capsule

    def _check_room(self, name: str) -> None:
        """A new name must fit under the limit; replacing a kept capsule always may."""
        if name not in self._capsules and len(self._capsules) >= self.limit:
            raise CapsuleStoreFull(
                f"cannot add capsule {shown(name)}: the store holds its limit of {self.limit} capsules; "
                "drop one first (~/capsule/list names them) or reuse a name"
            )

    def _get(self, name: str) -> Capsule:
        try:
            return self._capsules[_same_spelling(name) if isinstance(name, str) else name]
        except KeyError:
            have = some([shown(n) for n in sorted(self._capsules)], SHOWN_NAMES) or "none"
            raise CapsuleNotFound(f"no capsule named {shown(name)} (have: {have})") from None


SHOWN_NAMES = 10  # a refusal names this many of the capsules kept: its reply and log line stay short


_INVISIBLE = frozenset(
    chr(c) for c in (0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0, *range(0x180B, 0x1810))
) | frozenset(chr(c) for r in (range(0xFE00, 0xFE10), range(0xE0000, 0xE1000)) for c in r)
"""Characters that show nothing and are no control or format character: a grapheme joiner, Khmer
inherent vowels, Mongolian and other variation selectors, tags, Hangul and Braille blanks (Unicode's
default-ignorable code points and blank letters)."""
_UNSEEN_CATEGORIES = ("Cc", "Cf", "Cn", "Co")  # control, format (zero-width), unassigned, private use


def _unseen(c: str) -> bool:
    """A character that shows nothing, or nothing one can tell apart: also every space but U+0020
    (a no-break or ideographic space, a line separator reads as a space)."""
    return unicodedata.category(c) in _UNSEEN_CATEGORIES or c in _INVISIBLE or (c.isspace() and c != " ")


def _same_spelling(name: str) -> str:
    """One spelling per name (NFC): "café" typed as one character or as e + accent is one capsule."""
    return unicodedata.normalize("NFC", name)


def _check_name(name: str, what: str = "capsule name") -> None:
    """`what`: the request's field, where there are two (fork's source and target). No spaces at
    either end nor control or invisible (zero-width, blank) characters: " a" and "a" were two
    capsules that read alike in a list."""
    if not isinstance(name, str) or not name.strip() or len(_same_spelling(name)) > 256:  # as stored
        raise ValueError(f"{what} must be a non-empty string of at most 256 characters, got {shown(name)}")
    if name != name.strip() or any(_unseen(c) for c in name):
        raise ValueError(
            f"{what} {shown(name)} starts or ends with spaces or holds a control or invisible character; expected "
            "a name without them (names that read alike would be different capsules)"
        )


def _frozen(name: str, buffers: Mapping[str, np.ndarray], created_ns: int) -> Capsule:
    """Copies over immutable bytes (their writeable flag cannot be set again) in a read-only map."""
    copies = {}
    for key, value in buffers.items():
        a = np.asarray(value)
        copies[key] = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
    return Capsule(name, MappingProxyType(copies), created_ns)
