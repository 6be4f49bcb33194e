"""The prefix LM's gate|up GEMM + GeGLU (968 rows, 2048 -> 2 x 16384) on the GPU, with cold
weights as in the captured stage (distinct weights per layer, replayed from a graph): cuBLAS +
kernels/geglu.py against kernels/gate_up_geglu.py (one GEMM, GeGLU in its epilogue), alternating
over rounds, each checked against cuBLAS + geglu. GPU only.

    python bench/gate_up_geglu.py [--rounds 5] [--layers 2] [--out DIR]

Measured and dropped (2026-12-01, 0bb12f1, docs/results/gate_up_geglu_20261201_043735.json): the GeGLU's
programs in other orders (row-major from the top or bottom, column blocks from the right:
201.6-208.3 vs 203.0 us, noise), and other tiles of the fused GEMM (gate / up interleaved in one
256-wide tile): 128 x 256 x 64 with 4 stages on 8 warps, persistent, 194.6 us; 3 stages 197.2;
non-persistent 212.6; 128 x 128 tiles 210-213; BK 128 269.7; 64-row tiles 222.9; Triton's warp
specialisation 197.6 / 211.4 / 217.5. Gate and up as two 128-column MMAs on the plain weight
(no interleaving): 245.3 vs 203.0 us (3baba63), and the prefix stage 8.94 vs 8.30 ms.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.gate_up_geglu import gate_up_geglu, interleave_gate_up, supports_gate_up_geglu
from flashrt_ros.kernels.geglu import geglu

ROWS, K, FF = 968, 2048, 16384


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2, help="distinct weights (134 MB each: cold in L2)")
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "gate_up_geglu.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    if not supports_gate_up_geglu(dev):
        print("gate_up_geglu does not run on this GPU (needs sm_90+ and ~224 KB of shared memory): nothing to compare")
        return
    torch.manual_seed(0)
    x = torch.randn(ROWS, K, device=dev, dtype=dt)
    ws = [(torch.randn(2 * FF, K, device=dev) * K**-0.5).to(dt) for _ in range(args.layers)]
    gu = torch.empty(ROWS, 2 * FF, device=dev, dtype=dt)
    y = torch.empty(ROWS, FF, device=dev, dtype=dt)

    def cublas_geglu():
        for w in ws:
            geglu(torch.mm(x, w.t(), out=gu), out=y)

    wi = [interleave_gate_up(w, 128) for w in ws]

    def fused():
        for w in wi:
            gate_up_geglu(x, w, 128, out=y)

    variants = {"cublas gate|up + geglu": cublas_geglu, "triton gate_up_geglu": fused}
    cublas_geglu()
    want = y.float().clone()
    results = {}
    for name, fn in variants.items():
        fn()
        results[name] = dict(max_abs=float((y.float() - want).abs().max()), us=[])
    for _ in range(args.rounds):
        for name, fn in variants.items():
            results[name]["us"].append(graph_ms(fn, replays=20) / args.layers * 1e3)
    flops = 2 * ROWS * K * 2 * FF
    print(f"{'gate|up + GeGLU, 968 rows, cold weights':<40} {'us':>8} {'TFLOP/s':>8} {'max abs':>9}   rounds")
    for name, r in results.items():
        r["median_us"] = statistics.median(r["us"])
        rounds = " ".join(f"{v:.1f}" for v in r["us"])
        print(f"{name:<40} {r['median_us']:8.2f} {flops / r['median_us'] / 1e6:8.0f} {r['max_abs']:9.2e}   {rounds}")
    write_result(args.out, "gate_up_geglu", dev, rows=ROWS, k=K, ff=FF, results=results)


if __name__ == "__main__":
    main()
