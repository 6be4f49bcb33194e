"""How a decision's latency depends on the idle time before it. GPU.

    python bench/idle_gap.py [--policy pi05] [--views 3] [--gaps-ms 0,20,100,500] [--rounds 3] [--iters 20] [--out DIR]

The benchmarks time decisions back to back; a node deciding at `rate_hz` leaves the GPU and its
own thread idle between them (90 ms at 10 Hz with a 10 ms decision). At 4954422 a decision
20 ms after the last was ~1 ms slower than back to back, and the node's first decision, 0.5 s
after its warm-up, ~2.7 ms slower (docs/results/README.md). This separates where that goes.
After sleeping each gap, on one fused pipeline (bench/prefix_reuse.py's full-size set-up, its
warm-up made):

- "decide wall": `Pipeline.decide` on new frame ids (the prefix runs), wall clock, as the node
  times it;
- "denoise graph, GPU": the denoise graph replayed behind a 2 ms `torch.cuda._sleep`, which keeps
  the GPU busy while the host launches it, timed by CUDA events around the replay only: the
  GPU's own speed at that moment (its clocks), without the host's launch;
- "denoise launch, host": the host time of that `replay()` call.

Gaps run in turn within each round (every gap sees the same drift). A GPU that clocks down when
idle shows in the second row; a host that is slow to wake, in the first and third only.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch
from prefix_reuse import full_size_observation  # bench/ is on sys.path when run as a script
from tqdm import tqdm

from flashrt_ros.bench.timing import HEADER, Latency, write_result
from flashrt_ros.engine.pipeline import Pipeline

DOF = 14
COVER_CYCLES = 4_000_000  # torch.cuda._sleep: ~2 ms at ~2 GHz, longer than the replay's host call


def after_gap(pipe: Pipeline, obs, gap_s: float, i: int) -> tuple[float, float, float]:
    """(decide wall, denoise graph GPU, denoise launch host) in ms, each measured `gap_s` after
    the work before it ended."""
    time.sleep(gap_s)
    ids = tuple((i, v) for v in range(len(obs.images)))
    t0 = time.perf_counter()
    pipe.decide(dataclasses.replace(obs, frame_ids=ids))
    wall = (time.perf_counter() - t0) * 1e3
    fused = pipe.fused
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    time.sleep(gap_s)
    torch.cuda._sleep(COVER_CYCLES)
    start.record()
    t0 = time.perf_counter()
    fused.run("denoise")
    launch = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return wall, start.elapsed_time(end), launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05", choices=["pi05", "pi0"])
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--gaps-ms", default="0,20,100,500")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20, help="decisions per gap and round")
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("idle_gap.py needs a CUDA GPU")
    dev = torch.device("cuda")
    gaps = [float(g) for g in args.gaps_ms.split(",")]
    policy, obs, _ = full_size_observation(args.policy, args.views, DOF, dev)
    pipe = Pipeline(policy, backend="fused", release_reference=True)
    print(f"warm-up decision: {pipe.warm_up(DOF, obs.prompt, (480, 640)):.2f} ms")
    rows = ("decide wall", "denoise graph, GPU", "denoise launch, host")
    samples = {(g, r): [] for g in gaps for r in rows}
    i = 0
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for gap in gaps:
            for _ in range(args.iters):
                i += 1
                for row, ms in zip(rows, after_gap(pipe, obs, gap / 1e3, i), strict=True):
                    samples[(gap, row)].append(ms)
    tag = f"{args.policy} {args.views}v"
    print(HEADER)
    results = {}
    for row in rows:
        for gap in gaps:
            lat = Latency.from_samples(f"{tag} {row}, {gap:g} ms idle", samples[(gap, row)])
            results[lat.name] = lat.to_dict()
            print(lat.row())
    base = {row: results[f"{tag} {row}, {gaps[0]:g} ms idle"]["median_ms"] for row in rows}
    for gap in gaps[1:]:
        ratios = ", ".join(
            f"{row} {results[f'{tag} {row}, {gap:g} ms idle']['median_ms'] / base[row]:.3f}x" for row in rows
        )
        print(f"{tag} {gap:g} ms idle against {gaps[0]:g}: {ratios}")
    path = write_result(args.out, "idle_gap", dev, policy=args.policy, views=args.views, gaps_ms=gaps, results=results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
