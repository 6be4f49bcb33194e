"""Flash-style multi-query attention with pi0 / pi0.5's prefix-padding and block masks.

Gemma 2B and the action expert have 8 query heads and ONE K/V head of dim 256. The kernel
flattens (token, head) into the rows of the query tile, so every row of a tile shares the same
K/V tiles: each K/V tile is loaded once per query tile for all heads (multi-query attention as
one tall matrix). Softmax is online (flash attention) in fp32.

Masking, in openpi's own terms (``make_att_2d_masks``: query i sees key j iff
``cumsum(att)[j] <= cumsum(att)[i]`` and both are non-padding), is expressed per key and per
query with one int32 each:

    key j is visible to query i  <=>  key_blocks[j] <= query_blocks[i]

``attention_key_blocks`` builds ``key_blocks`` from the usual inputs:

* valid prefix key   -> -2**30 (seen by every query),  padded prefix key -> +2**30 (by none);
* suffix key j       -> suffix_blocks[j], the suffix's ``cumsum(att_mask)``: pi0.5: all equal
  (every suffix token sees every suffix token); pi0: [1, 2, 2, ...] (the state token sees
  only itself, the 50 action tokens see the state and each other).

Uses:
* denoise step: q = the suffix's queries [S, 8, 256]; k/v = the layer's cache rows [P + S, 256]
  (the cached prefix followed by the suffix's own k/v, written there by ``qkv_rope``);
  ``query_blocks = suffix_blocks``.
* prefix: q = the prefix's queries, k/v = its keys, ``key_blocks = attention_key_blocks(valid)``,
  ``query_blocks = None`` (all 0): bidirectional among valid tokens. Queries at *padded*
  positions then attend to the valid keys like any other query: a finite value that is never
  used (openpi's own masked softmax produces a different, equally unused value there).

A query row that sees no key at all returns zeros (not NaN).

For few query rows (the 51-token suffix is 408 rows, 13 tiles of 32 for 132 SMs) the keys are split
across programs (flash-decoding): each split writes an unnormalised partial (acc, max, sum) and
a small combine kernel merges them. ``num_splits`` picks it; by default a heuristic on the SM
count (1 on the interpreter).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import check_float_buffer, dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne

__all__ = ["attention", "attention_ref", "attention_key_blocks", "BLOCK_VISIBLE", "BLOCK_MASKED"]

BLOCK_VISIBLE = -(2**30)  # key block id of a valid prefix key: visible to every query
BLOCK_MASKED = 2**30  # key block id of a padded key: visible to no query
_LOG2E = 1.4426950408889634


@triton.jit
def online_softmax(s, m_i, l_i):
    """One key tile of the streaming softmax, scores `s` [rows, keys] in the exp2 domain:
    (p, the rescale of what came before, the new running max, the new running sum). A row that
    has seen no visible key yet keeps m = -inf; 0 is subtracted instead, so that exp2(-inf - m)
    is 0, not NaN. Shared by every attention kernel here."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _attn_fwd_tile(
    pid_m,
    pid_s,
    b,
    n_splits,
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    kb_ptr,
    qb_ptr,
    ws_acc_ptr,
    ws_m_ptr,
    ws_l_ptr,
    M,
    H,
    Tk,
    keys_per_split,
    qk_scale,  # softmax scale * log2(e): scores live in the exp2 domain
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_kbb,
    stride_qbb,
    HEAD_DIM: tl.constexpr,
    HAS_KB: tl.constexpr,
    HAS_QB: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CACHE: tl.constexpr,  # cache modifier of the q load ('.cg' inside a persistent kernel)
):
    """One (query tile, key split) of the forward pass; also called by kernels.expert_step."""
    b = b.to(tl.int64)

    # Rows of the tile are (token, head) pairs: row = token * H + head.
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    tok = (rows // H).to(tl.int64)
    head = rows % H
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    q = tl.load(
        q_ptr + b * stride_qb + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
        cache_modifier=CACHE,
    )
    if UPCAST:
        q = q.to(tl.float32)
    if HAS_QB:
        q_blk = tl.load(qb_ptr + b * stride_qbb + tok, mask=row_ok, other=0)
    else:
        q_blk = tl.zeros([BLOCK_M], dtype=tl.int32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    n_start = pid_s * keys_per_split
    n_end = tl.minimum(n_start + keys_per_split, Tk)
    for n0 in range(n_start, n_end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < n_end
        kv_mask = col_ok[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr + b * stride_kb + cols[:, None].to(tl.int64) * stride_kt + d[None, :], mask=kv_mask, other=0.0
        )
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # [BLOCK_M, BLOCK_N]

        if HAS_KB:
            k_blk = tl.load(kb_ptr + b * stride_kbb + cols, mask=col_ok, other=2**30)
            visible = (k_blk[None, :] <= q_blk[:, None]) & col_ok[None, :]
        else:
            visible = col_ok[None, :]  # every key in range (broadcast over rows)
        s = tl.where(visible, s, float("-inf"))

        p, alpha, m_new, l_i = online_softmax(s, m_i, l_i)

        v = tl.load(
            v_ptr + b * stride_vb + cols[:, None].to(tl.int64) * stride_vt + d[None, :], mask=kv_mask, other=0.0
        )
        p = p.to(v_ptr.dtype.element_ty)  # flash-attention practice: P in the K/V dtype for the MMA
        if UPCAST:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)
        m_i = m_new

    if SPLIT:
        # Unnormalised partial result of this key split: [B, splits, M, D], [B, splits, M] x 2.
        ws_row = (b * n_splits + pid_s) * M + rows.to(tl.int64)
        tl.store(ws_acc_ptr + ws_row[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(ws_m_ptr + ws_row, m_i, mask=row_ok)
        tl.store(ws_l_ptr + ws_row, l_i, mask=row_ok)
    else:
        # Rows that saw no visible key have acc = 0 and l = 0: divide by 1 to return zeros.
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        if FIX_O:
            o = round_bf16_rtne(o)
        tl.store(
            o_ptr + b * stride_ob + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )


@triton.jit
def _attn_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    kb_ptr,
    qb_ptr,
    ws_acc_ptr,
    ws_m_ptr,
    ws_l_ptr,
    M,
    H,
    Tk,
    keys_per_split,
    qk_scale,  # softmax scale * log2(e): scores live in the exp2 domain
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_kbb,
    stride_qbb,
    HEAD_DIM: tl.constexpr,
    HAS_KB: tl.constexpr,
    HAS_QB: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    _attn_fwd_tile(
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        tl.num_programs(1),
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        kb_ptr,
        qb_ptr,
        ws_acc_ptr,
        ws_m_ptr,
        ws_l_ptr,
        M,
        H,
        Tk,
        keys_per_split,
        qk_scale,
        stride_qb,
        stride_qt,
        stride_qh,
        stride_kb,
        stride_kt,
        stride_vb,
        stride_vt,
        stride_ob,
        stride_ot,
        stride_oh,
        stride_kbb,
        stride_qbb,
        HEAD_DIM,
        HAS_KB,
        HAS_QB,
        SPLIT,
        UPCAST,
        PREC,
        FIX_O,
        BLOCK_M,
        BLOCK_N,
        BLOCK_D,
        "",
    )


@triton.jit
def _attn_combine_tile(
    pid_m,
    pid_d,
    b,
    ws_acc_ptr,
    ws_m_ptr,
    ws_l_ptr,
    o_ptr,
    M,
    H,
    stride_ob,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DC: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CACHE: tl.constexpr,  # cache modifier of the partial loads
):
    # Merge the key splits of BLOCK_M rows x BLOCK_DC columns. All splits' (max, sum) are read
    # at once, so the partial loads below are independent of each other (no serial chain).
    b = b.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    d = pid_d * BLOCK_DC + tl.arange(0, BLOCK_DC)
    mask = row_ok[:, None] & (d < HEAD_DIM)[None, :]

    sp = tl.arange(0, BLOCK_S)
    ws_rows = (b * NUM_SPLITS + sp[:, None]) * M + rows[None, :].to(tl.int64)  # [BLOCK_S, BLOCK_M]
    s_mask = (sp < NUM_SPLITS)[:, None] & row_ok[None, :]
    m_s = tl.load(ws_m_ptr + ws_rows, mask=s_mask, other=float("-inf"), cache_modifier=CACHE)
    l_s = tl.load(ws_l_ptr + ws_rows, mask=s_mask, other=0.0, cache_modifier=CACHE)
    m_max = tl.max(m_s, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)  # no visible key in any split
    l_tot = tl.sum(tl.math.exp2(m_s - m_safe[None, :]) * l_s, axis=0)

    acc = tl.zeros([BLOCK_M, BLOCK_DC], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        row_s = (b * NUM_SPLITS + s) * M + rows.to(tl.int64)
        m_one = tl.load(ws_m_ptr + row_s, mask=row_ok, other=float("-inf"), cache_modifier=CACHE)
        a_s = tl.load(ws_acc_ptr + row_s[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0, cache_modifier=CACHE)
        acc += a_s * tl.math.exp2(m_one - m_safe)[:, None]

    o = acc / tl.where(l_tot > 0.0, l_tot, 1.0)[:, None]  # no visible key at all: zeros
    if FIX_O:
        o = round_bf16_rtne(o)
    tok = (rows // H).to(tl.int64)
    head = rows % H
    tl.store(
        o_ptr + b * stride_ob + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _attn_combine_kernel(
    ws_acc_ptr,
    ws_m_ptr,
    ws_l_ptr,
    o_ptr,
    M,
    H,
    stride_ob,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FIX_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DC: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    _attn_combine_tile(
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        ws_acc_ptr,
        ws_m_ptr,
        ws_l_ptr,
        o_ptr,
        M,
        H,
        stride_ob,
        stride_ot,
        stride_oh,
        HEAD_DIM,
        NUM_SPLITS,
        FIX_O,
        BLOCK_M,
        BLOCK_DC,
        BLOCK_S,
        "",
    )


# ----------------------------------------------------------------------------- launch helpers

_DEVICE_INFO: dict[int, tuple[int, int]] = {}


def _device_info(device: torch.device) -> tuple[int, int]:
    """(SM count, opt-in shared memory per block in bytes), cached per CUDA device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _DEVICE_INFO:
        props = torch.cuda.get_device_properties(idx)
        smem = getattr(props, "shared_memory_per_block_optin", 0) or 0
        _DEVICE_INFO[idx] = (props.multi_processor_count, int(smem))
    return _DEVICE_INFO[idx]


def _launch_settings(B: int, M: int, Tk: int, D: int, sms: int | None, smem: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, num_splits) without autotuning, for a GPU with
    `sms` SMs and `smem` bytes of opt-in shared memory per block (0: unknown, taken as large);
    sms None: the interpreter.

    Measured on the H200 (bf16, d 256, 8 heads): the pi0 suffix (51 tokens = 408 rows over
    968 + 51 keys) is latency-bound: 32 x 64 tiles, 4 warps, 2 stages and 8 key splits
    (104 programs + combine) take ~10 us against ~50 us unsplit and ~100 us for torch SDPA;
    the prefix (968 tokens = 7744 rows) is compute-bound: 128 x 64 tiles on 8 warps (two
    warpgroups per CTA), 2 stages, and as many key splits as fill the SMs once (2: 122 CTAs):
    32.7 us (~225 TFLOP/s) against 39.9 for 64 x 32 tiles on 4 warps (one CTA of 255 registers
    per SM), and 92 us less per prefix in the captured stage (bench/fused_ab.py, 5 rounds).
    Shared memory (`_smem_bytes`, a conservative model: Triton allocates less, e.g. 128 KB for
    the prefix's tiles where the model says 192): 192 KB for the prefix's tiles, 144 KB for the
    suffix's, within Hopper's and datacenter Blackwell / Thor's 227 KB; GPUs with less opt-in
    shared memory (e.g. 99 KB) get 32-key tiles and 2 stages (96 KB at 64 rows, 80 KB at 32).
    Heads wider than 256 shrink the tiles; a launch that still would not fit drops stages.
    Interpreter: one tile as large as the problem allows, no split (its cost is per program).
    """
    if sms is None:
        bm = min(64, max(16, triton.next_power_of_2(M)))
        return bm, min(64, max(16, triton.next_power_of_2(Tk))), 4, 1, 1
    bm, bn, warps, stages, splits = _heuristic(B, M, Tk, D, sms, smem)
    while stages > 1 and smem and _smem_bytes(bm, bn, D, stages) > smem:
        stages -= 1  # very wide heads on a GPU with little shared memory
    return bm, bn, warps, stages, splits


def _heuristic(B: int, M: int, Tk: int, D: int, sms: int, smem: int) -> tuple[int, int, int, int, int]:
    """`_launch_settings` on a GPU, before the shared-memory check."""
    block_d = _block_d(D)
    big_smem = smem == 0 or smem >= 200 * 1024
    scale_d = max(1, block_d // 256)  # wider heads: shrink tiles to stay in shared memory
    if B * triton.cdiv(M, 64) >= sms // 2:
        if not big_smem:
            return max(16, 64 // scale_d), max(16, 32 // scale_d), 4, 2, 1
        bm, bn = max(16, 128 // scale_d), max(16, 64 // scale_d)
        return bm, bn, 8, 2, max(1, min(sms // (B * triton.cdiv(M, bm)), triton.cdiv(Tk, bn)))
    bm, bn = max(16, 32 // scale_d), max(16, (64 if big_smem else 32) // scale_d)
    work = B * triton.cdiv(M, bm)
    splits = max(1, min(triton.cdiv(3 * sms // 4, work), triton.cdiv(Tk, bn)))
    return bm, bn, 4, 2, splits


def _block_d(D: int) -> int:
    """The head dim as the kernels tile it: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(D))


def _smem_bytes(block_m: int, block_n: int, D: int, stages: int, elem: int = 2) -> int:
    """Shared memory of a launch: the Q tile, and a K and a V tile per pipeline stage."""
    return elem * _block_d(D) * (block_m + 2 * block_n * stages)


def _as_batched(t: torch.Tensor, ndim: int, name: str) -> torch.Tensor:
    if t.dim() == ndim - 1:
        return t.unsqueeze(0)
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim - 1} or {ndim} dims, got {tuple(t.shape)}")
    return t


def _kv_rows(t: torch.Tensor, batched: bool, name: str) -> torch.Tensor:
    """[Tk, D] / [Tk, 1, D] (or with a leading batch dim when q has one) -> [B, Tk, D] view."""
    base = 3 if batched else 2
    if t.dim() == base + 1 and t.shape[-2] == 1:
        t = t.squeeze(-2)
    if t.dim() != base:
        raise ValueError(f"{name} must be [{'B, ' if batched else ''}Tk, (1,) D], got {tuple(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    return t if batched else t.unsqueeze(0)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_blocks: torch.Tensor | None = None,
    query_blocks: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    workspace: torch.Tensor | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Multi-query attention ``softmax(q k^T * scale + mask) v`` with block-id masking.

    Args:
        q: [Tq, H, D] or [B, Tq, H, D] queries (last dim contiguous; any token/head strides).
        k, v: [Tk, D] (or [Tk, 1, D], optionally with a leading batch dim): the single K/V
            head, rows may be strided (e.g. ``kv_cache[layer, 0, :P + S]``).
        key_blocks: int32 [Tk] or [B, Tk] (see ``attention_key_blocks``); None: all visible.
        query_blocks: int32 [Tq] or [B, Tq]; None: all 0.
        scale: softmax scale, default ``D ** -0.5`` (Gemma: 1/16).
        out: optional static [.., Tq, H, D] output (any strides with contiguous last dim).
        num_splits: key splits (flash-decoding); None: heuristic (1 on the interpreter; computed
            for the heuristic's tiles, also when `block_m` / `block_n` override them).
        block_m / block_n / num_warps / num_stages: launch settings; None: heuristic.
        workspace: optional fp32 buffer of at least ``B * num_splits * Tq * H * (D + 2)``
            elements for the split partials (allocated per call if None).
    """
    q4 = _as_batched(q, 4, "q")
    k3, v3 = _kv_rows(k, q.dim() == 4, "k"), _kv_rows(v, q.dim() == 4, "v")
    B, Tq, H, D = q4.shape
    if D == 0:  # the default scale 1 / sqrt(D)
        raise ValueError(f"q has head dim 0 (shape {tuple(q.shape)}); expected at least 1")
    Tk = k3.shape[1]
    if q4.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")
    if k3.shape != (B, Tk, D) or v3.shape != (B, Tk, D):
        raise ValueError(f"k/v must be [{Tk}, {D}] per batch, got {tuple(k.shape)} / {tuple(v.shape)}")
    if k3.dtype != q4.dtype or v3.dtype != q4.dtype:
        raise ValueError("q, k and v must share a dtype")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    o4 = _as_batched(out, 4, "out")
    if tuple(o4.shape) != (B, Tq, H, D) or o4.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} with a contiguous last dim")
    check_float_buffer(out, q.device)

    kb = qb = None
    if key_blocks is not None:
        kb = _as_batched(key_blocks, 2, "key_blocks")
        if kb.shape[-1] != Tk or kb.shape[0] not in (1, B) or kb.dtype != torch.int32 or kb.stride(-1) != 1:
            raise ValueError(f"key_blocks must be contiguous int32 [{Tk}] (per batch)")
    if query_blocks is not None:
        qb = _as_batched(query_blocks, 2, "query_blocks")
        if qb.shape[-1] != Tq or qb.shape[0] not in (1, B) or qb.dtype != torch.int32 or qb.stride(-1) != 1:
            raise ValueError(f"query_blocks must be contiguous int32 [{Tq}] (per batch)")

    M = Tq * H
    if M == 0 or B == 0:
        return out
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    gpu = not is_interpreting() and q.device.type == "cuda"
    sms, smem = _device_info(q.device) if gpu else (None, 0)
    bm, bn, warps, stages, splits = _launch_settings(B, M, Tk, D, sms, smem)
    bm, bn = block_m or bm, block_n or bn
    warps, stages = num_warps or warps, num_stages or stages
    block_d = _block_d(D)
    m_tiles = triton.cdiv(M, bm)
    num_splits = max(1, min(int(num_splits or splits), max(1, triton.cdiv(Tk, bn))))
    # Whole key tiles per split, and no empty split.
    keys_per_split = triton.cdiv(triton.cdiv(max(Tk, 1), num_splits), bn) * bn
    num_splits = max(1, triton.cdiv(Tk, keys_per_split))
    split = num_splits > 1

    if split:
        need = B * num_splits * M * (D + 2)
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.float32, device=q.device)
        if workspace.dtype != torch.float32 or workspace.numel() < need or not workspace.is_contiguous():
            raise ValueError(f"workspace must be contiguous fp32 with >= {need} elements")
        n_acc = B * num_splits * M * D
        ws_acc = workspace[:n_acc]
        ws_m = workspace[n_acc : n_acc + B * num_splits * M]
        ws_l = workspace[n_acc + B * num_splits * M : need]
    else:
        ws_acc = ws_m = ws_l = o4

    fix_o = needs_rtne_fix(o4.dtype)
    _attn_fwd_kernel[(m_tiles, num_splits, B)](
        q4,
        k3,
        v3,
        o4,
        kb if kb is not None else q4,
        qb if qb is not None else q4,
        ws_acc,
        ws_m,
        ws_l,
        M,
        H,
        Tk,
        keys_per_split,
        float(scale) * _LOG2E,
        q4.stride(0),
        q4.stride(1),
        q4.stride(2),
        k3.stride(0),
        k3.stride(1),
        v3.stride(0),
        v3.stride(1),
        o4.stride(0),
        o4.stride(1),
        o4.stride(2),
        (kb.stride(0) if kb is not None and kb.shape[0] > 1 else 0),
        (qb.stride(0) if qb is not None and qb.shape[0] > 1 else 0),
        HEAD_DIM=D,
        HAS_KB=kb is not None,
        HAS_QB=qb is not None,
        SPLIT=split,
        UPCAST=is_interpreting(),  # the 3.9 interpreter's tl.dot mis-multiplies bf16 (raw bits)
        PREC=dot_precision(q.dtype),
        FIX_O=fix_o,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_D=block_d,
        num_warps=warps,
        num_stages=stages,
    )
    if split:
        if is_interpreting():
            cm, cdc = min(64, max(16, triton.next_power_of_2(M))), block_d
        else:
            cm, cdc = 16, min(64, block_d)
        _attn_combine_kernel[(triton.cdiv(M, cm), triton.cdiv(block_d, cdc), B)](
            ws_acc,
            ws_m,
            ws_l,
            o4,
            M,
            H,
            o4.stride(0),
            o4.stride(1),
            o4.stride(2),
            HEAD_DIM=D,
            NUM_SPLITS=num_splits,
            FIX_O=fix_o,
            BLOCK_M=cm,
            BLOCK_DC=cdc,
            BLOCK_S=triton.next_power_of_2(num_splits),
            num_warps=4,
        )
    return out


def attention_key_blocks(
    prefix_valid: torch.Tensor | None,
    suffix_blocks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """int32 key block ids [..., P + S] for ``attention``: the cached prefix, then the suffix.

    Args:
        prefix_valid: bool [..., P] (True = real token, False = padding), or None for no prefix.
        suffix_blocks: int [..., S] = ``cumsum(att_mask)`` over the suffix tokens (>= 0), or None.
        out: optional static int32 buffer [..., P + S] (computed on-device, no host sync).
    """
    parts = []
    if prefix_valid is not None:
        parts.append(
            torch.where(
                prefix_valid.bool(),
                torch.tensor(BLOCK_VISIBLE, dtype=torch.int32, device=prefix_valid.device),
                torch.tensor(BLOCK_MASKED, dtype=torch.int32, device=prefix_valid.device),
            )
        )
    if suffix_blocks is not None:
        parts.append(suffix_blocks.to(torch.int32))
    if not parts:
        raise ValueError("give prefix_valid, suffix_blocks or both")
    blocks = torch.cat(parts, dim=-1)
    if out is None:
        return blocks.contiguous()
    out.copy_(blocks)
    return out


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_blocks: torch.Tensor | None = None,
    query_blocks: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Plain torch: explicit [B, Tq, Tk] mask, scores and softmax in fp32, empty rows -> 0."""
    batched = q.dim() == 4
    q4 = q if batched else q.unsqueeze(0)  # [B, Tq, H, D]
    k3, v3 = _kv_rows(k, batched, "k").float(), _kv_rows(v, batched, "v").float()  # [B, Tk, D]
    B, Tq, H, D = q4.shape
    Tk = k3.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kb = torch.full((B, Tk), BLOCK_VISIBLE, dtype=torch.int64, device=q.device)
    if key_blocks is not None:
        kb = (key_blocks if key_blocks.dim() == 2 else key_blocks[None]).long().expand(B, Tk)
    qb = torch.zeros(B, Tq, dtype=torch.int64, device=q.device)
    if query_blocks is not None:
        qb = (query_blocks if query_blocks.dim() == 2 else query_blocks[None]).long().expand(B, Tq)
    mask = kb[:, None, :] <= qb[:, :, None]  # [B, Tq, Tk]
    scores = torch.einsum("bthd,bkd->bthk", q4.float(), k3) * scale  # [B, Tq, H, Tk]
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: NaN -> 0
    o = torch.einsum("bthk,bkd->bthd", probs, v3).to(q.dtype)  # [B, Tq, H, D]
    return o if batched else o[0]
