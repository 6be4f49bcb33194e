"""The action expert's pass of one denoise step (every decoder layer + the final norm) as ONE
persistent launch.

At 50 tokens a layer streams ~35 MB of weights, ~10 us at HBM speed, but as 6-9 separate kernels
each one pays its launch, its first loads and its tail (~5-9 us each, measured on the H200), so a
step was latency-bound. Here one program per SM stays resident and walks every layer's phases,
separated by a grid-wide barrier (an arrival counter in global memory; `_arrive`, `_wait`):

    0  h += gate * Σ down partials (previous layer) ; x_attn = norm(h)        units: rows
    1  x_attn @ Wqkv.T -> RoPE -> q ; k, v into the cache's suffix rows       units: column-pair tiles
    2  attention scores over the cached prefix + suffix -> P, row stats       units: (query tile, key tile)
    3  P @ V, normalised -> attn [M, H*D]                                     units: (row tile, d tile)
    4  attn @ Wo.T -> split-K partials                                       units: (column tile, split)
    5  h += gate * Σ O partials ; x_mlp = norm(h)                             units: rows
    6  x_mlp @ Wgu.T -> gelu_tanh(g) * u -> act                               units: column-pair tiles
    7  act @ Wdown.T -> split-K partials (summed by the next layer's phase 0)

and after the last layer: h += its down output, x = final norm(h), and optionally the denoise
update of the action rows (velocity, Euler step, the next pass's input; kernels/denoise_update.py)
in two more grid-wide phases (`_denoise_tail`).
Split-K partials are reduced where they are read (phase 0 / 5), in split order: deterministic.

Norms are exactly the eager model's: pi0.5's adaRMS ``rms(h) * (1 + scale) + shift`` with the
gated residual ``h + y * gate``, or pi0's RMSNorm ``(1 + w)`` with a plain residual; the GEMM
output, ``y * gate`` and ``h`` are rounded to bf16 where the eager model stores them.

All programs must be resident at once (the barrier waits for every one): the grid is one
program per SM, launched cooperatively. On the interpreter (CI) the grid is one program, which
runs every unit of every phase in order.

Measured (H200, pi0.5 expert, 50 tokens, 968 + 50 keys; docs/results/README.md): ~682 us per
step alone, against ~950 us for the same work as separate kernels. Per layer (phase trace): QKV +
RoPE 5.9 us, attention 8.6, gate|up 6.1, down 3.2, the row phases 2.1 + 1.3, combine 1.9, O 2.1,
and ~1.3-1.6 us per barrier. Three things on the way there: the barrier's thread 0 alone polls
(`_wait`; 712 against 732 us with every thread polling); each program asks L2 for its next GEMM
tile's weights between arriving at the barrier and leaving it (`_prefetch_rows`; 696 against
713-717 us); and the QKV phase's free programs fetch the layer's gate|up weights into L2
(`_prefetch_span`; 682 against 696). RoPE's cos / sin come from a
table made once per decision (`rope_table`): computed here they cost ~1 us per layer and (Triton
3.6) the kernel's only spills. Measured and dropped: six phases per layer, with the norms inside
the GEMMs and the residuals closed by each column tile's last split-K arrival (871 us at its best
tiles: the last-arrival tails cost more than the row phases and barriers they save); L2 prefetch
of a whole layer's weights / cache rows ahead of its phases with ``cp.async.bulk.prefetch.L2``
(925-964 us: issuing it stalls its phase by 8-11 us); QKV and gate|up on FP8 operands (827 vs
742 us: halving their bytes gained 0.2-0.4 us, and O / down slowed). The attention phase reads
its tiles through TMA descriptors on sm_90+ (`_attn_tile_tma`; 671.2 vs 681.0 us per step).
The denoise update as the launch's tail saves ~6-9 us per step against the same update as its
own launch after the step (bench/expert_step.py).

Phases 2 and 3 on Hopper are the two-pass attention (`att_two_pass`): the scores as one tile per
(query tile, key tile), P stored relative to each tile's row max, then P @ V with every tile's
rescale known before the loop: no unit walks a chain of dependent softmax steps, and the output
needs no combine. 650.5 vs 664.0 us per step (H200, 5 alternating rounds) against the split path
(flash-style partials over key splits, then a combine phase), which other archs keep.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ._common import dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne, same_device
from .attention import _attn_combine_tile, _attn_fwd_tile, online_softmax
from .denoise_update import DenoiseUpdate, euler, next_input_part, velocity_part
from .gate_up_geglu import deinterleave_gate_up, interleave_gate_up

__all__ = ["PHASES", "ExpertStepPlan", "ExpertWeights", "expert_step_ref", "rope_table", "two_pass_by_default"]

_LOG2E = 1.4426950408889634
PHASES = 8  # per layer, each ended by a grid barrier
UPDATE_MAX_ACTIONS = 64  # action dims the denoise tail holds (its workspace is sized for them)


@triton.jit
def _arrive(bar_ptr, GPU: tl.constexpr):
    """This program's arrival at a grid barrier (release): once all of its threads are done,
    thread 0 adds 1 to the launch's counter. Split from `_wait` so that a program can issue
    work that needs no one else (the next phase's L2 prefetches) while the others finish."""
    tl.debug_barrier()
    if GPU:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "@p red.release.gpu.global.add.u32 [$1], 1; mov.u32 $0, 0; }",
            "=r,l", [bar_ptr], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    else:
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(bar_ptr, target, GPU: tl.constexpr):
    """Wait until the counter reaches `target` arrivals (acquire). On the GPU thread 0 alone
    polls with ``ld.acquire`` while the other threads wait at the CTA barrier (cooperative
    groups' grid sync; labels unique per inlined copy through LLVM's ``${:uid}``): 712 against
    732 us per step for every thread polling with plain loads and one acquire read-modify-write
    after. Measured worse: a flag per program polled by every thread (823) or by warp 0 (908),
    thread 0 polling with relaxed loads and one acquire fence after (744)."""
    if GPU:
        tl.inline_asm_elementwise(
            """{
            .reg .pred p, q;
            .reg .u32 t, v;
            mov.u32 t, %tid.x;
            setp.ne.u32 p, t, 0;
            @p bra DONE_${:uid};
            POLL_${:uid}:
            ld.acquire.gpu.global.u32 v, [$1];
            setp.lt.u32 q, v, $2;
            @q bra POLL_${:uid};
            DONE_${:uid}:
            mov.u32 $0, 0;
            }""",
            "=r,l,r", [bar_ptr, target], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    else:  # the interpreter (one program)
        seen = tl.load(bar_ptr, volatile=True)
        while seen < target:
            seen = tl.load(bar_ptr, volatile=True)
        tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _prefetch_lines(ptrs):
    """Ask L2 for the 128-byte line at each pointer (no wait, no registers held)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _prefetch_rows(w_ptr, wrow, k_lo, stride_w, K_LEN: tl.constexpr):
    """L2 prefetch of weight rows `wrow`, columns [k_lo, k_lo + K_LEN) (2-byte elements), one
    ``prefetch.global.L2`` per 128-byte line. Issued for the program's tile in the next GEMM
    phase (QKV, O, down; gate|up where `_prefetch_span` does not run) between arriving at the
    barrier and leaving it, so that the GEMM's first loads hit L2: 691.8-700.2 against
    710.7-717.5 us per step in three runs of 7-9 alternating rounds (then with gate|up's tile
    too: O 2.8 -> 2.0 us, gate|up 6.9 -> 5.7, down 4.4 -> 3.2-3.4, and the barrier before
    gate|up +0.8, issuing its 1024 lines outlasting the wait). Measured worse: issued before
    arriving (707.0 vs 711.9: the arrival waits for the issue), before arriving by the programs
    without a unit in the phase (699.2 vs 695.9), one barrier earlier (708.4), as bulk requests
    (``cp.async.bulk.prefetch.L2``, one per row segment: 717.6 vs 700.2, each stalls ~1.4 us),
    and with the layer's prefix K / V rows before QKV (696.6 vs 691.8)."""
    row = w_ptr + wrow.to(tl.int64)[:, None] * stride_w + k_lo
    for c in tl.static_range(0, K_LEN, 512):  # 8 lines a round (narrow rows: the same line again)
        _prefetch_lines(row + tl.minimum(c + tl.arange(0, 8) * 64, K_LEN - 1)[None, :])


@triton.jit
def _layer_zero(layer, GPU: tl.constexpr):
    """0, computed anew in each layer so that the compiler cannot see through it: every phase
    rebuilds its addresses from it instead of LLVM hoisting them out of the layer loop or
    stepping them across layers as induction variables. Measured on the H200: 767 against
    806 us per step (bench/expert_step.py, the two kernels one after the other on one machine).
    Written against an offline build that carried ~70 per-thread weight addresses around the
    loop; that build lacked the JIT's specialisation (see scripts/compile_check.py), and the
    specialised one carries 6, so why it pays is not pinned down."""
    if GPU:
        return tl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    return layer * 0


@triton.jit
def _now():
    """The GPU's global nanosecond timer (PTX %globaltimer; GPU only)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _prefetch_span(ptr, n, part, parts):
    """L2 prefetch of ptr[0:n] (2-byte elements) dealt out over `parts` programs, this one being
    `part`: rounds of 128 lines, one per thread (4 warps). The QKV phase's free programs (52 of
    132 on the H200) fetch the layer's gate|up weights this way, in place of each program its
    own tile at the barrier before gate|up: 681.6 against 696.3 us per step (9 alternating
    rounds; 686.7 vs 698.7 in another run), QKV 4.8 -> 5.9 us, gate|up 6.6 -> 6.1, the row
    phase before it 1.9 -> 1.3 and its barrier 2.0 -> 1.4. The down weights as well: 710.4
    (QKV 7.1 us); as one bulk request per thread: 682.3 (the same)."""
    lines = tl.cdiv(n, 64)
    for first in range(part * 128, lines, parts * 128):
        _prefetch_lines(ptr + tl.minimum(first + tl.arange(0, 128), lines - 1).to(tl.int64) * 64)


@triton.jit
def _prefetch_qkv(wqkv, u, WE: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BN: tl.constexpr):
    """Unit u's QKV weight rows (phase 1): a column tile of one head and its rotate_half pair,
    2 * BN consecutive rows in the interleaved layout (`ExpertStepPlan.lay_out`)."""
    CH: tl.constexpr = D // 2 // BN
    if u < (H + 2) * CH:
        _prefetch_rows(wqkv, (u // CH) * D + (u % CH) * 2 * BN + tl.arange(0, 2 * BN), 0, WE, WE)


@triton.jit
def _prefetch_split_k(w, u, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, KS: tl.constexpr):
    """Unit u's weight tile in a split-K phase (O: phase 4, down: phase 7), as
    `_split_k_partials` maps it: BN output rows x one K split of KS."""
    if u < (N // BN) * (K // KS):
        _prefetch_rows(w, (u % (N // BN)) * BN + tl.arange(0, BN), (u // (N // BN)) * KS, K, KS)


@triton.jit
def _prefetch_gate_up(wgu, u, WE: tl.constexpr, FF: tl.constexpr, BN: tl.constexpr):
    """Unit u's gate and up weight rows (phase 6; interleaved: 2 * BN consecutive rows)."""
    if u < FF // BN:
        _prefetch_rows(wgu, u * 2 * BN + tl.arange(0, 2 * BN), 0, WE, WE)


@triton.jit
def _phase_arrive(bar_ptr, trace_ptr, idx, TRACE: tl.constexpr, GPU: tl.constexpr):
    """End of phase `idx`; with TRACE, the time the last program finished it (atomic max)."""
    if TRACE:
        tl.atomic_max(trace_ptr + 2 * idx, _now())
    _arrive(bar_ptr, GPU)


@triton.jit
def _phase_wait(bar_ptr, target, trace_ptr, idx, pid, TRACE: tl.constexpr, GPU: tl.constexpr):
    """The barrier after phase `idx`; with TRACE, the time program 0 left it."""
    _wait(bar_ptr, target, GPU)
    if TRACE:
        if pid == 0:
            tl.store(trace_ptr + 2 * idx + 1, _now())


@triton.jit
def _round(x, FIX: tl.constexpr, dtype: tl.constexpr):
    """x rounded to `dtype` and back to fp32 (what a store and a load in the eager model give)."""
    if FIX:
        return round_bf16_rtne(x)
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rope_store(
    lo, hi, head, rows, row_ok, cols, col_ok, q_ptr, k_ptr, v_ptr, rope_ptr, M, stride_kt,
    H: tl.constexpr, D: tl.constexpr, FIX: tl.constexpr,
):  # fmt: skip
    """Columns `cols` (lo) and `cols + D/2` (hi) of QKV head `head` (q heads, then k, then v):
    q and k rotated by Gemma's rotate_half RoPE at each row's position (cos / sin read from
    `rope_table`'s [2, M, D/2]); q to q [M, H, D], k / v to their cache rows."""
    cs = rope_ptr + rows[:, None] * (D // 2) + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    rotate = tl.minimum(tl.maximum(H + 1 - head, 0), 1)  # 1 for q and k heads; v is copied
    c = tl.load(cs, mask=mask, other=1.0) * rotate + (1.0 - rotate)
    s = tl.load(cs + M * (D // 2), mask=mask, other=0.0) * rotate
    o_lo = lo * c - hi * s
    o_hi = hi * c + lo * s
    if FIX:
        o_lo = round_bf16_rtne(o_lo)
        o_hi = round_bf16_rtne(o_hi)
    r64 = rows.to(tl.int64)[:, None]
    if head < H:
        p = q_ptr + r64 * (H * D) + head * D + cols[None, :]
    elif head == H:
        p = k_ptr + r64 * stride_kt + cols[None, :]
    else:
        p = v_ptr + r64 * stride_kt + cols[None, :]
    tl.store(p, o_lo.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(p + D // 2, o_hi.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_store(g, u, rows, row_ok, cols, col_ok, act_ptr, FF: tl.constexpr, FIX: tl.constexpr):
    """act = gelu_tanh(gate) * up (Gemma's MLP activation) for one column tile."""
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    y = 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0)) * u
    if FIX:
        y = round_bf16_rtne(y)
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(act_ptr + rows.to(tl.int64)[:, None] * FF + cols[None, :], y.to(act_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _residual_norm_row(
    row,
    h_ptr,
    part_ptr,
    gate_ptr,
    mult_ptr,
    shift_ptr,
    x_ptr,
    eps,
    has_part,
    WE: tl.constexpr,
    N_PARTS: tl.constexpr,
    BM: tl.constexpr,
    GATED: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    FIX: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_W)
    ok = cols < WE
    hp = h_ptr + row * WE + cols
    h = tl.load(hp, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    if has_part:
        y = tl.zeros([BLOCK_W], dtype=tl.float32)
        for s in tl.static_range(N_PARTS):
            y += tl.load(part_ptr + (s * BM + row) * WE + cols, mask=ok, other=0.0, cache_modifier=".cg")
        y = _round(y, FIX, h_ptr.dtype.element_ty)  # the sub-layer's GEMM output, as stored
        if GATED:
            y = _round(y * tl.load(gate_ptr + cols, mask=ok, other=0.0), FIX, h_ptr.dtype.element_ty)
        h = _round(h + y, FIX, h_ptr.dtype.element_ty)
        tl.store(hp, h.to(h_ptr.dtype.element_ty), mask=ok)
    r = tl.math.rsqrt(tl.sum(h * h, axis=0) / WE + eps)
    x = h * r * tl.load(mult_ptr + cols, mask=ok, other=0.0)
    if HAS_SHIFT:
        x += tl.load(shift_ptr + cols, mask=ok, other=0.0)
    x = _round(x, FIX, x_ptr.dtype.element_ty)
    tl.store(x_ptr + row * WE + cols, x.to(x_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _tile_dot(
    a_ptr,
    stride_a,
    rows,
    row_ok,
    k_lo,
    k_hi,
    w_ptr,
    wrow,
    col_ok,
    stride_w,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] of a @ w.T over k in [k_lo, k_hi), w's rows `wrow`."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_a
    w_cols = w_ptr + wrow.to(tl.int64)[None, :] * stride_w
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        # activations were written by other programs in this launch: read them from L2
        a = tl.load(a_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg")
        wm = k_ok[:, None] & col_ok[None, :]
        w = tl.load(w_cols + ks[:, None], mask=wm, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PREC)
    return acc


@triton.jit
def _split_k_partials(
    u,
    a_ptr,
    w_ptr,
    part_ptr,
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    K_PER: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """Unit u = (column tile, K split s) of a [M, K] @ w[N, K].T -> fp32 rows of partial s."""
    n_tiles: tl.constexpr = N // BN
    t = u % n_tiles
    s = u // n_tiles
    rows = tl.arange(0, BM)
    cols = t * BN + tl.arange(0, BN)
    acc = _tile_dot(
        a_ptr, K, rows, rows < M, s * K_PER, s * K_PER + K_PER, w_ptr, cols, cols < N, K, UPCAST, PREC, BM, BN, BK,
    )  # fmt: skip
    tl.store(part_ptr + (s * BM + rows)[:, None] * N + cols[None, :], acc)


@triton.jit
def _attn_tile_tma(
    pid_m, pid_s, q_desc, k_desc, v_desc, layer, kb_ptr, qb_ptr, ws_acc_ptr, ws_m_ptr, ws_l_ptr,
    MH, H, Tk, keys_per_split, qk_scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """`_attn_fwd_tile`'s split partials with the q, K and V tiles through TMA descriptors (q as
    [M * H, D] rows, K / V as the caches' [L, Tk, D]): the copy engine fills shared memory
    without address registers or masks (rows past a layer's Tk keys arrive as zeros; keys past
    the split are hidden by `col_ok`). H200: 671.2 vs 681.0 us per step
    (7 alternating rounds, every one lower; attention phase 8.96 -> 8.32 us), the same bits.
    q and the suffix's K / V rows are stored by the QKV phase through the generic proxy, so a
    proxy fence sits on both sides of the barrier between them (`_proxy_fence`)."""
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < MH
    q = q_desc.load([pid_m * BM, 0])
    if UPCAST:
        q = q.to(tl.float32)
    q_blk = tl.load(qb_ptr + rows // H, mask=row_ok, other=0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    n_start = pid_s * keys_per_split
    n_end = tl.minimum(n_start + keys_per_split, Tk)
    for n0 in range(n_start, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        col_ok = cols < n_end
        k = k_desc.load([layer, n0, 0]).reshape(BN, D)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, k.T, input_precision=PREC) * qk_scale
        k_blk = tl.load(kb_ptr + cols, mask=col_ok, other=2**30)
        s = tl.where((k_blk[None, :] <= q_blk[:, None]) & col_ok[None, :], s, float("-inf"))
        p, alpha, m_new, l_i = online_softmax(s, m_i, l_i)
        v = v_desc.load([layer, n0, 0]).reshape(BN, D)
        if UPCAST:
            p = p.to(v_desc.dtype).to(tl.float32)
            v = v.to(tl.float32)
        else:
            p = p.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)
        m_i = m_new
    ws_row = pid_s * MH + rows.to(tl.int64)
    d = tl.arange(0, D)
    tl.store(ws_acc_ptr + ws_row[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
    tl.store(ws_m_ptr + ws_row, m_i, mask=row_ok)
    tl.store(ws_l_ptr + ws_row, l_i, mask=row_ok)


@triton.jit
def _attn_scores_tile(
    pid_m, pid_n, q_ptr, k_ptr, kb_ptr, qb_ptr, p_ptr, sm_ptr, sl_ptr, MH, H, Tk, stride_kt, stride_p, qk_scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """First pass of the two-pass attention (`ExpertStepPlan.att_two_pass`): the scores of BM
    query rows against BN keys in one unit (a dot over the head dim in BD slices), masked, stored as
    P = exp2(s - m_t) relative to this tile's own row max m_t (in the K / V dtype, as flash
    attention rounds P for its PV MMA), with m_t and l_t = sum(P) per row. No unit walks a chain of
    key tiles (the split path's online softmax does, 7 dependent tiles per unit)."""
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < MH
    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < Tk
    s = tl.zeros([BM, BN], dtype=tl.float32)
    for d0 in range(0, D, BD):  # over head-dim slices: a pipelined K loop (whole 256-wide tiles at
        d = d0 + tl.arange(0, BD)  # once took 264 KB of shared memory at 64 x 64, more than an SM has)
        q = tl.load(q_ptr + rows[:, None].to(tl.int64) * D + d[None, :], mask=row_ok[:, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        k = tl.load(k_ptr + cols[:, None].to(tl.int64) * stride_kt + d[None, :], mask=col_ok[:, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        if UPCAST:
            q, k = q.to(tl.float32), k.to(tl.float32)
        s += tl.dot(q, tl.trans(k), input_precision=PREC)
    s = s * qk_scale
    q_blk = tl.load(qb_ptr + rows // H, mask=row_ok, other=0)
    k_blk = tl.load(kb_ptr + cols, mask=col_ok, other=2**30)
    s = tl.where((k_blk[None, :] <= q_blk[:, None]) & col_ok[None, :], s, float("-inf"))
    m_t = tl.max(s, axis=1)
    p = tl.math.exp2(s - tl.where(m_t == float("-inf"), 0.0, m_t)[:, None])  # a row without keys: P = 0
    tl.store(p_ptr + rows[:, None].to(tl.int64) * stride_p + cols[None, :], p.to(p_ptr.dtype.element_ty),
             mask=row_ok[:, None])  # fmt: skip
    tl.store(sm_ptr + pid_n * MH + rows, m_t, mask=row_ok)
    tl.store(sl_ptr + pid_n * MH + rows, tl.sum(p, axis=1), mask=row_ok)


@triton.jit
def _attn_pv_tile(
    pid_m, pid_d, p_ptr, v_ptr, sm_ptr, sl_ptr, o_ptr, MH, Tk, stride_kt, stride_p,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr,
    STAGES: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, FIX: tl.constexpr,
):  # fmt: skip
    """Second pass: BM rows x BD columns of the attention output, normalised. Every key tile's
    row max is read first, so each tile's rescale exp2(m_t - m) is known before its PV product:
    the loop over key tiles only accumulates (its loads pipeline; no serial softmax chain), and
    the output needs no combine phase after it."""
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < MH
    n_kt = tl.cdiv(Tk, BN)
    t = tl.arange(0, BT)
    st_ok = (t < n_kt)[:, None] & row_ok[None, :]
    m_t = tl.load(sm_ptr + t[:, None] * MH + rows[None, :], mask=st_ok, other=float("-inf"), cache_modifier=".cg")
    l_t = tl.load(sl_ptr + t[:, None] * MH + rows[None, :], mask=st_ok, other=0.0, cache_modifier=".cg")
    m = tl.max(m_t, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # no visible key at all
    alpha_t = tl.math.exp2(m_t - m_safe[None, :])  # [BT, BM]: each key tile's rescale
    l_sum = tl.sum(alpha_t * l_t, axis=0)
    d = pid_d * BD + tl.arange(0, BD)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    for j in tl.range(0, n_kt, num_stages=STAGES):
        # tile j's rescale picked from registers rather than loaded here, where Triton would not
        # pipeline the load (it pipelines those feeding a dot); measured the same (H200, PV phase
        # 7.30 vs 7.17 us per layer at 16 x 64 tiles): the PV loop waits on its P / V tiles
        alpha = tl.sum(tl.where((t == j)[:, None], alpha_t, 0.0), axis=0)
        cols = j * BN + tl.arange(0, BN)
        p = tl.load(p_ptr + rows[:, None].to(tl.int64) * stride_p + cols[None, :], mask=row_ok[:, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        v = tl.load(v_ptr + cols[:, None].to(tl.int64) * stride_kt + d[None, :], mask=(cols < Tk)[:, None],
                    other=0.0, cache_modifier=".cg")  # fmt: skip
        if UPCAST:
            p, v = p.to(tl.float32), v.to(tl.float32)
        acc += tl.dot(p, v, input_precision=PREC) * alpha[:, None]
    o = acc / tl.where(l_sum > 0.0, l_sum, 1.0)[:, None]
    if FIX:
        o = round_bf16_rtne(o)
    tl.store(o_ptr + rows[:, None].to(tl.int64) * D + d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _proxy_fence(GPU: tl.constexpr):
    """Order this thread's generic-proxy memory accesses with its async-proxy (TMA) ones."""
    if GPU:
        tl.inline_asm_elementwise(
            "fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def _expert_step_kernel(
    h_ptr,  # [M, WE] residual stream (updated in place)
    xa_ptr,  # [M, WE] normed input of the attention block; at the end: the final norm's output
    xm_ptr,  # [M, WE] normed input of the MLP
    q_ptr,  # [M, H, D]
    attn_ptr,  # [M, H * D]
    act_ptr,  # [M, FF]
    part_o_ptr,  # [H*D / KS_O, BM, WE] fp32
    part_d_ptr,  # [FF / KS_D, BM, WE] fp32
    ws_acc_ptr,  # attention split partials
    ws_m_ptr,
    ws_l_ptr,
    p_ptr,  # ATT_TWO_PASS: P [M * H, stride_p] (K / V dtype); ws_m / ws_l then hold its per-tile row stats
    k_ptr,  # K cache [L, Tk, D]: each layer's prefix rows, then the suffix's from suffix_row0
    v_ptr,
    kb_ptr,  # [Tk] key block ids
    qb_ptr,  # [M] query block ids
    rope_ptr,  # [2, M, D / 2] fp32: cos, sin of each suffix row's RoPE angles (rope_table)
    q_desc,  # ATT_TMA: descriptors of q [M * H, D] and of the K / V caches [L, Tk, D]
    k_desc,
    v_desc,
    wqkv_ptr,  # [L, (H + 2) D, WE]
    wo_ptr,  # [L, WE, H D]
    wgu_ptr,  # [L, 2 FF, WE]
    wd_ptr,  # [L, WE, FF]
    m1_ptr,  # [L, WE] attention norm multiplier (1 + scale, or 1 + w)
    s1_ptr,  # [L, WE] attention norm shift (HAS_SHIFT)
    g1_ptr,  # [L, WE] attention residual gate (GATED)
    m2_ptr,  # [L, WE] MLP norm
    s2_ptr,
    g2_ptr,
    mf_ptr,  # [WE] final norm multiplier
    sf_ptr,  # [WE] final norm shift (HAS_SHIFT)
    bar_ptr,  # int32 arrival counter of this launch (zero at launch)
    trace_ptr,  # int64 [2 * (8 L + 1) + 1] phase timestamps (TRACE), zero at launch
    ux_ptr,  # UPDATE (the denoise update after the final norm, kernels/denoise_update.py):
    uwo_ptr,  # noisy actions [HA, A] fp32, action_out [A, WE] + bias, the next input's first
    ubo_ptr,  # layer [WE, A] + bias and its destination [HA, WE]
    uwi_ptr,
    ubi_ptr,
    uh_ptr,
    ugy_ptr,  # U_GUIDE: real-time chunking's target and weights [HA, A] fp32, this step's (t, c)
    ugw_ptr,
    utc_ptr,
    uv_ptr,  # fp32 workspace: velocity partials [WE / U_KC, HA, U_BA], then the old x [HA, U_BA]
    udt,
    act_row0,  # suffix row of the first action (UPDATE)
    M,
    Tk,
    suffix_row0,
    keys_per_split,
    stride_kl,
    stride_kt,
    stride_p,
    qk_scale,
    eps,
    N_LAYERS,
    H: tl.constexpr,
    D: tl.constexpr,
    WE: tl.constexpr,
    FF: tl.constexpr,
    GATED: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    BN_QKV: tl.constexpr,
    BN_O: tl.constexpr,
    KS_O: tl.constexpr,
    BN_GU: tl.constexpr,
    BN_D: tl.constexpr,
    KS_D: tl.constexpr,
    ATT_BM: tl.constexpr,
    ATT_BN: tl.constexpr,
    ATT_SPLITS: tl.constexpr,
    ATT_BS: tl.constexpr,
    CB_M: tl.constexpr,
    CB_DC: tl.constexpr,
    ATT_TWO_PASS: tl.constexpr,
    SC_BM: tl.constexpr,
    SC_BN: tl.constexpr,
    SC_BD: tl.constexpr,
    PV_BM: tl.constexpr,
    PV_BD: tl.constexpr,
    PV_BT: tl.constexpr,
    PV_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX: tl.constexpr,
    TRACE: tl.constexpr,
    ATT_TMA: tl.constexpr,
    PREFETCH: tl.constexpr,
    PREFETCH_SPAN: tl.constexpr,
    GPU: tl.constexpr,
    BLOCK_W: tl.constexpr,
    UPDATE: tl.constexpr,
    U_A: tl.constexpr,
    U_HAS_IN: tl.constexpr,
    U_SILU: tl.constexpr,
    U_FIX: tl.constexpr,
    U_BA: tl.constexpr,
    U_BW: tl.constexpr,
    U_KC: tl.constexpr,
    U_NC: tl.constexpr,
    U_GUIDE: tl.constexpr,
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    if TRACE:
        if pid == 0:
            tl.store(trace_ptr + 2 * (8 * N_LAYERS + 1), _now())
    HALF: tl.constexpr = D // 2
    CH: tl.constexpr = HALF // BN_QKV  # the plan keeps BN_QKV a divisor of D / 2
    n_mt = tl.cdiv(M * H, ATT_BM)
    n_cm = tl.cdiv(M * H, CB_M)
    n_cd: tl.constexpr = D // CB_DC
    arrivals = pid * 0
    for layer in range(N_LAYERS):
        zero = _layer_zero(layer, GPU)
        me = pid + zero  # first unit of this program in every phase below
        rows = zero + tl.arange(0, BM)
        row_ok = rows < M
        l64 = (zero + layer).to(tl.int64)
        lk = k_ptr + l64 * stride_kl
        lv = v_ptr + l64 * stride_kl
        wqkv = wqkv_ptr + l64 * ((H + 2) * D * WE)
        lnorm = layer * WE
        # 0: close the previous layer's MLP residual, norm for attention
        for row in range(me, M, G):
            _residual_norm_row(
                row, h_ptr, part_d_ptr, g2_ptr + lnorm - WE, m1_ptr + lnorm, s1_ptr + lnorm, xa_ptr, eps, layer > 0,
                WE, FF // KS_D, BM, GATED, HAS_SHIFT, FIX, BLOCK_W,
            )  # fmt: skip
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 0, TRACE, GPU)
        if PREFETCH:
            _prefetch_qkv(wqkv, me, WE, H, D, BN_QKV)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 0, pid, TRACE, GPU)
        # 1: QKV + RoPE; k / v into this layer's cache rows
        wo = wo_ptr + l64 * (WE * H * D)
        wgu = wgu_ptr + l64 * (2 * FF * WE)
        wd = wd_ptr + l64 * (WE * FF)
        for u in range(me, (H + 2) * CH, G):
            cols = (u % CH) * BN_QKV + tl.arange(0, BN_QKV)
            col_ok = cols < HALF
            # rows interleaved per head in blocks of BN_QKV (`ExpertStepPlan.lay_out`): one MMA of
            # 2 * BN_QKV rows gives columns `cols` and their rotate_half pair `cols + D / 2`
            # (667.9 vs 678.1 us per step for two paired BN_QKV-row MMAs on the plain layout, H200)
            wrows = (u // CH) * D + (u % CH) * 2 * BN_QKV + tl.arange(0, 2 * BN_QKV)
            acc = _tile_dot(
                xa_ptr, WE, rows, row_ok, 0, WE, wqkv, wrows, wrows < (H + 2) * D, WE, UPCAST, PREC, BM, 2 * BN_QKV,
                BK,
            )  # fmt: skip
            lo, hi = tl.split(acc.reshape(BM, 2, BN_QKV).permute(0, 2, 1))
            _rope_store(
                lo, hi, u // CH, rows, row_ok, cols, col_ok, q_ptr, lk + suffix_row0 * stride_kt,
                lv + suffix_row0 * stride_kt, rope_ptr, M, stride_kt, H, D, FIX,
            )  # fmt: skip
        if PREFETCH_SPAN:  # the programs without a QKV unit: the layer's gate|up weights into L2, shared out
            if me >= (H + 2) * CH:
                _prefetch_span(wgu, 2 * FF * WE, me - (H + 2) * CH, G - (H + 2) * CH)
        arrivals += G
        if ATT_TMA:  # q, k, v stored above are read through TMA (the async proxy) next
            _proxy_fence(GPU)
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 1, TRACE, GPU)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 1, pid, TRACE, GPU)
        if ATT_TMA:
            _proxy_fence(GPU)
        # 2: attention partials (query tile, key split), or the scores (query tile, key tile)
        if ATT_TWO_PASS:
            n_srow = tl.cdiv(M * H, SC_BM)  # score row tiles
            for u in range(me, n_srow * tl.cdiv(Tk, SC_BN), G):
                _attn_scores_tile(
                    u % n_srow, u // n_srow, q_ptr, lk, kb_ptr, qb_ptr, p_ptr, ws_m_ptr, ws_l_ptr, M * H, H, Tk,
                    stride_kt, stride_p, qk_scale, D, SC_BM, SC_BN, SC_BD, UPCAST, PREC,
                )  # fmt: skip
        elif ATT_TMA:
            for u in range(me, n_mt * ATT_SPLITS, G):
                _attn_tile_tma(
                    u % n_mt, u // n_mt, q_desc, k_desc, v_desc, zero + layer, kb_ptr, qb_ptr,
                    ws_acc_ptr, ws_m_ptr, ws_l_ptr, M * H, H, Tk, keys_per_split, qk_scale,
                    D, ATT_BM, ATT_BN, UPCAST, PREC,
                )  # fmt: skip
        else:
            for u in range(me, n_mt * ATT_SPLITS, G):
                _attn_fwd_tile(
                    u % n_mt, u // n_mt, zero, ATT_SPLITS, q_ptr, lk, lv, attn_ptr, kb_ptr, qb_ptr,
                    ws_acc_ptr, ws_m_ptr, ws_l_ptr, M * H, H, Tk, keys_per_split, qk_scale,
                    0, H * D, D, 0, stride_kt, 0, stride_kt, 0, H * D, D, 0, 0,
                    D, True, True, True, UPCAST, PREC, FIX, ATT_BM, ATT_BN, D, ".cg",
                )  # fmt: skip
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 2, TRACE, GPU)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 2, pid, TRACE, GPU)
        # 3: combine the key splits, or P @ V over every key tile
        if ATT_TWO_PASS:
            n_pd: tl.constexpr = D // PV_BD
            for u in range(me, tl.cdiv(M * H, PV_BM) * n_pd, G):
                _attn_pv_tile(
                    u // n_pd, u % n_pd, p_ptr, lv, ws_m_ptr, ws_l_ptr, attn_ptr, M * H, Tk, stride_kt, stride_p,
                    D, PV_BM, SC_BN, PV_BD, PV_BT, PV_STAGES, UPCAST, PREC, FIX,
                )  # fmt: skip
        else:
            for u in range(me, n_cm * n_cd, G):
                _attn_combine_tile(
                    u // n_cd, u % n_cd, zero, ws_acc_ptr, ws_m_ptr, ws_l_ptr, attn_ptr, M * H, H,
                    0, H * D, D, D, ATT_SPLITS, FIX, CB_M, CB_DC, ATT_BS, ".cg",
                )  # fmt: skip
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 3, TRACE, GPU)
        if PREFETCH:
            _prefetch_split_k(wo, me, WE, H * D, BN_O, KS_O)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 3, pid, TRACE, GPU)
        # 4: O projection, split-K partials
        for u in range(me, (WE // BN_O) * (H * D // KS_O), G):
            _split_k_partials(u, attn_ptr, wo, part_o_ptr, M, WE, H * D, KS_O, UPCAST, PREC, BM, BN_O, BK)
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 4, TRACE, GPU)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 4, pid, TRACE, GPU)
        # 5: close the attention residual, norm for the MLP
        for row in range(me, M, G):
            _residual_norm_row(
                row, h_ptr, part_o_ptr, g1_ptr + lnorm, m2_ptr + lnorm, s2_ptr + lnorm, xm_ptr, eps, layer >= 0,
                WE, H * D // KS_O, BM, GATED, HAS_SHIFT, FIX, BLOCK_W,
            )  # fmt: skip
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 5, TRACE, GPU)
        if PREFETCH and not PREFETCH_SPAN:  # (with the span, fetched during QKV)
            _prefetch_gate_up(wgu, me, WE, FF, BN_GU)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 5, pid, TRACE, GPU)
        # 6: gate|up + GeGLU
        for u in range(me, FF // BN_GU, G):
            cols = u * BN_GU + tl.arange(0, BN_GU)
            col_ok = cols < FF
            # the weight is interleaved in blocks of BN_GU (`ExpertStepPlan.lay_out`): one MMA of
            # 2 * BN_GU rows gives gate and up of the same columns (681.8 vs 686.2 us per step
            # for two paired BN_GU-row MMAs on the plain layout, H200)
            wrows = u * 2 * BN_GU + tl.arange(0, 2 * BN_GU)
            acc = _tile_dot(
                xm_ptr, WE, rows, row_ok, 0, WE, wgu, wrows, wrows < 2 * FF, WE, UPCAST, PREC, BM, 2 * BN_GU, BK,
            )  # fmt: skip
            gate, up = tl.split(acc.reshape(BM, 2, BN_GU).permute(0, 2, 1))
            _geglu_store(gate, up, rows, row_ok, cols, col_ok, act_ptr, FF, FIX)
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 6, TRACE, GPU)
        if PREFETCH:
            _prefetch_split_k(wd, me, WE, FF, BN_D, KS_D)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 6, pid, TRACE, GPU)
        # 7: down projection, split-K partials (summed by the next phase 0)
        for u in range(me, (WE // BN_D) * (FF // KS_D), G):
            _split_k_partials(u, act_ptr, wd, part_d_ptr, M, WE, FF, KS_D, UPCAST, PREC, BM, BN_D, BK)
        arrivals += G
        _phase_arrive(bar_ptr, trace_ptr, layer * 8 + 7, TRACE, GPU)
        _phase_wait(bar_ptr, arrivals, trace_ptr, layer * 8 + 7, pid, TRACE, GPU)
    # close the last MLP residual; the final norm
    for row in range(pid, M, G):
        _residual_norm_row(
            row, h_ptr, part_d_ptr, g2_ptr + (N_LAYERS - 1) * WE, mf_ptr, sf_ptr, xa_ptr, eps, N_LAYERS > 0,
            WE, FF // KS_D, BM, GATED, HAS_SHIFT, FIX, BLOCK_W,
        )  # fmt: skip
    if UPDATE:
        _denoise_tail(
            pid, G, bar_ptr, arrivals + G, xa_ptr, ux_ptr, uwo_ptr, ubo_ptr, uwi_ptr, ubi_ptr, uh_ptr, ugy_ptr,
            ugw_ptr, utc_ptr, uv_ptr, udt, act_row0, M, WE, U_A, U_HAS_IN, U_SILU, U_FIX, U_BA, U_BW, U_KC, U_NC,
            U_GUIDE, GPU,
        )  # fmt: skip
    if TRACE:
        tl.atomic_max(trace_ptr + 2 * (8 * N_LAYERS), _now())


@triton.jit
def _denoise_tail(
    pid, G, bar_ptr, arrivals, y_ptr, x_ptr, wo_ptr, bo_ptr, wi_ptr, bi_ptr, h_ptr, gy_ptr, gw_ptr, tc_ptr, ws_ptr,
    dt, act_row0, M, WE: tl.constexpr, A: tl.constexpr, HAS_IN: tl.constexpr, SILU: tl.constexpr,
    FIX_H: tl.constexpr, BA: tl.constexpr, BW: tl.constexpr, KC: tl.constexpr, NC: tl.constexpr,
    GUIDE: tl.constexpr, GPU: tl.constexpr,
):  # fmt: skip
    """The denoise update of the HA = M - act_row0 action rows (kernels/denoise_update.py) in two
    phases over every program, not one program per row: (row, K chunk) velocity partials, and
    (row, column chunk) of the next input, each summing its row's partials and taking the Euler
    step (the chunk-0 unit stores x). The old x is copied aside in the first phase, so that no
    unit of the second reads a row another one is writing."""
    _arrive(bar_ptr, GPU)
    _wait(bar_ptr, arrivals, GPU)  # every normed row stored
    HA = M - act_row0
    N_K: tl.constexpr = (WE + KC - 1) // KC
    acols = tl.arange(0, BA)
    a_ok = acols < A
    old_x = ws_ptr + N_K * HA * BA
    for u in range(pid, HA * N_K, G):
        r = u // N_K
        kc = u % N_K
        v = velocity_part(y_ptr + (act_row0 + r) * WE, wo_ptr, kc * KC, A, WE, KC, BA, BW)
        tl.store(ws_ptr + (kc * HA + r) * BA + acols, v)
        if kc == 0:
            tl.store(old_x + r * BA + acols, tl.load(x_ptr + r * A + acols, mask=a_ok, other=0.0))
    _arrive(bar_ptr, GPU)
    _wait(bar_ptr, arrivals + G, GPU)
    N_N: tl.constexpr = (WE + NC - 1) // NC
    for u in range(pid, HA * N_N, G):
        r = u // N_N
        nc = u % N_N
        v = tl.zeros([BA], dtype=tl.float32)
        for kc in tl.static_range(N_K):
            v += tl.load(ws_ptr + (kc * HA + r) * BA + acols, cache_modifier=".cg")
        x = euler(old_x + r * BA, v, bo_ptr, dt, gy_ptr + r * A, gw_ptr + r * A, tc_ptr, A, BA, GUIDE)
        if nc == 0:
            tl.store(x_ptr + r * A + acols, x, mask=a_ok)
        if HAS_IN:
            next_input_part(r.to(tl.int64), x, wi_ptr, bi_ptr, h_ptr, nc * NC, A, WE, NC, SILU, FIX_H, BA, BW)


# ---- host side ---------------------------------------------------------------------------------


def pair_halves(w: torch.Tensor, head_dim: int, block: int, undo: bool = False) -> torch.Tensor:
    """[..., heads * head_dim, K] -> per head, blocks of `block` rows of the first half each
    followed by the same rows of the second half (the step kernel's QKV layout: one MMA gives a
    column tile and its rotate_half pair); `undo`: back to nn.Linear's rows."""
    *lead, rows, kd = w.shape
    half = head_dim // 2
    if head_dim % 2 or rows % head_dim:
        raise ValueError(f"{rows} rows are not whole heads of an even head dim {head_dim}")
    if block <= 0 or half % block:
        raise ValueError(f"block {block} must divide half a head ({half} rows)")
    split = (*lead, rows // head_dim, 2, half // block, block, kd)
    paired = (*lead, rows // head_dim, half // block, 2, block, kd)
    n = len(lead)
    return w.reshape(paired if undo else split).transpose(n + 1, n + 2).reshape(w.shape).contiguous()


def unpair_columns(y: torch.Tensor, head_dim: int, block: int) -> torch.Tensor:
    """[M, heads * head_dim] output of a GEMM on a `pair_halves` weight -> nn.Linear's column
    order (a copy; for the per-op path, which reads the step kernel's laid-out weights)."""
    m = y.shape[0]
    return y.view(m, -1, head_dim // 2 // block, 2, block).transpose(2, 3).reshape(m, -1)


@dataclass
class ExpertWeights:
    """The expert's weights stacked over layers (nn.Linear layout, run dtype), and its norms at
    every denoise step: multipliers [N, L, WE] fp32 (1 + scale, or 1 + w), shifts and gates
    (pi0.5's adaRMS; None for pi0's RMSNorm and plain residuals), final norm [N, WE]."""

    qkv: torch.Tensor  # [L, (H + 2) * D, WE]
    o: torch.Tensor  # [L, WE, H * D]
    gate_up: torch.Tensor  # [L, 2 * FF, WE]
    down: torch.Tensor  # [L, WE, FF]
    attn_mult: torch.Tensor
    attn_shift: torch.Tensor | None
    attn_gate: torch.Tensor | None
    mlp_mult: torch.Tensor
    mlp_shift: torch.Tensor | None
    mlp_gate: torch.Tensor | None
    final_mult: torch.Tensor
    final_shift: torch.Tensor | None
    # The layouts of qkv and gate_up: 0 = nn.Linear's rows (what the reference reads); b > 0 =
    # what the kernel reads (`ExpertStepPlan.lay_out`): per head, blocks of b rows of the first
    # half each followed by the same rows of the second half (RoPE's rotate_half pairs); gate_up,
    # blocks of b gate rows each followed by the same rows of up
    qkv_block: int = 0
    gu_block: int = 0

    def plain_qkv(self) -> torch.Tensor:
        """qkv as [q heads; k; v] rows of nn.Linear, whatever the layout."""
        head_dim = (self.qkv.shape[1] - self.o.shape[2]) // 2  # (H + 2) * D rows against H * D
        return pair_halves(self.qkv, head_dim, self.qkv_block, undo=True) if self.qkv_block else self.qkv

    def plain_gate_up(self) -> torch.Tensor:
        """gate_up as [gate; up] rows, whatever the layout."""
        return deinterleave_gate_up(self.gate_up, self.gu_block) if self.gu_block else self.gate_up


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """cos and sin of the RoPE angles ``position * inv_freq`` (fp32), [2, M, D/2], for the step
    kernel's QKV phase. The suffix's positions are the same in every layer and every denoise step
    of a decision, so they are computed once, by torch, instead of 180 times in the kernel (where
    libdevice's cos / sin were ~20 KB of its 118 KB of machine code and, with Triton 3.6, all of
    its register spills)."""
    ang = positions.float()[:, None] * inv_freq.float()[None, :]
    if out is None:
        out = torch.empty(2, *ang.shape, device=ang.device, dtype=torch.float32)
    elif tuple(out.shape) != (2, *ang.shape) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 {[2, *ang.shape]}, got {out.dtype} {list(out.shape)}")
    torch.cos(ang, out=out[0])
    torch.sin(ang, out=out[1])
    return out


def _cuda_arch(device: torch.device) -> int | None:
    """The CUDA arch of `device` as 10 x major (90 Hopper, 100 / 110 Blackwell / Thor); None for
    another device (the interpreter's CPU, or meta for an offline build)."""
    return torch.cuda.get_device_capability(device)[0] * 10 if device.type == "cuda" else None


def _has_tma(device: torch.device) -> bool:
    """TMA descriptors: a CUDA GPU of sm_90+; another device (meta, for an offline build) stands
    for the Hopper / Blackwell / Thor targets the GPU code is built for."""
    arch = _cuda_arch(device)
    return arch is None or arch >= 90


def two_pass_by_default(arch: int | None) -> bool:
    """Whether a plan for CUDA arch `arch` (90 Hopper, 100 / 110 Blackwell / Thor; None: not a CUDA
    device, i.e. the interpreter or an offline build standing for the H200) starts with the
    two-pass attention. Only where it was measured: another arch keeps the split path (Thor's
    sm_110 two-pass build spills 64 bytes, the split one none; neither was timed there)."""
    return arch is None or arch // 10 == 9


def _pow2_tile(dim: int, want: int, least: int = 16) -> int:
    """Largest power of two <= want that divides dim (at least `least`: 16, as tl.dot needs)."""
    t = want
    while t > least and dim % t:
        t //= 2
    if dim % t:
        raise ValueError(f"dimension {dim} is not a multiple of {least}")
    return t


class ExpertStepPlan:
    """Static buffers and launch settings of the step kernel for one expert shape (built once,
    before any CUDA-graph capture)."""

    def __init__(
        self,
        rows: int,
        width: int,
        mlp_dim: int,
        num_heads: int,
        head_dim: int,
        launches: int,
        device: torch.device,
        dtype: torch.dtype,
        gpu: bool | None = None,
        sm_count: int | None = None,
    ):
        """gpu: GPU tiles and code (default: when running compiled on a CUDA device; True on
        another device builds the GPU launch for an offline compile, see `compile_for`)."""
        if rows > 64:
            raise ValueError(f"the step kernel holds at most 64 suffix tokens in one tile, got {rows}")
        self.M, self.WE, self.FF, self.H, self.D = rows, width, mlp_dim, num_heads, head_dim
        self.device, self.dtype = device, dtype
        self.gpu = gpu if gpu is not None else (not is_interpreting() and device.type == "cuda")
        interp = not self.gpu
        if interp:
            self.grid = 1
        else:
            self.grid = sm_count or torch.cuda.get_device_properties(device).multi_processor_count
        self.bm = 64 if not interp else max(16, triton.next_power_of_2(rows))
        # QKV: 16-column tiles and their rotate_half pairs (one 32-row MMA); narrower heads (the
        # tiny test model's 16) take 8, the least whose pair still makes tl.dot's 16 rows
        if head_dim % 16:
            raise ValueError(f"head dim {head_dim}: the step kernel's QKV tiles need a multiple of 16")
        self.bn_qkv = _pow2_tile(head_dim // 2, 16, least=8)
        # O and down: 32 columns x 4 K splits (128 units; the row phases sum 4 partials): 815 us per
        # step on the H200, against 845 with 64 columns x 8 splits
        self.bn_o, self.ks_o = _pow2_tile(width, 32), _pow2_tile(num_heads * head_dim, 512)
        self.bn_gu = _pow2_tile(mlp_dim, 32)
        self.bn_d, self.ks_d = _pow2_tile(width, 32), _pow2_tile(mlp_dim, 1024)
        # K step: a power of two (tl.arange) dividing the width (48 -> 16)
        self.bk = _pow2_tile(width, min(128 if not interp else 32, self.ks_o, self.ks_d))
        # attention: 16 query rows x 32-key tiles, with as many key splits as fill the grid once
        # (pi0.5: 25 tiles x 5 splits): 748 us per step on the H200 against 778 for 32 x 32 x 8
        # (13 x 8 units), alternating over 5 rounds; 16 x 4 splits 777, 16 x 8 830 (two waves)
        if interp:
            self.att_bm, self.att_bn, self.att_splits = max(16, triton.next_power_of_2(rows * num_heads)), 64, 1
        else:
            self.att_bm, self.att_bn = 16, 32
            self.att_splits = max(1, self.grid // triton.cdiv(rows * num_heads, self.att_bm))
        self.cb_m, self.cb_dc = 16, min(64, head_dim)
        # the two-pass attention (`_attn_scores_tile`, `_attn_pv_tile`) instead of key splits +
        # combine: scores of (sc_bm rows x sc_bn keys) units, then P @ V of (pv_bm rows x pv_bd
        # columns) units, the PV loop in pv_stages stages. pi0.5 on the H200 (7 x 8 score units,
        # 13 x 8 PV units of 8 key tiles): 650.5 vs 664.0 us per step for the split path, lower in
        # each of 5 alternating rounds (bench/expert_step.py has the tiles that lost)
        self.att_two_pass = two_pass_by_default(_cuda_arch(device))
        if interp:
            self.sc_bm, self.sc_bn = max(16, triton.next_power_of_2(rows * num_heads)), 16
            self.pv_bm, self.pv_bd = 16, _pow2_tile(head_dim, 64)
        else:
            self.sc_bm, self.sc_bn = 64, 128
            self.pv_bm, self.pv_bd = 32, _pow2_tile(head_dim, 32)
        self.sc_bd = _pow2_tile(head_dim, 64)  # the scores' head-dim slice (K step)
        # PV loop stages: with 16 x 64 PV tiles, 4 stages spilled (748.3 us per step at 128-key
        # score tiles) and 2 waited on L2 (691.1); at 32 x 32, 3 stages (650.5) was the one timed
        self.pv_stages = 3
        self.att_p = torch.zeros(0, device=device, dtype=dtype)  # P and its row stats, sized per cache
        self.att_stats = torch.zeros(0, device=device, dtype=torch.float32)  # length at the first launch
        self._retired: list[torch.Tensor] = []  # outgrown workspaces a captured graph may still use
        self.update_chunks = 0  # denoise tail: K / column chunks per action row (0: fill the grid once)
        self.num_warps, self.num_stages = 4, 4  # H200 (64-column O / down tiles): 845 us; 3 stages 857, 8 warps 884
        act = dict(device=device, dtype=dtype)
        self.x_attn = torch.zeros(rows, width, **act)
        self.x_mlp = torch.zeros(rows, width, **act)
        self.q = torch.zeros(rows, num_heads, head_dim, **act)
        self.attn = torch.zeros(rows, num_heads * head_dim, **act)
        self.act = torch.zeros(rows, mlp_dim, **act)
        self._allocate_splits()
        # L2 prefetch of each program's next GEMM tile between arriving at the barrier before that
        # phase and leaving it, gate|up's by the QKV phase's free programs (GPU only; `_prefetch_rows`,
        # `_prefetch_span`)
        self.prefetch = True
        # the attention phase's q / K / V tiles through TMA descriptors (sm_90+; `_attn_tile_tma`):
        # 671.2 vs 681.0 us per step on the H200, lower in each of 7 alternating rounds
        self.att_tma = self.gpu and _has_tma(device)
        # L2 size, for `_prefetch_span` (offline builds on the meta device, or a torch build that
        # does not report it: the H200's 50 MB)
        h200_l2 = 50 * 2**20
        cuda = device.type == "cuda" and torch.cuda.is_available()
        props = torch.cuda.get_device_properties(device) if cuda else None
        self.l2_bytes = int(getattr(props, "L2_cache_size", h200_l2) or h200_l2)
        # one arrival counter per launch, each in its own 16-byte row
        self.barriers = torch.zeros(launches, 4, dtype=torch.int32, device=device)
        self.trace: torch.Tensor | None = None  # see `enable_trace`
        # the denoise tail's workspace, for any chunking (chunks >= 16 columns) and action dims up to
        # UPDATE_MAX_ACTIONS: allocated here, so that a graph captured later never sees it replaced
        self.update_ws = torch.empty(
            (triton.cdiv(width, 16) + 1) * rows * UPDATE_MAX_ACTIONS, device=device, dtype=torch.float32
        )

    def set_tiles(self, **tiles: int) -> None:
        """Change tile settings (bn_o, ks_o, bn_d, ks_d, att_splits, num_warps, ...; for
        benchmarks and tests) and size the split buffers for them."""
        for name, value in tiles.items():
            if not hasattr(self, name):
                raise ValueError(f"unknown tile setting {name}")
            setattr(self, name, value)
        half = self.D // 2
        if self.bn_qkv < 8 or self.bn_qkv & (self.bn_qkv - 1) or half % self.bn_qkv:
            raise ValueError(
                f"bn_qkv {self.bn_qkv}: expected a power of two >= 8 dividing half the head dim ({half}); its "
                "rotate_half pair makes the tile's 2 x bn_qkv rows, and tl.dot needs at least 16"
            )
        for name in ("sc_bm", "sc_bn", "sc_bd", "pv_bm", "pv_bd"):
            t = getattr(self, name)
            if t < 16 or t & (t - 1):
                raise ValueError(f"{name} {t}: expected a power of two >= 16 (tl.dot's least tile)")
        for name in ("sc_bd", "pv_bd"):
            if self.D % getattr(self, name):
                raise ValueError(f"{name} {getattr(self, name)} does not divide the head dim {self.D}")
        self._allocate_splits()

    def _allocate_splits(self) -> None:
        f32 = dict(device=self.device, dtype=torch.float32)
        self.part_o = torch.zeros(self.H * self.D // self.ks_o, self.bm, self.WE, **f32)
        self.part_d = torch.zeros(self.FF // self.ks_d, self.bm, self.WE, **f32)
        self.att_ws = torch.zeros(self.att_splits * self.M * self.H * (self.D + 2), **f32)

    def reserve_keys(self, keys: int) -> None:
        """Size the two-pass attention's P and row-stat workspaces for caches of up to `keys`
        keys at the current `sc_bn`: before any CUDA-graph capture. A launch that needs more
        grows them outside a capture (the old buffers are kept alive, so a graph captured
        earlier never replays into freed memory) and is refused inside one."""
        need_p, need_stats = self._scores_need(keys)
        if self.att_p.numel() < need_p:
            self._retired.append(self.att_p)
            self.att_p = torch.zeros(need_p, device=self.device, dtype=self.dtype)
        if self.att_stats.numel() < need_stats:
            self._retired.append(self.att_stats)
            self.att_stats = torch.zeros(need_stats, device=self.device, dtype=torch.float32)

    def _scores_need(self, keys: int) -> tuple[int, int]:
        """Elements of P ([M * H, keys rounded up to sc_bn]) and of the row stats (max and sum per
        row and key tile) for `keys` keys."""
        tiles = triton.cdiv(keys, self.sc_bn)
        return self.M * self.H * tiles * self.sc_bn, 2 * self.M * self.H * tiles

    def _scores_ws(self, keys: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(P [M * H, cols], tile maxima, tile sums, cols) of the two-pass attention for `keys` keys."""
        need_p, need_stats = self._scores_need(keys)
        if self.att_p.numel() < need_p or self.att_stats.numel() < need_stats:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ValueError(
                    f"the two-pass attention's workspace holds {self.att_p.numel()} / {self.att_stats.numel()} "
                    f"elements of P / row stats, a launch over {keys} keys in tiles of {self.sc_bn} needs "
                    f"{need_p} / {need_stats}: call plan.reserve_keys({keys}) before capturing"
                )
            self.reserve_keys(keys)
        mh, n = self.M * self.H, need_stats // 2
        cols = need_p // mh
        return self.att_p[:need_p].view(mh, cols), self.att_stats[:n], self.att_stats[n : 2 * n], cols

    def enable_trace(self, layers: int) -> None:
        """Record phase timestamps in later launches (GPU only; for `phase_times`)."""
        self.trace = torch.zeros(2 * (PHASES * layers + 1) + 1, dtype=torch.int64, device=self.device)

    def phase_times(self) -> list[dict[str, float]]:
        """Per layer and phase of the last traced launch: `work` (previous barrier exit -> the
        last program done) and `barrier` (-> program 0 past the barrier), in microseconds. With
        `update=`, the last entry (the final norm) includes the denoise tail."""
        t = self.trace.tolist()
        layers = (len(t) - 3) // (2 * PHASES)
        out, start = [], t[-1]
        for i in range(PHASES * layers + 1):
            done, left = t[2 * i], t[2 * i + 1]
            layer, phase = divmod(i, PHASES)
            out.append(dict(layer=layer, phase=phase, work=(done - start) / 1e3, barrier=(left - done) / 1e3))
            start = left
        return out[:-1] + [dict(out[-1], barrier=0.0)]

    def describe(self) -> str:
        return (
            f"expert step kernel: {self.grid} resident programs, {PHASES} phases per layer; tiles (paired rows in "
            f"one MMA) qkv {self.bn_qkv}+{self.bn_qkv}, o {self.bn_o}/K{self.ks_o}, gate_up {self.bn_gu}+{self.bn_gu}, "
            f"down {self.bn_d}/K{self.ks_d}, "
            f"attention {self._attention_tiles()}; "
            f"L2 prefetch of the next GEMM's weights {'on' if self.prefetch and self.gpu else 'off'}"
            f"{' (gate|up during QKV)' if self._prefetch_span() else ''}"
        )

    def _attention_tiles(self) -> str:
        if self.att_two_pass:
            return f"two-pass: scores {self.sc_bm}x{self.sc_bn}, P @ V {self.pv_bm}x{self.pv_bd}"
        return f"{self.att_bm}x{self.att_bn} x {self.att_splits} splits{' (TMA)' if self.att_tma else ''}"

    def lay_out(self, w: ExpertWeights) -> ExpertWeights:
        """`w` with qkv and gate_up in the layouts this plan's kernel reads (`pair_halves` in
        blocks of `bn_qkv`, `interleave_gate_up` in blocks of `bn_gu`); done once at load. Changed
        tiles (set_tiles) need the weights laid out again: `step` refuses a layout that does not
        match."""
        if (w.qkv_block, w.gu_block) == (self.bn_qkv, self.bn_gu):
            return w
        qkv = pair_halves(w.plain_qkv(), self.D, self.bn_qkv)
        gate_up = interleave_gate_up(w.plain_gate_up(), self.bn_gu)
        return replace(w, qkv=qkv, qkv_block=self.bn_qkv, gate_up=gate_up, gu_block=self.bn_gu)

    def step(
        self, h: torch.Tensor, w: ExpertWeights, step: int, *cache_and_inputs, update: DenoiseUpdate | None = None
    ) -> torch.Tensor:
        """Every layer of one denoise step on the residual stream `h` [M, WE] (in place), then
        the final norm; returns it [M, WE] (the `x_attn` buffer). The rest, as `launch_args`:
        k, v (the cache [L, Tk, D]: prefix rows, then the suffix's rows from `suffix_row0`, which
        this launch writes), key_blocks, query_blocks, rope (`rope_table` of the suffix's
        positions, made once per decision), suffix_row0, slot
        (this launch's barrier counter, zeroed beforehand), eps.

        `update`: also the denoise update on the last `update.x.shape[0]` rows of the output
        (`denoise_update(out[-HA:], ...)`), in two more grid-wide phases: the launch,
        its ramp and its tail of a separate kernel less per step."""
        args, kwargs = self.launch_args(h, w, step, *cache_and_inputs, update=update)
        _expert_step_kernel[(self.grid,)](*args, **kwargs)
        return self.x_attn

    def _prefetch_span(self) -> bool:
        """Whether the QKV phase's free programs prefetch the layer's gate|up weights
        (`_prefetch_span`): only with enough of them (a few would each issue tens of thousands of
        lines: then every program prefetches its own tile at the barrier before gate|up) and
        where those weights fit in L2."""
        qkv_units = (self.H + 2) * triton.cdiv(self.D // 2, self.bn_qkv)
        free = self.grid - qkv_units
        span_bytes = 2 * self.FF * self.WE * self.dtype.itemsize
        return bool(self.prefetch and self.gpu and 4 * free >= qkv_units and span_bytes <= self.l2_bytes)

    def _attention_descriptors(self, k: torch.Tensor, v: torch.Tensor, att_tma: bool) -> tuple:
        """(q, k, v) TMA descriptors for `att_tma`: q as [M * H, D] rows, the caches as they are,
        [L, Tk, D] (a bucket's slice of a longer cache too; rows past Tk read as zeros); built per
        launch (a captured graph keeps its launch's copy); Nones without it."""
        if not att_tma:
            return None, None, None
        from triton.tools.tensor_descriptor import TensorDescriptor

        for name, t in (("k", k), ("v", v)):
            rows_ok = t.dim() == 3 and t.shape[2] == self.D and t.stride(2) == 1
            if not rows_ok or any(st * t.element_size() % 16 for st in t.stride()[:2]) or t.data_ptr() % 16:
                raise ValueError(
                    f"the {name} cache must be [L, Tk, {self.D}] with unit last stride, other strides of a multiple "
                    f"of 16 bytes and a 16-byte aligned start (TMA; plan.att_tma=False reads any rows), got shape "
                    f"{tuple(t.shape)}, strides {t.stride()}, start {t.data_ptr() % 16} bytes past alignment"
                )
        block = [1, self.att_bn, self.D]
        return (
            TensorDescriptor.from_tensor(self.q.view(-1, self.D), [self.att_bm, self.D]),
            TensorDescriptor(k, list(k.shape), list(k.stride()), block),
            TensorDescriptor(v, list(v.shape), list(v.stride()), block),
        )

    def _update_chunk(self, rows: int, bw: int) -> int:
        """Columns per chunk (K chunks of the velocity, column chunks of the next input) of the
        denoise tail: as many chunks per row as fill the grid once (H200, 50 rows: 2 of 512),
        each a multiple of the [A, BW] tile."""
        tiles = triton.cdiv(self.WE, bw)
        chunks = self.update_chunks or 1
        if tiles % chunks:
            raise ValueError(f"update_chunks={chunks} does not divide the {tiles} tiles of {bw} columns")
        while not self.update_chunks and chunks * 2 * rows <= self.grid and tiles % (chunks * 2) == 0:
            chunks *= 2
        return tiles // chunks * bw

    def _update_ws(self, rows: int, ba: int, kc: int) -> torch.Tensor:
        """The tail's fp32 workspace: `update_ws`, sized at construction for the largest tail."""
        need = (triton.cdiv(self.WE, kc) + 1) * rows * ba
        if ba > UPDATE_MAX_ACTIONS or need > self.update_ws.numel():
            raise ValueError(f"the denoise tail holds at most {UPDATE_MAX_ACTIONS} action dims, got {ba}")
        return self.update_ws

    def _check_cache(
        self, k: torch.Tensor, v: torch.Tensor, key_blocks: torch.Tensor, query_blocks: torch.Tensor, row0: int, L: int
    ) -> None:
        """The cache and masks this launch reads and writes fit the plan: the kernel checks no
        bounds of its own (a short key_blocks or a suffix past the cache would read or write
        outside the tensors)."""
        Tk, problems = int(k.shape[1]) if k.dim() == 3 else -1, []
        if tuple(k.shape) != tuple(v.shape) or k.dim() != 3 or k.shape[0] != L or k.shape[2] != self.D:
            problems.append(f"k / v must be [{L}, Tk, {self.D}], got {tuple(k.shape)} / {tuple(v.shape)}")
        if k.dtype != self.dtype or v.dtype != self.dtype:
            problems.append(f"k / v must be {self.dtype} (the plan's dtype), got {k.dtype} / {v.dtype}")
        if not 0 <= row0 <= Tk - self.M:
            problems.append(f"the suffix rows {row0}..{row0 + self.M} do not fit a cache of {Tk} keys")
        if tuple(key_blocks.shape) != (Tk,) or tuple(query_blocks.shape) != (self.M,):
            problems.append(
                f"key_blocks / query_blocks must be [{Tk}] / [{self.M}], got "
                f"{tuple(key_blocks.shape)} / {tuple(query_blocks.shape)}"
            )
        for name, t in (("key_blocks", key_blocks), ("query_blocks", query_blocks)):
            if t.dtype != torch.int32 or not t.is_contiguous() or not same_device(t, k.device):
                problems.append(f"{name} must be contiguous int32 on {k.device}, got {t.dtype} strides {t.stride()}")
        if problems:
            raise ValueError("; ".join(problems))

    def _check_weights(self, w: ExpertWeights, step: int) -> None:
        """The kernel reads every weight and norm as packed rows at the plan's shapes: a strided
        view (a slice of a bigger stack, a transpose) would be read as the wrong numbers."""
        L, WE, FF, HD = int(w.qkv.shape[0]), self.WE, self.FF, self.H * self.D
        want = {
            "qkv": ((L, HD + 2 * self.D, WE), self.dtype),
            "o": ((L, WE, HD), self.dtype),
            "gate_up": ((L, 2 * FF, WE), self.dtype),
            "down": ((L, WE, FF), self.dtype),
        }
        problems = []
        # the kernel's GATED / HAS_SHIFT follow attn_gate / attn_shift and go for every norm
        for kind, names in (("gate", ("attn_gate", "mlp_gate")), ("shift", ("attn_shift", "mlp_shift", "final_shift"))):
            missing = [name for name in names if getattr(w, name) is None]
            if missing and len(missing) != len(names):
                problems.append(f"{', '.join(missing)} missing: the {kind}s go together (all or none of {names})")
        norms = [f"{part}_{kind}" for part in ("attn", "mlp") for kind in ("mult", "shift", "gate")]
        for name in (*norms, "final_mult", "final_shift"):
            t = getattr(w, name)
            if t is not None:
                n = int(t.shape[0]) if t.dim() else 0
                want[name] = (((n, L, WE) if name.startswith(("attn", "mlp")) else (n, WE)), torch.float32)
                if not 0 <= step < n:
                    problems.append(f"{name} holds {n} denoise steps, step {step} asked for")
        for name, (shape, dtype) in want.items():
            t = getattr(w, name)
            if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous() or not same_device(t, self.device):
                problems.append(
                    f"{name} must be contiguous {dtype} {list(shape)} on {self.device}, got "
                    f"{t.dtype} {list(t.shape)} strides {t.stride()} on {t.device}"
                )
        if problems:
            raise ValueError("expert weights: " + "; ".join(problems))

    def launch_args(
        self,
        h: torch.Tensor,
        w: ExpertWeights,
        step: int,
        k: torch.Tensor,
        v: torch.Tensor,
        key_blocks: torch.Tensor,
        query_blocks: torch.Tensor,
        rope: torch.Tensor,
        suffix_row0: int,
        slot: int,
        eps: float,
        update: DenoiseUpdate | None = None,
    ) -> tuple[tuple, dict]:
        """The step kernel's arguments (see `step`)."""
        M, D, H, L = self.M, self.D, self.H, int(w.qkv.shape[0])
        if not 0 <= slot < self.barriers.shape[0]:
            raise ValueError(f"slot {slot} outside the plan's {self.barriers.shape[0]} launches")
        if (w.qkv_block, w.gu_block) != (self.bn_qkv, self.bn_gu):
            raise ValueError(
                f"expert weights laid out for (qkv, gate_up) blocks ({w.qkv_block}, {w.gu_block}) (0: plain), the "
                f"plan's tiles read (bn_qkv, bn_gu) = ({self.bn_qkv}, {self.bn_gu}): pass plan.lay_out(weights)"
            )
        if tuple(h.shape) != (M, self.WE) or not h.is_contiguous() or h.dtype != self.dtype:
            raise ValueError(f"h must be contiguous {self.dtype} [{M}, {self.WE}], got {tuple(h.shape)} {h.dtype}")
        if k.stride() != v.stride() or k.stride(-1) != 1:
            raise ValueError("k and v caches must share strides, rows contiguous")
        self._check_cache(k, v, key_blocks, query_blocks, suffix_row0, L)
        self._check_weights(w, step)
        if tuple(rope.shape) != (2, M, D // 2) or rope.dtype != torch.float32 or not rope.is_contiguous():
            raise ValueError(
                f"rope must be rope_table(...)'s contiguous float32 [2, {M}, {D // 2}], "
                f"got {tuple(rope.shape)} {rope.dtype}"
            )
        Tk = int(k.shape[1])
        kps = triton.cdiv(triton.cdiv(Tk, self.att_splits), self.att_bn) * self.att_bn
        splits = triton.cdiv(Tk, kps)
        n = splits * M * H
        ws = self.att_ws
        two_pass = bool(self.att_two_pass)
        if two_pass:
            att_p, ws_m, ws_l, stride_p = self._scores_ws(Tk)
            att = (ws, ws_m, ws_l, att_p)
        else:
            att = (ws[: n * D], ws[n * D : n * (D + 1)], ws[n * (D + 1) : n * (D + 2)], self.att_p)
            stride_p = 0
        att_tma = bool(self.att_tma) and not two_pass
        f = w.attn_mult  # any fp32 tensor for pointers a flag leaves unused
        opt = lambda t: t[step] if t is not None else f  # noqa: E731
        extra = {"launch_cooperative_grid": True} if self.gpu else {}  # all programs resident (barrier)
        if update is not None:
            update.check(update.x.shape[0], self.WE)
            if update.x.shape[0] > M:
                raise ValueError(f"the update has {update.x.shape[0]} action rows, the step {M} rows")
            (ux, uwo, ubo, uwi, ubi, uh, ugy, ugw, utc, udt), c = update.launch_args()
            kc = self._update_chunk(update.x.shape[0], c.bw)
            # no next input (the last step): one column unit per row, the one that stores x
            nc = kc if c.has_in else triton.cdiv(self.WE, c.bw) * c.bw
            ws = self._update_ws(update.x.shape[0], c.ba, kc)
            u_ptrs = (ux, uwo, ubo, uwi, ubi, uh, ugy, ugw, utc, ws, udt)
            u_const = (*c[:6], kc, nc, c.guide)
            act_row0 = M - update.x.shape[0]
        else:
            u_ptrs = (f, f, f, f, f, f, f, f, f, f, 0.0)
            u_const, act_row0 = (1, False, False, False, 16, 16, 16, 16, False), M
        args = (
            h, self.x_attn, self.x_mlp, self.q, self.attn, self.act, self.part_o, self.part_d,
            *att, k, v, key_blocks, query_blocks, rope, *self._attention_descriptors(k, v, att_tma),
            w.qkv, w.o, w.gate_up, w.down,
            w.attn_mult[step], opt(w.attn_shift), opt(w.attn_gate),
            w.mlp_mult[step], opt(w.mlp_shift), opt(w.mlp_gate),
            w.final_mult[step], opt(w.final_shift),
            self.barriers[slot], self.trace if self.trace is not None else self.barriers,
            *u_ptrs, act_row0,
            M, Tk, suffix_row0, kps, k.stride(0), k.stride(1), stride_p, (1.0 / D**0.5) * _LOG2E, eps, L,
        )  # fmt: skip
        interp = is_interpreting() and not self.gpu
        kwargs = dict(
            H=H, D=D, WE=self.WE, FF=self.FF, GATED=w.attn_gate is not None, HAS_SHIFT=w.attn_shift is not None,
            BM=self.bm, BK=self.bk,
            BN_QKV=self.bn_qkv, BN_O=self.bn_o, KS_O=self.ks_o, BN_GU=self.bn_gu,
            BN_D=self.bn_d, KS_D=self.ks_d, ATT_BM=self.att_bm, ATT_BN=self.att_bn, ATT_SPLITS=splits,
            ATT_BS=triton.next_power_of_2(splits), CB_M=self.cb_m, CB_DC=self.cb_dc,
            ATT_TWO_PASS=two_pass, SC_BM=self.sc_bm, SC_BN=self.sc_bn, SC_BD=self.sc_bd,
            PV_BM=self.pv_bm, PV_BD=self.pv_bd,
            PV_BT=triton.next_power_of_2(triton.cdiv(Tk, self.sc_bn)), PV_STAGES=self.pv_stages,
            UPCAST=interp, PREC=dot_precision(self.dtype), FIX=interp and needs_rtne_fix(self.dtype),
            TRACE=self.trace is not None,
            ATT_TMA=att_tma,
            PREFETCH=self.prefetch and self.gpu,
            PREFETCH_SPAN=self._prefetch_span(),
            GPU=self.gpu,
            BLOCK_W=triton.next_power_of_2(self.WE),
            UPDATE=update is not None,
            **dict(zip(("U_A", "U_HAS_IN", "U_SILU", "U_FIX", "U_BA", "U_BW", "U_KC", "U_NC", "U_GUIDE"), u_const,
                       strict=True)),
            num_warps=self.num_warps, num_stages=self.num_stages,
            **extra,
        )  # fmt: skip
        return args, kwargs


def compile_for(args: tuple, kwargs: dict, arch: int):
    """Compile the step kernel for CUDA arch `arch` (90 Hopper, 100 / 110 Blackwell / Thor)
    without a GPU, from `launch_args` of a plan built with ``gpu=True`` (tensors may live on
    the meta device): a check that the GPU code builds for a target we cannot run here."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _expert_step_kernel
    names = kernel.arg_names
    ptr = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32"}
    ptr[torch.int64] = "*i64"
    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "launch_cooperative_grid") if k in kwargs}
    # the JIT's specialisation: 16-byte aligned pointers and integers divisible by 16 are marked
    # so (vector loads, and the software pipelining of the K loops, depend on it); torch's
    # allocations are aligned, so a tensor's alignment is its storage offset's
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, args, strict=False)):
        if value is None:
            signature[name] = "constexpr"
            constexprs[(i,)] = None
            continue
        if hasattr(value, "block_shape"):  # a TMA TensorDescriptor
            dtype = ptr[value.base.dtype][1:]
            signature[name] = f"tensordesc<{dtype}[{', '.join(map(str, value.block_shape))}]>"
            continue
        if isinstance(value, torch.Tensor):
            signature[name] = ptr[value.dtype]
            aligned = value.storage_offset() * value.element_size() % 16 == 0
        else:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
            aligned = isinstance(value, int) and value % 16 == 0
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    for name in names[len(args) :]:
        signature[name] = "constexpr"
        constexprs[(names.index(name),)] = kwargs[name]
    return triton.compile(
        ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", arch, 64),
        options=options,
    )


# ---- reference (the eager model's maths, plain torch) -------------------------------------------


def expert_step_ref(
    h: torch.Tensor,
    w: ExpertWeights,
    step: int,
    k: torch.Tensor,
    v: torch.Tensor,
    key_blocks: torch.Tensor,
    query_blocks: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    suffix_row0: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `ExpertStepPlan.step` computes, layer by layer in torch: returns (h after the last
    layer, the final norm's output, k, v with the suffix rows written); inputs are not changed.
    Values are rounded to h's dtype where the eager model stores them."""
    from .attention import attention_ref

    dt, M = h.dtype, h.shape[0]
    L, D = w.qkv.shape[0], k.shape[-1]
    H = w.o.shape[2] // D
    h, k, v = h.clone(), k.clone(), v.clone()
    gate_up, qkv = w.plain_gate_up(), w.plain_qkv()
    pick = lambda t, i: None if t is None else t[step, i].float()  # noqa: E731

    def norm(x, mult, shift):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * mult
        return (y + shift if shift is not None else y).to(dt)

    def residual(x, y, gate):
        y = y.to(dt).float()
        if gate is not None:
            y = (y * gate).to(dt).float()
        return (x.float() + y).to(dt)

    def rope(t):  # [M, heads, D] fp32, Gemma rotate_half
        ang = positions.float()[:, None, None] * inv_freq.float()[None, None, :]
        c, s = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        return t * c + torch.cat([-t[..., D // 2 :], t[..., : D // 2]], -1) * s

    rows = slice(suffix_row0, suffix_row0 + M)
    for i in range(L):
        y = torch.nn.functional.linear(norm(h, pick(w.attn_mult, i), pick(w.attn_shift, i)), qkv[i]).float()
        q, kk, vv = y.split([H * D, D, D], -1)
        k[i, rows], v[i, rows] = rope(kk.view(M, 1, D))[:, 0].to(dt), vv.to(dt)
        a = attention_ref(rope(q.view(M, H, D)).to(dt), k[i], v[i], key_blocks, query_blocks)
        h = residual(h, torch.nn.functional.linear(a.reshape(M, -1), w.o[i]), pick(w.attn_gate, i))
        g, u = (
            torch.nn.functional.linear(norm(h, pick(w.mlp_mult, i), pick(w.mlp_shift, i)), gate_up[i])
            .float()
            .chunk(2, -1)
        )
        act = (torch.nn.functional.gelu(g, approximate="tanh") * u).to(dt)
        h = residual(h, torch.nn.functional.linear(act, w.down[i]), pick(w.mlp_gate, i))
    shift = None if w.final_shift is None else w.final_shift[step].float()
    return h, norm(h, w.final_mult[step].float(), shift), k, v
