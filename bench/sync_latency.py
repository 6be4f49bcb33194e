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
import statistics

import torch
import triton
import triton.language as tl

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import time_call, write_result
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


def per_iteration_us(launch, counters: torch.Tensor, iterations: int) -> float:
    """Median microseconds per loop iteration of `launch` (one kernel of `iterations`) over 5 runs."""
    laps = time_call(lambda: (counters.zero_(), launch()), 5, 1, counters.device)
    return statistics.median(laps) * 1e3 / iterations


def measure(iters: int, device: torch.device) -> dict[str, float]:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    counters = torch.zeros(2 * LINE, dtype=torch.int32, device=device)
    results: dict[str, float] = {}
    for g in sorted({2, 8, 32, 66, sms}):
        run = lambda g=g: _barriers[(g,)](counters, iters, num_warps=4, launch_cooperative_grid=True)  # noqa: E731
        results[f"grid barrier, {g} programs (us)"] = per_iteration_us(run, counters, iters)
    pp = lambda: _ping_pong[(2,)](counters, iters, LINE, num_warps=4, launch_cooperative_grid=True)  # noqa: E731
    results["point to point, one hand-off (us)"] = per_iteration_us(pp, counters, 2 * iters)
    return results


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--iters", type=int, default=20000)
    cli.add_argument("--out", type=out_folder, default="out")
    opts = cli.parse_args()
    require_cuda(cli, "sync_latency.py")
    dev = torch.device("cuda")
    found = measure(opts.iters, dev)
    for key, us in found.items():
        print(f"{key:<40} {us:7.3f}")
    write_result(opts.out, "sync_latency", dev, iters=opts.iters, results=found)
