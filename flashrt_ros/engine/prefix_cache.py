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
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is not imported here: the node's parameter checks use PREFIX_TRIGGERS without it
    import torch

PREFIX_TRIGGERS = ("new_inputs", "every_decision")
"""When the prefix stage runs: when its inputs changed (else the cached K/V is re-used), or at
every decision (what a decision costs without the cache, e.g. to measure it)."""


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
        return cls(frames, _bytes(tokens), _bytes(token_mask))


def _bytes(t: torch.Tensor) -> bytes:
    return np.ascontiguousarray(t.detach().cpu().numpy()).tobytes() + str(t.dtype).encode()


class PrefixCache:
    """The key of the prefix held in a pipeline's K/V cache, and a token the holder gives to say
    which build of it that was (the reference keeps the K/V itself there; the fused path, whose
    K/V lives in its static buffers, the count of prefix stages it ran, so that a prefix run by
    anyone else since is noticed)."""

    def __init__(self, trigger: str = "new_inputs"):
        self.trigger = check_trigger(trigger)
        self._key: PrefixKey | None = None
        self._held: object = None

    def lookup(self, key: PrefixKey | None, build: object = None) -> bool:
        """Whether the cache holds the prefix of `key` and the trigger allows re-using it; where
        `build` is given, it must also still be the build that was stored."""
        if self.trigger != "new_inputs" or key is None or key != self._key:
            return False
        return build is None or build == self.held

    @property
    def held(self) -> object:
        """What `store` was given with the held key (None when nothing is held)."""
        return self._held

    def store(self, key: PrefixKey | None, held: object) -> None:
        self._key, self._held = (key, held) if key is not None else (None, None)

    def forget(self) -> None:
        """Before the prefix stage writes the K/V: should it fail half-way, no key claims it."""
        self._key, self._held = None, None


def check_trigger(trigger: object) -> str:
    if trigger not in PREFIX_TRIGGERS:
        raise ValueError(f"prefix_trigger must be one of {', '.join(PREFIX_TRIGGERS)}, got {trigger!r}")
    return str(trigger)
