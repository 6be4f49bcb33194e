"""One action-expert decoder layer (the denoise step's building block) as ONE persistent launch.

At 50 tokens a layer streams ~35 MB of weights, ~10 us at HBM speed, but as 6-9 separate kernels
each one pays its launch, its first loads and its tail (~5-9 us each, measured on the H200), so a
step was latency-bound. Here one program per SM stays resident and walks the layer's phases,
separated by a grid-wide barrier (an arrival counter in global memory):

    0  h += gate * Σ down partials (previous layer) ; x_attn = norm(h)        units: rows
    1  x_attn @ Wqkv.T -> RoPE -> q ; k, v into the cache's suffix rows       units: column-pair tiles
    2  attention partials over the cached prefix + suffix (split keys)        units: (query tile, split)
    3  combine the splits -> attn [M, H*D]                                    units: (row tile, d tile)
    4  attn @ Wo.T -> split-K partials                                       units: (column tile, split)
    5  h += gate * Σ O partials ; x_mlp = norm(h)                             units: rows
    6  x_mlp @ Wgu.T -> gelu_tanh(g) * u -> act                               units: column-pair tiles
    7  act @ Wdown.T -> split-K partials (summed by the next layer's phase 0)

The last layer's down partials are summed by a launch of phase 0 alone with the final norm.
Split-K partials are reduced where they are read (phase 0 / 5), in split order: deterministic.

Norms are exactly the eager model's: pi0.5's adaRMS ``rms(h) * (1 + scale) + shift`` with the
gated residual ``h + y * gate``, or pi0's RMSNorm ``(1 + w)`` with a plain residual; the GEMM
output, ``y * gate`` and ``h`` are rounded to bf16 where the eager model stores them.

All programs must be resident at once (the barrier waits for every one): the grid is one
program per SM, launched cooperatively where Triton can. On the interpreter (CI) the grid is
one program, which runs every unit of every phase in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._common import dot_precision, is_interpreting, needs_rtne_fix
from .attention import _attn_combine_tile, _attn_fwd_tile
from .skinny_gemm import _epilogue, _round

__all__ = ["ExpertLayerPlan", "ExpertLayerWeights"]

_LOG2E = 1.4426950408889634


@triton.jit
def _grid_sync(bar_ptr, target):
    """Every program arrives (release) and waits until `target` arrivals are seen (acquire)."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


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
    WE: tl.constexpr,
    N_PARTS: tl.constexpr,
    BM: tl.constexpr,
    HAS_PART: tl.constexpr,
    GATED: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    FIX: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_W)
    ok = cols < WE
    hp = h_ptr + row * WE + cols
    h = tl.load(hp, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    if HAS_PART:
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
    PAIR_OFF,
    PAIRED: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] of a @ w.T over k in [k_lo, k_hi) (and of the paired rows + PAIR_OFF)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
        if PAIRED:
            w2 = tl.load(w_cols + PAIR_OFF * stride_w + ks[:, None], mask=wm, other=0.0)
            if UPCAST:
                w2 = w2.to(tl.float32)
            acc2 = tl.dot(a, w2, acc2, input_precision=PREC)
    return acc, acc2


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
    acc, _ = _tile_dot(
        a_ptr, K, rows, rows < M, s * K_PER, s * K_PER + K_PER, w_ptr, cols, cols < N, K, 0,
        False, UPCAST, PREC, BM, BN, BK,
    )  # fmt: skip
    tl.store(part_ptr + (s * BM + rows)[:, None] * N + cols[None, :], acc)


