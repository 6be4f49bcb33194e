"""The prefix LM's attention (968 tokens, 8 query heads, one K/V head of dim 256, padded prompt
keys masked) on the GPU: our Triton kernel at several tile settings against torch's SDPA
backends and the TMA kernel (kernels/prefix_attention.py), each checked against the fp32
reference; then SigLIP's attention (per view: 256
tokens, 16 heads of dim 72) under each SDPA backend and our packed kernel. GPU only.

    python bench/attention.py [--out DIR] [--tokens 968] [--valid 930] [--views 3] [--parts prefix,vision]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.attention import attention, attention_key_blocks, attention_ref
from flashrt_ros.kernels.packed_attention import packed_attention
from flashrt_ros.kernels.prefix_attention import prefix_attention

H, D = 8, 256


def median_us(fn) -> float:
    """Per call, from a CUDA graph of 10 back-to-back calls (see `graph_ms`)."""
    return graph_ms(fn, calls=10, replays=20) * 1e3


def vision(views: int, tokens: int = 256, heads: int = 16, hd: int = 72) -> dict[str, dict]:
    """SigLIP's attention as FusedPi0.vision calls it: q, k, v strided views of the fused QKV
    GEMM's output [v, n, 3, heads, hd]; each SDPA backend against the fp32 maths."""
    torch.manual_seed(0)
    qkv = torch.randn(views, tokens, 3, heads, hd, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    want = torch.softmax(q.float() @ k.float().transpose(-1, -2) / hd**0.5, -1) @ v.float()
    flops = 4 * views * heads * tokens * tokens * hd
    print(f"SigLIP attention: {views} views x {tokens} tokens, {heads} heads of dim {hd}, bf16")
    results = {}
    for name, backend in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
                err = float((fn().float() - want).abs().max())
                us = median_us(fn)
        except Exception as exc:
            print(f"sdpa {name:<40} unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
            continue
        results[name] = dict(us=us, max_abs=err)
        print(f"sdpa {name:<41} {us:8.1f} us {flops / us / 1e6:6.0f} TFLOP/s  max abs {err:.2e}")
    # kernels/packed_attention.py on the same buffer, its output in the O GEMM's layout
    packed = qkv.view(views * tokens, 3 * heads * hd)
    want_rows = want.transpose(1, 2).reshape(views * tokens, heads * hd)
    for label, tiles in (
        ("triton packed default", {}),
        *(
            (f"triton packed {bm}x{bn} w{w} s{s}", dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s))
            for bm, bn, w, s in (
                (64, 64, 4, 3),
                (128, 64, 8, 2),
                (64, 128, 4, 2),
                (32, 64, 4, 2),
                (64, 128, 4, 3),
                (128, 128, 8, 1),
                (64, 256, 4, 1),
            )
        ),
    ):
        fn = lambda t=tiles: packed_attention(packed, heads, tokens, **t)  # noqa: E731
        try:
            err = float((fn().float() - want_rows).abs().max())
            us = median_us(fn)
        except Exception as exc:  # e.g. out of shared memory: say why, go on (a fault still ends the run)
            print(f"{label:<46} unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
            results[label] = dict(error=f"{type(exc).__name__}: {exc}"[:300])
            continue
        results[label] = dict(us=us, max_abs=err)
        print(f"{label:<46} {us:8.1f} us {flops / us / 1e6:6.0f} TFLOP/s  max abs {err:.2e}")
    return results


def prefix(args: argparse.Namespace) -> dict[str, dict]:
    """The prefix LM's attention: our kernel at several launches, torch's SDPA backends."""
    dev, dt, T = torch.device("cuda"), torch.bfloat16, args.tokens
    torch.manual_seed(0)
    q = torch.randn(T, H, D, device=dev, dtype=dt)
    k, v = torch.randn(T, D, device=dev, dtype=dt), torch.randn(T, D, device=dev, dtype=dt)
    valid = torch.arange(T, device=dev) < args.valid
    kb = attention_key_blocks(valid)
    ref = attention_ref(q.float(), k.float(), v.float(), key_blocks=kb)
    rows = valid  # padded query rows are never used downstream: compare valid rows only
    flops = 4 * T * args.valid * D * H
    results: dict[str, dict] = {}

    def show(label: str, fn, want: torch.Tensor = ref) -> None:
        try:
            out = fn()
            err = float((out.float() - want)[rows].abs().max())
            us = median_us(fn)
        except Exception as exc:  # a backend that refuses these inputs: say why, go on
            print(f"{label:<46} unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
            results[label] = dict(error=f"{type(exc).__name__}: {exc}"[:300])
            return
        results[label] = dict(us=us, max_abs=err, tflops=flops / us / 1e6)
        print(f"{label:<46} {us:8.1f} us {flops / us / 1e6:6.0f} TFLOP/s  max abs {err:.2e}")

    print(f"prefix attention: {T} tokens ({args.valid} valid), {H} heads, 1 K/V head, d {D}, bf16")
    show("triton default", lambda: attention(q, k, v, key_blocks=kb))
    # kernels/prefix_attention.py: TMA loads, no key split (64-row tiles: 121 programs)
    show("tma default", lambda: prefix_attention(q, k, v, kb))
    for bm, bn, w, s in ((64, 64, 4, 3), (64, 32, 4, 3), (64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 3)):
        tiles = dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
        show(f"tma {bm}x{bn} w{w} s{s}", lambda t=tiles: prefix_attention(q, k, v, kb, **t))
    for bm, bn, w, s in ((64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2), (64, 32, 8, 3), (128, 32, 8, 3)):
        tiles = dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s, num_splits=1)
        show(f"triton {bm}x{bn} w{w} s{s}", lambda t=tiles: attention(q, k, v, key_blocks=kb, **t))
    show(
        "triton 64x32 w4 s3, 2 key splits",
        lambda: attention(q, k, v, key_blocks=kb, block_m=64, block_n=32, num_warps=4, num_stages=3, num_splits=2),
    )
    # two warpgroups per CTA (128-row tiles, 8 warps: 235 registers, no spill, offline build) do
    # more per SM than one (64 x 32, 4 warps: 255 registers, 1 CTA per SM), but 61 tiles fill half
    # the SMs (54 us above); 2 key splits give 122 CTAs, plus the combine
    for bm, bn, w, s, sp in ((128, 32, 8, 3, 2), (128, 64, 8, 2, 2), (128, 128, 8, 1, 2), (128, 64, 8, 2, 3),
                            (64, 64, 4, 2, 2), (128, 32, 8, 4, 2), (64, 128, 8, 2, 2)):  # fmt: skip
        tiles = dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s, num_splits=sp)
        show(f"triton {bm}x{bn} w{w} s{s}, {sp} key splits", lambda t=tiles: attention(q, k, v, key_blocks=kb, **t))

    # torch SDPA: [1, H, T, D] views of the same tensors (no copies), the mask as a bool row
    qs = q.unsqueeze(0).transpose(1, 2)
    ks, vs = k.view(1, 1, T, D), v.view(1, 1, T, D)
    ke, ve = ks.expand(1, H, T, D), vs.expand(1, H, T, D)
    mask = valid.view(1, 1, 1, T)
    bias = torch.zeros(1, 1, T, T, device=dev, dtype=dt).masked_fill(~mask, float("-inf"))
    sdpa = lambda kk, vv, m, **kw: F.scaled_dot_product_attention(qs, kk, vv, attn_mask=m, **kw).transpose(1, 2)[0]  # noqa: E731
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        with sdpa_kernel(backend):
            show(f"sdpa {name}, mask, gqa", lambda: sdpa(ks, vs, mask, enable_gqa=True))
            show(f"sdpa {name}, mask, k/v expanded", lambda: sdpa(ke, ve, mask))
            show(f"sdpa {name}, additive mask, k/v contiguous", lambda: sdpa(ke.contiguous(), ve.contiguous(), bias))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # no mask support: the unmasked floor, for scale
        no_mask = attention_ref(q.float(), k.float(), v.float())
        show("sdpa flash, NO mask (a floor only), gqa", lambda: sdpa(ks, vs, None, enable_gqa=True), no_mask)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_folder, default="out")
    ap.add_argument("--tokens", type=int, default=968)
    ap.add_argument("--valid", type=int, default=930, help="valid tokens; the rest are padded keys")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--parts", default="prefix,vision", help="prefix, vision or both (comma-separated)")
    args = ap.parse_args()
    require_cuda(ap, "attention.py")
    parts = args.parts.split(",")
    if not parts or set(parts) - {"prefix", "vision"}:
        raise SystemExit(f"--parts {args.parts!r}: expected prefix, vision or prefix,vision")
    results = prefix(args) if "prefix" in parts else {}
    if "vision" in parts:
        results["vision"] = vision(args.views)
    write_result(args.out, "attention", torch.device("cuda"), tokens=args.tokens, valid=args.valid, results=results)


if __name__ == "__main__":
    main()
