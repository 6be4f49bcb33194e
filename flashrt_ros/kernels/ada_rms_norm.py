"""pi0.5 adaptive RMSNorm (adaRMS) and its gated residual, fused into one row kernel.

In pi0.5's action expert every norm is conditioned on the flow-matching time: a Dense layer maps
the time embedding to ``modulation = [scale | shift | gate]`` (3 x D), and (openpi
``GemmaRMSNorm`` with ``cond_dim``)

    y = rmsnorm_noweight(x) * (1 + scale) + shift        # fp32, cast to x's dtype
    next_residual = residual + sublayer(y) * gate          # "gated residual"

Because the modulation depends only on the time, the fused pipeline computes all of them once
per step schedule at load time; at run time each norm is a pure row op. The gated residual that
closes a sub-layer is always followed by the next adaRMS, so the fused kernel does both:

    h  = residual + y_prev * gate_prev                   # written as the new residual
    y2 = rmsnorm_noweight(h) * (1 + scale) + shift       # written as the next sub-layer input

Numerics: all in fp32; ``h`` is rounded to the residual dtype before it is normed (as the eager
model, which stores ``h``). The modulation may be fp32 or bf16 and is used as stored; the product
``y_prev * gate_prev`` is not rounded before the add (the eager model rounds it, and its gate, to
bf16; kernels README, "Numerics").
"""

from __future__ import annotations

import math

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

__all__ = [
    "ada_rms_norm",
    "ada_rms_norm_ref",
    "gated_residual",
    "gated_residual_ref",
    "gated_residual_ada_rms_norm",
    "gated_residual_ada_rms_norm_ref",
]


