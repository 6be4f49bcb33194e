"""GEMMs for a few rows (the action expert's 50-51 tokens), with the norm before and the
sub-layer's elementwise work after fused in, and split-K that reduces inside the same kernel.

At M = 50 a GEMM is a weight stream (e.g. 17 MB for the expert's gate|up): the time goes on
reading W once at full bandwidth, and on the launches around it. So each expert sub-layer is one
launch:

    qkv      = norm(h) @ Wqkv.T  -> RoPE(q, k) -> q out, k/v into the KV cache   (`norm_qkv_rope`)
    attn out @ Wo.T              -> h += gate * o                              (`linear_gated_residual`)
    gate|up  = norm(h) @ Wgu.T   -> gelu_tanh(gate) * up                       (`norm_geglu`)
    act @ Wdown.T                -> h += gate * d                              (`linear_gated_residual`)

The norm (Gemma RMSNorm ``(1 + w)``, or pi0.5's adaRMS ``* (1 + scale) + shift``) is folded into
the GEMM exactly: ``(rms(x) * x * m + shift) @ W.T = rms(x) * ((x * m) @ W.T) + shift @ W.T``;
the row statistic is summed from the A tiles the GEMM loads anyway, ``m`` scales them, and
``shift @ W.T`` (it depends only on the denoise time) is a precomputed column bias.

Split-K: few rows leave few output tiles, so the K range is split over programs to fill the GPU.
Each program writes its fp32 partial tile to a workspace and bumps a per-tile counter; the last
one to arrive sums the partials in split order (deterministic) and runs the epilogue, then
resets the counter, so the kernel is one launch and replays in a CUDA graph.
Paired epilogues (RoPE: a head's two halves; GeGLU: gate and up) keep two accumulators over the
same A tile, so no weight re-layout is needed.

Numerics: fp32 accumulation; the A tile is multiplied by ``m`` in fp32 and rounded to the
weight dtype for the MMA (the eager model rounds the normed row instead); the epilogue works on
the fp32 accumulator and rounds once at the store; the gated residual rounds the sub-layer
output to the residual dtype first, as the eager model stores it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._common import dot_precision, is_interpreting, needs_rtne_fix, round_bf16_rtne

__all__ = [
    "NormPrologue",
    "GemmConfig",
    "Workspace",
    "norm_linear",
    "norm_linear_ref",
    "norm_qkv_rope",
    "norm_qkv_rope_ref",
    "norm_geglu",
    "norm_geglu_ref",
    "linear_gated_residual",
    "linear_gated_residual_ref",
    "fold_shift",
]

PLAIN, ROPE, GEGLU, GATED_RESIDUAL = 0, 1, 2, 3  # epilogues
_SQRT_2_OVER_PI = 0.7978845608028654


@dataclass
class NormPrologue:
    """RMSNorm of the A rows, folded into the GEMM: ``rms(x) * x * mult (+ shift)``.

    mult: [K] fp32, ``1 + w`` (Gemma RMSNorm) or ``1 + scale`` (adaRMS);
    bias: [N] fp32 ``shift @ W.T`` for adaRMS (see `fold_shift`), or None."""

    mult: torch.Tensor
    bias: torch.Tensor | None = None
    eps: float = 1e-6


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split: int
    num_warps: int = 4
    num_stages: int = 3


class Workspace:
    """Split-K partial tiles and per-tile arrival counters, allocated once (before capture).

    Calls on one stream run one after another, so every GEMM of a pipeline can share one
    workspace: the last program of each tile resets its counter to zero."""

    def __init__(self, device: torch.device | str, floats: int = 1 << 20, tiles: int = 4096):
        self.partials = torch.empty(floats, dtype=torch.float32, device=device)
        self.counters = torch.zeros(tiles, dtype=torch.int32, device=device)

    def check(self, floats: int, tiles: int) -> None:
        if floats > self.partials.numel() or tiles > self.counters.numel():
            raise ValueError(
                f"split-K workspace too small: need {floats} floats / {tiles} counters, "
                f"have {self.partials.numel()} / {self.counters.numel()}"
            )


_WORKSPACES: dict[str, Workspace] = {}


def _default_workspace(device: torch.device, floats: int, tiles: int) -> Workspace:
    """A per-device workspace that grows on demand (never during a capture: pass one then)."""
    key = str(device)
    ws = _WORKSPACES.get(key)
    if ws is None or floats > ws.partials.numel() or tiles > ws.counters.numel():
        old = (ws.partials.numel(), ws.counters.numel()) if ws else (0, 0)
        ws = _WORKSPACES[key] = Workspace(device, max(floats, old[0], 1 << 16), max(tiles, old[1], 256))
    return ws


# ---- kernel ------------------------------------------------------------------------------------


@triton.jit
def _round(x, FIX: tl.constexpr, dtype: tl.constexpr):
    """x rounded to `dtype` and back to fp32 (the value a store + load in the eager model gives)."""
    if FIX:
        return round_bf16_rtne(x)
    return x.to(dtype).to(tl.float32)


@triton.jit
def _epilogue(
    acc,
    acc2,
    ss,
    pid_n,
    rows,
    row_ok,
    cols,
    col_ok,
    wrow,
    K,
    eps,
    c_ptr,
    o_ptr,
    o2_ptr,
    o3_ptr,
    pos_ptr,
    inv_ptr,
    gate_ptr,
    stride_om,
    stride_oh,
    stride_o2m,
    stride_o2h,
    stride_o3m,
    stride_o3h,
    PAIR_OFF,
    CHUNKS,
    H,
    HK,
    EPILOGUE: tl.constexpr,
    NORM: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_GATE: tl.constexpr,
    PAIRED: tl.constexpr,
    FIX: tl.constexpr,
):
    if NORM:
        r = tl.math.rsqrt(ss / K + eps)
        acc = acc * r[:, None]
        if PAIRED:
            acc2 = acc2 * r[:, None]
    if HAS_C:
        acc = acc + tl.load(c_ptr + wrow, mask=col_ok, other=0.0)[None, :]
        if PAIRED:
            acc2 = acc2 + tl.load(c_ptr + wrow + PAIR_OFF, mask=col_ok, other=0.0)[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]
    if EPILOGUE == 0:  # PLAIN: out[m, n]
        if FIX:
            acc = round_bf16_rtne(acc)
        tl.store(o_ptr + r64 * stride_om + wrow[None, :], acc.to(o_ptr.dtype.element_ty), mask=mask)
    elif EPILOGUE == 1:  # ROPE: acc / acc2 are columns c and c + HALF of head `hh`
        hh = pid_n // CHUNKS
        pos = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.float32)
        ang = pos[:, None] * tl.load(inv_ptr + cols, mask=col_ok, other=0.0)[None, :]
        rotate = (hh < H + HK).to(tl.float32)  # q and k heads rotate; v heads are copied
        c = tl.cos(ang) * rotate + (1.0 - rotate)
        s = tl.sin(ang) * rotate
        lo = acc * c - acc2 * s
        hi = acc2 * c + acc * s
        if FIX:
            lo = round_bf16_rtne(lo)
            hi = round_bf16_rtne(hi)
        if hh < H:
            p = o_ptr + r64 * stride_om + hh * stride_oh + cols[None, :]
        elif hh < H + HK:
            p = o2_ptr + r64 * stride_o2m + (hh - H) * stride_o2h + cols[None, :]
        else:
            p = o3_ptr + r64 * stride_o3m + (hh - H - HK) * stride_o3h + cols[None, :]
        tl.store(p, lo.to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(p + PAIR_OFF, hi.to(o_ptr.dtype.element_ty), mask=mask)
    elif EPILOGUE == 2:  # GEGLU: gelu_tanh(gate) * up
        g = acc
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh
        y = 0.5 * g * (1.0 + t) * acc2
        if FIX:
            y = round_bf16_rtne(y)
        tl.store(o_ptr + r64 * stride_om + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)
    else:  # GATED_RESIDUAL: residual (o_ptr) += gate * out, in place
        y = _round(acc, FIX, o_ptr.dtype.element_ty)
        p = o_ptr + r64 * stride_om + wrow[None, :]
        h = tl.load(p, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            y = _round(y * tl.load(gate_ptr + wrow, mask=col_ok, other=0.0)[None, :], FIX, o_ptr.dtype.element_ty)
        h = h + y
        if FIX:
            h = round_bf16_rtne(h)
        tl.store(p, h.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _a_tile(a_rows, ks, k_ok, row_ok, mult_ptr, ss, NORM: tl.constexpr, dtype: tl.constexpr):
    """An A tile for the MMA; with NORM, scaled by the norm multiplier and its squares summed."""
    a = tl.load(a_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    if NORM:
        a32 = a.to(tl.float32)
        ss += tl.sum(a32 * a32, axis=1)
        a = (a32 * tl.load(mult_ptr + ks, mask=k_ok, other=0.0)[None, :]).to(dtype)
    return a, ss


@triton.jit
def _skinny_gemm_kernel(
    a_ptr,  # [M, K] rows
    w_ptr,  # [N_total, K] (nn.Linear layout)
    mult_ptr,  # [K] fp32 norm multiplier (NORM)
    c_ptr,  # [N_total] fp32 column bias (HAS_C)
    ws_ptr,  # split-K partial tiles
    cnt_ptr,  # split-K arrival counters
    o_ptr,
    o2_ptr,
    o3_ptr,
    pos_ptr,
    inv_ptr,
    gate_ptr,
    M,
    K,
    K_PER_SPLIT,
    GROUP_W,  # valid columns per group (N, HALF or F)
    GROUP_STRIDE,  # weight rows between groups (head_dim for RoPE)
    PAIR_OFF,  # weight rows between the two accumulators (HALF, F)
    CHUNKS,  # tiles per group
    N_TILES,
    H,
    HK,
    stride_am,
    stride_wn,
    stride_om,
    stride_oh,
    stride_o2m,
    stride_o2h,
    stride_o3m,
    stride_o3h,
    eps,
    EPILOGUE: tl.constexpr,
    NORM: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_GATE: tl.constexpr,
    PAIRED: tl.constexpr,
    SPLIT: tl.constexpr,
    ONE_SHOT: tl.constexpr,
    USE_PDL: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
    FIX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = (pid_n % CHUNKS) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < GROUP_W
    wrow = (pid_n // CHUNKS) * GROUP_STRIDE + cols
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_am
    w_cols = w_ptr + wrow.to(tl.int64)[None, :] * stride_wn

    if USE_PDL:
        # Programmatic dependent launch: let the next kernel's programs start (and stream their
        # own weights) while this one runs; they wait for this grid before reading its output.
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_lo = pid_k * K_PER_SPLIT
    if ONE_SHOT:
        # The whole K slice in one tile: weights (independent of earlier kernels) are loaded
        # before waiting for the previous grid, the activations after.
        ks = k_lo + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        wm = k_ok[:, None] & col_ok[None, :]
        w = tl.load(w_cols + ks[:, None], mask=wm, other=0.0)
        w2 = w
        if PAIRED:
            w2 = tl.load(w_cols + PAIR_OFF * stride_wn + ks[:, None], mask=wm, other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        a, ss = _a_tile(a_rows, ks, k_ok, row_ok, mult_ptr, ss, NORM, w_ptr.dtype.element_ty)
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
            w2 = w2.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PREC)
        if PAIRED:
            acc2 = tl.dot(a, w2, acc2, input_precision=PREC)
    else:
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < k_hi
            a, ss = _a_tile(a_rows, ks, k_ok, row_ok, mult_ptr, ss, NORM, w_ptr.dtype.element_ty)
            wm = k_ok[:, None] & col_ok[None, :]
            w = tl.load(w_cols + ks[:, None], mask=wm, other=0.0)  # [BLOCK_K, BLOCK_N]
            if UPCAST:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=PREC)
            if PAIRED:
                w2 = tl.load(w_cols + PAIR_OFF * stride_wn + ks[:, None], mask=wm, other=0.0)
                if UPCAST:
                    w2 = w2.to(tl.float32)
                acc2 = tl.dot(a, w2, acc2, input_precision=PREC)

    if SPLIT == 1:
        _epilogue(
            acc, acc2, ss, pid_n, rows, row_ok, cols, col_ok, wrow, K, eps,
            c_ptr, o_ptr, o2_ptr, o3_ptr, pos_ptr, inv_ptr, gate_ptr,
            stride_om, stride_oh, stride_o2m, stride_o2h, stride_o3m, stride_o3h,
            PAIR_OFF, CHUNKS, H, HK, EPILOGUE, NORM, HAS_C, HAS_GATE, PAIRED, FIX,
        )  # fmt: skip
    else:
        # Partial tile -> workspace slot (tile, split); tile-contiguous so stores coalesce.
        tile = pid_m * N_TILES + pid_n
        n_acc = 2 if PAIRED else 1
        tile_elems = BLOCK_M * BLOCK_N * n_acc + BLOCK_M
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        base = ws_ptr + (tile.to(tl.int64) * SPLIT + pid_k) * tile_elems
        tl.store(base + offs, acc)
        if PAIRED:
            tl.store(base + BLOCK_M * BLOCK_N + offs, acc2)
        ss_offs = BLOCK_M * BLOCK_N * n_acc + tl.arange(0, BLOCK_M)
        tl.store(base + ss_offs, ss)
        tl.debug_barrier()  # every thread's partial is written before the arrival is published
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # last program of this tile: reduce in split order, finish
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            ss = tl.zeros([BLOCK_M], dtype=tl.float32)
            first = ws_ptr + tile.to(tl.int64) * SPLIT * tile_elems
            for s in tl.static_range(SPLIT):  # unrolled: all partial loads in flight at once
                acc += tl.load(first + s * tile_elems + offs, cache_modifier=".cg")
                if PAIRED:
                    acc2 += tl.load(first + s * tile_elems + BLOCK_M * BLOCK_N + offs, cache_modifier=".cg")
                ss += tl.load(first + s * tile_elems + ss_offs, cache_modifier=".cg")
            _epilogue(
                acc, acc2, ss, pid_n, rows, row_ok, cols, col_ok, wrow, K, eps,
                c_ptr, o_ptr, o2_ptr, o3_ptr, pos_ptr, inv_ptr, gate_ptr,
                stride_om, stride_oh, stride_o2m, stride_o2h, stride_o3m, stride_o3h,
                PAIR_OFF, CHUNKS, H, HK, EPILOGUE, NORM, HAS_C, HAS_GATE, PAIRED, FIX,
            )  # fmt: skip
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next call


# ---- launch settings -----------------------------------------------------------------------------

_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def default_config(M: int, group_w: int, groups: int, K: int, paired: bool, device: torch.device) -> GemmConfig:
    """Tiles without autotuning (nothing is benchmarked during a graph capture).

    One M tile holds all rows (the expert's 50-51); N tiles of 64 (32 when paired, as each
    program then streams two weight tiles), and K split until the grid covers the SMs about
    once, keeping at least 128 K per split. Shared memory: 3 stages x (64x128 A + 1-2 x
    128x64 W) bf16 = 96-144 KB, within Hopper's and Blackwell's (Thor's) 227 KB.
    Interpreter: one split, whole-problem tiles (its cost is per program)."""
    bm = max(16, min(64, triton.next_power_of_2(M)))
    if is_interpreting() or device.type != "cuda":
        bn = max(16, min(64, triton.next_power_of_2(group_w)))
        return GemmConfig(bm, bn, max(16, min(64, triton.next_power_of_2(K))), 1, 4, 1)
    bn = 32 if paired else 64
    bn = max(16, min(bn, triton.next_power_of_2(group_w)))
    bk = 128
    tiles = triton.cdiv(M, bm) * groups * triton.cdiv(group_w, bn)
    split = 1
    while tiles * split * 2 <= _sm_count(device) and K // (split * 2) >= bk:
        split *= 2
    return GemmConfig(bm, bn, bk, split, 4, 3)


# ---- launcher ----------------------------------------------------------------------------------


def _launch(
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    epilogue: int,
    group_w: int,
    groups: int,
    group_stride: int,
    pair_off: int,
    norm: NormPrologue | None,
    out: torch.Tensor,
    out_strides: tuple[int, int],
    out2: torch.Tensor | None = None,
    out2_strides: tuple[int, int] = (0, 0),
    out3: torch.Tensor | None = None,
    out3_strides: tuple[int, int] = (0, 0),
    positions: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    heads: tuple[int, int] = (0, 0),
    config: GemmConfig | None = None,
    workspace: Workspace | None = None,
    pdl: bool = False,
) -> None:
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise ValueError(f"expected a [M, K] and w [N, K], got {tuple(a.shape)} and {tuple(w.shape)}")
    if a.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("a and w must be contiguous in their last (K) dimension")
    M, K = a.shape
    paired = pair_off > 0
    cfg = config or default_config(M, group_w, groups, K, paired, a.device)
    chunks = triton.cdiv(group_w, cfg.block_n)
    n_tiles = groups * chunks
    m_tiles = triton.cdiv(M, cfg.block_m)
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(K, k_per_split)  # splits that have work
    tile_elems = cfg.block_m * cfg.block_n * (2 if paired else 1) + cfg.block_m
    if split > 1:
        need = (m_tiles * n_tiles * split * tile_elems, m_tiles * n_tiles)
        if workspace is None:
            workspace = _default_workspace(a.device, *need)
        workspace.check(*need)
    ws = workspace.partials if workspace is not None else out
    cnt = workspace.counters if workspace is not None else out
    if norm is not None:
        if norm.mult.shape != (K,):
            raise ValueError(f"norm multiplier has shape {tuple(norm.mult.shape)}, expected ({K},)")
        if norm.bias is not None and norm.bias.shape != (w.shape[0],):
            raise ValueError(f"norm bias has shape {tuple(norm.bias.shape)}, expected ({w.shape[0]},)")
    dummy = out
    pdl = pdl and not is_interpreting()
    _skinny_gemm_kernel[(n_tiles, m_tiles, split)](
        a,
        w,
        norm.mult if norm is not None else dummy,
        norm.bias if norm is not None and norm.bias is not None else dummy,
        ws,
        cnt,
        out,
        out2 if out2 is not None else dummy,
        out3 if out3 is not None else dummy,
        positions if positions is not None else dummy,
        inv_freq if inv_freq is not None else dummy,
        gate if gate is not None else dummy,
        M,
        K,
        k_per_split,
        group_w,
        group_stride,
        pair_off,
        chunks,
        n_tiles,
        heads[0],
        heads[1],
        a.stride(0),
        w.stride(0),
        *out_strides,
        *out2_strides,
        *out3_strides,
        float(norm.eps) if norm is not None else 0.0,
        EPILOGUE=epilogue,
        NORM=norm is not None,
        HAS_C=norm is not None and norm.bias is not None,
        HAS_GATE=gate is not None,
        PAIRED=paired,
        SPLIT=split,
        ONE_SHOT=k_per_split == cfg.block_k,
        USE_PDL=pdl,
        UPCAST=is_interpreting(),  # the interpreter's tl.dot mis-multiplies bf16
        PREC=dot_precision(w.dtype),
        FIX=needs_rtne_fix(out.dtype),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )


# ---- ops ---------------------------------------------------------------------------------------


def fold_shift(shift: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """adaRMS shift folded through the GEMM: ``shift @ W.T`` as an fp32 column bias (load time)."""
    return (shift.float() @ w.float().T).contiguous()


def norm_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    norm: NormPrologue | None = None,
    out: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    workspace: Workspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``norm(x) @ w.T`` (or ``x @ w.T``) -> [M, N] in w's dtype."""
    N = w.shape[0]
    out = out if out is not None else torch.empty(x.shape[0], N, dtype=w.dtype, device=x.device)
    _launch(
        x, w, epilogue=PLAIN, group_w=N, groups=1, group_stride=0, pair_off=0, norm=norm,
        out=out, out_strides=(out.stride(0), 0), config=config, workspace=workspace, pdl=pdl,
    )  # fmt: skip
    return out


def norm_qkv_rope(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
    v_out: torch.Tensor | None = None,
    norm: NormPrologue | None = None,
    config: GemmConfig | None = None,
    workspace: Workspace | None = None,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``norm(x) @ Wqkv.T`` split into heads, q and k rotated (Gemma rotate_half RoPE at
    `positions`), written to q_out [M, H, D] and k_out / v_out [M, HK, D] or [M, D] (e.g. rows of
    the KV cache); returns (q, k, v)."""
    M, H, HK, D = x.shape[0], num_heads, num_kv_heads, head_dim
    if w_qkv.shape[0] != (H + 2 * HK) * D:
        raise ValueError(f"w_qkv has {w_qkv.shape[0]} rows, expected (H + 2 HK) * D = {(H + 2 * HK) * D}")
    if D % 2 or inv_freq.shape != (D // 2,):
        raise ValueError(f"head_dim must be even with inv_freq [{D // 2}], got {D} / {tuple(inv_freq.shape)}")
    if positions.shape != (M,):
        raise ValueError(f"positions has shape {tuple(positions.shape)}, expected ({M},)")
    dt, dev = w_qkv.dtype, x.device
    q_out = q_out if q_out is not None else torch.empty(M, H, D, dtype=dt, device=dev)
    k_out = k_out if k_out is not None else torch.empty(M, HK, D, dtype=dt, device=dev)
    v_out = v_out if v_out is not None else torch.empty(M, HK, D, dtype=dt, device=dev)
    views = []
    for name, t, n in (("q_out", q_out, H), ("k_out", k_out, HK), ("v_out", v_out, HK)):
        v3 = t.view(M, 1, D) if t.dim() == 2 and n == 1 else t
        if tuple(v3.shape) != (M, n, D) or v3.stride(2) != 1 or v3.dtype != dt:
            raise ValueError(f"{name} must be [{M}, {n}, {D}] ({dt}, contiguous rows), got {tuple(t.shape)}")
        views.append(v3)
    q3, k3, v3 = views
    _launch(
        x, w_qkv, epilogue=ROPE, group_w=D // 2, groups=H + 2 * HK, group_stride=D, pair_off=D // 2, norm=norm,
        out=q3, out_strides=(q3.stride(0), q3.stride(1)), out2=k3, out2_strides=(k3.stride(0), k3.stride(1)),
        out3=v3, out3_strides=(v3.stride(0), v3.stride(1)), positions=positions, inv_freq=inv_freq,
        heads=(H, HK), config=config, workspace=workspace, pdl=pdl,
    )  # fmt: skip
    return q_out, k_out, v_out


def norm_geglu(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    norm: NormPrologue | None = None,
    out: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    workspace: Workspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``gelu_tanh(g) * u`` for ``[g | u] = norm(x) @ Wgu.T`` -> [M, F]."""
    F2 = w_gate_up.shape[0]
    if F2 % 2:
        raise ValueError(f"w_gate_up must have an even number of rows (gate | up), got {F2}")
    out = out if out is not None else torch.empty(x.shape[0], F2 // 2, dtype=w_gate_up.dtype, device=x.device)
    _launch(
        x, w_gate_up, epilogue=GEGLU, group_w=F2 // 2, groups=1, group_stride=0, pair_off=F2 // 2, norm=norm,
        out=out, out_strides=(out.stride(0), 0), config=config, workspace=workspace, pdl=pdl,
    )  # fmt: skip
    return out


def linear_gated_residual(
    x: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor,
    gate: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    workspace: Workspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``residual += (x @ w.T) * gate`` in place (gate [N] or None for a plain residual add)."""
    N = w.shape[0]
    if residual.shape != (x.shape[0], N) or residual.stride(1) != 1:
        raise ValueError(f"residual must be [{x.shape[0]}, {N}] with contiguous rows, got {tuple(residual.shape)}")
    if gate is not None and gate.shape != (N,):
        raise ValueError(f"gate has shape {tuple(gate.shape)}, expected ({N},)")
    _launch(
        x, w, epilogue=GATED_RESIDUAL, group_w=N, groups=1, group_stride=0, pair_off=0, norm=None,
        out=residual, out_strides=(residual.stride(0), 0), gate=gate, config=config, workspace=workspace, pdl=pdl,
    )  # fmt: skip
    return residual


# ---- references (the eager model's maths) ------------------------------------------------------


def _norm_ref(x: torch.Tensor, mult: torch.Tensor | None, shift: torch.Tensor | None, eps: float) -> torch.Tensor:
    if mult is None:
        return x
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * mult.float()
    if shift is not None:
        y = y + shift.float()
    return y.to(x.dtype)


def norm_linear_ref(x, w, mult=None, shift=None, eps=1e-6) -> torch.Tensor:
    """Eager: normed row rounded to x's dtype, then the GEMM."""
    return torch.nn.functional.linear(_norm_ref(x, mult, shift, eps), w)


def norm_qkv_rope_ref(
    x, w_qkv, positions, inv_freq, num_heads, head_dim, num_kv_heads, mult=None, shift=None, eps=1e-6
):
    qkv = norm_linear_ref(x, w_qkv, mult, shift, eps).float()
    H, HK, D = num_heads, num_kv_heads, head_dim
    q, k, v = qkv.split([H * D, HK * D, HK * D], -1)
    ang = positions.float()[:, None] * inv_freq.float()[None, :]
    c, s = torch.cat([ang.cos(), ang.cos()], -1)[:, None], torch.cat([ang.sin(), ang.sin()], -1)[:, None]

    def rot(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t[..., : D // 2], t[..., D // 2 :]
        return t * c + torch.cat([-t2, t1], -1) * s

    q, k, v = rot(q.view(-1, H, D)), rot(k.view(-1, HK, D)), v.view(-1, HK, D)
    return q.to(x.dtype), k.to(x.dtype), v.to(x.dtype)


def norm_geglu_ref(x, w_gate_up, mult=None, shift=None, eps=1e-6) -> torch.Tensor:
    g, u = norm_linear_ref(x, w_gate_up, mult, shift, eps).float().chunk(2, -1)
    return (torch.nn.functional.gelu(g, approximate="tanh") * u).to(x.dtype)


def linear_gated_residual_ref(x, w, residual, gate=None) -> torch.Tensor:
    y = torch.nn.functional.linear(x, w)
    if gate is not None:
        y = (y.float() * gate.float()).to(residual.dtype)
    return (residual.float() + y.float()).to(residual.dtype)
