"""Multi-head attention straight from a fused QKV GEMM's output, for independent sequences of
equal length without masks: SigLIP's (each camera view is its own 256-token sequence, 16 heads
of dim 72).

    qkv [B * T, 3 * H * D]  (rows token-major; columns q heads | k heads | v heads)
    ->  out [B * T, H * D]  (the O projection's input, heads side by side)

One program per (query tile, head, sequence) runs flash attention over all of the sequence's
keys: q, k and v are strided views of `qkv`, and the output is written in the layout the O GEMM
reads, so neither the q/k/v split nor the head transpose is ever copied. A head dim that is no
power of two is tiled as two (72 = 64 + 16 with 8 masked) rather than one padded to 128. Scores
and softmax in fp32, P in the input dtype for the PV product (flash-attention practice).

Why a kernel of our own: torch's SDPA on these views costs a memset plus the cuDNN kernel
(8.4 + 0.8 us per SigLIP layer at 3 views on the H200, docs/results), for ~0.9 GFLOP and ~7 MB.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne

_LOG2E = 1.4426950408889634

__all__ = ["packed_attention", "packed_attention_ref"]


@triton.jit
def _load_rows(
    ptr, rows, row_ok, stride, lo: tl.constexpr, width: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr
):
    """[len(rows), BLOCK] of columns lo .. lo + BLOCK of a row-major matrix (columns >= width: 0)."""
    d = lo + tl.arange(0, BLOCK)
    t = tl.load(
        ptr + rows[:, None].to(tl.int64) * stride + d[None, :], mask=row_ok[:, None] & (d < width)[None, :], other=0.0
    )
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _packed_attn_kernel(
    qkv_ptr,
    o_ptr,
    T,
    qk_scale,  # softmax scale * log2(e): scores live in the exp2 domain
    stride_row,  # qkv row stride
    stride_orow,  # out row stride
    HEAD_DIM: tl.constexpr,
    HEADS_DIM: tl.constexpr,  # H * HEAD_DIM: the offset of the k (then v) columns
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_LO: tl.constexpr,  # the head dim as two power-of-two tiles: 72 = 64 + 8 (in a 16-wide tile)
    D_HI: tl.constexpr,
    HAS_HI: tl.constexpr,  # False: the head dim fits the D_LO tile
):
    pid_m, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    base = qkv_ptr + seq.to(tl.int64) * T * stride_row + head * HEAD_DIM
    q_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_ok = q_rows < T
    q_lo = _load_rows(base, q_rows, q_ok, stride_row, 0, HEAD_DIM, D_LO, UPCAST)
    if HAS_HI:
        q_hi = _load_rows(base, q_rows, q_ok, stride_row, D_LO, HEAD_DIM, D_HI, UPCAST)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_lo = tl.zeros([BLOCK_M, D_LO], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, D_HI], dtype=tl.float32)
    for n0 in range(0, T, BLOCK_N):
        k_rows = n0 + tl.arange(0, BLOCK_N)
        k_ok = k_rows < T
        k_lo = _load_rows(base + HEADS_DIM, k_rows, k_ok, stride_row, 0, HEAD_DIM, D_LO, UPCAST)
        s = tl.dot(q_lo, tl.trans(k_lo), input_precision=PREC)
        if HAS_HI:
            k_hi = _load_rows(base + HEADS_DIM, k_rows, k_ok, stride_row, D_LO, HEAD_DIM, D_HI, UPCAST)
            s = tl.dot(q_hi, tl.trans(k_hi), s, input_precision=PREC)
        s = tl.where(k_ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every tile holds at least one key
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(qkv_ptr.dtype.element_ty)  # P in the input dtype for the MMA (flash practice)
        if UPCAST:
            p = p.to(tl.float32)
        v_lo = _load_rows(base + 2 * HEADS_DIM, k_rows, k_ok, stride_row, 0, HEAD_DIM, D_LO, UPCAST)
        acc_lo = tl.dot(p, v_lo, acc_lo * alpha[:, None], input_precision=PREC)
        if HAS_HI:
            v_hi = _load_rows(base + 2 * HEADS_DIM, k_rows, k_ok, stride_row, D_LO, HEAD_DIM, D_HI, UPCAST)
            acc_hi = tl.dot(p, v_hi, acc_hi * alpha[:, None], input_precision=PREC)
        m_i = m_new
    out = o_ptr + seq.to(tl.int64) * T * stride_orow + head * HEAD_DIM
    _store_rows(out, acc_lo / l_i[:, None], q_rows, q_ok, stride_orow, 0, HEAD_DIM, D_LO, FIX_O)
    if HAS_HI:
        _store_rows(out, acc_hi / l_i[:, None], q_rows, q_ok, stride_orow, D_LO, HEAD_DIM, D_HI, FIX_O)


@triton.jit
def _store_rows(
    ptr, x, rows, row_ok, stride, lo: tl.constexpr, width: tl.constexpr, BLOCK: tl.constexpr, FIX: tl.constexpr
):
    d = lo + tl.arange(0, BLOCK)
    if FIX:
        x = round_bf16_rtne(x)
    mask = row_ok[:, None] & (d < width)[None, :]
    tl.store(ptr + rows[:, None].to(tl.int64) * stride + d[None, :], x.to(ptr.dtype.element_ty), mask=mask)


def _head_parts(D: int, split: bool = True) -> tuple[int, int, bool]:
    """The head dim as tiles (D_LO, D_HI, HAS_HI): the largest power of two <= D, and the rest
    in a power-of-two tile of at least 16 (tl.dot's minimum). SigLIP's 72 -> 64 + 16: 80 columns
    of MMA work per product instead of 128 in one padded tile (split=False)."""
    lo = max(16, 1 << (D.bit_length() - 1))
    if not split or D <= lo:
        return max(16, triton.next_power_of_2(D)), 16, False
    return lo, max(16, triton.next_power_of_2(D - lo)), True


def _launch_settings(T: int, interp: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). GPU: 64-row query tiles over 64-key tiles on
    4 warps, 2 stages (SigLIP at 3 views: 4 x 16 x 3 = 192 programs). Interpreter: one tile."""
    if interp:
        block = min(64, max(16, triton.next_power_of_2(T)))
        return block, block, 4, 1
    return 64, 64, 4, 2


def packed_attention(
    qkv: torch.Tensor,
    num_heads: int,
    seq_len: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    split_head: bool = True,
) -> torch.Tensor:
    """softmax(q k^T * scale) v per head and per sequence of `seq_len` rows of `qkv`
    [B * seq_len, 3 * num_heads * D] -> [B * seq_len, num_heads * D] (into `out` if given).
    scale: default 1 / sqrt(D). Tile settings: see `_launch_settings`; split_head: a head dim
    that is no power of two in two tiles (`_head_parts`), else one padded tile."""
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be 2-D [B * T, 3 * H * D] with contiguous rows, got {tuple(qkv.shape)}")
    rows, width = qkv.shape
    if num_heads < 1 or width % (3 * num_heads):
        raise ValueError(f"qkv's {width} columns are not 3 x {num_heads} heads")
    if seq_len < 1 or rows % seq_len:
        raise ValueError(f"qkv's {rows} rows are not whole sequences of {seq_len} tokens")
    D = width // (3 * num_heads)
    if out is None:
        out = torch.empty(rows, num_heads * D, device=qkv.device, dtype=qkv.dtype)
    elif tuple(out.shape) != (rows, num_heads * D) or out.stride(-1) != 1 or out.dtype != qkv.dtype:
        want = f"{qkv.dtype} [{rows}, {num_heads * D}] with contiguous rows"
        raise ValueError(f"out must be {want}, got {out.dtype} {tuple(out.shape)}")
    interp = is_interpreting()
    bm, bn, warps, stages = _launch_settings(seq_len, interp)
    bm, bn = block_m or bm, block_n or bn
    warps, stages = num_warps or warps, num_stages or stages
    scale = D**-0.5 if scale is None else scale
    d_lo, d_hi, has_hi = _head_parts(D, split_head)
    _packed_attn_kernel[(triton.cdiv(seq_len, bm), num_heads, rows // seq_len)](
        qkv, out, seq_len, float(scale) * _LOG2E, qkv.stride(0), out.stride(0),
        HEAD_DIM=D, HEADS_DIM=num_heads * D,
        UPCAST=interp,  # the interpreter's tl.dot mis-multiplies bf16 (see kernels/attention.py)
        PREC=dot_precision(qkv.dtype), FIX_O=needs_rtne_fix(out.dtype),
        BLOCK_M=bm, BLOCK_N=bn, D_LO=d_lo, D_HI=d_hi, HAS_HI=has_hi, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def packed_attention_ref(qkv: torch.Tensor, num_heads: int, seq_len: int, scale: float | None = None) -> torch.Tensor:
    """Plain torch, fp32: the same maths as SigLIP's eager attention."""
    rows, width = qkv.shape
    D = width // (3 * num_heads)
    q, k, v = qkv.float().view(rows // seq_len, seq_len, 3, num_heads, D).permute(2, 0, 3, 1, 4)
    scale = D**-0.5 if scale is None else scale
    probs = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
    return (probs @ v).transpose(1, 2).reshape(rows, num_heads * D).to(qkv.dtype)
