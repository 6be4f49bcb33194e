"""What one synchronisation costs on this GPU, with the step kernel's own primitives
(`kernels/expert_step.py`: `_arrive` = thread 0's ``red.release.gpu`` after a CTA barrier,
`_wait` = thread 0 polling with ``ld.acquire.gpu``). GPU only.

- grid barrier: G programs (one per SM, cooperative launch) passing N empty barriers in a row;
  time per barrier, for several G. The step kernel's traced barriers (1.25-1.7 us) include
  waiting for the slowest program of the phase; this is the barrier alone.
- point to point: two programs handing a flag back and forth N times (program 0 arrives on A
  and waits on B, program 1 waits on A and arrives on B); time per hand-off. What a dataflow
  kernel (per-dependency counters instead of grid barriers) would pay per dependency.

    python bench/sync_latency.py [--iters 20000] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from flashrt_ros.bench.timing import write_result
from flashrt_ros.kernels.expert_step import _arrive, _wait

LINE = 32  # int32s between the two flags (their own 128-byte lines)


@triton.jit
def _barriers(bar_ptr, N):
    G = tl.num_programs(0)
    for i in range(N):
        _arrive(bar_ptr, True)
        _wait(bar_ptr, (i + 1) * G, True)


@triton.jit
def _ping_pong(flag_ptr, N, LINE: tl.constexpr):
    if tl.program_id(0) == 0:
        for i in range(N):
            _arrive(flag_ptr, True)
            _wait(flag_ptr + LINE, i + 1, True)
    else:
        for i in range(N):
            _wait(flag_ptr, i + 1, True)
            _arrive(flag_ptr + LINE, True)


def timed_us(launch, counters: torch.Tensor, reps: int = 5) -> float:
    """Median wall time of `launch` (one kernel) over `reps` runs, in microseconds."""
    times = []
    for _ in range(reps):
        counters.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    counters = torch.zeros(2 * LINE, dtype=torch.int32, device=dev)
    n = args.iters
    results: dict[str, float] = {}
    for g in sorted({2, 8, 32, 66, sms}):
        run = lambda g=g: _barriers[(g,)](counters, n, num_warps=4, launch_cooperative_grid=True)  # noqa: E731
        run()  # build
        results[f"grid barrier, {g} programs (us)"] = timed_us(run, counters) / n
    pp = lambda: _ping_pong[(2,)](counters, n, LINE, num_warps=4, launch_cooperative_grid=True)  # noqa: E731
    pp()
    results["point to point, one hand-off (us)"] = timed_us(pp, counters) / (2 * n)
    for key, us in results.items():
        print(f"{key:<40} {us:7.3f}")
    write_result(args.out, "sync_latency", dev, iters=n, results=results)


if __name__ == "__main__":
    main()
