"""What happens between two expert passes of the denoise loop:

    v = y @ W_out.T + b_out            the expert's action rows -> velocity      [H, A] fp32
    x = x + dt * v                     the Euler step, in place                  [H, A] fp32
      (guided: x + dt * (v - c * W * (Y - (x - t * v))), real-time chunking's correction
      towards a previous chunk Y with weights W, its Jacobian taken as identity;
      policies/guidance.py; t and c per step from a [2] table)
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

from ._common import check_float_buffer, needs_rtne_fix, round_bf16_rtne

__all__ = [
    "DenoiseUpdate",
    "EulerGuide",
    "guided_velocity_ref",
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
def euler(
    x_row_ptr, v, bo_ptr, dt, gy_row_ptr, gw_row_ptr, tc_ptr, A: tl.constexpr, BA: tl.constexpr, GUIDE: tl.constexpr
):
    """x + dt * (v + b_out) for one action row (fp32 [BA]); with GUIDE, the velocity corrected
    towards the guide's row (target `gy`, weights `gw`; t and c at `tc_ptr`)."""
    acols = tl.arange(0, BA)
    a_ok = acols < A
    x = tl.load(x_row_ptr + acols, mask=a_ok, other=0.0)
    v = v + tl.load(bo_ptr + acols, mask=a_ok, other=0.0)
    if GUIDE:
        t = tl.load(tc_ptr)
        c = tl.load(tc_ptr + 1)
        y = tl.load(gy_row_ptr + acols, mask=a_ok, other=0.0)
        w = tl.load(gw_row_ptr + acols, mask=a_ok, other=0.0)
        v = v - c * (w * (y - (x - t * v)))
    return x + dt * v


@triton.jit
def _denoise_update_kernel(
    y_ptr,  # [H, WE] rows (stride_y)
    x_ptr,  # [H, A] fp32, updated in place
    wo_ptr,  # [A, WE] fp32
    bo_ptr,  # [A]
    wi_ptr,  # [WE, A] fp32 (HAS_IN)
    bi_ptr,  # [WE]
    h_ptr,  # [H, WE] (HAS_IN)
    gy_ptr,  # [H, A] fp32 guide target (GUIDE)
    gw_ptr,  # [H, A] fp32 guide weights
    tc_ptr,  # [2] fp32: this step's t and c
    stride_y,
    dt,
    A: tl.constexpr,
    WE: tl.constexpr,
    HAS_IN: tl.constexpr,
    SILU: tl.constexpr,
    FIX_H: tl.constexpr,
    BA: tl.constexpr,
    BW: tl.constexpr,
    GUIDE: tl.constexpr,
):
    """One program per action row, end to end (the step kernel's tail splits the same work
    over more programs, see kernels/expert_step.py)."""
    row = tl.program_id(0).to(tl.int64)
    WHOLE: tl.constexpr = (WE + BW - 1) // BW * BW
    v = velocity_part(y_ptr + row * stride_y, wo_ptr, 0, A, WE, WHOLE, BA, BW)
    x = euler(x_ptr + row * A, v, bo_ptr, dt, gy_ptr + row * A, gw_ptr + row * A, tc_ptr, A, BA, GUIDE)
    tl.store(x_ptr + row * A + tl.arange(0, BA), x, mask=tl.arange(0, BA) < A)
    if HAS_IN:
        next_input_part(row, x, wi_ptr, bi_ptr, h_ptr, 0, A, WE, WHOLE, SILU, FIX_H, BA, BW)


class UpdateConsts(NamedTuple):
    """The update's constexprs: action dims, next input?, its SiLU?, its bf16 fix, tile sizes,
    guided?"""

    A: int
    has_in: bool
    silu: bool
    fix_h: bool
    ba: int
    bw: int
    guide: bool = False


