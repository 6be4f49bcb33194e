"""Gemma RMSNorm with the (1 + w) weight, optionally fused with the residual add before it.

Gemma (and openpi's pi0 / pi0.5 PaliGemma and action expert) normalise as

    y = x * rsqrt(mean(x**2) + eps) * (1 + w)          # all in fp32, cast to x's dtype at the end

and every decoder block does ``h = residual + sublayer_out; y = norm(h)``. Fusing the add into
the norm reads both operands once and writes the new residual and the normed row in the same
pass (one launch instead of two, one round trip through memory less).

Numerics: the sum ``s = x + residual`` is rounded to the storage dtype *before* it is normed,
exactly like the eager model, which stores ``h`` in bf16 and norms that stored value; the
returned residual and the normed output therefore stay consistent with each other.
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
    is_interpreting,
    needs_rtne_fix,
    num_warps_for,
    round_bf16_rtne,
    row_block,
    rows_2d,
)
from .fp8 import check_scale, scale_row_e4m3

__all__ = ["rms_norm", "rms_norm_ref"]


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    q_ptr,
    D,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    FIX_Y: tl.constexpr,
    FIX_S: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program normalises one row of D elements held entirely in registers.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D

    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to the residual stream's dtype, store it, and norm the stored value.
        s = x + r
        if FIX_S:
            s = round_bf16_rtne(s)
        s = s.to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + cols, s, mask=mask)
        x = s.to(tl.float32)

    var = tl.sum(x * x, axis=0) / D
    y = x * tl.math.rsqrt(var + eps)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:
            w = w + 1.0
        y = y * w
    if QUANT:  # e4m3 with one scale per row (kernels/fp8.py): the largest |y| -> 448
        y, scale = scale_row_e4m3(y, FIX_Y)
        tl.store(q_ptr + row, scale)
    elif FIX_Y:
        y = round_bf16_rtne(y)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    unit_offset: bool = True,
    num_warps: int | None = None,
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Gemma RMSNorm over the last dimension, optionally fused with ``x + residual``.

    Args:
        x: [..., D] activations (fp32 / bf16 / fp16), last dim contiguous.
        weight: [D] Gemma weight ``w`` (the norm multiplies by ``1 + w``); ``None`` for no weight.
        eps: added to the mean square (Gemma: 1e-6).
        residual: optional [..., D]; then ``s = x + residual`` (rounded to ``x.dtype``) is normed.
        out: optional static [..., D] buffer for ``y`` (dtype may differ from ``x``).
        residual_out: optional static buffer for ``s``; may alias ``x`` or ``residual`` (each
            program reads its row before writing it).
        unit_offset: ``True`` for Gemma's ``(1 + w)``; ``False`` if ``1 + w`` was folded into
            ``weight`` at load time.
        num_warps: launch setting; None: by row width (`num_warps_for`).
        out_scale: with an e4m3 ``out`` only: fp32 [N] (one per row); ``y`` is stored row-scaled
            (kernels/fp8.py: ``y ~ out_scale[:, None] * out``), the input of an FP8 GEMM.

    Returns:
        ``y`` if ``residual`` is None, else ``(y, s)``.
    """
    D = x.shape[-1]
    check_features(x)
    x2 = rows_2d(x, "x")
    n_rows = x2.shape[0]
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    check_out(out, tuple(x.shape), x.device, fp8=out_scale is not None)
    y2 = rows_2d(out, "out", writable=True)
    quant = out.dtype == torch.float8_e4m3fn
    if quant != (out_scale is not None):
        raise ValueError(f"out_scale goes with an e4m3 out (got out {out.dtype}, out_scale {out_scale is not None})")
    if quant:
        check_scale(out_scale, y2.shape[0], x.device, "out_scale")

    if weight is not None:
        if weight.shape != (D,) or not weight.is_contiguous():
            raise ValueError(f"weight must be a contiguous [{D}] tensor, got {tuple(weight.shape)}")

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
        r2, s2 = x2, y2  # unused placeholders (HAS_RESIDUAL is a constexpr False)

    if n_rows > 0:
        block = row_block(D)
        _rms_norm_kernel[(n_rows,)](
            x2,
            r2,
            weight if weight is not None else x2,
            y2,
            s2,
            out_scale if quant else y2,
            D,
            x2.stride(0),
            r2.stride(0),
            y2.stride(0),
            s2.stride(0),
            float(eps),
            HAS_RESIDUAL=residual is not None,
            HAS_WEIGHT=weight is not None,
            UNIT_OFFSET=bool(unit_offset),
            FIX_Y=needs_rtne_fix(y2.dtype) or (quant and is_interpreting()),
            FIX_S=needs_rtne_fix(s2.dtype),
            QUANT=quant,
            BLOCK_D=block,
            num_warps=num_warps or num_warps_for(block),
        )
    if residual is None:
        return out
    return out, residual_out


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    unit_offset: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch Gemma RMSNorm (HF ``GemmaRMSNorm`` / openpi), same contract as ``rms_norm``."""
    s = None
    if residual is not None:
        s = (x.float() + residual.float()).to(x.dtype)  # [..., D] new residual, stored dtype
        x = s
    xf = x.float()  # [..., D]
    var = xf.pow(2).mean(dim=-1, keepdim=True)  # [..., 1]
    y = xf * torch.rsqrt(var + eps)  # [..., D]
    if weight is not None:
        w = weight.float()  # [D]
        y = y * ((1.0 + w) if unit_offset else w)
    y = y.to(x.dtype)
    return y if s is None else (y, s)
