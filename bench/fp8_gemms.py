"""Would FP8 (e4m3, row-scaled) GEMMs make the prefix faster? Each GEMM of pi0.5's prefix at its
real shape (3 views: 968 LM rows, 768 vision rows), cold weights (distinct per layer, replayed
from a CUDA graph), bf16 against FP8, alternating over rounds. GPU only.

    python bench/fp8_gemms.py [--rounds 5] [--layers 2] [--out DIR]

Rows: the LM's gate|up + GeGLU (kernels/gate_up_geglu.py in bf16 and FP8; cuBLASLt's
row-scaled `torch._scaled_mm` + kernels/geglu.py), the LM's down / QKV / O and SigLIP's GEMMs
(cuBLAS bf16 vs `torch._scaled_mm`), and the norm that feeds gate|up (bf16 out vs e4m3 out + row
scales). Each FP8 row's max abs is against its bf16 row (FP8's rounding, not a bug, unless large).
"""

from __future__ import annotations

import argparse
import statistics

import torch

import flashrt_ros.kernels.gate_up_geglu as gu_mod
from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.fp8 import dequantize_rows, quantize_rows
from flashrt_ros.kernels.gate_up_geglu import (
    gate_up_geglu,
    gate_up_geglu_ref,
    interleave_gate_up,
    supports_gate_up_geglu,
)
from flashrt_ros.kernels.geglu import geglu
from flashrt_ros.kernels.rms_norm import rms_norm

ROWS_LM, ROWS_VISION = 968, 768
# name: (rows, K, N)
PLAIN = {
    "lm down 16384->2048": (ROWS_LM, 16384, 2048),
    "lm qkv 2048->2560": (ROWS_LM, 2048, 2560),
    "lm o 2048->2048": (ROWS_LM, 2048, 2048),
    "vision qkv 1152->3456": (ROWS_VISION, 1152, 3456),
    "vision o 1152->1152": (ROWS_VISION, 1152, 1152),
    "vision fc1 1152->4304": (ROWS_VISION, 1152, 4304),
    "vision fc2 4304->1152": (ROWS_VISION, 4304, 1152),
}


def _scaled_mm(xq, xs, wq, ws, out):
    return torch._scaled_mm(xq, wq.t(), scale_a=xs[:, None], scale_b=ws[None, :], out_dtype=torch.bfloat16, out=out)


def _gate_up_variants(dev, layers: int) -> tuple[dict, dict]:
    """(name -> fn, name -> (output, reference output)) for the LM's gate|up + GeGLU."""
    rows, k, ff = ROWS_LM, 2048, 16384
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    ws = [(torch.randn(2 * ff, k, device=dev) * k**-0.5).to(torch.bfloat16) for _ in range(layers)]
    wi = [interleave_gate_up(w, 128) for w in ws]
    wq = [quantize_rows(w) for w in wi]
    wq_plain = [quantize_rows(w) for w in ws]
    xq, xs = quantize_rows(x)
    y = torch.empty(rows, ff, device=dev, dtype=torch.bfloat16)
    gu = torch.empty(rows, 2 * ff, device=dev, dtype=torch.bfloat16)
    outs = {name: torch.empty_like(y) for name in ("bf16", "fp8", "fp8p", "lt")}

    def bf16():
        for w in wi:
            gate_up_geglu(x, w, 128, out=outs["bf16"])

    def fp8():
        for q, s in wq:
            gate_up_geglu(xq, q, 128, out=outs["fp8"], x_scale=xs, w_scale=s)

    def fp8_promoted():  # partial sums promoted into fp32 every K step (FP8_PROMOTE_K = 128)
        gu_mod.FP8_PROMOTE_K = 128
        try:
            for q, s in wq:
                gate_up_geglu(xq, q, 128, out=outs["fp8p"], x_scale=xs, w_scale=s)
        finally:
            gu_mod.FP8_PROMOTE_K = None

    def lt():
        for q, s in wq_plain:
            geglu(_scaled_mm(xq, xs, q, s, gu), out=outs["lt"])

    fns = {
        "lm gate|up+geglu triton bf16": bf16,
        "lm gate|up+geglu triton fp8": fp8,
        "lm gate|up+geglu triton fp8 promote/128": fp8_promoted,
        "lm gate|up+geglu cublasLt fp8": lt,
    }
    pairs = {
        "lm gate|up+geglu triton fp8": (outs["fp8"], outs["bf16"]),
        "lm gate|up+geglu triton fp8 promote/128": (outs["fp8p"], outs["bf16"]),
        "lm gate|up+geglu cublasLt fp8": (outs["lt"], outs["bf16"]),
    }
    # against the fp32 product of the values the FP8 operands stand for (the last layer's weight):
    # what the FP8 MMA's accumulation adds on top of the operands' rounding
    exact = gate_up_geglu_ref(dequantize_rows(xq, xs), dequantize_rows(*quantize_rows(ws[-1]))).float()
    for name in ("fp8", "fp8p"):
        pairs[f"accumulation error of triton {name}"] = (outs[name], exact)
    return fns, pairs


