"""Timing helpers: CUDA events around a whole call, percentiles, and what ran where."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..policies import cuda_graphs


@dataclass
class Latency:
    name: str
    n: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def from_samples(cls, name: str, samples_ms: list[float]) -> Latency:
        a = np.asarray(samples_ms, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])  # linear interpolation between samples
        return cls(name, len(a), float(p50), float(p90), float(p99), float(a.mean()), float(a.min()), float(a.max()))

    def row(self) -> str:
        cols = (self.median_ms, self.p90_ms, self.p99_ms, self.max_ms)
        return f"{self.name:<{LABEL_WIDTH}} " + " ".join(f"{ms:9.3f}" for ms in cols) + f" {self.n:5d}"

    def to_dict(self) -> dict:
        return asdict(self)


LABEL_WIDTH = 50  # "pi05 3v fused-fp8 preprocess 3x480x640 from host" and the like fit
HEADER = f"{'what':<{LABEL_WIDTH}} {'median':>9} {'p90':>9} {'p99':>9} {'max':>9} {'n':>5}   (ms)"
"""The table's columns. p90 / p99 interpolate between the two nearest samples (numpy's linear
method): with n = 100 the p99 lies between the two slowest, so the slowest is printed as max."""


def time_call(
    fn: Callable[[], object], iters: int, warmup: int, device: torch.device, progress: str = ""
) -> list[float]:
    """Milliseconds of `fn()` per call: CUDA events on a GPU (one sync per call), else perf_counter."""
    return time_parts([("call", fn)], iters, warmup, device, progress)["total"]


def time_parts(
    parts: list[tuple[str, Callable[[], object]]], iters: int, warmup: int, device: torch.device, progress: str = ""
) -> dict[str, list[float]]:
    """Milliseconds of each part of one call made of `parts` run in order, plus "total": the
    parts of a decision split where they run inside it (an event between each two on a GPU),
    so that they add up to the whole; a part timed alone can differ (other cache and clock state)."""
    from tqdm import tqdm

    def call() -> None:
        for _, fn in parts:
            fn()

    for _ in range(warmup):
        call()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    out: dict[str, list[float]] = {name: [] for name, _ in parts} | {"total": []}
    show = bool(progress) and sys.stderr.isatty()
    for _ in tqdm(range(iters), desc=progress or "timing", leave=False, disable=not show):
        if cuda:
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(parts) + 1)]
            marks[0].record()
            for (_, fn), mark in zip(parts, marks[1:], strict=True):
                fn()
                mark.record()
            marks[-1].synchronize()
            laps = [a.elapsed_time(b) for a, b in zip(marks, marks[1:], strict=False)]
            total = marks[0].elapsed_time(marks[-1])
        else:
            stamps = [time.perf_counter()]
            for _, fn in parts:
                fn()
                stamps.append(time.perf_counter())
            laps = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]
            total = (stamps[-1] - stamps[0]) * 1e3
        for (name, _), lap in zip(parts, laps, strict=True):
            out[name].append(lap)
        out["total"].append(total)
    return out


def graph_ms(fn: Callable[[], object], calls: int = 1, replays: int = 10) -> float:
    """Median milliseconds per call of `fn` replayed from a CUDA graph of `calls` back-to-back
    calls: the kernels' own time, without the Python launch path (which for one small kernel can
    be longer than the kernel). `fn` runs once on a side stream first (warm-up, JIT builds)."""
    device = torch.cuda.current_device()
    cuda_graphs.warm_up(fn, device)
    graph = cuda_graphs.capture(lambda: [fn() for _ in range(calls)], device, warmup=0)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return float(np.median(times))


def environment(device: torch.device) -> dict:
    """Commit, GPU, versions: enough to tell two result files apart."""
    from .. import __version__

    commit, dirty = _commit()
    env = {
        "commit": commit,
        "dirty": dirty,
        "flashrt_ros": __version__,  # what ran where no commit can be read (a copy outside git)
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda  # the CUDA torch was built with
        env["cudnn"] = torch.backends.cudnn.version()
        env["driver"] = _driver_version()
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def _commit() -> tuple[str, bool | None]:
    """(commit, dirty): FLASHRT_COMMIT where given (the device machine's copy of the tree has no
    .git; a value that is no commit hash is marked), else this package's own checkout (not one
    that merely encloses an installed copy); dirty is None where it could not be read."""
    given = os.environ.get("FLASHRT_COMMIT", "").strip()
    if given:
        return (given if re.fullmatch(r"[0-9a-f]{7,40}", given) else f"unverified: {given}"), None
    root = Path(__file__).resolve().parents[2]
    git = {"capture_output": True, "text": True, "check": False, "cwd": root, "timeout": 10}
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], **git)
        lines = top.stdout.splitlines()  # a path may hold spaces
        if top.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root:
            return "unknown", None
        status = subprocess.run(["git", "status", "--porcelain"], **git)
        return lines[1], (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", None


def _driver_version() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi where it is on the PATH."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


def write_result(out_dir: Path, stem: str, device: torch.device, **payload) -> Path:
    """`out_dir/<stem>_<date>_<time>.json` with the run's environment (commit, GPU, versions)
    beside `payload`; prints where it went."""
    if "env" in payload:
        raise ValueError("payload key 'env' is reserved for the run's environment")
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    path, n = out_dir / f"{stem}_{stamp}.json", 1
    while path.exists():  # two results in one second must not share (and overwrite) a file
        n += 1
        path = out_dir / f"{stem}_{stamp}_{n}.json"
    path.write_text(json.dumps(finite_or_null(dict(env=environment(device), **payload)), indent=1, allow_nan=False))
    print("wrote", path)
    return path


def finite_or_null(value):
    """`value` with NaN / inf as null: json writes them as bare NaN, which strict JSON readers
    (JavaScript's JSON.parse, many others) refuse, losing the whole file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value
