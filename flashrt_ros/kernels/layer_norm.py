"""SigLIP LayerNorm (weight + bias, eps 1e-6), optionally fused with the residual add before it.

SigLIP's pre-LN encoder layer is ``h = h + attn(ln1(h)); h = h + mlp(ln2(h))`` and ends with a
post LayerNorm; fusing each residual add into the following LayerNorm reads both operands once
and writes the new residual and the normed row in one pass. It can also add the bias of the GEMM
that produced x (`x_bias`), so that the GEMM runs without a bias epilogue: for SigLIP's fc2
(768 x 4304 -> 1152) cuBLASLt's bias-epilogue kernel took 20.7 us against 16.1 for the plain
cuBLAS GEMM (H200, docs/results/gemm_shapes_b0181f6.log).

Numerics: mean and (biased) variance in fp32 over the row held in registers (two-pass, so no
cancellation); ``s = x + residual`` is rounded to the storage dtype and that stored value is
normed, as in the eager model. With `x_bias`, ``x + x_bias`` is rounded to x's dtype first (the
GEMM's epilogue would have stored it so, from its fp32 accumulator rather than from x: one bf16
rounding more).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    check_apart,
    check_features,
    check_out,
    check_same_dtype,
    needs_rtne_fix,
    num_warps_for,
    round_bf16_rtne,
    row_block,
    rows_2d,
)

__all__ = ["layer_norm", "layer_norm_ref"]


@triton.jit
def _layer_norm_kernel(
    x_ptr,
    xb_ptr,
    r_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    s_ptr,
    D,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    eps,
    HAS_X_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FIX_X: tl.constexpr,
    FIX_Y: tl.constexpr,
    FIX_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D

    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_X_BIAS:
        x = x + tl.load(xb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if FIX_X:
            x = round_bf16_rtne(x)
        x = x.to(x_ptr.dtype.element_ty).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        s = x + r
        if FIX_S:
            s = round_bf16_rtne(s)
        s = s.to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + cols, s, mask=mask)
        x = s.to(tl.float32)

    mean = tl.sum(x, axis=0) / D
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / D
    y = xc * tl.math.rsqrt(var + eps)
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if FIX_Y:
        y = round_bf16_rtne(y)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    num_warps: int | None = None,
    x_bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dim, optionally of ``s = x + residual``.

    Args:
        x: [..., D] (last dim contiguous).
        weight / bias: [D] or None.
        eps: SigLIP uses 1e-6.
        residual: optional [..., D]; then returns ``(y, s)`` with ``s`` rounded to ``x.dtype``.
        out / residual_out: optional static buffers; ``residual_out`` may alias x or residual.
        num_warps: launch setting; None: by row width (`num_warps_for`).
        x_bias: optional [D], added to x first (the bias of the GEMM that produced x).
    """
    D = x.shape[-1]
    check_features(x)
    x2 = rows_2d(x, "x")
    for name, p in (("weight", weight), ("bias", bias), ("x_bias", x_bias)):
        if p is not None and (p.shape != (D,) or not p.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous [{D}] tensor, got {tuple(p.shape)}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    check_out(out, tuple(x.shape), x.device)
    y2 = rows_2d(out, "out", writable=True)
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
        r2 = rows_2d(residual, "residual")
        if residual_out is None:
            residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        check_out(residual_out, tuple(x.shape), x.device, "residual_out")
        check_same_dtype(residual_out, x, "x")
        s2 = rows_2d(residual_out, "residual_out", writable=True)
        check_apart(out, residual_out, "out and residual_out")
    else:
        r2, s2 = x2, y2
    if x2.shape[0] > 0:
        block = row_block(D)
        _layer_norm_kernel[(x2.shape[0],)](
            x2,
            x_bias if x_bias is not None else x2,
            r2,
            weight if weight is not None else x2,
            bias if bias is not None else x2,
            y2,
            s2,
            D,
            x2.stride(0),
            r2.stride(0),
            y2.stride(0),
            s2.stride(0),
            float(eps),
            HAS_X_BIAS=x_bias is not None,
            HAS_RESIDUAL=residual is not None,
            HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None,
            FIX_X=needs_rtne_fix(x2.dtype),
            FIX_Y=needs_rtne_fix(y2.dtype),
            FIX_S=needs_rtne_fix(s2.dtype),
            BLOCK_D=block,
            num_warps=num_warps or num_warps_for(block),
        )
    return out if residual is None else (out, residual_out)


def layer_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    x_bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``torch.nn.functional.layer_norm`` in fp32 (of ``x + residual`` rounded to x's dtype;
    with `x_bias`, of ``x + x_bias`` rounded to x's dtype, plus the residual)."""
    if x_bias is not None:
        x = (x.float() + x_bias.float()).to(x.dtype)  # [..., D]
    s = None
    if residual is not None:
        s = (x.float() + residual.float()).to(x.dtype)  # [..., D]
        x = s
    w = weight.float() if weight is not None else None  # [D]
    b = bias.float() if bias is not None else None  # [D]
    y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w, b, eps).to(x.dtype)
    return y if s is None else (y, s)
