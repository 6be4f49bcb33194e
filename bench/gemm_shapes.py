"""cuBLAS at the fused prefix's GEMM shapes (SigLIP at 3 views: 768 rows; the prefix LM at 968),
with cold weights as in the captured stage (one distinct weight per layer, replayed from a
graph), as laid out now and in candidate layouts: SigLIP's MLP width (4304) zero-padded to a
multiple of 128 (exact: GELU(0) = 0 meets zero rows of fc2), and the cuBLASLt backend. The LM
at 1024 rows shows what the 968-row tile tail costs. GPU only.

    python bench/gemm_shapes.py [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result

# name, rows, K, N, layers timed (distinct weights; together larger than the 50 MB L2), GELU epilogue
SHAPES = [
    ("siglip qkv", 768, 1152, 3456, 12, False),
    ("siglip o", 768, 1152, 1152, 27, False),
    ("siglip fc1", 768, 1152, 4304, 8, True),
    ("siglip fc1 N=4352", 768, 1152, 4352, 8, True),
    ("siglip fc2", 768, 4304, 1152, 8, False),
    ("siglip fc2 K=4352", 768, 4352, 1152, 8, False),
    ("lm qkv", 968, 2048, 2560, 8, False),
    ("lm qkv M=1024", 1024, 2048, 2560, 8, False),
    ("lm o", 968, 2048, 2048, 8, False),
    ("lm gate|up", 968, 2048, 32768, 2, False),
    ("lm gate|up M=1024", 1024, 2048, 32768, 2, False),
    ("lm down", 968, 16384, 2048, 2, False),
    ("lm down M=1024", 1024, 16384, 2048, 2, False),
]


def time_shape(rows: int, k: int, n: int, layers: int, gelu: bool, dev: torch.device) -> float:
    """Microseconds per GEMM over `layers` distinct weights, back to back in one graph."""
    dt = torch.bfloat16
    x = torch.randn(rows, k, device=dev, dtype=dt)
    ws = [(torch.randn(n, k, device=dev) * k**-0.5).to(dt) for _ in range(layers)]
    bias = torch.zeros(n, device=dev, dtype=dt)
    out = torch.empty(rows, n, device=dev, dtype=dt)

    def run():
        for w in ws:
            if gelu:
                torch._addmm_activation(bias, x, w.t(), use_gelu=True)  # (graph-pool output)
            else:
                torch.mm(x, w.t(), out=out)

    return graph_ms(run, replays=20) / layers * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "gemm_shapes.py")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    results: dict[str, list[float]] = {}
    backends = ("cublas", "cublaslt")
    for _ in range(args.rounds):
        for backend in backends:
            torch.backends.cuda.preferred_blas_library(backend)
            for name, rows, k, n, layers, gelu in SHAPES:
                results.setdefault(f"{name} [{backend}]", []).append(time_shape(rows, k, n, layers, gelu, dev))
    torch.backends.cuda.preferred_blas_library("cublas")
    print(f"{'GEMM (cold weights)':<34} {'us median':>9} {'TFLOP/s':>8}   rounds")
    table = {}
    for name, rows, k, n, _, _ in SHAPES:
        for backend in backends:
            key = f"{name} [{backend}]"
            us = statistics.median(results[key])
            tflops = 2 * rows * k * n / us / 1e6
            table[key] = dict(us=us, tflops=tflops, rounds=results[key])
            print(f"{key:<34} {us:9.2f} {tflops:8.0f}   {' '.join(f'{v:.2f}' for v in results[key])}")
    # the padded MLP computes the same: fc2(gelu(fc1 x)) with zero columns / rows appended
    x = torch.randn(768, 1152, device=dev, dtype=torch.bfloat16)
    w1, b1 = (torch.randn(4304, 1152, device=dev) / 34).bfloat16(), torch.randn(4304, device=dev).bfloat16()
    w2 = (torch.randn(1152, 4304, device=dev) / 66).bfloat16()
    ref = F.linear(torch._addmm_activation(b1, x, w1.t(), use_gelu=True), w2)
    w1p, b1p, w2p = F.pad(w1, (0, 0, 0, 48)), F.pad(b1, (0, 48)), F.pad(w2, (0, 48))
    got = F.linear(torch._addmm_activation(b1p, x, w1p.t(), use_gelu=True), w2p)
    table["padded mlp max abs diff"] = float((got.float() - ref.float()).abs().max())
    print("SigLIP MLP padded to 4352 vs 4304, max abs diff:", table["padded mlp max abs diff"])
    write_result(args.out, "gemm_shapes", dev, results=table)


if __name__ == "__main__":
    main()
