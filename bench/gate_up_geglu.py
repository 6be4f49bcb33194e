"""The prefix LM's gate|up GEMM + GeGLU (968 rows, 2048 -> 2 x 16384) on the GPU, with cold
weights as in the captured stage (distinct weights per layer, replayed from a graph):

- cuBLAS GEMM, then kernels/geglu.py, with the GeGLU's programs in four orders (which of the
  GEMM's freshly written lines it finds in L2 depends on the order);
- one Triton GEMM with GeGLU in its epilogue (TMA loads, gate and up rows interleaved in blocks
  of BN / 2 so that one tile holds both halves of its columns): half the GEMM's output bytes and
  no separate GeGLU pass; at several tile settings, plain and persistent grids.

Each variant's output is checked against cuBLAS + geglu. GPU only. A prototype: nothing here is
used by the pipeline unless it wins.

    python bench/gate_up_geglu.py [--rounds 3] [--layers 2] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from flashrt_ros.bench.timing import graph_ms, write_result
from kernels._common import is_interpreting
from kernels.geglu import geglu
from kernels.gelu import gelu_tanh

ROWS, K, FF = 968, 2048, 16384


@triton.jit
def _geglu_ordered(gu_ptr, y_ptr, R, F, ORDER: tl.constexpr, BLOCK: tl.constexpr):
    """kernels/geglu.py's GeGLU with the program -> (row, column block) map chosen by ORDER:
    0 rows fastest (geglu.py's), 1 row-major from the top, 2 row-major from the bottom,
    3 rows fastest with the column blocks from the right."""
    nb = tl.cdiv(F, BLOCK)
    if ORDER == 0:
        row, blk = tl.program_id(0), tl.program_id(1)
    elif ORDER == 1:
        row, blk = tl.program_id(1), tl.program_id(0)
    elif ORDER == 2:
        row, blk = R - 1 - tl.program_id(1), tl.program_id(0)
    else:
        row, blk = tl.program_id(0), nb - 1 - tl.program_id(1)
    row = row.to(tl.int64)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    g = tl.load(gu_ptr + row * 2 * F + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * F + F + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * F + cols, (gelu_tanh(g) * u).to(y_ptr.dtype.element_ty), mask=ok)


def geglu_ordered(gu: torch.Tensor, y: torch.Tensor, order: int, block: int = 1024) -> None:
    R, F = y.shape
    nb = triton.cdiv(F, block)
    grid = (R, nb) if order in (0, 3) else (nb, R)
    _geglu_ordered[grid](gu, y, R, F, ORDER=order, BLOCK=block, num_warps=4)


@triton.jit
def _tile(t, n_m, n_n, GROUP_M: tl.constexpr):
    """Tile index -> (row tile, column tile), GROUP_M row tiles walked together (L2 reuse)."""
    per_group = GROUP_M * n_n
    first = (t // per_group) * GROUP_M
    size = tl.minimum(n_m - first, GROUP_M)
    return first + (t % per_group) % size, (t % per_group) // size


@triton.jit
def _gate_up_geglu_kernel(
    a_desc, w_desc, y_desc, M, N2, KD,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr, NUM_SMS: tl.constexpr, UPCAST: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    n_m, n_n = tl.cdiv(M, BM), N2 // BN
    start, step = (tl.program_id(0), NUM_SMS) if PERSISTENT else (tl.program_id(0), n_m * n_n)
    for t in tl.range(start, n_m * n_n, step, flatten=PERSISTENT, warp_specialize=WS):
        pm, pn = _tile(t, n_m, n_n, GROUP_M)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, KD, BK):
            a = a_desc.load([pm * BM, k])
            w = w_desc.load([pn * BN, k])
            if UPCAST:  # the interpreter's bf16 dot is wrong (kernels/_common.py)
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w.T, acc)
        g, u = tl.split(acc.reshape(BM, 2, BN // 2).permute(0, 2, 1))
        y_desc.store([pm * BM, pn * (BN // 2)], (gelu_tanh(g) * u).to(y_desc.dtype))


def interleave(w_gu: torch.Tensor, half: int) -> torch.Tensor:
    """[gate; up] rows -> blocks of `half` gate rows then the same `half` up rows."""
    two_f, kd = w_gu.shape
    g, u = w_gu.view(2, two_f // 2 // half, half, kd).unbind(0)
    return torch.stack((g, u), dim=1).reshape(two_f, kd)


def gate_up_geglu(x, w_int, y, bm, bn, bk, stages, warps, persistent, ws=False, group_m=8, sms=132) -> None:
    M, KD = x.shape
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w_int, [bn, bk])
    y_desc = TensorDescriptor.from_tensor(y, [bm, bn // 2])
    tiles = triton.cdiv(M, bm) * (w_int.shape[0] // bn)
    grid = (min(sms, tiles),) if persistent else (tiles,)
    _gate_up_geglu_kernel[grid](
        a_desc, w_desc, y_desc, M, w_int.shape[0], KD, BM=bm, BN=bn, BK=bk, GROUP_M=group_m,
        PERSISTENT=persistent, NUM_SMS=sms, UPCAST=is_interpreting(), WS=ws, num_stages=stages, num_warps=warps,
    )  # fmt: skip


CONFIGS = [  # BM, BN, BK, stages, warps, persistent, warp-specialised
    (128, 256, 64, 3, 8, False, False),
    (128, 256, 64, 3, 8, True, False),
    (128, 256, 64, 4, 8, True, False),
    (128, 128, 64, 4, 8, True, False),
    (128, 128, 64, 4, 4, True, False),
    (128, 256, 128, 2, 8, True, False),
    (64, 256, 64, 4, 4, True, False),
    (128, 256, 64, 3, 8, True, True),
    (128, 128, 64, 4, 4, True, True),
    (128, 256, 64, 4, 8, False, True),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2, help="distinct weights (134 MB each: cold in L2)")
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    x = torch.randn(ROWS, K, device=dev, dtype=dt)
    ws = [(torch.randn(2 * FF, K, device=dev) * K**-0.5).to(dt) for _ in range(args.layers)]
    gu = torch.empty(ROWS, 2 * FF, device=dev, dtype=dt)
    y = torch.empty(ROWS, FF, device=dev, dtype=dt)
    want = geglu(F.linear(x, ws[-1])).float()

    variants: dict[str, callable] = {}
    for order in range(4):

        def run(o=order):
            for w in ws:
                torch.mm(x, w.t(), out=gu)
                geglu_ordered(gu, y, o)

        variants[f"cublas + geglu order {order}"] = run
    for cfg in CONFIGS:
        bm, bn, bk, stages, warps, pers, ws_ = cfg
        w_int = [interleave(w, bn // 2) for w in ws]

        def run(c=cfg, wi=w_int):
            for w in wi:
                gate_up_geglu(x, w, y, *c, sms=sms)

        variants[f"triton {bm}x{bn}x{bk} s{stages} w{warps}{' persistent' if pers else ''}{' ws' if ws_ else ''}"] = run

    results: dict[str, dict] = {}
    for name, fn in variants.items():  # build + check once
        try:
            fn()
            err = float((y.float() - want).abs().max())
            results[name] = dict(max_abs=err, us=[])
        except Exception as exc:
            print(f"{name:<44} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    for _ in range(args.rounds):
        for name in results:
            results[name]["us"].append(graph_ms(variants[name], replays=20) / args.layers * 1e3)
    flops = 2 * ROWS * K * 2 * FF
    print(f"{'gate|up + GeGLU, 968 rows, cold weights':<44} {'us':>8} {'TFLOP/s':>8} {'max abs':>9}   rounds")
    for name, r in results.items():
        us = sorted(r["us"])[len(r["us"]) // 2]
        r["median_us"] = us
        rounds = " ".join(f"{v:.1f}" for v in r["us"])
        print(f"{name:<44} {us:8.2f} {flops / us / 1e6:8.0f} {r['max_abs']:9.2e}   {rounds}")
    write_result(args.out, "gate_up_geglu", dev, rows=ROWS, k=K, ff=FF, results=results)


if __name__ == "__main__":
    main()