@dataclass
class EulerGuide:
    """Real-time chunking's correction in the Euler step (policies/guidance.py, "identity"):
    target and weights [H, A] fp32 contiguous, `tc` this step's (t, c) as a [2] fp32 tensor (a
    row of a table kept on the device, so a captured graph reads values changed between replays)."""

    target: torch.Tensor
    weights: torch.Tensor
    tc: torch.Tensor

    def check(self, H: int, A: int, device: torch.device) -> None:
        for name in ("target", "weights", "tc"):
            if getattr(self, name).device != device:
                raise ValueError(f"guide {name} is on {getattr(self, name).device}, the update on {device}")
        for name in ("target", "weights"):
            t = getattr(self, name)
            if tuple(t.shape) != (H, A) or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"guide {name} must be contiguous fp32 [{H}, {A}], got {tuple(t.shape)} {t.dtype}")
        if tuple(self.tc.shape) != (2,) or self.tc.dtype != torch.float32 or not self.tc.is_contiguous():
            raise ValueError(f"guide tc must be fp32 [2] (t, c), got {tuple(self.tc.shape)} {self.tc.dtype}")


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
    guide: EulerGuide | None = None

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
            check_float_buffer(self.h_next, self.x.device, "h_next")
        for name in ("w_out", "b_out", "w_in", "b_in"):
            t = getattr(self, name)
            if t is not None and (t.dtype != torch.float32 or not t.is_contiguous()):
                raise ValueError(f"{name} must be contiguous fp32")
        if self.guide is not None:
            self.guide.check(H, A, self.x.device)

    def launch_args(self) -> tuple[tuple, UpdateConsts]:
        """(x, w_out, b_out, w_in, b_in, h_next, guide target, weights, tc, dt) pointers (unused
        ones stand in) and the constexprs (A, HAS_IN, SILU, FIX_H, BA, BW, GUIDE) of
        `_denoise_update_kernel` and the step kernel's tail."""
        has_in, g = self.h_next is not None, self.guide
        A, WE = self.w_out.shape
        ba = triton.next_power_of_2(A)
        bw = min(triton.next_power_of_2(WE), max(16, 8192 // ba))  # an [A, BW] fp32 tile: 64 values per thread
        ptrs = (
            self.x, self.w_out, self.b_out, self.w_in if has_in else self.w_out, self.b_in if has_in else self.b_out,
            self.h_next if has_in else self.x, *((g.target, g.weights, g.tc) if g else (self.x, self.x, self.b_out)),
            float(self.dt),
        )  # fmt: skip
        fix = has_in and needs_rtne_fix(self.h_next.dtype)
        return ptrs, UpdateConsts(A, has_in, self.silu, fix, ba, bw, g is not None)


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
    guide: EulerGuide | None = None,
) -> None:
    """x += dt * (y @ w_out.T + b_out) in place; with w_in / b_in / h_next also
    h_next = x @ w_in.T + b_in (after the update, in h_next's dtype), or its SiLU with `silu`;
    with `guide`, the velocity corrected as the module docstring says.

    Args:
        y: the expert's output rows of the actions [H, WE] (rows may be strided, a slice).
        x: the noisy actions [H, A] fp32, contiguous.
        w_out, b_out: action_out projection [A, WE], [A] fp32.
        w_in, b_in: action_in projection [WE, A], [WE] fp32 (optional).
        h_next: [H, WE] contiguous destination of the next expert input.
        silu: apply SiLU to h_next (pi0's action-time MLP).
    """
    if y.dim() != 2:
        raise ValueError(f"y must be the expert's output rows [H, WE], got {tuple(y.shape)}")
    H, WE = y.shape
    if y.stride(1) != 1:
        raise ValueError(f"y must be [H, WE] with contiguous rows, got {tuple(y.shape)} strides {y.stride()}")
    update = DenoiseUpdate(x, w_out, b_out, dt, w_in, b_in, h_next, silu, guide)
    update.check(H, WE)
    (x, wo, bo, wi, bi, h, gy, gw, tc, dt), (A, has_in, silu, fix, ba, bw, guided) = update.launch_args()
    _denoise_update_kernel[(H,)](
        y, x, wo, bo, wi, bi, h, gy, gw, tc, y.stride(0), dt, A, WE, has_in, silu, fix, ba, bw, guided, num_warps=4,
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
    guide: EulerGuide | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same in torch (the eager model's fp32 projections): returns (new x, next h or None)."""
    F = torch.nn.functional
    v = F.linear(y.float(), w_out, b_out)
    if guide is not None:
        t, c = guide.tc.tolist()
        v = guided_velocity_ref(v, x, guide.target, guide.weights, t, c)
    x = x + dt * v
    if w_in is None:
        return x, None
    h = F.linear(x, w_in, b_in)
    return x, (F.silu(h) if silu else h).to(h_dtype)


def guided_velocity_ref(
    v: torch.Tensor, x: torch.Tensor, target: torch.Tensor, weights: torch.Tensor, t, c
) -> torch.Tensor:
    """`euler`'s GUIDE correction in torch: v - c * W * (Y - (x - t * v)). `t` and `c` may be
    numbers or device scalars (the fused path's per-op expert reads them from its table)."""
    return v - c * (weights * (target - (x - t * v)))
