"""The prefix LM's attention (bidirectional over the valid prefix tokens) on TMA descriptors.

pi0 / pi0.5's prefix attention is multi-query: 8 query heads share one K / V head of dim 256,
so the [T, H, D] queries are one [T * H, D] matrix against one [Tk, D] key / value matrix, and
a key is visible to every query exactly when it is a valid token (`key_blocks[j] <= 0`, the
encoding of `attention.attention_key_blocks`). At 968 tokens that is 7744 query rows: 121 tiles
of 64 rows fill the H200's 132 SMs once, with no key split and so no combine kernel.

Each program streams its K / V tiles with TMA (the copy engine writes shared memory, no address
registers), keeps its 64 x 256 fp32 accumulator in one warpgroup's registers and runs the online
softmax in the exp2 domain. `kernels.attention` (pointer loads, 128-row tiles, 2 key splits +
combine) stays for every other shape, for GPUs without TMA (below sm_90) and where these tiles
do not fit in shared memory (`supports_prefix_attention`: e.g. fp32 at head dim 256).

Measured and dropped (H200, 3 views, Triton 3.6): the key loop warp-specialised by Triton
(``tl.range(..., warp_specialize=True)``: a TMA producer + MMA consumers, 12 warps from 4):
37-44 us against 24.9 alone, and the captured prefix stage 8.408 vs 8.148 ms.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_out, dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne
from .attention import _device_info, _smem_bytes, online_softmax
from .gate_up_geglu import _check_tma_rows

__all__ = ["compile_offline", "prefix_attention", "supports_prefix_attention"]

_LOG2E = 1.4426950408889634
GPU_TILES = dict(BM=64, BN=64, num_warps=4, num_stages=2)  # measured on the H200 (bench/attention.py)
HEAD_DIMS = (16, 32, 64, 128, 256)  # powers of two that fit one TMA box (256 elements at most)
HIDDEN = tl.constexpr(2**30)  # key_blocks value of keys beyond Tk (never visible)


@triton.jit
def _prefix_attn_kernel(
    q_desc,  # [T * H, D]
    k_desc,  # [Tk, D]
    v_desc,  # [Tk, D]
    o_ptr,  # [T * H, D]
    kb_ptr,  # [Tk] int32: visible iff <= 0
    MQ,
    Tk,
    qk_scale,  # softmax scale * log2(e)
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX_O: tl.constexpr,
):
    row0 = tl.program_id(0) * BM
    q = q_desc.load([row0, 0])
    if UPCAST:  # the interpreter's bf16 dot is wrong (Triton 3.9): fp32 there
        q = q.to(tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    for n0 in range(0, Tk, BN):
        k = k_desc.load([n0, 0])  # rows past Tk arrive as zeros; their key_blocks hide them
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, k.T, input_precision=PREC) * qk_scale
        cols = n0 + tl.arange(0, BN)
        kb = tl.load(kb_ptr + cols, mask=cols < Tk, other=HIDDEN)
        s = tl.where((kb <= 0)[None, :], s, float("-inf"))
        p, alpha, m_new, l_i = online_softmax(s, m_i, l_i)
        v = v_desc.load([n0, 0])
        if UPCAST:
            p = p.to(v_desc.dtype).to(tl.float32)  # the bf16 P of the GPU path
            v = v.to(tl.float32)
        else:
            p = p.to(v.dtype)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PREC)
        m_i = m_new
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # no visible key at all: zeros
    if FIX_O:
        o = round_bf16_rtne(o)
    rows = row0 + tl.arange(0, BM)
    d = tl.arange(0, D)
    tl.store(
        o_ptr + rows.to(tl.int64)[:, None] * D + d[None, :], o.to(o_ptr.dtype.element_ty), mask=(rows < MQ)[:, None]
    )


def supports_prefix_attention(device: torch.device, dtype: torch.dtype = torch.bfloat16, head_dim: int = 256) -> bool:
    """Whether the GPU launch runs here for this dtype and head dim: a head dim of one TMA box
    (`HEAD_DIMS`), TMA descriptors (sm_90+) and room for its tiles (bf16 at head dim 256:
    164 KB, within Hopper's, datacenter Blackwell's and Jetson Thor's 227 KB; not consumer
    Blackwell's 99 KB, nor fp32 at 256); everywhere under the interpreter."""
    if head_dim not in HEAD_DIMS:
        return False
    if is_interpreting():
        return True
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    t = GPU_TILES
    need = _smem_bytes(t["BM"], t["BN"], head_dim, t["num_stages"], dtype.itemsize)
    return _device_info(device)[1] >= need + 1024  # + Triton's own scratch


def _launch_settings(MQ: int, Tk: int, device: torch.device) -> dict[str, int]:
    """GPU: `GPU_TILES`, 64-row tiles (one warpgroup, 4 warps), 64-key tiles, 2 stages (32 KB
    of Q and 2 x 64 KB of K / V in shared memory at bf16, head dim 256). Interpreter: tiles as
    small as the problem allows."""
    if is_interpreting() or device.type != "cuda":
        return dict(BM=min(64, max(16, triton.next_power_of_2(MQ))), BN=min(64, max(16, triton.next_power_of_2(Tk))),
                    num_warps=4, num_stages=1)  # fmt: skip
    return dict(GPU_TILES)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_blocks: torch.Tensor) -> tuple[int, int, int, int]:
    if q.dim() != 3 or not q.is_contiguous():
        raise ValueError(f"q must be a contiguous [T, H, D], got {tuple(q.shape)} (strides {q.stride()})")
    T, H, D = q.shape
    if k.dim() != 2 or v.shape != k.shape or k.shape[1] != D:
        raise ValueError(f"k and v must be [Tk, {D}] (one K/V head), got {tuple(k.shape)} and {tuple(v.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim {D}: expected a power of two from 16 to 256 (one TMA box)")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v differ: {q.dtype}/{k.dtype}/{v.dtype} on {q.device}/{k.device}/{v.device}")
    Tk = k.shape[0]
    if Tk == 0:
        raise ValueError("k and v hold no keys: every query needs at least one key to attend to")
    kb = key_blocks
    if kb.shape != (Tk,) or kb.dtype != torch.int32 or kb.device != q.device or kb.stride(0) != 1:
        raise ValueError(
            f"key_blocks must be a contiguous int32 [{Tk}] on {q.device}, got {kb.dtype} {tuple(kb.shape)} "
            f"(stride {kb.stride()}) on {kb.device}"
        )
    _check_tma_rows("k", k)
    _check_tma_rows("v", v)
    _check_tma_rows("q", q.view(T * H, D))
    return T, H, D, Tk


