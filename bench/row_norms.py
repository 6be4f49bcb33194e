"""The row norms between the GEMMs, at their pipeline shapes, per launch setting: SigLIP's
LayerNorm with the residual add (768 rows x 1152, 3 views) and Gemma's RMSNorm with the residual
add (968 rows x 2048, the prefix LM). GPU only.

    python bench/row_norms.py [--out DIR]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.layer_norm import layer_norm
from flashrt_ros.kernels.rms_norm import rms_norm

CASES = {"siglip layer_norm 768x1152": (768, 1152, "ln"), "gemma rms_norm 968x2048": (968, 2048, "rms")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "row_norms.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    results = {}
    for name, (rows, width, kind) in CASES.items():
        x, h = torch.randn(rows, width, device=dev, dtype=dt), torch.randn(rows, width, device=dev, dtype=dt)
        w, b = torch.randn(width, device=dev, dtype=dt), torch.randn(width, device=dev, dtype=dt)
        y, s = torch.empty_like(x), torch.empty_like(x)
        for warps in (None, 1, 2, 4, 8, 16):
            io = dict(residual=h, out=y, residual_out=s, num_warps=warps)
            fn = partial(layer_norm, x, w, b, **io) if kind == "ln" else partial(rms_norm, x, w, **io)
            us = graph_ms(fn, calls=20) * 1e3
            results[f"{name} warps={warps or 'default'}"] = us
            print(f"{name:<28} warps={str(warps or 'default'):<8} {us:7.2f} us")
    write_result(args.out, "row_norms", dev, results=results)


if __name__ == "__main__":
    main()