@triton.jit
def _ada_rms_norm_kernel(
    x_ptr,  # [N, D] norm input (or residual when GATED)
    dy_ptr,  # [N, D] sub-layer output y_prev (GATED only)
    gate_ptr,  # [B, D] gate (GATED only), row stride stride_gb (0: broadcast)
    mod_ptr,  # [B, 3D] scale|shift|gate (NORM only), row stride stride_mb (0: broadcast)
    y_ptr,  # [N, D] normed output (NORM only)
    h_ptr,  # [N, D] new residual (GATED only)
    D,
    rows_per_batch,
    stride_x,
    stride_dy,
    stride_gb,
    stride_mb,
    stride_y,
    stride_h,
    eps,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    FIX_Y: tl.constexpr,
    FIX_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = row // rows_per_batch
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D

    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + b * stride_gb + cols, mask=mask, other=0.0).to(tl.float32)
        h = x + dy * g
        if FIX_H:
            h = round_bf16_rtne(h)
        h = h.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)  # norm the stored (rounded) residual

    if NORM:
        var = tl.sum(x * x, axis=0) / D
        xn = x * tl.math.rsqrt(var + eps)
        mod_row = mod_ptr + b * stride_mb
        scale = tl.load(mod_row + cols, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(mod_row + D + cols, mask=mask, other=0.0).to(tl.float32)
        y = xn * (1.0 + scale) + shift
        if FIX_Y:
            y = round_bf16_rtne(y)
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _per_batch(t: torch.Tensor, width: int, n_batches: int, name: str) -> tuple[torch.Tensor, int]:
    """Check a [width] or [B, width] per-batch vector; return it and its batch stride (0 = shared)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    if t.dim() == 1 and t.shape[0] == width:
        return t, 0
    if t.dim() == 2 and t.shape[1] == width and t.shape[0] in (1, n_batches):
        return t, (t.stride(0) if t.shape[0] > 1 else 0)
    raise ValueError(f"{name} must be [{width}] or [{n_batches}, {width}], got {tuple(t.shape)}")


def _launch(
    x: torch.Tensor,
    dy: torch.Tensor | None,
    gate: torch.Tensor | None,
    modulation: torch.Tensor | None,
    eps: float,
    out: torch.Tensor | None,
    residual_out: torch.Tensor | None,
    residual_out_name: str = "residual_out",
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`residual_out_name`: what the caller calls the buffer for ``h`` (gated_residual: ``out``)."""
    D = x.shape[-1]
    gated, norm = dy is not None, modulation is not None
    if norm:  # the gated residual alone is elementwise: no features, an empty result
        check_features(x)
    # Rows of x are tokens; a batch is x's leading dims (all but the token and feature dims).
    rows_per_batch = x.shape[-2] if x.dim() >= 2 else 1
    n_batches = math.prod(x.shape[:-2]) if x.dim() >= 3 else 1
    x2 = rows_2d(x, "x")
    n_rows = x2.shape[0]

    if gated:
        if dy.shape != x.shape:
            raise ValueError(f"y shape {tuple(dy.shape)} != residual shape {tuple(x.shape)}")
        dy2 = rows_2d(dy, "y")
        gate, stride_gb = _per_batch(gate, D, n_batches, "gate")
        if residual_out is None:
            residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        check_out(residual_out, tuple(x.shape), x.device, residual_out_name)
        check_same_dtype(residual_out, x, "the residual", residual_out_name)
        h2 = rows_2d(residual_out, residual_out_name, writable=True)
    else:
        dy2, gate, stride_gb, h2 = x2, x2, 0, x2
    if norm:
        modulation, stride_mb = _per_batch(modulation, 3 * D, n_batches, "modulation")
        if out is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        check_out(out, tuple(x.shape), x.device)
        y2 = rows_2d(out, "out", writable=True)
        if gated:
            check_apart(out, residual_out, f"out and {residual_out_name}")
    else:
        modulation, stride_mb, y2 = x2, 0, x2

    if n_rows > 0:
        block = row_block(D)
        _ada_rms_norm_kernel[(n_rows,)](
            x2,
            dy2,
            gate,
            modulation,
            y2,
            h2,
            D,
            rows_per_batch,
            x2.stride(0),
            dy2.stride(0),
            stride_gb,
            stride_mb,
            y2.stride(0),
            h2.stride(0),
            float(eps),
            GATED=gated,
            NORM=norm,
            FIX_Y=norm and needs_rtne_fix(y2.dtype),
            FIX_H=gated and needs_rtne_fix(h2.dtype),
            BLOCK_D=block,
            num_warps=num_warps_for(block),
        )
    return out, residual_out


def ada_rms_norm(
    x: torch.Tensor, modulation: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """adaRMS: ``rmsnorm_noweight(x) * (1 + scale) + shift``.

    Args:
        x: [T, D] or [B, T, D] (last dim contiguous).
        modulation: [3D] or [B, 3D] = scale | shift | gate (gate is not used here: slice
            ``modulation[..., 2D:]`` and pass it to the following gated residual).
        out: optional static [..., D] output buffer.
    """
    y, _ = _launch(x, None, None, modulation, eps, out, None)
    return y


def gated_residual(
    residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``residual + y * gate`` (gate: [D] or [B, D]); ``out`` may alias ``residual``."""
    _, h = _launch(residual, y, gate, None, 0.0, None, out, residual_out_name="out")
    return h


def gated_residual_ada_rms_norm(
    residual: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    modulation: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``h = residual + y * gate`` then ``y2 = adaRMS(h, modulation)``.

    Args:
        residual: [T, D] or [B, T, D] residual stream before the sub-layer.
        y: sub-layer output, same shape.
        gate: [D] or [B, D]: the gate of the norm that *opened* this sub-layer (e.g. a view
            ``modulation_prev[..., 2D:]``).
        modulation: [3D] or [B, 3D] of the *next* norm.
        out / residual_out: optional static buffers for ``y2`` / ``h``; ``residual_out`` may
            alias ``residual``.

    Returns:
        ``(y2, h)``.
    """
    y2, h = _launch(residual, y, gate, modulation, eps, out, residual_out)
    return y2, h


# ----------------------------------------------------------------------------- references


def _split_modulation(modulation: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    D = x.shape[-1]
    mod = modulation.float()  # [3D] or [B, 3D]
    if mod.dim() == 2 and x.dim() == 3:
        mod = mod[:, None, :]  # [B, 1, 3D] broadcasts over tokens
    elif mod.dim() == 2:
        mod = mod.reshape(-1)  # [1, 3D] with x [T, D]
    return mod[..., :D], mod[..., D : 2 * D], mod[..., 2 * D :]


def ada_rms_norm_ref(x: torch.Tensor, modulation: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """openpi ``GemmaRMSNorm(cond_dim=...)`` forward: returns the normed x (gate not applied)."""
    scale, shift, _ = _split_modulation(modulation, x)
    xf = x.float()  # [..., D]
    var = xf.pow(2).mean(dim=-1, keepdim=True)  # [..., 1]
    y = xf * torch.rsqrt(var + eps) * (1.0 + scale) + shift  # [..., D]
    return y.to(x.dtype)


def gated_residual_ref(residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """openpi ``_gated_residual``'s ``residual + y * gate`` in fp32, rounded once to the residual's
    dtype (openpi's eager bf16 model also rounds the product before the add)."""
    g = gate.float()  # [D] or [B, D]
    if g.dim() == 2 and residual.dim() == 3:
        g = g[:, None, :]  # [B, 1, D]
    elif g.dim() == 2:
        g = g.reshape(-1)
    return (residual.float() + y.float() * g).to(residual.dtype)


def gated_residual_ada_rms_norm_ref(
    residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, modulation: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for the fused op: ``(ada_rms_norm_ref(h), h)`` with ``h = gated_residual_ref(...)``."""
    h = gated_residual_ref(residual, y, gate)
    return ada_rms_norm_ref(h, modulation, eps), h
