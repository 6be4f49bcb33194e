"""Timing helpers: CUDA events around a whole call, percentiles, and what ran where."""

from __future__ import annotations

import json
import os
import platform
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
        return f"{self.name:<34} {self.median_ms:9.3f} {self.p90_ms:9.3f} {self.p99_ms:9.3f} {self.n:5d}"

    def to_dict(self) -> dict:
        return asdict(self)


HEADER = f"{'what':<34} {'median':>9} {'p90':>9} {'p99':>9} {'n':>5}   (ms)"


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
    commit = os.environ.get("FLASHRT_COMMIT", "")
    dirty: bool | None = None  # unknown when the commit is given, not read
    if not commit:  # the device machine gets a copy of the tree without .git: pass FLASHRT_COMMIT there
        package_root = Path(__file__).resolve().parents[2]  # this package's checkout, not the caller's cwd
        git = {"capture_output": True, "text": True, "check": False, "cwd": package_root}
        try:
            res = subprocess.run(["git", "rev-parse", "HEAD"], **git)
            commit = res.stdout.strip() if res.returncode == 0 else ""
            st = subprocess.run(["git", "status", "--porcelain"], **git)
            dirty = res.returncode == 0 and bool(st.stdout.strip())
        except OSError:
            pass
    env = {
        "commit": commit or "unknown",
        "dirty": dirty,
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
        env["cuda"] = torch.version.cuda
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def write_result(out_dir: Path, stem: str, device: torch.device, **payload) -> Path:
    """`out_dir/<stem>_<date>_<time>.json` with the run's environment (commit, GPU, versions)
    beside `payload`; prints where it went."""
    if "env" in payload:
        raise ValueError("payload key 'env' is reserved for the run's environment")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(dict(env=environment(device), **payload), indent=1))
    print("wrote", path)
    return path
