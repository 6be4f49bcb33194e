"""Where a fused decision's time goes beyond its kernels. GPU only.

The headline times `sample_actions` between two CUDA events with one sync per call, so its
number includes whatever the GPU waits for between the events: the host submitting the prefix
graph (~400 kernel nodes) and then the denoise graph. This prints, for one policy (random
weights) in alternating rounds:

- per call: as the headline (events around `sample_actions`, one sync per call);
- back to back: many decisions between two events, no sync between them (the GPU's time per
  decision; submission hidden behind the previous decision);
- one graph: prefix + denoise captured as a single CUDA graph, timed per call like the first;
- the host time of each `graph.replay()` call.

    python bench/decision_overhead.py [--policy pi05] [--views 3] [--iters 30] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flashrt_ros.bench.args import at_least, out_folder, require_cuda
from flashrt_ros.bench.stages import random_fused
from flashrt_ros.bench.timing import time_call, write_result
from flashrt_ros.policies import cuda_graphs
from flashrt_ros.policies.fused import FusedPi0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def back_to_back_ms(fn, iters: int) -> float:
    """Milliseconds per call of `iters` calls between two events, no sync in between."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def host_replay_us(fused: FusedPi0, iters: int) -> tuple[float, float]:
    """Median host microseconds of the prefix and of the denoise graph's replay call."""
    pre, den = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fused.run("prefix")
        t1 = time.perf_counter()
        fused.run("denoise")
        t2 = time.perf_counter()
        pre.append((t1 - t0) * 1e6)
        den.append((t2 - t1) * 1e6)
    torch.cuda.synchronize()
    return median(pre), median(den)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05")
    ap.add_argument("--views", type=at_least(1), default=3)
    ap.add_argument("--iters", type=at_least(1), default=30)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "decision_overhead.py")
    dev = torch.device("cuda")
    _, _, fused = random_fused(args.policy, args.views, dev)
    two = fused.sample_actions().clone()
    single = cuda_graphs.capture(lambda: (fused.prefix(), fused.denoise()), dev)  # one graph for the decision
    fused.actions.fill_(float("nan"))  # the capture's warm-up ran the stages eagerly: the replay must write it
    single.replay()
    same = bool(torch.equal(fused.actions, two))
    ways = {
        "per call (headline)": lambda: median(time_call(fused.sample_actions, args.iters, 3, dev)),
        "one graph, per call": lambda: median(time_call(single.replay, args.iters, 3, dev)),
        "back to back": lambda: back_to_back_ms(fused.sample_actions, args.iters),
        "one graph, back to back": lambda: back_to_back_ms(single.replay, args.iters),
    }
    laps: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            laps[name].append(way())
    host_prefix, host_denoise = host_replay_us(fused, args.iters)
    print(f"{args.policy} {args.views} views, fused bf16, median of {args.rounds} rounds of {args.iters} decisions")
    for name, t in laps.items():
        print(f"  {name:<28} {median(t):8.3f} ms   rounds {[round(x, 3) for x in t]}")
    print(f"  host time of replay(): prefix graph {host_prefix:.1f} us, denoise graph {host_denoise:.1f} us")
    print(f"  one graph's chunk equals the two graphs': {same}")
    results = {name: dict(median_ms=median(t), rounds_ms=t) for name, t in laps.items()}
    results.update(host_prefix_replay_us=host_prefix, host_denoise_replay_us=host_denoise, one_graph_same_chunk=same)
    write_result(args.out, "decision_overhead", dev, policy=args.policy, views=args.views, results=results)


if __name__ == "__main__":
    main()
