"""Multi-head attention straight from a fused QKV GEMM's output, for independent sequences of
equal length without masks: SigLIP's (each camera view is its own 256-token sequence, 16 heads
of dim 72).

    qkv [B * T, 3 * H * D]  (rows token-major; columns q heads | k heads | v heads)
    ->  out [B * T, H * D]  (the O projection's input, heads side by side)

One program per (query tile, head, sequence) runs the flash-attention tile of
`kernels/attention.py` with one head per row and no key split: q, k and v are strided views of
`qkv`, and the output is written in the layout the O GEMM reads, so neither the q/k/v split nor
the head transpose is ever copied. Scores and softmax in fp32, P in the input dtype for the PV
product (flash-attention practice).

Why a kernel of our own: torch's SDPA on these views costs the cuDNN kernel plus a workspace
memset (8.4 + 0.8 us per SigLIP layer at 3 views on the H200, docs/results), for ~0.9 GFLOP and
~7 MB. Measured on the H200 (SigLIP, 3 views, bf16; bench/attention.py and the profiles):
9.4-9.7 us per layer against
10.1-10.8 for cuDNN, and inside the captured vision stage 2.013 against 2.064 ms (bench/fused_ab.py,
5 alternating rounds, lower in each). Measured and dropped: the head dim as two MMA tiles (72 = 64 + 16 instead
of one padded to 128): 0.1-0.2 us less, and its 1-stage launches faulted (128 x 128, 64 x 256;
bench/packed_attention_probe.py); other tiles: 64 x 128 9.1 alone but 2.014 vs 2.003 ms in the
stage, 128 x 64 on 8 warps 9.2-9.8, 32 x 64 13-14.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import dot_precision, is_interpreting, needs_rtne_fix
from .attention import _LOG2E, _attn_fwd_tile, _block_d

__all__ = ["packed_attention", "packed_attention_ref"]


@triton.jit
def _packed_attn_kernel(
    qkv_ptr,
    o_ptr,
    T,
    qk_scale,  # softmax scale * log2(e)
    stride_row,  # qkv row stride
    stride_orow,  # out row stride
    HEAD_DIM: tl.constexpr,
    HEADS_DIM: tl.constexpr,  # H * HEAD_DIM: the offset of the k (then v) columns
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    head = tl.program_id(1)
    q_ptr = qkv_ptr + head * HEAD_DIM
    _attn_fwd_tile(
        tl.program_id(0), 0, tl.program_id(2), 1,
        q_ptr, q_ptr + HEADS_DIM, q_ptr + 2 * HEADS_DIM, o_ptr + head * HEAD_DIM,
        o_ptr, o_ptr, o_ptr, o_ptr, o_ptr,  # masks and split workspaces: unused
        T, 1, T, T, qk_scale,
        T * stride_row, stride_row, 0,  # q: sequence, token, head (one head per row)
        T * stride_row, stride_row,  # k
        T * stride_row, stride_row,  # v
        T * stride_orow, stride_orow, 0,  # out
        0, 0,
        HEAD_DIM, False, False, False, UPCAST, PREC, FIX_O, BLOCK_M, BLOCK_N, BLOCK_D, "",
    )  # fmt: skip


def _launch_settings(T: int, interp: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). GPU: 64-row query tiles over 64-key tiles on
    4 warps, 2 stages (SigLIP at 3 views: 4 x 16 x 3 = 192 programs). Interpreter: tiles as
    large as the sequence up to 64 (its cost is per program)."""
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
) -> torch.Tensor:
    """softmax(q k^T * scale) v per head and per sequence of `seq_len` rows of `qkv`
    [B * seq_len, 3 * num_heads * D] -> [B * seq_len, num_heads * D] (into `out` if given).
    scale: default 1 / sqrt(D). Tile settings: see `_launch_settings`."""
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be 2-D [B * T, 3 * H * D] with contiguous rows, got {tuple(qkv.shape)}")
    if qkv.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"qkv must be fp32, bf16 or fp16, got {qkv.dtype}")
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
    _packed_attn_kernel[(triton.cdiv(seq_len, bm), num_heads, rows // seq_len)](
        qkv, out, seq_len, float(scale) * _LOG2E, qkv.stride(0), out.stride(0),
        HEAD_DIM=D, HEADS_DIM=num_heads * D,
        UPCAST=interp,  # the interpreter's tl.dot mis-multiplies bf16 (see kernels/attention.py)
        PREC=dot_precision(qkv.dtype), FIX_O=needs_rtne_fix(out.dtype),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_block_d(D), num_warps=warps, num_stages=stages,
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
