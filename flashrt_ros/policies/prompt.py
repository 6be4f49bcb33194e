"""Prompt tokenisation as openpi's `PaligemmaTokenizer` does it.

pi0.5: the normalised state is discretised into 256 bins over [-1, 1] and written into the
prompt: "Task: <task>, State: <bins>;\\nAction: ". pi0: "<task>" then "\\n" as its own
piece (the start-of-answer token); the state goes to the state token instead. LeRobot's pi0
("pi0_lerobot") tokenises the task as it is, uncleaned, with "\\n" appended where missing.
Tokens are right-padded with 0 to the prompt length; the mask marks real tokens.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .normalize import what_is_there

log = logging.getLogger(__name__)

STATE_BINS = 256


def clean_task(task: str) -> str:
    return task.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: np.ndarray) -> np.ndarray:
    """Normalised state in [-1, 1] -> bin index 0..255, as openpi bins it: at or above the last
    edge (0.992) -> 255, below -1 -> -1 (openpi and LeRobot write that -1 into the prompt too)."""
    bins = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]
    return np.digitize(np.asarray(state, dtype=np.float64), bins=bins) - 1


def pi05_prompt(task: str, state: np.ndarray) -> str:
    state_str = " ".join(map(str, discretize_state(state)))
    return f"Task: {clean_task(task)}, State: {state_str};\nAction: "


class PromptTooLong(ValueError):
    """The prompt (with pi0.5's state) takes more tokens than the policy's prompt length."""


def worst_case_state(n: int) -> np.ndarray:
    """A state whose pi0.5 bins all print with three digits (bin 255), the longest state text."""
    return np.ones(n, dtype=np.float32)


@dataclass
class Tokens:
    ids: np.ndarray  # int64 [L]
    mask: np.ndarray  # bool [L]
    truncated: bool
    length: int = 0  # the tokens before any cut


class PromptTokenizer:
    """SentencePiece (PaliGemma's `tokenizer.model`, given as a local file) plus prompt layout."""

    def __init__(self, model_file: str | Path, prompt_len: int):
        import sentencepiece

        path = Path(model_file)
        if not path.is_file():
            what = what_is_there(path) if os.path.lexists(path) else "not found"
            raise FileNotFoundError(f"tokenizer model {what}: {path}; expected PaliGemma's tokenizer.model file")
        try:  # a file the robot's user may not read: said as such, not as a file of another kind
            open(path, "rb").close()
        except OSError as exc:
            raise PermissionError(
                f"tokenizer model cannot be read: {path} ({exc.strerror or exc}); give the node's user read access"
            ) from exc
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as exc:  # sentencepiece's own message names neither file nor kind
            raise ValueError(
                f"tokenizer {path} is not a SentencePiece model ({exc}); expected PaliGemma's tokenizer.model"
            ) from exc
        self.path = path
        self.prompt_len = prompt_len
        log.info("tokenizer %s: vocab %d, prompt length %d", path, self.sp.get_piece_size(), prompt_len)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return list(self.sp.encode(text, add_bos=add_bos))

    def token_ids(self, layout: str, task: str, state: np.ndarray | None = None) -> list[int]:
        """The prompt's tokens before padding. `layout` is `PolicyConfig.prompt_format`: "pi05" writes
        the task and the discretised state, "pi0" the task alone (pi0, and pi0.5 trained without
        the state in its prompt), "pi0_lerobot" the task alone as LeRobot's pi0 pre-processing
        writes it."""
        try:
            task.encode("utf-8")  # a lone surrogate: SentencePiece's binding raised a bare cast error
        except UnicodeEncodeError as err:
            where = f"{err.reason} at character {err.start}"
            raise ValueError(f"prompt is not valid UTF-8 text ({where}); no action computed") from None
        if layout == "pi05":
            if state is None:
                raise ValueError("pi0.5 writes the discretised state into the prompt: state is required")
            return self.encode(pi05_prompt(task, state), add_bos=True)
        if layout == "pi0_lerobot":
            return self.encode(task if task.endswith("\n") else task + "\n", add_bos=True)
        return self.encode(clean_task(task), add_bos=True) + self.encode("\n")

    def tokenize(self, layout: str, task: str, state: np.ndarray | None = None) -> Tokens:
        return self.pad(self.token_ids(layout, task, state))

    def pad(self, ids: list[int]) -> Tokens:
        """Right-pad to prompt_len; a longer prompt is cut to it (as openpi does) and flagged, so
        the caller refuses to act on it (a cut pi0.5 prompt loses its state and "Action: ") and says
        so with `length`."""
        n, length = self.prompt_len, len(ids)
        truncated = length > n
        ids = ids[:n]
        out = np.zeros(n, dtype=np.int64)
        out[: len(ids)] = ids
        mask = np.zeros(n, dtype=bool)
        mask[: len(ids)] = True
        return Tokens(out, mask, truncated, length)