def prefix_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_blocks: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scale, over visible keys) v`` -> [T, H, D] in q's dtype.

    Args:
        q: [T, H, D] contiguous queries (RoPE applied).
        k, v: [Tk, D] the one K / V head (contiguous rows, 16-byte aligned).
        key_blocks: int32 [Tk], `attention_key_blocks(valid)`: key j is visible iff <= 0.
        scale: default 1 / sqrt(D).
        out: optional static [T, H, D] buffer.
        block_m, block_n, num_warps, num_stages: launch overrides (benchmarks).
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    T, H, D, Tk = _check(q, k, v, key_blocks)
    if out is None:
        out = torch.empty_like(q)
    check_out(out, (T, H, D), q.device)
    if out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {q.dtype} [T, H, D]")
    if T == 0:
        return out
    s = _launch_settings(T * H, Tk, q.device)
    bm, bn = block_m or s["BM"], block_n or s["BN"]
    scale = D**-0.5 if scale is None else scale
    _prefix_attn_kernel[(triton.cdiv(T * H, bm),)](
        TensorDescriptor.from_tensor(q.view(T * H, D), [bm, D]),
        TensorDescriptor.from_tensor(k, [bn, D]),
        TensorDescriptor.from_tensor(v, [bn, D]),
        out,
        key_blocks,
        T * H,
        Tk,
        scale * _LOG2E,
        D=D,
        BM=bm,
        BN=bn,
        UPCAST=is_interpreting() and q.dtype != torch.float32,
        PREC=dot_precision(q.dtype),
        FIX_O=needs_rtne_fix(out.dtype),
        num_warps=num_warps or s["num_warps"],
        num_stages=num_stages or s["num_stages"],
    )
    return out


def compile_offline(
    arch: int,
    block_m: int = GPU_TILES["BM"],
    block_n: int = GPU_TILES["BN"],
    num_warps: int = GPU_TILES["num_warps"],
    num_stages: int = GPU_TILES["num_stages"],
):
    """Build the GPU launch (bf16, head dim 256) for CUDA `arch` without a GPU (90: H200,
    110: Jetson Thor): registers, spills and shared memory of a target CI has no device for."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    D = 256
    desc = lambda rows: f"tensordesc<bf16[{rows}, {D}]>"  # noqa: E731
    signature = dict(q_desc=desc(block_m), k_desc=desc(block_n), v_desc=desc(block_n), o_ptr="*bf16", kb_ptr="*i32")
    signature.update(MQ="i32", Tk="i32", qk_scale="fp32")
    constexprs = dict(D=D, BM=block_m, BN=block_n, UPCAST=False, PREC="tf32", FIX_O=False)
    signature.update({name: "constexpr" for name in constexprs})
    return triton.compile(
        ASTSource(
            _prefix_attn_kernel,
            signature,
            constexprs=constexprs,
            attrs={(3,): [["tt.divisibility", 16]], (4,): [["tt.divisibility", 16]]},
        ),
        target=GPUTarget("cuda", arch, 64),
        options=dict(num_warps=num_warps, num_stages=num_stages),
    )
