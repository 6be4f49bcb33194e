"""Does the first denoise step pay to run beside the prefix LM? GPU only; a measurement, not a path.

The denoise step 0 needs layer i's prefix K/V only at layer i, and those are written by the
prefix's QKV of layer i, ~300 us before the prefix ends. The prefix LM is GEMM-bound on every
SM; a denoise step is latency-bound (~660 us on the step kernel, far fewer SM-seconds). So
step 0 could run on a side stream, layer i waiting on an event after the prefix's QKV of layer
i, as separate kernels (the step kernel's grid barriers need every SM); the decision then ends
with the step kernel's steps 1..N-1. This captures both orders as one graph each and times them
in alternating rounds:

- serial: prefix, then all N steps on the step kernel (the shipped order);
- overlapped: prefix || step 0 (separate kernels, side stream at the given priority), then 1..N-1;
- the parts: prefix alone, step 0 as separate kernels alone.

    python bench/prefix_overlap.py [--policy pi05] [--views 3] [--iters 30] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager

import torch

from flashrt_ros.bench.args import at_least, out_folder, require_cuda
from flashrt_ros.bench.parity import compare
from flashrt_ros.bench.stages import random_fused
from flashrt_ros.bench.timing import time_call, write_result
from flashrt_ros.kernels.denoise_update import DenoiseUpdate
from flashrt_ros.kernels.euler import euler_step
from flashrt_ros.kernels.linear_f32 import linear_f32
from flashrt_ros.policies import cuda_graphs
from flashrt_ros.policies.fused import FusedPi0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def steps_from(fused: FusedPi0, start: int) -> None:
    """The step kernel's steps start..N-1 on `fused.actions` (as FusedPi0.denoise, pi0.5 only)."""
    cfg = fused.cfg
    x, h, dt = fused.actions, fused.suffix_in, -1.0 / cfg.num_steps
    fused.step_plan.barriers.zero_()
    linear_f32(x, *fused.action_in, out=h)
    for step in range(start, cfg.num_steps):
        nxt = () if step + 1 == cfg.num_steps else (*fused.action_in, h)
        fused.expert_pass(step, h, DenoiseUpdate(x, *fused.action_out, dt, *nxt, silu=False))


@contextmanager
def qkv_hook(fused: FusedPi0, rows: slice, before=None, after=None):
    """Calls `before(layer)` / `after(layer)` around each `_qkv_into_cache` call on `rows`
    (the prefix's rows or the suffix's), for as long as the block runs."""
    original = fused._qkv_into_cache

    def qkv(layer, x_n, w, positions, spec, at, **kw):
        if before is not None and at == rows:
            before(layer)
        q = original(layer, x_n, w, positions, spec, at, **kw)
        if after is not None and at == rows:
            after(layer)
        return q

    fused._qkv_into_cache = qkv
    try:
        yield
    finally:
        del fused._qkv_into_cache


def step0_separate(fused: FusedPi0, wait=None) -> None:
    """noise -> actions after step 0, as separate kernels; `wait(i)` before the expert's layer i."""
    x = fused.actions
    x.copy_(fused.noise)
    own = slice(fused.prefix_rows, fused.prefix_rows + fused.cfg.suffix_len)
    with qkv_hook(fused, own, before=wait):
        euler_step(x, fused.velocity(0, x), -1.0 / fused.cfg.num_steps)


def overlapped(fused: FusedPi0, side: torch.cuda.Stream) -> None:
    main = torch.cuda.current_stream()
    events = [torch.cuda.Event() for _ in fused.prefix_layers]
    side.wait_stream(main)
    with qkv_hook(fused, slice(0, fused.prefix_rows), after=lambda i: events[i].record(main)):
        fused.prefix()
    with torch.cuda.stream(side):
        step0_separate(fused, wait=lambda i: side.wait_event(events[i]))
    main.wait_stream(side)
    steps_from(fused, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05")
    ap.add_argument("--views", type=at_least(1), default=3)
    ap.add_argument("--iters", type=at_least(1), default=30)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "prefix_overlap.py")
    dev = torch.device("cuda")
    _, _, fused = random_fused(args.policy, args.views, dev)
    if not fused.cfg.uses_adarms or fused.step_plan is None:
        raise SystemExit("this measurement is written for pi0.5 on the step kernel")
    serial = cuda_graphs.capture(lambda: (fused.prefix(), fused.denoise()), dev)
    serial.replay()
    ref = fused.actions.clone()
    graphs = {"serial": serial}
    for prio in (0, -1):
        side = torch.cuda.Stream(dev, priority=prio)
        graphs[f"overlapped, side priority {prio}"] = cuda_graphs.capture(lambda s=side: overlapped(fused, s), dev)
    checks = {}
    for name, g in graphs.items():
        g.replay()
        torch.cuda.synchronize()
        checks[name] = compare(fused.actions, ref)
    graphs["prefix alone"] = cuda_graphs.capture(fused.prefix, dev)
    graphs["step 0 separate alone"] = cuda_graphs.capture(lambda: step0_separate(fused), dev)
    graphs["steps 1.. alone"] = cuda_graphs.capture(lambda: steps_from(fused, 1), dev)
    laps: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, g in graphs.items():
            laps[name].append(median(time_call(g.replay, args.iters, 3, dev)))
    print(f"{args.policy} {args.views} views, fused bf16, median of {args.rounds} rounds of {args.iters} calls")
    for name, t in laps.items():
        extra = checks.get(name)
        tail = f"   chunk vs serial: cosine {extra['cosine']:.6f}, max abs {extra['max_abs']:.2e}" if extra else ""
        print(f"  {name:<34} {median(t):8.3f} ms   rounds {[round(x, 3) for x in t]}{tail}")
    results = {name: dict(median_ms=median(t), rounds_ms=t, **checks.get(name, {})) for name, t in laps.items()}
    write_result(args.out, "prefix_overlap", dev, policy=args.policy, views=args.views, results=results)


if __name__ == "__main__":
    main()
