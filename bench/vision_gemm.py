"""SigLIP's four GEMMs per layer (3 views: 768 rows) under cuBLAS, as the fused path calls them,
and under the Triton TMA GEMM (`kernels/linear.py`) at several tiles. GPU only.

    python bench/vision_gemm.py [--views 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from itertools import product
from pathlib import Path

import torch
import torch.nn.functional as F

from flashrt_ros.bench.timing import environment, graph_ms
from kernels.linear import LinearTiles, linear

WIDTH, MLP, TOKENS = 1152, 4304, 256
SHAPES = {  # name: (N, K, GELU epilogue)
    "qkv": (3 * WIDTH, WIDTH, False),
    "o": (WIDTH, WIDTH, False),
    "fc1": (MLP, WIDTH, True),
    "fc2": (WIDTH, MLP, False),
}
TILES = [
    LinearTiles(128, 128, 64, 8, 8, 4),
    LinearTiles(128, 256, 64, 8, 8, 3),
    LinearTiles(128, 64, 64, 8, 4, 5),
    LinearTiles(64, 128, 64, 8, 4, 5),
    LinearTiles(64, 256, 64, 8, 8, 4),
    LinearTiles(64, 64, 64, 8, 4, 6),
    LinearTiles(128, 128, 128, 8, 8, 3),
    LinearTiles(64, 128, 128, 8, 4, 3),
]


def cublas(x, w, b, gelu):
    if gelu:
        return lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
    return lambda: F.linear(x, w, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--views", default="3", help="comma-separated view counts (256 rows each)")
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    results: dict = {}
    print(f"{'gemm':<5} {'rows':>5} {'impl':<34} {'us':>7} {'TFLOP/s':>8} {'max abs vs cuBLAS':>18}")
    for M, (name, (N, K, gelu)) in product([int(v) * TOKENS for v in args.views.split(",")], SHAPES.items()):
        x = torch.randn(M, K, device=dev, dtype=dt)
        w = (torch.randn(N, K, device=dev) / K**0.5).to(dt)
        b = (0.1 * torch.randn(N, device=dev)).to(dt)
        flop = 2 * M * N * K
        ref = cublas(x, w, b, gelu)()
        rows = []
        ms = graph_ms(cublas(x, w, b, gelu), calls=20)
        rows.append(dict(impl="cuBLAS", us=ms * 1e3, max_abs=0.0))
        out = torch.empty(M, N, device=dev, dtype=dt)
        for t in TILES:
            label = f"triton {t.bm}x{t.bn}x{t.bk} w{t.num_warps} s{t.num_stages}"
            try:
                fn = partial(linear, x, w, b, gelu=gelu, out=out, tiles=t)
                ms = graph_ms(fn, calls=20)
                rows.append(dict(impl=label, us=ms * 1e3, max_abs=float((out.float() - ref.float()).abs().max())))
            except Exception as exc:  # e.g. out of shared memory
                print(f"{name:<5} {M:5d} {label:<34} {type(exc).__name__}: {str(exc)[:80]}")
        for r in rows:
            print(f"{name:<5} {M:5d} {r['impl']:<34} {r['us']:7.2f} {flop / r['us'] / 1e6:8.1f} {r['max_abs']:18.3e}")
        best = min(rows, key=lambda r: r["us"])
        print(f"{name:<5} {M:5d} best: {best['impl']} ({rows[0]['us'] / best['us']:.2f}x cuBLAS)")
        results[f"{name} {M}"] = dict(M=M, N=N, K=K, gelu=gelu, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"vision_gemm_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(dict(env=environment(dev), results=results), indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
