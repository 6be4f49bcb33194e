"""Small helpers shared by the kernel wrappers (no kernels here).

Kept free of any GPU-only API so that the same wrappers run compiled on CUDA and on CPU under
``TRITON_INTERPRET=1`` (the CI path).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

# Largest row the one-row-per-program kernels hold in registers (elements, power of two).
# Gemma's widest normed row is 2048, SigLIP's 1152; 64K leaves ample headroom.
MAX_FUSED_ROW = 65536


def is_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


INTERPRETING_AT_IMPORT = is_interpreting()
"""Whether ``TRITON_INTERPRET`` was set when the kernels were imported (this module is imported by
each of them first). ``triton.jit`` decides at decoration whether a kernel is interpreted: set
later, the variable makes `is_interpreting` say yes while the kernels still want a GPU driver."""


def row_block(width: int) -> int:
    """Power-of-two block that holds a whole row of ``width`` elements."""
    block = triton.next_power_of_2(max(int(width), 1))
    if block > MAX_FUSED_ROW:
        raise ValueError(f"row of {width} elements is wider than the fused limit {MAX_FUSED_ROW}")
    return block


def num_warps_for(block: int) -> int:
    """Warps for a memory-bound row kernel (Liger-Kernel's ``calculate_settings`` heuristic).

    Valid for Hopper (sm_90) and Blackwell (sm_100 / sm_110): 4 warps for rows that fit in
    2K elements, more for wider rows so that each thread keeps a handful of values.
    """
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def rows_2d(x: torch.Tensor, name: str, writable: bool = False) -> torch.Tensor:
    """View ``x`` [..., D] as [N, D] rows; the last dimension must be contiguous (stride 1).

    Rows may have any stride (e.g. a slice of a wider buffer). Inputs whose leading dimensions
    cannot be merged into one view are copied (``reshape``); outputs (``writable``) must be
    viewable, since writing into a silent copy would lose the result.
    """
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension")
    if x.stride(-1) != 1 and x.size(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tuple(x.stride())}")
    rows = (math.prod(x.shape[:-1]), x.size(-1))  # not -1: no row length to infer it from with D = 0
    if writable:
        try:
            view = x.view(rows)
        except RuntimeError as err:
            raise ValueError(f"{name} cannot be viewed as rows [N, {x.size(-1)}] without a copy") from err
        if rows[0] > 1 and view.stride(0) < rows[1]:  # an expanded or as_strided buffer
            raise ValueError(
                f"{name}'s rows overlap (row stride {view.stride(0)} for rows of {rows[1]}): every row must be "
                "memory of its own (the rows written last would overwrite the others)"
            )
        return view
    return x.reshape(rows)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [first, past the last] a non-empty tensor's elements occupy."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def check_apart(a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    """Two outputs of one kernel must not share memory: each would overwrite the other's values
    (e.g. a norm's out and residual_out in one buffer: the normed rows returned as the residual)."""
    if a.numel() and b.numel():
        (a0, a1), (b0, b1) = _span(a), _span(b)
        if a0 < b1 and b0 < a1:
            raise ValueError(f"{names} share memory; expected two separate buffers")


def check_features(x: torch.Tensor, name: str = "x") -> None:
    """A norm's rows must hold features: a mean over none is no number (torch gives NaN)."""
    if x.size(-1) == 0:
        shape = tuple(x.shape)
        raise ValueError(f"{name} has an empty last dimension (shape {shape}); a norm needs at least 1 feature")


def check_same_dtype(residual_out: torch.Tensor, x: torch.Tensor, what: str, name: str = "residual_out") -> None:
    """The residual stream's sum is rounded to its own dtype and the norm reads it back: another
    dtype than the stream's would norm a value the reference does not."""
    if residual_out.dtype != x.dtype:
        raise ValueError(f"{name} is {residual_out.dtype}; expected {x.dtype}, the dtype of {what}")


def same_device(t: torch.Tensor, device: torch.device) -> bool:
    """`t` lives on `device`; "cuda" (no index) stands for whichever GPU the tensor is on."""
    device = torch.device(device)
    return t.device.type == device.type and (device.index is None or t.device.index == device.index)


def check_float_buffer(out: torch.Tensor, device: torch.device, name: str = "out", fp8: bool = False) -> None:
    """A buffer a kernel stores into: floating point (it computes in fp32; an integer buffer would
    silently truncate), not 8-bit unless the kernel writes row scales with it (`fp8`: rms_norm's
    out_scale, quantize_rows_kernel; unscaled, values past e4m3's range saturate and the
    interpreter rounds them wrong), and on the kernel's device (else Triton's pointer error)."""
    if not out.dtype.is_floating_point:
        raise ValueError(f"{name} is {out.dtype}; expected a floating-point buffer")
    if out.element_size() == 1 and not fp8:
        raise ValueError(
            f"{name} is {out.dtype}; expected float32, bfloat16 or float16 (8-bit floats need row scales, "
            "which only rms_norm(out_scale=) and quantize_rows_kernel write)"
        )
    if out.device != device:
        raise ValueError(f"{name} is on {out.device}, expected {device}")


def check_out(
    out: torch.Tensor, shape: tuple[int, ...], device: torch.device, name: str = "out", fp8: bool = False
) -> None:
    """Validate a caller-provided static output buffer (for the CUDA-graph path). Every kernel
    computes in fp32 and stores floats: an integer buffer would silently truncate."""
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(out.shape)}, expected {tuple(shape)}")
    check_float_buffer(out, device, name, fp8)
    if out.stride(-1) != 1 and out.size(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact fp32 ("ieee") for fp32 operands, default otherwise.

    TF32 would cost ~1e-3 relative error on fp32 inputs; bf16/fp16 ignore the setting.
    """
    return "ieee" if dtype == torch.float32 else "tf32"


def needs_rtne_fix(dtype: torch.dtype) -> bool:
    """Whether a kernel must pre-round to bf16 itself before storing ``dtype``.

    Triton's interpreter (3.9) converts fp32 -> bf16 by truncation, while compiled kernels round
    to nearest even like torch. Kernels take this as a constexpr flag and apply
    :func:`round_bf16_rtne` only when it is True, so compiled code is unchanged and CI sees the
    same bf16 values as the GPU.
    """
    return dtype == torch.bfloat16 and is_interpreting()


@triton.jit
def round_bf16_rtne(x):
    """Round fp32 ``x`` to the nearest bf16 (ties to even), returned as fp32 with low bits zero.

    Interpreter-only workaround (see ``needs_rtne_fix``); NaN payloads are not preserved.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    bits = bits & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def round_e4m3_rtne(x):
    """Round fp32 ``x`` (|x| <= 448) to the nearest e4m3 value (ties to even), returned as fp32.

    Interpreter-only workaround: Triton 3.9's interpreter converts fp32 -> e4m3 without carrying
    a rounded-up mantissa into the exponent (125.997 -> 64, not 128). Normal range: keep 3
    mantissa bits of the fp32; below 2**-6 (e4m3's subnormals, spacing 2**-9) the add / subtract
    of 1.5 * 2**14 rounds to that spacing in fp32.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFFF + ((bits >> 20) & 1)
    normal = (bits & 0xFFF00000).to(tl.float32, bitcast=True)
    tiny = (x + 24576.0) - 24576.0
    return tl.where(tl.abs(x) < 0.015625, tiny, normal)
