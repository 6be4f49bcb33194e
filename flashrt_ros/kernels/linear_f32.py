"""A small fp32 linear layer, y = x @ W.T + b, stored in the output's dtype.

pi0's action-time MLP ends with a [50, 1024] x [1024, 1024] fp32 projection whose result is the
expert's input (bf16) for the next denoise step. cuBLAS runs it as a split-K `sgemm_largek`
(16.7 us on the H200, docs/results/profile_pi0_3v_831fc71.log), followed by a cast and a copy
into the input rows. Here one launch does all three: 16 output columns per program, fp32
accuracy from three TF32 tensor-core products ("tf32x3"), the bias, and the store into any row
slice of a larger buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_float_buffer, is_interpreting, needs_rtne_fix, round_bf16_rtne

__all__ = ["linear_f32", "linear_f32_ref"]


@triton.jit
def _linear_f32_kernel(
    x_ptr,  # [M, K] fp32 rows (stride_x)
    w_ptr,  # [N, K] fp32
    b_ptr,  # [N] fp32
    y_ptr,  # [M, N] rows (stride_y)
    M,
    N,
    K,
    stride_x,
    stride_y,
    PREC: tl.constexpr,
    FIX: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    rows = tl.program_id(1) * BM + tl.arange(0, BM)
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        a = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PREC)
    y = acc + tl.load(b_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if FIX:
        y = round_bf16_rtne(y)
    tl.store(
        y_ptr + rows[:, None] * stride_y + cols[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def linear_f32(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = x @ w.T + b at fp32 accuracy, stored in out's dtype; returns out.

    Args:
        x: [M, K] fp32 with contiguous rows.
        w, b: [N, K] and [N] fp32, contiguous (nn.Linear layout).
        out: [M, N] with contiguous rows, any float dtype (e.g. rows 1.. of the expert's input).
    """
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"x and w must be 2-D [M, K] / [N, K], got {tuple(x.shape)} / {tuple(w.shape)}")
    M, K = x.shape
    N = w.shape[0]
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"x must be fp32 [M, K] with contiguous rows, got {x.dtype} strides {x.stride()}")
    if tuple(w.shape) != (N, K) or tuple(b.shape) != (N,) or not (w.is_contiguous() and b.is_contiguous()):
        raise ValueError(f"w / b must be contiguous [N, {K}] / [N], got {tuple(w.shape)} / {tuple(b.shape)}")
    if w.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"w and b must be fp32, got {w.dtype} / {b.dtype}")
    if tuple(out.shape) != (M, N) or out.stride(1) != 1:
        raise ValueError(f"out must be [{M}, {N}] with contiguous rows, got {tuple(out.shape)} strides {out.stride()}")
    check_float_buffer(out, x.device)
    interp = is_interpreting()
    bm = min(64, max(16, triton.next_power_of_2(M)))
    bn, bk = 16, (64 if not interp else 32)
    _linear_f32_kernel[(triton.cdiv(N, bn), triton.cdiv(M, bm))](
        x, w, b, out, M, N, K, x.stride(0), out.stride(0),
        "ieee" if interp else "tf32x3", interp and needs_rtne_fix(out.dtype), bm, bn, bk, num_warps=4, num_stages=3,
    )  # fmt: skip
    return out


def linear_f32_ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch: the fp32 linear, then the cast."""
    return torch.nn.functional.linear(x, w, b).to(dtype)
