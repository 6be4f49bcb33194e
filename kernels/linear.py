"""A bf16 linear layer with its epilogue, y = act(x @ W.T + b), for the vision tower's GEMMs.

SigLIP's GEMMs have 256 rows per view (768 at three views), so a GEMM is one to three waves of
tiles on 132 SMs and the tile shape decides how much of the last wave idles. cuBLAS picks one
tile for every shape; here the tile is chosen per GEMM from measurements (`bench/vision_gemm.py`).
Operands move by TMA (tensor descriptors, Hopper and Blackwell), which also clips the ragged
edges (SigLIP's 4304-wide MLP), and the bias and GELU(tanh) are applied in fp32 before the one
rounding to the output dtype, as cuBLASLt's bias / GELU-bias epilogues do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne

__all__ = ["LinearTiles", "linear", "linear_ref"]


@dataclass(frozen=True)
class LinearTiles:
    bm: int = 128
    bn: int = 128
    bk: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 4


@triton.jit
def _gelu_tanh(y):
    inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
    return 0.5 * y * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))


@triton.jit
def _linear_kernel(
    x_desc,  # [M, K] blocks [BM, BK]
    w_desc,  # [N, K] blocks [BN, BK]
    y_desc,  # [M, N] blocks [BM, BN]
    b_ptr,  # [N]
    M,
    N,
    K,
    GELU: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX: tl.constexpr,
):
    # tiles in groups of GROUP_M row tiles per column tile: a W tile is read once from HBM
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    in_group = GROUP_M * n_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    off_m = (first_m + (pid % in_group) % size_m) * BM
    off_n = ((pid % in_group) // size_m) * BN
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK):
        a = x_desc.load([off_m, k])
        b = w_desc.load([off_n, k])
        if UPCAST:  # the interpreter's tl.dot mis-multiplies bf16
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b.T, acc, input_precision=PREC)
    cols = off_n + tl.arange(0, BN)
    y = acc + tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if GELU:
        y = _gelu_tanh(y)
    if FIX:
        y = round_bf16_rtne(y)
    y_desc.store([off_m, off_n], y.to(y_desc.dtype))


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    gelu: bool = False,
    out: torch.Tensor | None = None,
    tiles: LinearTiles = LinearTiles(),
) -> torch.Tensor:
    """act(x @ w.T + b) with act GELU(tanh) or none; returns out [M, N] (allocated if None).

    x [M, K], w [N, K] (nn.Linear layout), b [N], out [M, N]: one dtype (bf16 / fp16; fp32 runs
    the products in TF32 on a GPU), rows contiguous with 16-byte aligned strides (TMA)."""
    M, K = x.shape
    N = w.shape[0]
    if tuple(w.shape) != (N, K) or tuple(b.shape) != (N,):
        raise ValueError(f"w / b must be [N, {K}] / [N], got {tuple(w.shape)} / {tuple(b.shape)}")
    if not (x.dtype == w.dtype == b.dtype) or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x, w, b must share a float dtype, got {x.dtype} / {w.dtype} / {b.dtype}")
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if tuple(out.shape) != (M, N) or out.dtype != x.dtype:
        raise ValueError(f"out must be {x.dtype} [{M}, {N}], got {out.dtype} {tuple(out.shape)}")
    for name, t in (("x", x), ("w", w), ("out", out)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name} needs contiguous rows with a 16-byte aligned stride and base (TMA)")
    t = tiles
    grid = (triton.cdiv(M, t.bm) * triton.cdiv(N, t.bn),)
    _linear_kernel[grid](
        TensorDescriptor.from_tensor(x, [t.bm, t.bk]),
        TensorDescriptor.from_tensor(w, [t.bn, t.bk]),
        TensorDescriptor.from_tensor(out, [t.bm, t.bn]),
        b, M, N, K, gelu, t.bm, t.bn, t.bk, t.group_m,
        is_interpreting() and x.dtype != torch.float32, dot_precision(x.dtype), needs_rtne_fix(x.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out


def linear_ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """torch: fp32 GEMM + bias (+ GELU tanh), one rounding to x's dtype."""
    y = x.float() @ w.float().T + b.float()
    if gelu:
        y = torch.nn.functional.gelu(y, approximate="tanh")
    return y.to(x.dtype)
