"""Rotary position embedding (HF Gemma convention) and the fused QKV-projection epilogue.

Gemma rotates each head of q and k by position-dependent angles in the *rotate_half* layout
(first half / second half of the head dim, not interleaved pairs):

    inv_freq[i] = 1 / base ** (2i / d)                     i in [0, d/2)
    a = pos * inv_freq;  c, s = cos(a), sin(a)              fp32
    out[:d/2] = x1 * c - x2 * s;   out[d/2:] = x2 * c + x1 * s

Fused entry ``qkv_rope``: the pipeline runs ONE GEMM for the concatenated Q|K|V weights, giving
[T, (H + 2*HK) * d]; this kernel splits it, rotates q and k and writes q, k, v straight into
their destination buffers (k and v usually rows of the persistent KV cache at some offset), so
no separate split / rope / cache-copy launches remain.

Numerics: angles and rotations in fp32, one rounding at the store. ``inv_freq`` is computed once
by torch exactly as HF does (and cached per device), so ``pos * inv_freq`` is bit-identical to
the reference; cos/sin are evaluated in-kernel. (HF eager rounds cos/sin and the products to
bf16 as well; the fp32 path here is closer to the fp32 reference and to openpi's JAX model.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_float_buffer, needs_rtne_fix, round_bf16_rtne

__all__ = ["rope", "rope_ref", "qkv_rope", "qkv_rope_ref", "rope_inv_freq"]

_INV_FREQ_CACHE: dict[tuple[int, float, str], torch.Tensor] = {}


def rope_inv_freq(head_dim: int, base: float, device: torch.device | str) -> torch.Tensor:
    """[head_dim/2] fp32 inverse frequencies, HF formula, cached per (head_dim, base, device).

    The first call allocates; call it (or run the op once) before CUDA-graph capture.
    """
    key = (int(head_dim), float(base), str(torch.device(device)))
    inv = _INV_FREQ_CACHE.get(key)
    if inv is None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv = (1.0 / (base**exponents)).to(torch.float32).to(device)
        _INV_FREQ_CACHE[key] = inv
    return inv


@triton.jit
def _rotate_heads(
    x_ptr,
    o_ptr,
    stride_xh,
    stride_oh,
    n_heads,
    c,
    s,
    cols,
    col_mask,
    HALF: tl.constexpr,
    ROTATE: tl.constexpr,
    FIX: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # x/o point at head 0 of one token; the tile is [BLOCK_H heads, BLOCK_HALF columns].
    heads = tl.arange(0, BLOCK_H)
    m = (heads < n_heads)[:, None] & col_mask[None, :]
    xp = x_ptr + heads[:, None] * stride_xh + cols[None, :]
    op = o_ptr + heads[:, None] * stride_oh + cols[None, :]
    x1 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF, mask=m, other=0.0).to(tl.float32)
    if ROTATE:
        o1 = x1 * c[None, :] - x2 * s[None, :]
        o2 = x2 * c[None, :] + x1 * s[None, :]
    else:
        o1 = x1
        o2 = x2
    if FIX:
        o1 = round_bf16_rtne(o1)
        o2 = round_bf16_rtne(o2)
    tl.store(op, o1.to(o_ptr.dtype.element_ty), mask=m)
    tl.store(op + HALF, o2.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qo_ptr,
    ko_ptr,
    vo_ptr,
    pos_ptr,
    inv_freq_ptr,
    H,
    HK,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_vot,
    stride_voh,
    HALF: tl.constexpr,
    HAS_K: tl.constexpr,
    HAS_V: tl.constexpr,
    FIX_Q: tl.constexpr,
    FIX_K: tl.constexpr,
    FIX_V: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HK: tl.constexpr,
):
    # One program per token: all its q heads, its k head(s) and the v copy share one cos/sin.
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    col_mask = cols < HALF
    pos = tl.load(pos_ptr + t).to(tl.float32)
    inv = tl.load(inv_freq_ptr + cols, mask=col_mask, other=0.0)
    ang = pos * inv
    c = tl.cos(ang)
    s = tl.sin(ang)

    _rotate_heads(
        q_ptr + t * stride_qt,
        qo_ptr + t * stride_qot,
        stride_qh,
        stride_qoh,
        H,
        c,
        s,
        cols,
        col_mask,
        HALF,
        True,
        FIX_Q,
        BLOCK_H,
    )
    if HAS_K:
        _rotate_heads(
            k_ptr + t * stride_kt,
            ko_ptr + t * stride_kot,
            stride_kh,
            stride_koh,
            HK,
            c,
            s,
            cols,
            col_mask,
            HALF,
            True,
            FIX_K,
            BLOCK_HK,
        )
    if HAS_V:
        _rotate_heads(
            v_ptr + t * stride_vt,
            vo_ptr + t * stride_vot,
            stride_vh,
            stride_voh,
            HK,
            c,
            s,
            cols,
            col_mask,
            HALF,
            False,
            FIX_V,
            BLOCK_HK,
        )


def _heads(t: torch.Tensor, n_tok: int, n_heads: int, head_dim: int, name: str) -> tuple[int, int]:
    """(token stride, head stride) of ``t`` viewed as [n_tok, n_heads, head_dim].

    Accepts [..., n_heads, head_dim] or, for flat rows, [..., n_heads * head_dim] (e.g. a slice
    ``kv_cache[layer, 0, offset:offset + T]`` of shape [T, 256] for a single KV head).
    """
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    try:
        if t.dim() >= 2 and t.shape[-2:] == (n_heads, head_dim):
            v = t.view(-1, n_heads, head_dim) if t.dim() != 3 else t
            st, sh = v.stride(0), v.stride(1)
        elif t.shape[-1] == n_heads * head_dim:
            v = t.view(-1, n_heads * head_dim) if t.dim() != 2 else t
            st, sh = v.stride(0), head_dim
        else:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [..., {n_heads}, {head_dim}]")
    except RuntimeError:  # view(): leading dimensions that do not merge
        raise ValueError(
            f"{name} {tuple(t.shape)} (strides {t.stride()}) cannot be viewed as [tokens, {n_heads}, {head_dim}] "
            "without a copy: pass it contiguous"
        ) from None
    if v.shape[0] != n_tok:
        raise ValueError(f"{name} has {v.shape[0]} tokens, expected {n_tok}")
    return st, sh


def _launch(
    q_in: tuple[torch.Tensor, int, int],
    k_in: tuple[torch.Tensor, int, int] | None,
    v_in: tuple[torch.Tensor, int, int] | None,
    q_out: tuple[torch.Tensor, int, int],
    k_out: tuple[torch.Tensor, int, int] | None,
    v_out: tuple[torch.Tensor, int, int] | None,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    n_tok: int,
    H: int,
    HK: int,
    head_dim: int,
) -> None:
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if positions.numel() != n_tok:
        raise ValueError(f"positions has {positions.numel()} entries, expected {n_tok}")
    if positions.dtype not in (torch.int32, torch.int64) or not positions.is_contiguous():
        raise ValueError("positions must be a contiguous int32/int64 tensor")
    half = head_dim // 2
    if inv_freq.shape != (half,) or inv_freq.dtype != torch.float32 or not inv_freq.is_contiguous():
        raise ValueError(f"inv_freq must be contiguous fp32 [{half}], got {inv_freq.dtype} {list(inv_freq.shape)}")
    if inv_freq.device != positions.device:
        raise ValueError(f"inv_freq is on {inv_freq.device}, positions on {positions.device}: expected one device")
    for name, dst in (("q_out", q_out), ("k_out", k_out), ("v_out", v_out)):
        if dst is not None:
            check_float_buffer(dst[0], q_in[0].device, name)
    if n_tok == 0:
        return
    dummy = (q_in[0], 0, 0)
    k_in, k_out = k_in or dummy, k_out or dummy
    v_in, v_out = v_in or dummy, v_out or dummy
    block_half = triton.next_power_of_2(half)
    _rope_kernel[(n_tok,)](
        q_in[0],
        k_in[0],
        v_in[0],
        q_out[0],
        k_out[0],
        v_out[0],
        positions,
        inv_freq,
        H,
        HK,
        q_in[1],
        q_in[2],
        k_in[1],
        k_in[2],
        v_in[1],
        v_in[2],
        q_out[1],
        q_out[2],
        k_out[1],
        k_out[2],
        v_out[1],
        v_out[2],
        HALF=half,
        HAS_K=k_out is not dummy,
        HAS_V=v_out is not dummy,
        FIX_Q=needs_rtne_fix(q_out[0].dtype),
        FIX_K=needs_rtne_fix(k_out[0].dtype),
        FIX_V=needs_rtne_fix(v_out[0].dtype),
        BLOCK_HALF=block_half,
        BLOCK_H=triton.next_power_of_2(H),
        BLOCK_HK=triton.next_power_of_2(HK),
        num_warps=4 if H * block_half <= 2048 else 8,
    )


def rope(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    base: float = 10000.0,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q [..., H, d] and k [..., HK, d] by integer ``positions`` [...] (HF Gemma RoPE).

    ``q_out`` / ``k_out`` are optional static buffers and may alias ``q`` / ``k`` (in place).
    Returns ``(q_out, k_out)`` (``k_out`` is None when ``k`` is None).
    """
    H, head_dim = q.shape[-2], q.shape[-1]
    n_tok = positions.numel()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format) if q_out is None else q_out
    q_st, q_sh = _heads(q, n_tok, H, head_dim, "q")
    qo_st, qo_sh = _heads(q_out, n_tok, H, head_dim, "q_out")
    k_in = k_o = None
    HK = 1
    if k is not None:
        HK = k.shape[-2]
        k_out = torch.empty_like(k, memory_format=torch.contiguous_format) if k_out is None else k_out
        k_in = (k, *_heads(k, n_tok, HK, head_dim, "k"))
        k_o = (k_out, *_heads(k_out, n_tok, HK, head_dim, "k_out"))
    if inv_freq is None:
        inv_freq = rope_inv_freq(head_dim, base, q.device)
    _launch(
        (q, q_st, q_sh),
        k_in,
        None,
        (q_out, qo_st, qo_sh),
        k_o,
        None,
        positions,
        inv_freq,
        n_tok,
        H,
        HK,
        head_dim,
    )
    return q_out, (k_out if k is not None else None)


