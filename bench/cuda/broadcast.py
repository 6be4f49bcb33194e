"""Prototype (bench only): the time for one shared [rows x 1024] bf16 activation tile to reach the
shared memory of 128 CTAs (`broadcast.cu`), plain TMA against TMA multicast over clusters of 2 to
16 CTAs, with a grid barrier after each round (as between the ops of a step kernel) or only a
cluster barrier. Prints per round: the time, the time less the same kernel without loads (its
barriers), and the rate at which the tile reached the SMs. Checks that every CTA got the whole
tile. GPU only (sm_90a); step 0 of docs/step_megakernel.md.

    python bench/cuda/broadcast.py [--reps 36] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch
from nvcc_build import build

from flashrt_ros.bench.timing import graph_ms, write_result

GRID_BARRIER, ROTATE, NO_LOAD = 1, 2, 4  # broadcast.cu's mode bits
ARGS = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5 + [ctypes.c_void_p]
ERRORS = {-1: "occupancy query failed", -2: "its clusters cannot all be resident", -3: "no such cluster size"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=36)
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = build("broadcast", "broadcast_launch", ARGS)
    x = torch.randn(64, 1024, device=dev).to(torch.bfloat16)
    counter = torch.zeros(1, device=dev, dtype=torch.int32)
    sums = torch.zeros(132, device=dev)

    def launch(rows: int, grid: int, cluster: int, mode: int, reps: int) -> None:
        counter.zero_()
        sums.zero_()
        ptrs = (x.data_ptr(), counter.data_ptr(), sums.data_ptr())
        rc = lib.broadcast_launch(*ptrs, reps, rows, grid, cluster, mode, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(ERRORS.get(rc, f"cudaError {rc}"))

    def per_round(rows: int, grid: int, cluster: int, mode: int) -> float:
        return graph_ms(lambda: launch(rows, grid, cluster, mode, args.reps)) / args.reps

    def measure(rows: int, grid: int, cluster: int, barrier: int, order: int, empty: float) -> dict:
        launch(rows, grid, cluster, barrier | order, 1)
        want = float(x[:rows].float().sum())
        worst = float((sums[:grid] - want).abs().max())
        ok = worst <= 1e-3 * float(x[:rows].float().abs().sum())
        t = per_round(rows, grid, cluster, barrier | order)
        net = t - empty
        per_sm = rows * 2048 / (net * 1e-3) / 1e9 if net > 0 else float("nan")
        print(f"{rows:4d} {grid:4d} {cluster:7d} {'grid' if barrier else 'cluster':>8} "
              f"{'rotated' if order else 'same':>7} {t * 1e3:9.2f} {net * 1e3:7.2f} {per_sm:8.1f} "
              f"{per_sm * grid / 1e3:6.2f}  {'ok' if ok else f'WRONG ({worst:.3g})'}", flush=True)  # fmt: skip
        return dict(rows=rows, grid=grid, cluster=cluster, grid_barrier=bool(barrier), rotate=bool(order),
                    us_per_round=t * 1e3, barrier_us=empty * 1e3, net_us=net * 1e3, gb_s_per_sm=per_sm,
                    tb_s=per_sm * grid / 1e3, every_cta_got_the_tile=ok)  # fmt: skip

    results = []
    print(f"{'rows':>4} {'grid':>4} {'cluster':>7} {'barrier':>8} {'order':>7} {'us/round':>9} {'net us':>7} "
          f"{'GB/s/SM':>8} {'TB/s':>6}  check")  # fmt: skip
    for rows in (64, 50):
        for grid, cluster in ((128, 1), (132, 1), (128, 2), (128, 4), (132, 4), (128, 8), (128, 16)):
            for barrier in (GRID_BARRIER, 0):
                try:
                    empty = per_round(rows, grid, cluster, barrier | NO_LOAD)
                except RuntimeError as exc:
                    print(f"{rows:4d} {grid:4d} {cluster:7d}: {exc}")
                    break
                results += [measure(rows, grid, cluster, barrier, order, empty) for order in (0, ROTATE)]
    write_result(args.out, "broadcast", dev, reps=args.reps, results=results)


if __name__ == "__main__":
    main()
