"""SigLIP's O and fc2 GEMMs (768 rows at 3 views, N = 1152) whole or split along K, each followed
by the LayerNorm that adds its bias and the residual (and sums the partials): 27 layers of cold
weights captured in one CUDA graph, per layer. At 768 x 1152 cuBLAS's 128 x 128 tiles give 54
output tiles for 132 SMs; K splits give more tiles at once, for one more read of the partials.
GPU only; `bench/fused_ab.py "VISION_FC2_SPLIT_K=1;2;4"` decides in the captured stage.

    python bench/vision_split_k.py [--views 3] [--splits 1,2,3,4] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import torch

from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.layer_norm import layer_norm
from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.fused import split_k_matmul


def layer_fn(x: torch.Tensor, weights: list[torch.Tensor], bias: torch.Tensor, h: torch.Tensor, splits: int):
    """Every layer's GEMM (whole or split) and the LayerNorm that closes it."""
    d = h.shape[-1]
    ones = torch.ones(d, device=h.device, dtype=h.dtype)

    def run() -> None:
        for w in weights:
            if splits == 1:
                layer_norm(x @ w.t(), ones, bias, residual=h, residual_out=h, x_bias=bias)
            else:
                parts = split_k_matmul(x, w, splits)
                layer_norm(parts, ones, bias, residual=h, residual_out=h, x_bias=bias, partials=True)

    return run


def kernels_of(fn) -> list[str]:
    """The CUDA kernels one call launches (to see that the split runs no copies)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--splits", default="1,2,3,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    spec = PolicyConfig.preset("pi05", num_views=args.views, dtype="bfloat16").vision
    rows, d = args.views * spec.num_tokens, spec.width
    g = torch.Generator(device=dev).manual_seed(0)
    results: dict[str, list[float]] = {}
    for name, k in (("O", d), ("fc2", spec.mlp_dim)):
        x = torch.randn(rows, k, device=dev, dtype=dt, generator=g)
        weights = [torch.randn(d, k, device=dev, dtype=dt, generator=g) / k**0.5 for _ in range(spec.depth)]
        bias, h = torch.randn(d, device=dev, dtype=dt, generator=g), torch.randn(rows, d, device=dev, dtype=dt)
        splits = [s for s in map(int, args.splits.split(",")) if k % s == 0]
        for s in splits[1:]:
            print(f"{name} split {s}: kernels {kernels_of(partial(split_k_matmul, x, weights[0], s))}")
            whole, parts = x.float() @ weights[0].float().t(), split_k_matmul(x, weights[0], s).float().sum(0)
            print(f"  max abs vs the fp32 product {float((parts - whole).abs().max()):.3e}")
        for rnd in range(args.rounds):
            for s in splits:
                us = graph_ms(layer_fn(x, weights, bias, h, s), replays=20) * 1e3 / spec.depth
                results.setdefault(f"{name} {rows}x{k}->{d} split {s}", []).append(us)
                print(f"round {rnd}: {name:<4} split {s}: {us:7.2f} us per layer (GEMM + LayerNorm)", flush=True)
    print()
    for key, values in results.items():
        print(f"{key:<32} median of rounds {sorted(values)[len(values) // 2]:7.2f} us")
    write_result(args.out, "vision_split_k", dev, views=args.views, results=results)


if __name__ == "__main__":
    main()
