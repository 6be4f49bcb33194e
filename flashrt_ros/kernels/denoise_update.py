"""What happens between two expert passes of the denoise loop:

    v = y @ W_out.T + b_out            the expert's action rows -> velocity      [H, A] fp32
    x = x + dt * v                     the Euler step, in place                  [H, A] fp32
    h = (x @ W_in.T + b_in).to(dtype)  the next pass's input (pi0.5; optional)   [H, WE]
    h = silu(x @ W_in.T + b_in)        or its SiLU (pi0: the action-time MLP's hidden layer, with
                                       its action_in projection folded into W_in at load)

As torch ops this was 7 small launches per step, the fp32 action_out GEMM alone taking 14 us
on the H200 (cuBLAS picks a split-K "largek" kernel for K = 1024, N = 32): ~0.5 ms of a
10-step denoise (docs/results/profile_pi05_3v_20261129_195354.json). `denoise_update` is one
launch in which each program owns one action row end to end; the fused path runs the same
pieces (`velocity_part`, `euler`, `next_input_part`) as the step kernel's tail instead, spread
over every program in (row, chunk) units (kernels/expert_step.py `_denoise_tail`). fp32
throughout, as the eager model's fp32 projections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import needs_rtne_fix, round_bf16_rtne

__all__ = [
    "DenoiseUpdate",
    "UpdateConsts",
    "denoise_update",
    "denoise_update_ref",
    "euler",
    "next_input_part",
    "velocity_part",
]


@triton.jit
def velocity_part(
    y_row_ptr, wo_ptr, k_lo, A: tl.constexpr, WE: tl.constexpr, KC: tl.constexpr, BA: tl.constexpr, BW: tl.constexpr
):
    """Σ_k W_out[:, k] * y[k] over k in [k_lo, k_lo + KC) -> [BA] fp32 (KC a multiple of BW): the
    dot products as broadcast multiplies and row sums (fp32 `tl.dot` at these sizes measured
    60 us per call on the H200)."""
    acols = tl.arange(0, BA)
    a_ok = acols < A
    v = tl.zeros([BA], dtype=tl.float32)
    for k0 in tl.static_range(0, KC, BW):
        ks = k_lo + k0 + tl.arange(0, BW)
        k_ok = ks < WE
        y = tl.load(y_row_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(wo_ptr + acols[:, None] * WE + ks[None, :], mask=a_ok[:, None] & k_ok[None, :], other=0.0)
        v += tl.sum(w * y[None, :], axis=1)
    return v


@triton.jit
def next_input_part(
    row, x, wi_ptr, bi_ptr, h_ptr, n_lo,
    A: tl.constexpr, WE: tl.constexpr, NC: tl.constexpr, SILU: tl.constexpr, FIX_H: tl.constexpr,
    BA: tl.constexpr, BW: tl.constexpr,
):  # fmt: skip
    """Columns [n_lo, n_lo + NC) of the next input's row: (x @ W_in.T + b_in), or its SiLU."""
    acols = tl.arange(0, BA)
    a_ok = acols < A
    x = tl.where(a_ok, x, 0.0)
    for n0 in tl.static_range(0, NC, BW):
        ns = n_lo + n0 + tl.arange(0, BW)
        n_ok = ns < WE
        w = tl.load(wi_ptr + ns[:, None] * A + acols[None, :], mask=n_ok[:, None] & a_ok[None, :], other=0.0)
        h = tl.sum(w * x[None, :], axis=1) + tl.load(bi_ptr + ns, mask=n_ok, other=0.0)
        if SILU:
            h = h / (1.0 + tl.exp(-h))
        if FIX_H:
            h = round_bf16_rtne(h)
        tl.store(h_ptr + row * WE + ns, h.to(h_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def euler(x_row_ptr, v, bo_ptr, dt, A: tl.constexpr, BA: tl.constexpr):
    """x + dt * (v + b_out) for one action row (fp32 [BA])."""
    acols = tl.arange(0, BA)
    a_ok = acols < A
    return tl.load(x_row_ptr + acols, mask=a_ok, other=0.0) + dt * (v + tl.load(bo_ptr + acols, mask=a_ok, other=0.0))


@triton.jit
def _denoise_update_kernel(
    y_ptr,  # [H, WE] rows (stride_y)
    x_ptr,  # [H, A] fp32, updated in place
    wo_ptr,  # [A, WE] fp32
    bo_ptr,  # [A]
    wi_ptr,  # [WE, A] fp32 (HAS_IN)
    bi_ptr,  # [WE]
    h_ptr,  # [H, WE] (HAS_IN)
    stride_y,
    dt,
    A: tl.constexpr,
    WE: tl.constexpr,
    HAS_IN: tl.constexpr,
    SILU: tl.constexpr,
    FIX_H: tl.constexpr,
    BA: tl.constexpr,
    BW: tl.constexpr,
):
    """One program per action row, end to end (the step kernel's tail splits the same work
    over more programs, see kernels/expert_step.py)."""
    row = tl.program_id(0).to(tl.int64)
    WHOLE: tl.constexpr = (WE + BW - 1) // BW * BW
    v = velocity_part(y_ptr + row * stride_y, wo_ptr, 0, A, WE, WHOLE, BA, BW)
    x = euler(x_ptr + row * A, v, bo_ptr, dt, A, BA)
    tl.store(x_ptr + row * A + tl.arange(0, BA), x, mask=tl.arange(0, BA) < A)
    if HAS_IN:
        next_input_part(row, x, wi_ptr, bi_ptr, h_ptr, 0, A, WE, WHOLE, SILU, FIX_H, BA, BW)


class UpdateConsts(NamedTuple):
    """The update's constexprs: action dims, next input?, its SiLU?, its bf16 fix, tile sizes."""

    A: int
    has_in: bool
    silu: bool
    fix_h: bool
    ba: int
    bw: int


@dataclass
class DenoiseUpdate:
    """The arguments of `denoise_update` after its `y`: what a launch that ends with the update
    (the step kernel's tail) needs."""

    x: torch.Tensor
    w_out: torch.Tensor
    b_out: torch.Tensor
    dt: float
    w_in: torch.Tensor | None = None
    b_in: torch.Tensor | None = None
    h_next: torch.Tensor | None = None
    silu: bool = False

    def check(self, H: int, WE: int) -> None:
        """Shapes / dtypes for an expert output of H action rows of width WE; ValueError if not."""
        if self.x.dim() != 2:
            raise ValueError(f"x must be [{H}, A] (2-D), got shape {tuple(self.x.shape)}")
        A = self.x.shape[1]
        if self.x.shape[0] != H:
            raise ValueError(f"x has {self.x.shape[0]} action rows, the expert output {H}")
        if self.x.dtype != torch.float32 or not self.x.is_contiguous():
            raise ValueError(f"x must be contiguous fp32 [{H}, A], got {self.x.dtype} strides {self.x.stride()}")
        if tuple(self.w_out.shape) != (A, WE) or tuple(self.b_out.shape) != (A,):
            raise ValueError(
                f"w_out / b_out must be [{A}, {WE}] / [{A}], got {tuple(self.w_out.shape)} / {tuple(self.b_out.shape)}"
            )
        if self.h_next is not None:
            w, b = self.w_in, self.b_in
            if w is None or b is None or tuple(w.shape) != (WE, A) or tuple(b.shape) != (WE,):
                raise ValueError(f"w_in / b_in must be [{WE}, {A}] / [{WE}] with h_next")
            if tuple(self.h_next.shape) != (H, WE) or not self.h_next.is_contiguous():
                raise ValueError(f"h_next must be contiguous [{H}, {WE}], got {tuple(self.h_next.shape)}")
        for name in ("w_out", "b_out", "w_in", "b_in"):
            t = getattr(self, name)
            if t is not None and (t.dtype != torch.float32 or not t.is_contiguous()):
                raise ValueError(f"{name} must be contiguous fp32")

    def launch_args(self) -> tuple[tuple, UpdateConsts]:
        """(x, w_out, b_out, w_in, b_in, h_next, dt) pointers (unused ones stand in) and the
        constexprs (A, HAS_IN, SILU, FIX_H, BA, BW) of `_denoise_update_kernel` and the step
        kernel's tail."""
        has_in = self.h_next is not None
        A, WE = self.w_out.shape
        ba = triton.next_power_of_2(A)
        bw = min(triton.next_power_of_2(WE), max(16, 8192 // ba))  # an [A, BW] fp32 tile: 64 values per thread
        ptrs = (
            self.x, self.w_out, self.b_out, self.w_in if has_in else self.w_out, self.b_in if has_in else self.b_out,
            self.h_next if has_in else self.x, float(self.dt),
        )  # fmt: skip
        return ptrs, UpdateConsts(A, has_in, self.silu, has_in and needs_rtne_fix(self.h_next.dtype), ba, bw)


def denoise_update(
    y: torch.Tensor,
    x: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
    dt: float,
    w_in: torch.Tensor | None = None,
    b_in: torch.Tensor | None = None,
    h_next: torch.Tensor | None = None,
    silu: bool = False,
) -> None:
    """x += dt * (y @ w_out.T + b_out) in place; with w_in / b_in / h_next also
    h_next = x @ w_in.T + b_in (after the update, in h_next's dtype), or its SiLU with `silu`.

    Args:
        y: the expert's output rows of the actions [H, WE] (rows may be strided, a slice).
        x: the noisy actions [H, A] fp32, contiguous.
        w_out, b_out: action_out projection [A, WE], [A] fp32.
        w_in, b_in: action_in projection [WE, A], [WE] fp32 (optional).
        h_next: [H, WE] contiguous destination of the next expert input.
        silu: apply SiLU to h_next (pi0's action-time MLP).
    """
    H, WE = y.shape
    if y.stride(1) != 1:
        raise ValueError(f"y must be [H, WE] with contiguous rows, got {tuple(y.shape)} strides {y.stride()}")
    update = DenoiseUpdate(x, w_out, b_out, dt, w_in, b_in, h_next, silu)
    update.check(H, WE)
    (x, wo, bo, wi, bi, h, dt), (A, has_in, silu, fix, ba, bw) = update.launch_args()
    _denoise_update_kernel[(H,)](
        y, x, wo, bo, wi, bi, h, y.stride(0), dt, A, WE, has_in, silu, fix, ba, bw, num_warps=4,
    )  # fmt: skip


def denoise_update_ref(
    y: torch.Tensor,
    x: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
    dt: float,
    w_in: torch.Tensor | None = None,
    b_in: torch.Tensor | None = None,
    h_dtype: torch.dtype = torch.bfloat16,
    silu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same in torch (the eager model's fp32 projections): returns (new x, next h or None)."""
    F = torch.nn.functional
    x = x + dt * F.linear(y.float(), w_out, b_out)
    if w_in is None:
        return x, None
    h = F.linear(x, w_in, b_in)
    return x, (F.silu(h) if silu else h).to(h_dtype)
