"""When a decision may re-use the prefix stage's K/V instead of running the stage again.

The prefix stage (vision + the prefix LM -> prefix_kv) is a function of the camera frames, of
which views are present and of the prompt tokens (pi0.5's carry the discretised robot state).
A decision whose inputs to it are the ones the cached K/V was built from would build the same
K/V again, so it skips the stage and runs the denoise on the cache: the chunk is byte-identical
to a full decision's (its own noise and, for pi0, its own state still go into the denoise).
This pays when decisions come faster than the cameras: on the H200 a pi0.5 decision at 3 views
is ~14 ms and its denoise alone ~6.6 ms.

Whether two decisions saw the same frames is for the caller to say, through
``Observation.frame_ids`` (the node passes each camera message's stamp and arrival): equal ids
promise equal pixels. Without ids the stage always runs.

The "period" trigger is DESIGN's multi-rate contract (prefix at 10 Hz, denoise at 30-50 Hz): new
frames alone run the stage at most once per ``period_s``, and the decisions between re-use the
prefix of frames up to that much older. The prompt tokens (pi0.5's state among them) and which
views are present are never held back: a change of them runs the stage. Such a chunk is not a
full decision's on its own frames; it is the one a full decision on the held frames gives, and
``held_frames`` says which those were.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is not imported here: the node's parameter checks use PREFIX_TRIGGERS without it
    import torch

PREFIX_TRIGGERS = ("new_inputs", "period", "every_decision")
"""When the prefix stage runs: when its inputs changed (else the cached K/V is re-used); when its
inputs changed but, for new frames alone, at most once per period; or at every decision (what a
decision costs without the cache, e.g. to measure it)."""


@dataclass(frozen=True)
class PrefixKey:
    """Everything the prefix stage's output depends on that can change between decisions."""

    frames: tuple[Hashable, ...]  # one per view: the frame's id, None where the view is absent
    tokens: bytes
    token_mask: bytes

    @classmethod
    def of(
        cls,
        frame_ids: Sequence[Hashable] | None,
        images: Sequence[object | None],
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> PrefixKey | None:
        """The key of one decision's prefix inputs; None when the frames carry no ids."""
        frames = cls.frames_of(frame_ids, images)
        return None if frames is None else cls(frames, _bytes(tokens), _bytes(token_mask))

    @staticmethod
    def frames_of(frame_ids: Sequence[Hashable] | None, images: Sequence[object | None]) -> tuple[Hashable, ...] | None:
        """The frames part of a key (checked): one id per view, None where the view is absent;
        None when the frames carry no ids."""
        if frame_ids is None:
            return None
        if isinstance(frame_ids, str | bytes) or len(frame_ids) != len(images):
            raise ValueError(
                f"frame_ids must hold one id per camera view ({len(images)}), got {frame_ids!r}; no action computed"
            )
        frames = tuple(None if img is None else fid for fid, img in zip(frame_ids, images, strict=True))
        if any(fid is None for fid, img in zip(frames, images, strict=True) if img is not None):
            raise ValueError(f"frame_ids has None for a present camera view: {frame_ids!r}; no action computed")
        hash(frames)  # an unhashable id (a list) fails here, before any work, with Python's own message
        return frames

    def differs_in_frames_only(self, other: PrefixKey) -> bool:
        """Same prompt tokens and mask, and the same views present: only frames are newer."""
        return (self.tokens, self.token_mask) == (other.tokens, other.token_mask) and _same_views(
            self.frames, other.frames
        )


def _same_views(a: Sequence[Hashable], b: Sequence[Hashable]) -> bool:
    """The same views present (an id) and absent (None) in two keys' frames."""
    return [f is None for f in a] == [f is None for f in b]


def _bytes(t: torch.Tensor) -> bytes:
    return np.ascontiguousarray(t.detach().cpu().numpy()).tobytes() + str(t.dtype).encode()


class PrefixCache:
    """The key of the prefix held in a pipeline's K/V cache, and a token the holder gives to say
    which build of it that was (the reference keeps the K/V itself there; the fused path, whose
    K/V lives in its static buffers, the count of prefix stages it ran, so that a prefix run by
    anyone else since is noticed). `clock` (seconds) measures the age of the held prefix for the
    "period" trigger; the node passes the clock its decision timer runs on."""

    def __init__(self, trigger: str = "new_inputs", period_s: float = 0.1, clock: Callable[[], float] = time.monotonic):
        self.trigger = check_trigger(trigger)
        self.period_s = check_period(period_s)
        self.clock = clock
        self._key: PrefixKey | None = None
        self._held: object = None
        self._built_at = 0.0
        self.stores = 0  # prefixes built so far: whether a decision built one (a refused one forgets it)

    def lookup(self, key: PrefixKey | None, build: object = None, now: float | None = None) -> bool:
        """Whether the trigger lets a decision with prefix inputs `key` re-use the held prefix
        (at `now` on the clock; read from it when not given); where `build` is given, it must also
        still be the build that was stored."""
        if self.trigger == "every_decision" or key is None or self._key is None:
            return False
        if build is not None and build != self._held:
            return False
        if key == self._key:
            return True
        if self.trigger != "period" or not key.differs_in_frames_only(self._key):
            return False
        return self._within_period(now)

    def builds_whatever_the_prompt(
        self, frames: tuple[Hashable, ...] | None, build: object = None, now: float | None = None
    ) -> bool:
        """Whether a decision on `frames` (`PrefixKey.frames_of`) runs the prefix stage whatever
        its prompt tokens turn out to be: then `lookup` refuses every key with these frames, and
        the caller may start the stage before the tokens are made (the fused path's vision).
        False where the answer depends on the tokens."""
        held = self._key
        if self.trigger == "every_decision" or frames is None or held is None:
            return True
        if build is not None and build != self._held:
            return True
        if frames == held.frames:
            return False  # re-used if the tokens are the same
        if self.trigger != "period" or not _same_views(frames, held.frames):
            return True  # new frames (or other views present) always run it
        return not self._within_period(now)

    def _within_period(self, now: float | None) -> bool:
        """Whether the held prefix is younger than the period at `now` (read from the clock when
        not given); a negative age, the clock gone back (sim time), is no known age."""
        age = (self.clock() if now is None else now) - self._built_at
        return 0.0 <= age < self.period_s

    @property
    def held(self) -> object:
        """What `store` was given with the held key (None when nothing is held)."""
        return self._held

    @property
    def held_frames(self) -> tuple[Hashable, ...] | None:
        """The frame ids the held prefix was built from (None when nothing is held)."""
        return None if self._key is None else self._key.frames

    def store(self, key: PrefixKey | None, held: object, built_at: float | None = None) -> None:
        """Hold `key`'s prefix, built by the decision that began at `built_at` on the clock."""
        self._key, self._held = (key, held) if key is not None else (None, None)
        self._built_at = self.clock() if built_at is None else built_at
        self.stores += 1

    def forget(self) -> None:
        """Before the prefix stage writes the K/V (should it fail half-way, no key claims it), and
        where the held prefix must not be used again (a reset, a restored capsule, old frames)."""
        self._key, self._held = None, None


def check_trigger(trigger: object) -> str:
    if trigger not in PREFIX_TRIGGERS:
        raise ValueError(f"prefix_trigger must be one of {', '.join(PREFIX_TRIGGERS)}, got {trigger!r}")
    return str(trigger)


def check_period(period_s: object) -> float:
    """A finite number of seconds > 0 (not a bool); numpy's scalars count (a period read from an array)."""
    real = isinstance(period_s, numbers.Real) and not isinstance(period_s, bool | np.bool_)
    ok = real and math.isfinite(period_s)
    if not ok or period_s <= 0:
        raise ValueError(f"prefix_period_s must be a finite number of seconds > 0, got {period_s!r}")
    return float(period_s)