def _plain_variants(dev, layers: int) -> tuple[dict, dict]:
    fns, pairs = {}, {}
    for name, (rows, k, n) in PLAIN.items():
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        ws = [(torch.randn(n, k, device=dev) * k**-0.5).to(torch.bfloat16) for _ in range(layers)]
        wq = [quantize_rows(w) for w in ws]
        xq, xs = quantize_rows(x)
        yb = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
        y8 = torch.empty_like(yb)
        fns[f"{name} cublas bf16"] = lambda x=x, ws=ws, yb=yb: [torch.mm(x, w.t(), out=yb) for w in ws]
        fns[f"{name} cublasLt fp8"] = lambda xq=xq, xs=xs, wq=wq, y8=y8: [_scaled_mm(xq, xs, q, s, y8) for q, s in wq]
        pairs[f"{name} cublasLt fp8"] = (y8, yb)
    return fns, pairs


def _norm_variants(dev, layers: int) -> tuple[dict, dict]:
    rows, k = ROWS_LM, 2048
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(k, device=dev, dtype=torch.bfloat16) * 0.1
    yb, s = torch.empty_like(x), torch.empty_like(x)
    y8, sc = torch.empty(rows, k, device=dev, dtype=torch.float8_e4m3fn), torch.empty(rows, device=dev)
    fns = {
        "lm rms_norm+residual -> bf16": lambda: [
            rms_norm(x, w, residual=r, out=yb, residual_out=s) for _ in range(layers)
        ],
        "lm rms_norm+residual -> fp8": lambda: [
            rms_norm(x, w, residual=r, out=y8, residual_out=s, out_scale=sc) for _ in range(layers)
        ],
    }
    return fns, {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2, help="distinct weights per GEMM (cold in L2)")
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "fp8_gemms.py")
    dev = torch.device("cuda")
    if not supports_gate_up_geglu(dev):
        print("needs sm_90+ (TMA, FP8 MMA)")
        return
    torch.manual_seed(0)
    fns, pairs = {}, {}
    for part in (_gate_up_variants, _plain_variants, _norm_variants):
        f, p = part(dev, args.layers)
        fns.update(f)
        pairs.update(p)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    results = {name: dict(us=[]) for name in fns}
    for name, (got, want) in pairs.items():
        results.setdefault(name, dict(us=[]))
        results[name]["max_abs_vs_bf16"] = float((got.float() - want.float()).abs().max())
        cos = torch.cosine_similarity(got.float().flatten(), want.float().flatten(), 0)
        results[name]["cosine_vs_bf16"] = float(cos)
    for name in [n for n in results if n not in fns]:  # error-only rows
        r = results[name]
        print(f"{name:<42} max abs {r['max_abs_vs_bf16']:.3e}, cosine {r['cosine_vs_bf16']:.7f}")
        del results[name]["us"]
    for _ in range(args.rounds):
        for name, fn in fns.items():
            results[name]["us"].append(graph_ms(fn, replays=20) / args.layers * 1e3)
    print(f"{'GEMM (cold weights)':<42} {'us':>8}  {'cos vs bf16':>11} {'max abs':>9}   rounds")
    for name, r in results.items():
        if name not in fns:
            continue
        r["median_us"] = statistics.median(r["us"])
        rounds = " ".join(f"{v:.1f}" for v in r["us"])
        cos = f"{r['cosine_vs_bf16']:11.6f} {r['max_abs_vs_bf16']:9.2e}" if "cosine_vs_bf16" in r else " " * 21
        print(f"{name:<42} {r['median_us']:8.2f}  {cos}   {rounds}")
    write_result(args.out, "fp8_gemms", dev, layers=args.layers, results=results)


if __name__ == "__main__":
    main()
