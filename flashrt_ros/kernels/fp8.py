"""Row-scaled FP8 (e4m3): the format of the prefix LM's FP8 MLP GEMMs (node parameter `fp8`).

Each row of a matrix keeps one fp32 scale, ``t ~ scale[:, None] * q`` with ``q`` in e4m3 and the
row's largest magnitude mapped to e4m3's largest finite value (448). Weights are quantised once
at load (`quantize_rows`, rows = output channels); activations per token inside the norm that
produces them (`kernels.rms_norm.rms_norm(..., out=e4m3 buffer, out_scale=...)`) or by
`quantize_rows_kernel` (the same rounding as one Triton launch). A row of zeros
gets the scale of a tiny amax, so it stays zeros and never divides by zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_out, is_interpreting, num_warps_for, round_e4m3_rtne, row_block

__all__ = [
    "E4M3",
    "E4M3_MAX",
    "MIN_AMAX",
    "check_scale",
    "dequantize_rows",
    "quantize_rows",
    "quantize_rows_kernel",
    "scale_row_e4m3",
]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_AMAX = 1e-12  # floor of a row's amax (the kernels use the same)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] (any float dtype) -> (e4m3 [N, K], fp32 scales [N]), computed in fp32."""
    if t.dim() != 2:
        raise ValueError(f"quantize_rows wants [N, K], got {tuple(t.shape)}")
    tf = t.float()
    amax = tf.abs().amax(dim=1).clamp(min=MIN_AMAX)  # [N]
    # divide by a tensor, not the Python float: CUDA torch divides by a scalar through its fp32
    # reciprocal (1 ulp off the IEEE quotient in some rows, which moves values sitting on an e4m3
    # rounding midpoint); the kernels and CPU torch divide exactly
    scale = amax / amax.new_full((), E4M3_MAX)
    return (tf / scale[:, None]).to(E4M3), scale.contiguous()


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 values an e4m3 matrix and its row scales stand for."""
    return q.float() * scale[:, None]


def check_scale(t: torch.Tensor | None, n: int, device: torch.device, name: str) -> None:
    """A row-scale argument must be a contiguous fp32 [n] on `device`."""
    if t is None or t.shape != (n,) or t.dtype != torch.float32 or not t.is_contiguous() or t.device != device:
        got = "None" if t is None else f"{tuple(t.shape)} {t.dtype} on {t.device}"
        raise ValueError(f"{name}: expected a contiguous [{n}] float32 tensor on {device}, got {got}")


@triton.jit
def scale_row_e4m3(y, FIX: tl.constexpr):
    """One fp32 row (in registers) -> (the row divided by its scale, ready for an e4m3 store;
    the scale): `quantize_rows` in a kernel. IEEE divisions (div_rn; `/` compiles to an
    approximate one): the same bits as torch. FIX: the interpreter's rounding workaround."""
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12), 448.0)  # MIN_AMAX, E4M3_MAX
    # a NaN in the row makes its scale NaN, as quantize_rows' amax does (max and maximum drop it;
    # the interpreter stores NaN into e4m3 as a finite value: the scale then still carries it)
    scale += tl.sum(tl.where(y != y, y, 0.0), axis=0)
    y = tl.math.div_rn(y, scale)
    if FIX:
        y = round_e4m3_rtne(y)
    return y, scale


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, D, stride_x, stride_q, FIX: tl.constexpr, BLOCK_D: tl.constexpr):
    # one program per row, the whole row in registers: amax, scale, e4m3 store
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < D, other=0.0).to(tl.float32)
    y, scale = scale_row_e4m3(x, FIX)
    tl.store(s_ptr + row, scale)
    tl.store(q_ptr + row * stride_q + cols, y.to(q_ptr.dtype.element_ty), mask=cols < D)


def quantize_rows_kernel(
    x: torch.Tensor, out: torch.Tensor | None = None, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows` as one Triton launch, for activations inside a captured stage: [N, D] ->
    (e4m3 [N, D] into `out`, fp32 [N] into `scale`)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [N, D] with contiguous rows, got {tuple(x.shape)} strides {x.stride()}")
    if not x.is_floating_point() or x.dtype == E4M3:
        raise ValueError(f"x must be fp32, bf16 or fp16 to quantize, got {x.dtype}")
    n, d = x.shape
    out = torch.empty(n, d, dtype=E4M3, device=x.device) if out is None else out
    scale = torch.empty(n, dtype=torch.float32, device=x.device) if scale is None else scale
    check_out(out, (n, d), x.device, fp8=True)
    if out.dtype != E4M3 or scale.dtype != torch.float32:
        raise ValueError(f"out must be e4m3 and scale float32, got {out.dtype} and {scale.dtype}")
    check_scale(scale, n, x.device, "scale")
    if n:
        block = row_block(d)
        _quantize_rows_kernel[(n,)](
            x, out, scale, d, x.stride(0), out.stride(0), FIX=is_interpreting(), BLOCK_D=block,
            num_warps=num_warps_for(block),
        )  # fmt: skip
    return out, scale
