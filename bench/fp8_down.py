"""Prototype: could the prefix LM's down projection (968 x 16384 -> 2048) run in FP8 with its
input scaled per 1 x 128 block (what a GeGLU epilogue can produce tile by tile, without a pass
over whole rows)? A persistent Triton TMA GEMM applying the block scales per K step, against
cuBLAS bf16 and cuBLASLt's row-scaled `_scaled_mm`, cold weights, alternating rounds. GPU only.

    python bench/fp8_down.py [--rounds 5] [--layers 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.fp8 import quantize_rows

ROWS, K, N, BLOCK = 968, 16384, 2048, 128


@triton.jit
def _down_kernel(a_desc, w_desc, y_desc, as_ptr, ws_ptr, M, N, KD, NUM_PROGS, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    n_kb = KD // BK
    for t in tl.range(tl.program_id(0), n_m * n_n, NUM_PROGS, flatten=True):
        per_group = GROUP_M * n_n
        first = (t // per_group) * GROUP_M
        size = tl.minimum(n_m - first, GROUP_M)
        pm, pn = first + (t % per_group) % size, (t % per_group) // size
        rows = pm * BM + tl.arange(0, BM)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for kb in range(0, n_kb):
            a = a_desc.load([pm * BM, kb * BK])
            w = w_desc.load([pn * BN, kb * BK])
            s = tl.load(as_ptr + rows * n_kb + kb, mask=rows < M, other=0.0)
            acc += tl.dot(a, w.T) * s[:, None]
        cols = pn * BN + tl.arange(0, BN)
        acc = acc * tl.load(ws_ptr + cols, mask=cols < N, other=0.0)[None, :]
        y_desc.store([pm * BM, pn * BN], acc.to(y_desc.dtype))


def block_quantize(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> e4m3 [M, K] and fp32 scales [M, K // block] (one per 1 x block)."""
    m, k = x.shape
    q, s = quantize_rows(x.reshape(m * (k // block), block))
    return q.reshape(m, k), s.reshape(m, k // block).contiguous()


def down_fp8(aq, a_s, wq, w_s, out, bm=128, bn=128, stages=4, warps=8, group_m=8):
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, kd = aq.shape
    n = wq.shape[0]
    sms = torch.cuda.get_device_properties(aq.device).multi_processor_count
    progs = min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn))
    _down_kernel[(progs,)](
        TensorDescriptor.from_tensor(aq, [bm, BLOCK]), TensorDescriptor.from_tensor(wq, [bn, BLOCK]),
        TensorDescriptor.from_tensor(out, [bm, bn]), a_s, w_s, m, n, kd, progs,
        BM=bm, BN=bn, BK=BLOCK, GROUP_M=group_m, num_stages=stages, num_warps=warps,
    )  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "fp8_down.py")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = (torch.randn(ROWS, K, device=dev) * 0.5).to(torch.bfloat16)
    ws = [(torch.randn(N, K, device=dev) * K**-0.5).to(torch.bfloat16) for _ in range(args.layers)]
    wq = [quantize_rows(w) for w in ws]
    aq, a_s = block_quantize(x)
    xq_row, xs_row = quantize_rows(x)
    outs = {name: torch.empty(ROWS, N, device=dev, dtype=torch.bfloat16) for name in ("bf16", "lt", "tri")}
    fns = {
        "down cublas bf16": lambda: [torch.mm(x, w.t(), out=outs["bf16"]) for w in ws],
        "down cublasLt fp8 row-scaled": lambda: [
            torch._scaled_mm(
                xq_row, q.t(), scale_a=xs_row[:, None], scale_b=s[None, :], out_dtype=torch.bfloat16, out=outs["lt"]
            )
            for q, s in wq
        ],  # fmt: skip
    }
    for bm, bn, st, wp in ((128, 128, 4, 8), (128, 128, 3, 8), (128, 256, 3, 8), (64, 128, 4, 4), (128, 64, 4, 4)):
        fns[f"down triton fp8 1x128 blocks {bm}x{bn} s{st} w{wp}"] = lambda bm=bm, bn=bn, st=st, wp=wp: [
            down_fp8(aq, a_s, q, s, outs["tri"], bm, bn, st, wp) for q, s in wq
        ]
    results = {name: dict(us=[]) for name in fns}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        got = outs["tri"] if "triton" in name else outs["lt"] if "Lt" in name else outs["bf16"]
        ref = outs["bf16"] if "bf16" not in name else got
        results[name]["cosine_vs_bf16"] = float(
            torch.cosine_similarity(got.float().flatten(), ref.float().flatten(), 0)
        )
    for _ in range(args.rounds):
        for name, fn in fns.items():
            results[name]["us"].append(graph_ms(fn, replays=20) / args.layers * 1e3)
    print(f"{'down 968 x 16384 -> 2048 (cold weights)':<48} {'us':>8} {'cos vs bf16':>11}   rounds")
    for name, r in results.items():
        r["median_us"] = statistics.median(r["us"])
        print(
            f"{name:<48} {r['median_us']:8.2f} {r['cosine_vs_bf16']:11.6f}   " + " ".join(f"{v:.1f}" for v in r["us"])
        )
    write_result(args.out, "fp8_down", dev, rows=ROWS, k=K, n=N, results=results)


if __name__ == "__main__":
    main()
