"""Bias + GELU(tanh) epilogue for SigLIP's MLP fc1, and the shared ``gelu_tanh`` device function.

SigLIP's MLP is ``fc2(gelu_tanh(fc1(x)))`` with fc1: 1152 -> 4304. The GEMM runs without its bias
(cuBLAS, or ``torch.matmul``); this kernel adds the bias and applies the activation in the same
pass over the [T, 4304] result, instead of an ``addmm`` epilogue plus a separate GELU launch.

    gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))
                 = x * sigmoid(2u) = x / (1 + exp(-2u)),   u = sqrt(2/pi) * (x + 0.044715 * x**3)

The sigmoid form is the same function without a ``tanh`` primitive (not in ``tl`` core); for
u < -40 (x below about -9.6) the result is -0, as torch's tanh form rounds it, whatever the size of x.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import check_out, is_interpreting, needs_rtne_fix, round_bf16_rtne, rows_2d

__all__ = ["bias_gelu", "bias_gelu_ref", "gelu_tanh", "gelu_tanh_ref", "elementwise_block"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@triton.jit
def gelu_tanh(x):
    """GELU, tanh approximation, on an fp32 tile (see module docstring for the sigmoid form)."""
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi) * (x + 0.044715 x^3)
    # The exponent clamped below fp32 overflow (exp(80) ~ 5.5e34); past the clamp (x < ~-9.6) the
    # result is -0 as torch's tanh form gives (x / 5.5e34 is not ~0 for |x| near fp32's largest),
    # and NaN for x = -inf as there (x * 0)
    y = x / (1.0 + tl.exp(tl.minimum(-2.0 * u, 80.0)))
    return tl.where(u < -40.0, x * 0.0, y)


def elementwise_block(width: int) -> int:
    """Column block for a [rows, width] elementwise epilogue (grid: rows x column blocks).

    1024 columns per program on the GPU (4 warps, 8 elements per thread); the interpreter
    prefers a whole row per program since its cost is per launched program.
    """
    cap = 8192 if is_interpreting() else 1024
    return min(triton.next_power_of_2(max(width, 1)), cap)


@triton.jit
def _bias_gelu_kernel(
    x_ptr,
    b_ptr,
    y_ptr,
    N,
    stride_x,
    stride_y,
    HAS_BIAS: tl.constexpr,
    FIX_Y: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = gelu_tanh(x)
    if FIX_Y:
        y = round_bf16_rtne(y)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu_tanh(x + bias)`` over [..., N] (bias [N] or None); ``out`` may alias ``x``."""
    N = x.shape[-1]
    x2 = rows_2d(x, "x")
    if bias is not None and (bias.shape != (N,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{N}] tensor, got {tuple(bias.shape)}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    check_out(out, tuple(x.shape), x.device)
    y2 = rows_2d(out, "out", writable=True)
    if x2.shape[0] > 0 and N > 0:
        block = elementwise_block(N)
        _bias_gelu_kernel[(x2.shape[0], triton.cdiv(N, block))](
            x2,
            bias if bias is not None else x2,
            y2,
            N,
            x2.stride(0),
            y2.stride(0),
            HAS_BIAS=bias is not None,
            FIX_Y=needs_rtne_fix(y2.dtype),
            BLOCK_N=block,
            num_warps=4,
        )
    return out


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    """The textbook tanh form in fp32 (what ``F.gelu(approximate="tanh")`` computes)."""
    xf = x.float()
    return 0.5 * xf * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (xf + 0.044715 * xf.pow(3))))


def bias_gelu_ref(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.gelu(x + bias, approximate="tanh")`` in fp32, cast to x's dtype. x [..., N], bias [N]."""
    xf = x.float() + (bias.float() if bias is not None else 0.0)
    return gelu_tanh_ref(xf).to(x.dtype)
