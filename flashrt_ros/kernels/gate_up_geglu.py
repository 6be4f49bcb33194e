"""Gemma's gate|up GEMM with the GeGLU in its epilogue: ``gelu_tanh(x @ Wg.T) * (x @ Wu.T)``.

The prefix LM's MLP as cuBLAS + `kernels.geglu` writes the [T, 2F] gate|up product (63 MB at
968 rows) and reads it back; here each tile keeps gate and up of the same columns in one
accumulator and stores only their [T, F] product: half the output bytes, no second pass. For
that the weight is laid out once at load (`interleave_gate_up`): blocks of `block` gate rows,
each followed by the same rows of up, so one [2 * block, K] weight tile and one MMA per K step
give both halves. Measured on the H200 at the prefix's shape (968 x 2048 -> 2 x 16384, cold
weights, `bench/gate_up_geglu.py`; 128 x 256 x 64 tiles, 4 stages, 8 warps, persistent):
183.5 us per layer against 199.7 us for cuBLAS + GeGLU; the same maths as two separate
128-column MMAs on the un-interleaved weight took 245 us. A persistent grid (one program per SM
walking the tiles, GROUP_M row tiles together so that a weight tile is read once from HBM) on
TMA descriptors, so sm_90+ only (Hopper, Blackwell, Jetson Thor); older GPUs keep cuBLAS + GeGLU.
Numerics: fp32 accumulators, GeGLU in fp32, one rounding at the store (the two-kernel path
rounds the gate|up product to the run dtype first). On e4m3 operands the Hopper MMA accumulates
in reduced precision within the K loop (FP8_PROMOTE_K says why that is kept).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_out, dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne
from .fp8 import check_scale
from .geglu import geglu_ref
from .gelu import gelu_tanh

__all__ = [
    "compile_offline",
    "deinterleave_gate_up",
    "gate_up_geglu",
    "gate_up_geglu_ref",
    "interleave_block",
    "interleave_gate_up",
    "supports_gate_up_geglu",
]


@triton.jit
def _tile(t, n_m, n_n, GROUP_M: tl.constexpr):
    """Tile index -> (row tile, column tile), walking GROUP_M row tiles per column tile."""
    per_group = GROUP_M * n_n
    first = (t // per_group) * GROUP_M
    size = tl.minimum(n_m - first, GROUP_M)
    return first + (t % per_group) % size, (t % per_group) // size


@triton.jit
def _gate_up_geglu_kernel(
    x_desc,
    w_desc,
    y_desc,
    xs_ptr,
    ws_ptr,
    M,
    F,
    KD,
    NUM_PROGS,
    BM: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX_Y: tl.constexpr,
    SCALED: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
):
    n_m, n_n = tl.cdiv(M, BM), F // BH
    for t in tl.range(tl.program_id(0), n_m * n_n, NUM_PROGS, flatten=True):
        pm, pn = _tile(t, n_m, n_n, GROUP_M)
        acc = tl.zeros([BM, 2 * BH], dtype=tl.float32)
        for k in range(0, KD, BK):
            a = x_desc.load([pm * BM, k])
            w = w_desc.load([pn * 2 * BH, k])  # BH gate rows, then the same BH rows of up
            if UPCAST:  # the interpreter's bf16 dot is wrong (Triton 3.9): fp32 there
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w.T, acc, input_precision=PREC, max_num_imprecise_acc=MAX_IMPRECISE)
        if SCALED:  # FP8 operands: one scale per x row and per weight row (gate|up column)
            rows = pm * BM + tl.arange(0, BM)
            cols = pn * 2 * BH + tl.arange(0, 2 * BH)
            xs = tl.load(xs_ptr + rows, mask=rows < M, other=0.0)
            acc = acc * xs[:, None] * tl.load(ws_ptr + cols)[None, :]
        g, u = tl.split(acc.reshape(BM, 2, BH).permute(0, 2, 1))
        y = gelu_tanh(g) * u
        if FIX_Y:
            y = round_bf16_rtne(y)
        y_desc.store([pm * BM, pn * BH], y.to(y_desc.dtype))


def interleave_block(F: int, device: torch.device) -> int:
    """The layout block for an MLP of width F: the largest power of two that divides F, at most
    128 on a GPU (the 128 x 256 tiles measured fastest) and 64 on the interpreter; 0 where F
    has no block of at least 16 (tl.dot's minimum) or the fused kernel cannot run (below sm_90):
    use cuBLAS + geglu there."""
    if not supports_gate_up_geglu(device):
        return 0
    want = 64 if is_interpreting() or device.type != "cuda" else 128
    block = want
    while block >= 16 and F % block:
        block //= 2
    return block if block >= 16 else 0


def _half_in_blocks(w: torch.Tensor, block: int) -> int:
    """F of a [..., 2F, K] gate|up weight, checked to be a multiple of `block`."""
    two_f, kd = w.shape[-2:]
    if two_f % 2 or block <= 0 or (two_f // 2) % block:
        raise ValueError(f"w_gu [..., {two_f}, {kd}]: expected 2F rows with F a multiple of block {block}")
    return two_f // 2


def interleave_gate_up(w_gu: torch.Tensor, block: int) -> torch.Tensor:
    """[..., 2F, K] ([gate; up] rows; leading dims such as layers) -> blocks of `block` gate rows,
    each followed by the same rows of up: the layout `gate_up_geglu`, `geglu(..., interleave=)`
    and the step kernel's gate|up phase read."""
    *lead, two_f, kd = w_gu.shape
    F = _half_in_blocks(w_gu, block)
    g, u = w_gu.reshape(*lead, 2, F // block, block, kd).unbind(-4)
    return torch.stack((g, u), dim=-3).reshape(*lead, two_f, kd).contiguous()


def deinterleave_gate_up(w_int: torch.Tensor, block: int) -> torch.Tensor:
    """The inverse of `interleave_gate_up`: back to [gate; up] rows."""
    *lead, two_f, kd = w_int.shape
    F = _half_in_blocks(w_int, block)
    pairs = w_int.reshape(*lead, F // block, 2, block, kd)
    return torch.stack(pairs.unbind(-3), dim=-4).reshape(*lead, two_f, kd).contiguous()


# The GPU tiles: 128 rows x (2 x block) weight rows x 128 bytes of K per stage (64 bf16, 128 FP8)
BM_GPU, BK_BYTES = 128, 128
MIN_SMEM = 200 * 1024  # the measured launch wants ~224 KB; GPUs with less keep cuBLAS + geglu
FP8 = torch.float8_e4m3fn
# FP8 on Hopper: the e4m3 MMA accumulates in reduced precision; Triton adds its partial sums into
# the fp32 accumulator every this many products of K (None: Triton's default, which on sm_90 never
# promotes within the K loop). H200, the prefix's shape (bench/fp8_gemms.py): promoting every K step
# (128) took 204 vs 112 us and moved the result against the fp32 product of the same e4m3 operands
# only from max abs 6.6e-2 / cosine 0.9999977 to 3.3e-2 / 0.9999986 (the operands' own rounding:
# cosine 0.9985 against the unquantised product), so not promoted
FP8_PROMOTE_K: int | None = None
# Triton 3.9's sm_100+ build of the FP8 tile takes 16 KB more shared memory than the operand
# stages + output tile (245 KB at 4 stages for sm_110, offline): one stage fewer there.
FP8_BLACKWELL_EXTRA = 16 * 1024


def _extra_smem(arch_major: int, elem: int) -> int:
    return FP8_BLACKWELL_EXTRA if elem == 1 and arch_major >= 10 else 0


def supports_gate_up_geglu(device: torch.device) -> bool:
    """TMA descriptors (sm_90+) and room for the measured tiles' stages (Hopper, datacenter
    Blackwell, Jetson Thor: 227 KB; not consumer Blackwell's 99 KB); everywhere under the
    interpreter."""
    if is_interpreting():
        return True
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    return _smem(device) >= MIN_SMEM


def _smem(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 0) or 227 * 1024


def _stages(smem: int, bh: int, elem: int, out_elem: int | None = None, arch_major: int = 9) -> int:
    """Operand stages that fit beside the output tile (at most 4: measured best on the H200)."""
    stage, y_tile = (BM_GPU + 2 * bh) * BK_BYTES, BM_GPU * bh * (out_elem or elem)
    return max(1, min(4, (smem - y_tile - _extra_smem(arch_major, elem)) // stage))


def _launch_settings(
    M: int, F: int, KD: int, bh: int, elem: int, device: torch.device, out_elem: int | None = None
) -> dict[str, int]:
    """BM, BK, stages, warps, programs for column tiles of `bh` (the layout's block). GPU:
    128 x (2 x 128) x 128-byte tiles (K 64 in bf16, 128 in FP8) on 8 warps with 4 stages
    (192 KB of operand stages + the 32 KB output tile: within the 227 KB of Hopper / Blackwell /
    Thor; fewer stages where there is less), one program per SM. Interpreter: small tiles, one
    program per tile."""
    if is_interpreting() or device.type != "cuda":
        bm, bk = (min(64, max(16, triton.next_power_of_2(n))) for n in (M, KD))
        return dict(BM=bm, BK=bk, num_stages=1, num_warps=4, programs=triton.cdiv(M, bm) * (F // bh))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = triton.cdiv(M, BM_GPU) * (F // bh)
    major = torch.cuda.get_device_capability(device)[0]
    stages = _stages(_smem(device), bh, elem, out_elem, major)
    return dict(BM=BM_GPU, BK=BK_BYTES // elem, num_stages=stages, num_warps=8, programs=min(sms, tiles))


def _check_tma_rows(name: str, t: torch.Tensor) -> None:
    """What a TMA descriptor needs of a 2-D operand: unit inner stride, rows of a multiple of 16
    bytes, a 16-byte aligned base."""
    if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
        raise ValueError(f"{name} must have contiguous rows of a multiple of 16 bytes, 16-byte aligned")


def _check(x: torch.Tensor, w_gu: torch.Tensor, block: int) -> tuple[int, int, int]:
    if x.dim() != 2 or w_gu.dim() != 2:
        raise ValueError(f"x must be [T, K] and w_gu [2F, K], got {tuple(x.shape)} and {tuple(w_gu.shape)}")
    (M, KD), (two_f, kw) = x.shape, w_gu.shape
    if block not in (16, 32, 64, 128):
        raise ValueError(f"block {block}: expected 16, 32, 64 or 128 (a tile's column count; see interleave_block)")
    if kw != KD or two_f % 2 or (two_f // 2) % block:
        raise ValueError(
            f"w_gu must be [2F, {KD}] interleaved in blocks of {block} (>= 16, dividing F), got {tuple(w_gu.shape)}"
        )
    if x.dtype != w_gu.dtype or x.device != w_gu.device:
        raise ValueError(f"x and w_gu differ: {x.dtype} on {x.device} vs {w_gu.dtype} on {w_gu.device}")
    _check_tma_rows("x", x)
    _check_tma_rows("w_gu", w_gu)
    return M, two_f // 2, KD


def _check_scales(x: torch.Tensor, w_gu: torch.Tensor, x_scale, w_scale) -> bool:
    """Whether this is the FP8 (e4m3, row-scaled) form; its scales checked."""
    if x.dtype.itemsize == 1 and x.dtype != FP8:
        raise ValueError(f"x is {x.dtype}: of the 8-bit formats only e4m3 (torch.float8_e4m3fn) is supported")
    if x.dtype != FP8:
        if x_scale is not None or w_scale is not None:
            raise ValueError(f"x_scale / w_scale are for FP8 (e4m3) operands, got {x.dtype}")
        return False
    check_scale(x_scale, x.shape[0], x.device, "x_scale")
    check_scale(w_scale, w_gu.shape[0], x.device, "w_scale")
    return True


def gate_up_geglu(
    x: torch.Tensor,
    w_gu: torch.Tensor,
    block: int,
    out: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``gelu_tanh(x @ Wg.T) * (x @ Wu.T)`` -> [T, F] in x's dtype (bf16 for FP8 operands).

    Args:
        x: [T, K] rows (normed hidden states), contiguous rows of a multiple of 16 bytes.
        w_gu: [2F, K] from `interleave_gate_up(cat(gate_proj, up_proj), block)`.
        block: the layout's block (also the tile's column count).
        out: optional static [T, F] buffer (same row rules).
        x_scale, w_scale: for e4m3 x and w_gu only: fp32 [T] and [2F] (w_gu's rows, interleaved
            with them): x ~ x_scale[:, None] * x_fp8, W ~ w_scale[:, None] * W_fp8
            (`kernels.fp8.quantize_rows`).
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, F, KD = _check(x, w_gu, block)
    scaled = _check_scales(x, w_gu, x_scale, w_scale)
    out_dtype = torch.bfloat16 if scaled else x.dtype
    if out is None:
        out = x.new_empty(M, F, dtype=out_dtype)
    check_out(out, (M, F), x.device)
    if out.dtype != out_dtype:
        raise ValueError(f"out is {out.dtype}, expected {out_dtype}")
    _check_tma_rows("out", out)
    if M == 0:
        return out
    s = _launch_settings(M, F, KD, block, x.element_size(), x.device, out.element_size())
    bm, bk = s["BM"], s["BK"]
    _gate_up_geglu_kernel[(s["programs"],)](
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(w_gu, [2 * block, bk]),
        TensorDescriptor.from_tensor(out, [bm, block]),
        x_scale,
        w_scale,
        M,
        F,
        KD,
        s["programs"],
        BM=bm,
        BH=block,
        BK=bk,
        GROUP_M=8,
        UPCAST=is_interpreting() and x.dtype != torch.float32,
        PREC=dot_precision(x.dtype),
        FIX_Y=needs_rtne_fix(out.dtype),
        SCALED=scaled,
        MAX_IMPRECISE=FP8_PROMOTE_K if scaled else None,
        num_stages=s["num_stages"],
        num_warps=s["num_warps"],
    )
    return out


def gate_up_geglu_ref(x: torch.Tensor, w_gu: torch.Tensor) -> torch.Tensor:
    """HF ``GemmaMLP`` up to the down projection, in fp32, on the plain [gate; up] weight
    (not interleaved): geglu(x @ w_gu.T), cast back."""
    return geglu_ref(x.float() @ w_gu.float().T).to(x.dtype)


def compile_offline(arch: int, block: int = 128, smem: int = 227 * 1024, fp8: bool = False):
    """Build the GPU launch's kernel (bf16 or FP8 operands, `block` columns, the stages `_launch_settings`
    picks for `smem` bytes) for CUDA `arch` without a GPU, e.g. 90 (H200) or 110 (Jetson Thor):
    what CI can check of targets it has no device for. Returns Triton's compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    elem = 1 if fp8 else 2
    bm, bk, stages = BM_GPU, BK_BYTES // elem, _stages(smem, block, elem, 2, arch // 10)
    op = "fp8e4nv" if fp8 else "bf16"
    desc = lambda t, rows, cols: f"tensordesc<{t}[{rows}, {cols}]>"  # noqa: E731
    signature = dict(x_desc=desc(op, bm, bk), w_desc=desc(op, 2 * block, bk), y_desc=desc("bf16", bm, block))
    signature.update(xs_ptr="*fp32" if fp8 else "constexpr", ws_ptr="*fp32" if fp8 else "constexpr")
    signature.update(M="i32", F="i32", KD="i32", NUM_PROGS="i32")
    constexprs = dict(BM=bm, BH=block, BK=bk, GROUP_M=8, UPCAST=False, PREC="tf32", FIX_Y=False, SCALED=fp8)
    constexprs.update(MAX_IMPRECISE=FP8_PROMOTE_K if fp8 else None)
    if not fp8:
        constexprs.update(xs_ptr=None, ws_ptr=None)
    signature.update({name: "constexpr" for name in constexprs})
    return triton.compile(
        ASTSource(_gate_up_geglu_kernel, signature, constexprs=constexprs),
        target=GPUTarget("cuda", arch, 64),
        options=dict(num_warps=8, num_stages=stages),
    )
