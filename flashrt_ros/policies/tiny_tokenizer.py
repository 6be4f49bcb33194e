"""A small SentencePiece model for the embedded default policy and the tests.

PaliGemma's real `tokenizer.model` cannot be downloaded here, so the embedded default (and
every CPU test) uses a tiny model trained on the fly, with PaliGemma's special-token ids
(pad 0, eos 1, bos 2, unk 3) and byte fallback so any prompt encodes. The code path that
reads it is the real one (`PromptTokenizer`).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

VOCAB_SIZE = 400

_CORPUS = [
    "Task: pick up the red cube, State: 128 127 130 99 0 255;\nAction: ",
    "Task: open the drawer and put the spoon inside, State: 12 64 200 31 77;\nAction: ",
    "Task: fold the towel, State: 1 2 3 4 5 6 7 8 9 10 11 12 13 14;\nAction: ",
    "pick up the cup",
    "place it on the plate",
    "push the button",
    "wipe the table",
    "stack the blocks",
    "move the arm to the left",
    "grasp the bottle",
    "pour water",
    "close the gripper",
    "turn the knob",
    "insert the peg into the hole",
] + [" ".join(str((i * 37 + j * 11) % 256) for j in range(16)) for i in range(64)]


def _spec_hash() -> str:
    return hashlib.sha256(("\n".join(_CORPUS) + str(VOCAB_SIZE)).encode()).hexdigest()[:12]


def train_tiny_tokenizer(path: str | Path) -> Path:
    """Train the model deterministically (one thread) and write it to `path`."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 4),
        model_writer=buf,
        vocab_size=VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        num_threads=1,
        minloglevel=2,
        hard_vocab_limit=False,
        split_digits=True,
        # Gemma's tokenizer keeps text as is ("\n" is a real token): no normalisation.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        user_defined_symbols=["\n"],
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)  # atomic: parallel test processes never read a half-written file
    return path


def tiny_tokenizer_path(cache_dir: str | Path | None = None) -> Path:
    """The cached tiny model, trained on first use, in `cache_dir`, else $FLASHRT_CACHE, else
    ~/.cache/flashrt_ros. A folder that cannot be written is an OSError naming it and the fix."""
    root = Path(cache_dir or os.environ.get("FLASHRT_CACHE", Path.home() / ".cache" / "flashrt_ros"))
    path = root / f"tiny_spm_{_spec_hash()}.model"
    if path.is_file():
        return path
    try:
        return train_tiny_tokenizer(path)
    except OSError as exc:
        raise OSError(
            f"cannot write the tiny tokenizer to {path}: {exc.strerror or exc}; "
            "set FLASHRT_CACHE to a folder this user can write"
        ) from exc
