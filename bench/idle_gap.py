"""How a decision's latency depends on the idle time before it. GPU.

    python bench/idle_gap.py [--policy pi05] [--views 3] [--gaps-ms 0,20,100,500] [--rounds 3] [--iters 20] [--out DIR]

The benchmarks time decisions back to back; a node deciding at `rate_hz` leaves the GPU and its
own thread idle between them (90 ms at 10 Hz with a 10 ms decision). Decisions 20 ms
apart were 0.3-1 ms slower than back to back (4954422, 274ea44), and the node's first decision, 0.5 s
after its warm-up, ~2.7 ms slower (docs/results/README.md). This separates where that goes.
After sleeping each gap, on one fused pipeline (bench/prefix_reuse.py's full-size set-up, its
warm-up made; the frames copied into the frame pool first, untimed, as the node's camera threads
do):

- "decide wall": `Pipeline.decide` on new frame ids (the prefix runs), wall clock, as the node
  times it;
then, after the same gap again:
- "first launch, host": the host time of the first two CUDA calls after the idle time (an event
  record and a launch);
- "fixed-cycle kernel, GPU": that launch, `torch.cuda._sleep` of a fixed number of SM clock
  cycles (~2 ms at full clock), timed by CUDA events: longer where the GPU woke at a lower clock;
- "denoise graph, GPU": the denoise graph replayed right behind it (queued while it runs, so the
  host's launch is hidden), timed by events around the replay only: the GPU's speed once awake;
- "denoise launch, host": the host time of that `replay()` call.

Gaps run in turn within each round (every gap sees the same drift).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from prefix_reuse import full_size_observation  # bench/ is on sys.path when run as a script
from tqdm import tqdm

from flashrt_ros.bench.args import at_least, numbers_at_least, out_folder, require_cuda
from flashrt_ros.bench.timing import HEADER, Latency, write_result
from flashrt_ros.engine.pipeline import Pipeline

DOF = 14
FIXED_CYCLES = 4_000_000  # torch.cuda._sleep: ~2 ms at ~2 GHz, longer than the replay's host call


ROWS = ("decide wall", "first launch, host", "fixed-cycle kernel, GPU", "denoise graph, GPU", "denoise launch, host")


def after_gap(pipe: Pipeline, obs, gap_s: float, i: int) -> dict[str, float]:
    """Each row's milliseconds (ROWS), the decision and the probes each `gap_s` after the work
    before them ended."""
    frames = [pipe.frame_pool.copy(f) for f in obs.images]  # the camera threads' copy: untimed
    time.sleep(gap_s)
    ids = tuple((i, v) for v in range(len(frames)))
    t0 = time.perf_counter()
    pipe.decide(dataclasses.replace(obs, images=frames, frame_ids=ids))
    wall = (time.perf_counter() - t0) * 1e3
    a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    time.sleep(gap_s)
    t0 = time.perf_counter()
    a.record()
    torch.cuda._sleep(FIXED_CYCLES)
    first = (time.perf_counter() - t0) * 1e3
    b.record()
    t0 = time.perf_counter()
    pipe.fused.run("denoise")
    launch = (time.perf_counter() - t0) * 1e3
    c.record()
    c.synchronize()
    return dict(zip(ROWS, (wall, first, a.elapsed_time(b), b.elapsed_time(c), launch), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05", choices=["pi05", "pi0"])
    ap.add_argument("--views", type=at_least(1), default=3)
    ap.add_argument("--gaps-ms", type=numbers_at_least(0.0), default="0,20,100,500")
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--iters", type=at_least(1), default=20, help="decisions per gap and round")
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "idle_gap.py")
    dev = torch.device("cuda")
    gaps = list(dict.fromkeys(args.gaps_ms))  # a gap listed twice would be one row of twice the samples
    policy, obs, _ = full_size_observation(args.policy, args.views, DOF, dev)
    pipe = Pipeline(policy, backend="fused", release_reference=True)
    print(f"warm-up decision: {pipe.warm_up(DOF, obs.prompt, (480, 640)):.2f} ms")
    samples = {(g, r): [] for g in gaps for r in ROWS}
    after_gap(pipe, obs, 0.0, 0)  # untimed: the probes' first launch (the sleep kernel, the events) loads them
    i = 0
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for gap in gaps:
            for _ in range(args.iters):
                i += 1
                for row, ms in after_gap(pipe, obs, gap / 1e3, i).items():
                    samples[(gap, row)].append(ms)
    tag = f"{args.policy} {args.views}v"
    print(HEADER)
    results = {}
    for row in ROWS:
        for gap in gaps:
            lat = Latency.from_samples(f"{tag} {row}, {gap:g} ms idle", samples[(gap, row)])
            results[lat.name] = lat.to_dict()
            print(lat.row())
    base = {row: results[f"{tag} {row}, {gaps[0]:g} ms idle"]["median_ms"] for row in ROWS}
    for gap in gaps[1:]:
        ratios = ", ".join(
            f"{row} {results[f'{tag} {row}, {gap:g} ms idle']['median_ms'] / base[row]:.3f}x" for row in ROWS
        )
        print(f"{tag} {gap:g} ms idle against {gaps[0]:g}: {ratios}")
    write_result(args.out, "idle_gap", dev, policy=args.policy, views=args.views, gaps_ms=gaps, results=results)


if __name__ == "__main__":
    main()
