"""The frame pre-processing kernel specialised on each camera's geometry (Triton's default: one
compile per size, encoding and row padding) against the one geometry-free variant the fused path
compiles at capture (kernels/preprocess.py, FRAME_ARGS): GPU time per call (a CUDA graph of 20
calls, so the launch path is out), host time per launch, and the compiles each needs. GPU.

    python bench/frame_kernel.py [--rounds 5] [--views 3] [--out DIR]

Alternating rounds; the pixels of both variants are compared bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import triton

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels import preprocess

CAMERAS = {"480x640 rgb8": (480, 640, 3), "720x1280 bgra8": (720, 1280, 4), "224x224 rgb8": (224, 224, 3)}
BGR = {"720x1280 bgra8"}


def compiled(kernel) -> int:
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


def host_us(fn, calls: int = 200) -> float:
    """Median host microseconds per launch (the GPU kept ahead by the queue)."""
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--out", type=out_folder, default="bench_results")
    args = ap.parse_args()
    require_cuda(ap, "frame_kernel.py")
    free = preprocess._preprocess_kernel
    variants = {"specialised": triton.jit(free.fn), "geometry-free": free}
    gen = torch.Generator(device="cuda").manual_seed(0)
    frames = {
        name: torch.randint(0, 256, (args.views, *shape), dtype=torch.uint8, device="cuda", generator=gen)
        for name, shape in CAMERAS.items()
    }
    out = {v: torch.empty(args.views, 3, 224, 224, dtype=torch.bfloat16, device="cuda") for v in variants}
    found: dict[str, dict[str, list[float]]] = {}
    try:
        for _ in range(args.rounds):
            for variant, kernel in variants.items():
                preprocess._preprocess_kernel = kernel
                for cam, frame in frames.items():

                    def call(frame=frame, variant=variant, bgr=cam in BGR):
                        preprocess.preprocess_image(frame, 224, out=out[variant], bgr=bgr)

                    row = found.setdefault(f"{variant} {cam}", {"gpu_us": [], "host_us": []})
                    row["gpu_us"].append(graph_ms(call, calls=20) * 1e3)
                    row["host_us"].append(host_us(call))
        for cam, frame in frames.items():  # each camera's pixels, from both variants
            for variant, kernel in variants.items():
                preprocess._preprocess_kernel = kernel
                preprocess.preprocess_image(frame, 224, out=out[variant], bgr=cam in BGR)
            if not torch.equal(out["specialised"], out["geometry-free"]):
                raise SystemExit(f"the two variants' pixels differ for {cam}")
    finally:
        preprocess._preprocess_kernel = free
    counts = {v: compiled(k) for v, k in variants.items()}
    print(f"\n{args.views} views into bf16 224x224, {args.rounds} alternating rounds (medians of the rounds)")
    print(f"{'variant, camera':36} {'GPU us':>9} {'host us':>9}")
    for name, row in found.items():
        print(f"{name:36} {statistics.median(row['gpu_us']):9.2f} {statistics.median(row['host_us']):9.2f}")
    print(f"compiles for {len(CAMERAS)} camera kinds: " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    print("pixels equal bit for bit: yes")
    write_result(Path(args.out), "frame_kernel", torch.device("cuda"), views=args.views, results=found, compiles=counts)


if __name__ == "__main__":
    main()