@triton.jit
def _expert_layer_kernel(
    h_ptr,  # [M, WE] residual stream (updated in place)
    xa_ptr,  # [M, WE] normed input of the attention block (or the final norm's output)
    xm_ptr,  # [M, WE] normed input of the MLP
    q_ptr,  # [M, H, D]
    attn_ptr,  # [M, H * D]
    act_ptr,  # [M, FF]
    part_o_ptr,  # [H*D / KS_O, BM, WE] fp32
    part_d_ptr,  # [FF / KS_D, BM, WE] fp32
    ws_acc_ptr,  # attention split partials
    ws_m_ptr,
    ws_l_ptr,
    k_ptr,  # this layer's K cache rows [Tk, D] (prefix, then the suffix from suffix_row0)
    v_ptr,
    kb_ptr,  # [Tk] key block ids
    qb_ptr,  # [M] query block ids
    pos_ptr,  # [M] suffix positions
    inv_ptr,  # [D / 2] RoPE inverse frequencies
    wqkv_ptr,
    wo_ptr,
    wgu_ptr,
    wd_ptr,
    m1_ptr,  # [WE] attention norm multiplier (1 + scale or 1 + w)
    s1_ptr,  # [WE] attention norm shift (HAS_SHIFT)
    g0_ptr,  # [WE] gate of the residual phase 0 closes (previous layer's MLP; GATED)
    m2_ptr,
    s2_ptr,
    g1_ptr,  # [WE] gate of this layer's attention residual (GATED)
    bar_ptr,  # int32 arrival counter of this launch (zero at launch)
    M,
    Tk,
    suffix_row0,
    keys_per_split,
    stride_kt,
    stride_vt,
    qk_scale,
    eps,
    H: tl.constexpr,
    D: tl.constexpr,
    WE: tl.constexpr,
    FF: tl.constexpr,
    PHASE_LO: tl.constexpr,
    PHASE_HI: tl.constexpr,
    HAS_PREV: tl.constexpr,
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
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    zero = pid * 0
    HALF: tl.constexpr = D // 2
    rows = tl.arange(0, BM)
    row_ok = rows < M
    for phase in tl.static_range(PHASE_LO, PHASE_HI + 1):
        if phase == 0:
            for row in range(pid, M, G):
                _residual_norm_row(
                    row, h_ptr, part_d_ptr, g0_ptr, m1_ptr, s1_ptr, xa_ptr, eps,
                    WE, FF // KS_D, BM, HAS_PREV, GATED, HAS_SHIFT, FIX, BLOCK_W,
                )  # fmt: skip
        elif phase == 1:
            CH: tl.constexpr = (HALF + BN_QKV - 1) // BN_QKV
            for u in range(pid, (H + 2) * CH, G):
                cols = (u % CH) * BN_QKV + tl.arange(0, BN_QKV)
                col_ok = cols < HALF
                wrow = (u // CH) * D + cols
                acc, acc2 = _tile_dot(
                    xa_ptr, WE, rows, row_ok, 0, WE, wqkv_ptr, wrow, col_ok, WE, HALF,
                    True, UPCAST, PREC, BM, BN_QKV, BK,
                )  # fmt: skip
                _epilogue(
                    acc, acc2, tl.zeros([BM], dtype=tl.float32), u, rows, row_ok, cols, col_ok, wrow, WE, eps,
                    inv_ptr, q_ptr, k_ptr + suffix_row0 * stride_kt, v_ptr + suffix_row0 * stride_vt,
                    pos_ptr, inv_ptr, inv_ptr, H * D, D, stride_kt, 0, stride_vt, 0,
                    HALF, CH, H, 1, 1, False, False, False, True, FIX,
                )  # fmt: skip
        elif phase == 2:
            n_mt = tl.cdiv(M * H, ATT_BM)
            for u in range(pid, n_mt * ATT_SPLITS, G):
                _attn_fwd_tile(
                    u % n_mt, u // n_mt, zero, ATT_SPLITS, q_ptr, k_ptr, v_ptr, attn_ptr, kb_ptr, qb_ptr,
                    ws_acc_ptr, ws_m_ptr, ws_l_ptr, M * H, H, Tk, keys_per_split, qk_scale,
                    0, H * D, D, 0, stride_kt, 0, stride_vt, 0, H * D, D, 0, 0,
                    D, True, True, True, UPCAST, PREC, FIX, ATT_BM, ATT_BN, D,
                )  # fmt: skip
        elif phase == 3:
            n_cm = tl.cdiv(M * H, CB_M)
            n_cd: tl.constexpr = D // CB_DC
            for u in range(pid, n_cm * n_cd, G):
                _attn_combine_tile(
                    u // n_cd, u % n_cd, zero, ws_acc_ptr, ws_m_ptr, ws_l_ptr, attn_ptr, M * H, H,
                    0, H * D, D, D, ATT_SPLITS, FIX, CB_M, CB_DC, ATT_BS,
                )  # fmt: skip
        elif phase == 4:
            for u in range(pid, (WE // BN_O) * (H * D // KS_O), G):
                _split_k_partials(u, attn_ptr, wo_ptr, part_o_ptr, M, WE, H * D, KS_O, UPCAST, PREC, BM, BN_O, BK)
        elif phase == 5:
            for row in range(pid, M, G):
                _residual_norm_row(
                    row, h_ptr, part_o_ptr, g1_ptr, m2_ptr, s2_ptr, xm_ptr, eps,
                    WE, H * D // KS_O, BM, True, GATED, HAS_SHIFT, FIX, BLOCK_W,
                )  # fmt: skip
        elif phase == 6:
            for u in range(pid, FF // BN_GU, G):
                cols = u * BN_GU + tl.arange(0, BN_GU)
                col_ok = cols < FF
                acc, acc2 = _tile_dot(
                    xm_ptr, WE, rows, row_ok, 0, WE, wgu_ptr, cols, col_ok, WE, FF,
                    True, UPCAST, PREC, BM, BN_GU, BK,
                )  # fmt: skip
                _epilogue(
                    acc, acc2, tl.zeros([BM], dtype=tl.float32), u, rows, row_ok, cols, col_ok, cols, WE, eps,
                    inv_ptr, act_ptr, act_ptr, act_ptr, pos_ptr, inv_ptr, inv_ptr, FF, 0, 0, 0, 0, 0,
                    FF, FF // BN_GU, H, 1, 2, False, False, False, True, FIX,
                )  # fmt: skip
        else:
            for u in range(pid, (WE // BN_D) * (FF // KS_D), G):
                _split_k_partials(u, act_ptr, wd_ptr, part_d_ptr, M, WE, FF, KS_D, UPCAST, PREC, BM, BN_D, BK)
        if phase < PHASE_HI:
            _grid_sync(bar_ptr, G * (phase - PHASE_LO + 1))


# ---- host side ---------------------------------------------------------------------------------


@dataclass
class ExpertLayerWeights:
    """One layer's weights (nn.Linear layout, run dtype) and its norms at one denoise step."""

    qkv: torch.Tensor  # [(H + 2) * D, WE]
    o: torch.Tensor  # [WE, H * D]
    gate_up: torch.Tensor  # [2 * FF, WE]
    down: torch.Tensor  # [WE, FF]
    attn_mult: torch.Tensor  # [WE] fp32
    attn_shift: torch.Tensor | None
    attn_gate: torch.Tensor | None
    mlp_mult: torch.Tensor
    mlp_shift: torch.Tensor | None
    mlp_gate: torch.Tensor | None


def _pow2_tile(dim: int, want: int) -> int:
    """Largest power of two <= want that divides dim (at least 16, as tl.dot needs)."""
    t = want
    while t > 16 and dim % t:
        t //= 2
    if dim % t:
        raise ValueError(f"dimension {dim} is not a multiple of 16")
    return t


class ExpertLayerPlan:
    """Static buffers and launch settings of the layer kernel for one expert shape (built once,
    before any CUDA-graph capture)."""

    def __init__(
        self,
        rows: int,
        width: int,
        mlp_dim: int,
        num_heads: int,
        head_dim: int,
        max_keys: int,
        launches: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        if rows > 64:
            raise ValueError(f"the layer kernel holds at most 64 suffix tokens in one tile, got {rows}")
        self.M, self.WE, self.FF, self.H, self.D = rows, width, mlp_dim, num_heads, head_dim
        self.device, self.dtype = device, dtype
        interp = is_interpreting() or device.type != "cuda"
        self.bm = 64 if not interp else max(16, triton.next_power_of_2(rows))
        self.bk = 128 if not interp else 32
        self.bn_qkv = max(16, min(16, triton.next_power_of_2(head_dim // 2)))
        self.bn_o, self.ks_o = _pow2_tile(width, 64), _pow2_tile(num_heads * head_dim, 256)
        self.bn_gu = _pow2_tile(mlp_dim, 32)
        self.bn_d, self.ks_d = _pow2_tile(width, 64), _pow2_tile(mlp_dim, 512)
        self.bk = min(self.bk, width, self.ks_o, self.ks_d)
        self.att_bm, self.att_bn = (32, 64) if not interp else (max(16, triton.next_power_of_2(rows * num_heads)), 64)
        self.att_splits = 8 if not interp else 1
        self.cb_m, self.cb_dc = 16, min(64, head_dim)
        self.num_warps, self.num_stages = 4, 2
        self.grid = 1 if interp else torch.cuda.get_device_properties(device).multi_processor_count
        f32 = dict(device=device, dtype=torch.float32)
        act = dict(device=device, dtype=dtype)
        self.x_attn = torch.zeros(rows, width, **act)
        self.x_mlp = torch.zeros(rows, width, **act)
        self.q = torch.zeros(rows, num_heads, head_dim, **act)
        self.attn = torch.zeros(rows, num_heads * head_dim, **act)
        self.act = torch.zeros(rows, mlp_dim, **act)
        self.part_o = torch.zeros(num_heads * head_dim // self.ks_o, self.bm, width, **f32)
        self.part_d = torch.zeros(mlp_dim // self.ks_d, self.bm, width, **f32)
        n = self.att_splits * rows * num_heads
        self.att_ws = torch.zeros(n * (head_dim + 2), **f32)
        self.barriers = torch.zeros(launches, dtype=torch.int32, device=device)
        self.max_keys = max_keys

    def describe(self) -> str:
        return (
            f"expert layer kernel: {self.grid} resident programs, 8 phases; tiles qkv {self.bn_qkv}x2, "
            f"o {self.bn_o}/K{self.ks_o}, gate_up {self.bn_gu}x2, down {self.bn_d}/K{self.ks_d}, "
            f"attention {self.att_bm}x{self.att_bn} x {self.att_splits} splits"
        )

    def layer(
        self,
        h: torch.Tensor,
        w: ExpertLayerWeights,
        prev: ExpertLayerWeights | None,
        k: torch.Tensor,
        v: torch.Tensor,
        key_blocks: torch.Tensor,
        query_blocks: torch.Tensor,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        suffix_row0: int,
        slot: int,
        eps: float,
    ) -> None:
        """One layer (phases 0-7) on the residual stream `h` [M, WE] in place. k / v: this
        layer's cache rows [Tk, D] (prefix, then the suffix's rows from `suffix_row0`, which
        this launch writes); prev: the previous layer, whose down output phase 0 adds to h
        (None for the first layer); slot: this launch's barrier counter (zeroed beforehand)."""
        self._run(h, w.attn_mult, w.attn_shift, prev, (0, 7), slot, eps, w, k, v, key_blocks, query_blocks,
                  positions, inv_freq, suffix_row0)  # fmt: skip

    def final(
        self,
        h: torch.Tensor,
        prev: ExpertLayerWeights,
        mult: torch.Tensor,
        shift: torch.Tensor | None,
        slot: int,
        eps: float,
    ) -> torch.Tensor:
        """Phase 0 alone after the last layer: h += its down output; returns norm(h) [M, WE]
        (in `x_attn`) with the final norm's multiplier / shift."""
        self._run(h, mult, shift, prev, (0, 0), slot, eps)
        return self.x_attn

    def _run(self, h, mult, shift, prev, phases, slot, eps, w=None, k=None, v=None, kb=None, qb=None, pos=None,
             inv=None, suffix_row0=0) -> None:  # fmt: skip
        M, D, H = self.M, self.D, self.H
        if tuple(h.shape) != (M, self.WE) or not h.is_contiguous() or h.dtype != self.dtype:
            raise ValueError(f"h must be contiguous {self.dtype} [{M}, {self.WE}], got {tuple(h.shape)} {h.dtype}")
        if k is None:
            k = v = self.x_mlp  # phase 0 alone: no attention
        Tk = int(k.shape[0])
        kps = triton.cdiv(triton.cdiv(Tk, self.att_splits), self.att_bn) * self.att_bn
        splits = triton.cdiv(Tk, kps)
        n = splits * M * H
        ws = self.att_ws
        f = mult  # any fp32 tensor for unused pointers
        gated = prev.mlp_gate is not None if prev is not None else (w is not None and w.attn_gate is not None)
        extra = {}
        if not is_interpreting() and self.device.type == "cuda":
            extra["launch_cooperative_grid"] = True  # every program must be resident (grid barrier)
        _expert_layer_kernel[(self.grid,)](
            h, self.x_attn, self.x_mlp, self.q, self.attn, self.act, self.part_o, self.part_d,
            ws[: n * D], ws[n * D : n * (D + 1)], ws[n * (D + 1) : n * (D + 2)],
            k, v, kb if kb is not None else f, qb if qb is not None else f,
            pos if pos is not None else f, inv if inv is not None else f,
            w.qkv if w else h, w.o if w else h, w.gate_up if w else h, w.down if w else h,
            mult, shift if shift is not None else f,
            prev.mlp_gate if prev is not None and prev.mlp_gate is not None else f,
            w.mlp_mult if w else f, w.mlp_shift if w and w.mlp_shift is not None else f,
            w.attn_gate if w and w.attn_gate is not None else f,
            self.barriers[slot:],
            M, Tk, suffix_row0, kps, k.stride(0), v.stride(0), (1.0 / D**0.5) * _LOG2E, eps,
            H=H, D=D, WE=self.WE, FF=self.FF, PHASE_LO=phases[0], PHASE_HI=phases[1],
            HAS_PREV=prev is not None, GATED=gated, HAS_SHIFT=shift is not None,
            BM=self.bm, BK=self.bk, BN_QKV=self.bn_qkv, BN_O=self.bn_o, KS_O=self.ks_o, BN_GU=self.bn_gu,
            BN_D=self.bn_d, KS_D=self.ks_d, ATT_BM=self.att_bm, ATT_BN=self.att_bn, ATT_SPLITS=splits,
            ATT_BS=triton.next_power_of_2(splits), CB_M=self.cb_m, CB_DC=self.cb_dc,
            UPCAST=is_interpreting(), PREC=dot_precision(self.dtype), FIX=needs_rtne_fix(self.dtype),
            BLOCK_W=triton.next_power_of_2(self.WE), num_warps=self.num_warps, num_stages=self.num_stages, **extra,
        )  # fmt: skip
