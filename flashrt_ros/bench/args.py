"""Argument checks the benchmark CLI and the bench/ scripts share (stdlib only: the CLI checks
its arguments before it imports PyTorch)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path


def out_problem(out: Path) -> str | None:
    """Why the results could not be written to folder `out`, or None: checked up front, since a
    run that takes minutes would otherwise end in FileExistsError with no JSON written."""
    if out.exists() and not out.is_dir():
        return f"--out {str(out)!r} is an existing file; expected a folder (existing or new) for the results"
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        return f"--out {str(out)!r}: {str(existing)!r} is a file, so the folder cannot be made there"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {str(out)!r}: {str(existing)!r} is not writable; expected a folder this user can write"
    return None


def out_folder(text: str) -> Path:
    """argparse `type` for a script's --out: a folder that cannot hold the results is refused
    with one line before the run, not found when the JSON is written after it."""
    path = Path(text)
    problem = out_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


def at_least(minimum: int) -> Callable[[str], int]:
    """argparse `type` for an integer >= `minimum` (a count of samples, views, rounds)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def number_above(minimum: float) -> Callable[[str], float]:
    """argparse `type` for a finite number > `minimum` (durations, rates)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and value > minimum):
            raise argparse.ArgumentTypeError(f"expected a number > {minimum:g}, got {text}")
        return value

    return parse


def number_at_least(minimum: float) -> Callable[[str], float]:
    """argparse `type` for one finite number >= `minimum` (an idle gap in ms)."""
    many = numbers_at_least(minimum)

    def parse(text: str) -> float:
        try:
            (value,) = many(text)
        except (argparse.ArgumentTypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected one number >= {minimum:g}, got {text!r}") from None
        return value

    return parse


def numbers_at_least(minimum: float) -> Callable[[str], list[float]]:
    """argparse `type` for a comma-separated list of finite numbers >= `minimum` (idle gaps in ms)."""

    def parse(text: str) -> list[float]:
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
        if not all(math.isfinite(v) and v >= minimum for v in values):
            raise argparse.ArgumentTypeError(f"expected numbers >= {minimum:g}, got {text}")
        return values

    return parse


def require_cuda(ap: argparse.ArgumentParser, what: str) -> None:
    """A full-size GPU benchmark on a machine without a CUDA GPU: one line and exit 2 (a traceback
    and exit 1 read as a benchmark that failed, not as the wrong machine)."""
    import torch  # here: the module itself stays stdlib only

    if not torch.cuda.is_available():
        ap.error(f"{what} needs a CUDA GPU (none here)")
