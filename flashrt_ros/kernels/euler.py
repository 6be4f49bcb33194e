"""The flow-matching Euler update ``x <- x + dt * v``, in place on a static fp32 buffer.

Trivial arithmetic, but as a kernel it lets the whole denoise loop (10 steps) live in one CUDA
graph on fixed buffers: no new tensor per step, no host-side scalar. ``dt`` may be a Python float
(baked into the graph) or a 1-element device tensor (changed between replays without re-capture).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_float_buffer, is_interpreting, needs_rtne_fix, round_bf16_rtne

__all__ = ["euler_step", "euler_step_ref"]


@triton.jit
def _euler_kernel(
    x_ptr,
    v_ptr,
    o_ptr,
    dt_ptr,
    dt_value,
    n,
    DT_IS_TENSOR: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if DT_IS_TENSOR:
        dt = tl.load(dt_ptr).to(tl.float32)
    else:
        dt = dt_value
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    o = x + dt * v
    if FIX_O:
        o = round_bf16_rtne(o)
    tl.store(o_ptr + offs, o.to(o_ptr.dtype.element_ty), mask=mask)


def euler_step(
    x: torch.Tensor, v: torch.Tensor, dt: float | torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = x + dt * v`` elementwise; by default in place (``out = x``).

    Args:
        x: noisy actions, e.g. [B, 50, 32] fp32, contiguous.
        v: velocity, same shape (fp32 or bf16), contiguous.
        dt: Python float or 1-element tensor on x's device (e.g. -1/num_steps).
        out: destination (default ``x``), contiguous, same shape.
    """
    if v.shape != x.shape:
        raise ValueError(f"v shape {tuple(v.shape)} != x shape {tuple(x.shape)}")
    out = x if out is None else out
    if out.shape != x.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != x shape {tuple(x.shape)}")
    for name, t in (("x", x), ("v", v), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        check_float_buffer(t, x.device, name)
    dt_is_tensor = isinstance(dt, torch.Tensor)
    if dt_is_tensor and (dt.numel() != 1 or dt.device != x.device):
        raise ValueError("a tensor dt must have one element on x's device")
    n = x.numel()
    if n:
        block = min(triton.next_power_of_2(n), 16384 if is_interpreting() else 1024)
        _euler_kernel[(triton.cdiv(n, block),)](
            x,
            v,
            out,
            dt if dt_is_tensor else x,
            0.0 if dt_is_tensor else float(dt),
            n,
            DT_IS_TENSOR=dt_is_tensor,
            FIX_O=needs_rtne_fix(out.dtype),
            BLOCK=block,
            num_warps=4,
        )
    return out


def euler_step_ref(x: torch.Tensor, v: torch.Tensor, dt: float | torch.Tensor) -> torch.Tensor:
    """``x + dt * v`` in fp32, cast to x's dtype (a new tensor)."""
    dt_f = dt.float().reshape(()) if isinstance(dt, torch.Tensor) else dt
    return (x.float() + dt_f * v.float()).to(x.dtype)