def qkv_rope(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    head_dim: int = 256,
    num_kv_heads: int = 1,
    base: float = 10000.0,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
    v_out: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Epilogue of the fused QKV GEMM: split, RoPE q and k, write q, k, v where the caller wants.

    Args:
        qkv: [T, (H + 2*HK) * d] output of ``x @ [Wq; Wk; Wv].T`` (rows may be strided).
        positions: [T] int32/int64 token positions.
        num_heads / head_dim / num_kv_heads: H, d, HK (Gemma: 8, 256, 1).
        q_out: optional [T, H, d] buffer.
        k_out / v_out: optional [T, HK, d] or [T, HK*d] buffers, e.g. ``kv_cache[l, 0, P:P+T]``.

    Returns:
        ``(q [T, H, d], k, v)``: the given buffers, or new tensors of ``qkv``'s dtype.

    ``num_heads=0``: ``qkv`` is the output of a K|V-only GEMM ``x @ [Wk; Wv].T``, for a layer
    whose queries are never read (the prefix's last layer); q is empty.
    """
    H, HK, d = num_heads, num_kv_heads, head_dim
    if qkv.dim() != 2 or qkv.shape[1] != (H + 2 * HK) * d or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be [T, {(H + 2 * HK) * d}] with contiguous rows, got {tuple(qkv.shape)}")
    T = qkv.shape[0]
    if H == 0:  # the kernel's q slot ropes the k heads
        k_out = qkv.new_empty(T, HK, d) if k_out is None else k_out
        v_out = qkv.new_empty(T, HK, d) if v_out is None else v_out
        k_in, v_in = (qkv, qkv.stride(0), d), (qkv[:, HK * d :], qkv.stride(0), d)
        k_dst = (k_out, *_heads(k_out, T, HK, d, "k_out"))
        v_dst = (v_out, *_heads(v_out, T, HK, d, "v_out"))
        inv_freq = rope_inv_freq(d, base, qkv.device) if inv_freq is None else inv_freq
        _launch(k_in, None, v_in, k_dst, None, v_dst, positions, inv_freq, T, HK, HK, d)
        return qkv.new_empty(T, 0, d), k_out, v_out
    if q_out is None:
        q_out = qkv.new_empty(T, H, d)
    if k_out is None:
        k_out = qkv.new_empty(T, HK, d)
    if v_out is None:
        v_out = qkv.new_empty(T, HK, d)
    st = qkv.stride(0)
    q_in = (qkv, st, d)
    k_in = (qkv[:, H * d :], st, d)
    v_in = (qkv[:, (H + HK) * d :], st, d)
    if inv_freq is None:
        inv_freq = rope_inv_freq(d, base, qkv.device)
    _launch(
        q_in,
        k_in,
        v_in,
        (q_out, *_heads(q_out, T, H, d, "q_out")),
        (k_out, *_heads(k_out, T, HK, d, "k_out")),
        (v_out, *_heads(v_out, T, HK, d, "v_out")),
        positions,
        inv_freq,
        T,
        H,
        HK,
        d,
    )
    return q_out, k_out, v_out


# ----------------------------------------------------------------------------- references


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # [..., d/2] each
    return torch.cat((-x2, x1), dim=-1)


def rope_ref(
    q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF Gemma ``GemmaRotaryEmbedding`` + ``apply_rotary_pos_emb`` in fp32 (q [T,H,d], k [T,HK,d])."""
    d = q.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))  # [d/2]
    freqs = positions.reshape(-1).float().cpu()[:, None] * inv_freq[None, :]  # [T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1).to(q.device)  # [T, d]
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [T, 1, d] broadcast over heads

    def apply(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xf = x.float().reshape(-1, shape[-2], d)  # [T, heads, d]
        return (xf * cos + _rotate_half(xf) * sin).reshape(shape).to(x.dtype)

    return apply(q), (apply(k) if k is not None else None)


def qkv_rope_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    head_dim: int = 256,
    num_kv_heads: int = 1,
    base: float = 10000.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference epilogue: split [T, (H+2HK)d] into q/k/v heads, rope q and k; v is copied."""
    T, H, HK, d = qkv.shape[0], num_heads, num_kv_heads, head_dim
    q = qkv[:, : H * d].reshape(T, H, d)
    k = qkv[:, H * d : (H + HK) * d].reshape(T, HK, d)
    v = qkv[:, (H + HK) * d :].reshape(T, HK, d).clone()
    q, k = rope_ref(q, k, positions, base)
    return q, k, v
