"""Gemma GeGLU: ``gelu_tanh(gate) * up`` from ONE fused gate|up GEMM.

Gemma's MLP is ``down(gelu_tanh(gate(x)) * up(x))``. At load time the fused pipeline concatenates
the gate and up weights into one [2F, D] matrix, so one GEMM yields [T, 2F] = gate | up; this
kernel reads both halves once and writes the [T, F] product that feeds the down projection
(one launch, no [T, F] gelu temporary). F is 16384 for Gemma 2B and 4096 for the action expert.

Numerics: fp32 inside, a single rounding at the store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_out, needs_rtne_fix, round_bf16_rtne, rows_2d
from .gelu import elementwise_block, gelu_tanh, gelu_tanh_ref

__all__ = ["geglu", "geglu_ref"]


@triton.jit
def _geglu_kernel(
    gu_ptr,
    y_ptr,
    F,
    stride_gu,
    stride_y,
    FIX_Y: tl.constexpr,
    BLOCK_F: tl.constexpr,
    INTERLEAVE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = cols < F
    base = gu_ptr + row * stride_gu
    if INTERLEAVE > 0:  # blocks of INTERLEAVE gate columns, then the same columns of up
        g_col = (cols // INTERLEAVE) * (2 * INTERLEAVE) + cols % INTERLEAVE
        u_col = g_col + INTERLEAVE
    else:
        g_col, u_col = cols, F + cols
    gate = tl.load(base + g_col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + u_col, mask=mask, other=0.0).to(tl.float32)
    y = gelu_tanh(gate) * up
    if FIX_Y:
        y = round_bf16_rtne(y)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def geglu(gate_up: torch.Tensor, out: torch.Tensor | None = None, interleave: int = 0) -> torch.Tensor:
    """``gelu_tanh(gate_up[..., :F]) * gate_up[..., F:]`` -> [..., F].

    Args:
        gate_up: [..., 2F] output of the fused gate|up GEMM (gate first), last dim contiguous.
        out: optional static [..., F] buffer.
        interleave: 0, or the block of a GEMM output whose weight was laid out by
            `kernels.gate_up_geglu.interleave_gate_up` (blocks of `interleave` gate columns,
            each followed by the same columns of up; F a multiple of it).
    """
    two_f = gate_up.shape[-1]
    if two_f % 2:
        raise ValueError(f"gate_up's last dim must be even (gate | up), got {two_f}")
    F = two_f // 2
    if interleave < 0 or (interleave and F % interleave):
        raise ValueError(f"interleave {interleave}: expected 0 or a block that divides F = {F}")
    gu2 = rows_2d(gate_up, "gate_up")
    shape = (*gate_up.shape[:-1], F)
    if out is None:
        out = gate_up.new_empty(shape)
    check_out(out, shape, gate_up.device)
    y2 = rows_2d(out, "out", writable=True)
    if gu2.shape[0] > 0 and F > 0:
        block = elementwise_block(F)
        _geglu_kernel[(gu2.shape[0], triton.cdiv(F, block))](
            gu2,
            y2,
            F,
            gu2.stride(0),
            y2.stride(0),
            FIX_Y=needs_rtne_fix(y2.dtype),
            BLOCK_F=block,
            INTERLEAVE=interleave,
            num_warps=4,
        )
    return out


def geglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """HF ``GemmaMLP`` activation: ``gelu_pytorch_tanh(gate) * up`` in fp32, cast back. [..., 2F] -> [..., F]."""
    gate, up = gate_up.float().chunk(2, dim=-1)  # [..., F] each
    return (gelu_tanh_ref(gate) * up).to(gate_up.dtype)
