"""flashrt_ros.kernels.expert_step: the expert's whole denoise-step pass in one persistent launch.

- against `expert_step_ref` (torch, layer by layer): small ragged shapes on the CPU
  (interpreter, one program), the real pi0.5 shapes on a GPU (one program per SM, barriers);
  through the whole model in test_fused.py;
- the GPU code builds at the real shapes for Hopper (sm_90, the H200) and Jetson Thor (sm_110)
  with Triton's own ptxas and no GPU (scripts/compile_check.py, in a process without the
  interpreter): the only check of Thor's target we can run in CI.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from kernel_fixtures import DEVICE, run_offline
from policy_fixtures import cosine

from flashrt_ros.kernels.denoise_update import DenoiseUpdate, EulerGuide, denoise_update_ref
from flashrt_ros.kernels.expert_step import (
    PHASES,
    ExpertStepPlan,
    ExpertWeights,
    expert_step_ref,
    pair_halves,
    rope_table,
    unpair_columns,
)
from flashrt_ros.kernels.rope import rope_inv_freq

ROOT = Path(__file__).resolve().parents[1]


def _compile_check(*argv: str) -> list[dict]:
    """scripts/compile_check.py in a process without the interpreter; its JSON lines."""
    return run_offline(str(ROOT / "scripts/compile_check.py"), *argv)


def test_step_kernel_builds_for_hopper_and_thor() -> None:
    results = {r["arch"]: r for r in _compile_check("90", "110")}
    assert set(results) == {90, 110}
    assert "unsupported_by_ptxas" not in results[90]
    # specialised like the JIT's build: the four GEMM K loops and the attention's two (the scores'
    # head-dim loop, the PV key loop) are software-pipelined (an unspecialised build pipelines
    # none of the GEMM loops)
    assert results[90]["pipelined_loops"] == 6
    assert results[90]["prefetches"] > 0  # the weight prefetches at the barriers
    for r in results.values():
        if "unsupported_by_ptxas" in r:
            continue  # checked below, after sm_90's build was
        assert r["target"] and r["cooperative"]
        assert 0 < r["shared_bytes"] <= 227 * 1024  # fits Hopper's and Thor's shared memory
        assert r["registers"] is None or 0 < r["registers"] <= 255  # None: this cuobjdump cannot read it
    if "unsupported_by_ptxas" in results[110]:  # Triton 3.6's ptxas predates sm_110 (seen on the H200 box)
        pytest.skip(f"sm_90 checked; this Triton's ptxas cannot build sm_110: {results[110]['unsupported_by_ptxas']}")


def test_split_attention_builds_for_hopper() -> None:
    """The split attention (key splits + combine, tiles through TMA) on sm_90, which other archs
    run by default: its attention loop and the four GEMM K loops are pipelined."""
    (result,) = _compile_check("--set", "att_two_pass=0", "90")
    assert result["target"] and result["pipelined_loops"] == 5 and result["stack_bytes"] in (0, None)


def test_pre_hopper_target_builds_without_tma() -> None:
    """sm_80 (no TMA): the launch builds with the split attention's pointer loads."""
    (result,) = _compile_check("80")
    assert result["target"] and result["tiles"] == {}


def test_thor_sized_launch_builds() -> None:
    """--sms 20 (Jetson AGX Thor's SM count) with Thor's split attention: the grid-dependent
    launch (one key split per query tile, the tail's chunks) builds too, for Hopper here (any
    Triton's ptxas knows sm_90)."""
    (result,) = _compile_check("--sms", "20", "--set", "att_two_pass=0", "90")
    assert result["sms"] == 20 and result["target"] and result["cooperative"]
    assert 0 < result["shared_bytes"] <= 227 * 1024


def test_step_kernel_builds_at_the_tiny_shape() -> None:
    """PolicyConfig.tiny's expert (width 32, head dim 16), which the fused tests build on a GPU:
    narrow rows must still compile (a prefetch of K // 64 lines once made an empty range there)."""
    (result,) = _compile_check("--shape", "tiny", "90")
    assert result["shape"] == "tiny" and result["target"] and result["cooperative"]
    assert result["registers"] is None or 0 < result["registers"] <= 255
    assert result["prefetches"] > 0  # the prefetches are in that build, not compiled away


def test_traced_variant_with_other_tiles_builds() -> None:
    """The variant bench/expert_step.py traces builds too (phase timestamps), here with other
    tiles set the way the benchmark's variants set them."""
    (result,) = _compile_check("--trace", "--set", "bk=64", "--set", "sc_bn=64", "90")
    assert result["trace"] and result["target"] and result["tiles"] == {"bk": 64, "sc_bn": 64}


def test_plan_refuses_too_many_suffix_tokens() -> None:
    with pytest.raises(ValueError, match="at most 64 suffix tokens"):
        ExpertStepPlan(65, 1024, 4096, 8, 256, 1, torch.device("meta"), torch.bfloat16, gpu=True, sm_count=132)


@pytest.mark.parametrize("rows", [50, 51], ids=["pi05", "pi0"])
@pytest.mark.parametrize("sms", [132, 20, 170])
def test_attention_units_fill_the_grid_once(rows: int, sms: int) -> None:
    """GPU launch of the split attention (built on meta tensors, not run): 16 query rows per
    attention unit and as many key splits over the 968 + S keys as fill the grid in one wave
    (pi0.5 on 132 SMs: 25 tiles x 5 splits); a grid smaller than the query tiles (Thor's 20 SMs)
    gets no split."""
    meta, bf16, W, F, H, D, L, P = torch.device("meta"), torch.bfloat16, 1024, 4096, 8, 256, 2, 968
    plan = ExpertStepPlan(rows, W, F, H, D, 1, meta, bf16, gpu=True, sm_count=sms)
    plan.set_tiles(att_two_pass=False)
    e = lambda *shape, dtype=bf16: torch.empty(*shape, dtype=dtype, device=meta)  # noqa: E731
    vec = e(1, L, W, dtype=torch.float32)
    w = ExpertWeights(e(L, (H + 2) * D, W), e(L, W, H * D), e(L, 2 * F, W), e(L, W, F), vec, vec, vec, vec, vec, vec,
                      e(1, W, dtype=torch.float32), e(1, W, dtype=torch.float32))  # fmt: skip
    i32 = torch.int32
    _, kw = plan.launch_args(
        e(rows, W), plan.lay_out(w), 0, e(L, P + rows, D), e(L, P + rows, D), e(P + rows, dtype=i32),
        e(rows, dtype=i32), e(2, rows, D // 2, dtype=torch.float32), P, 0, 1e-6,
    )  # fmt: skip
    tiles = -(-rows * H // kw["ATT_BM"])
    assert not kw["ATT_TWO_PASS"] and kw["ATT_BM"] == 16 and kw["ATT_SPLITS"] == plan.att_splits
    if tiles >= sms:
        assert kw["ATT_SPLITS"] == 1
    else:
        assert tiles * kw["ATT_SPLITS"] <= sms < tiles * (kw["ATT_SPLITS"] + 1)


def test_rope_table_is_cos_sin_of_position_times_frequency_and_checked() -> None:
    """`rope_table`: [2, M, D/2] cos / sin of position x inv_freq; a launch refuses a table of
    the wrong shape or dtype (a positions vector, say) with what it expected."""
    pos, inv = torch.arange(7, 12), rope_inv_freq(16, 10000.0, "cpu")
    table = rope_table(pos, inv)
    ang = pos.double()[:, None] * inv.double()[None, :]
    assert table.shape == (2, 5, 8) and table.dtype == torch.float32
    torch.testing.assert_close(table, torch.stack([ang.cos(), ang.sin()]).float(), rtol=1e-5, atol=1e-6)
    M, W, F, H, D, L, P = 10, 32, 64, 4, 16, 2, 24
    h0, w, (k, v, kb, qb, pos, inv, row0) = _problem(M, W, F, H, D, L, P, torch.float32, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    for bad in (pos, rope_table(pos, inv).double(), rope_table(pos[:-1], inv)):
        with pytest.raises(ValueError, match=rf"rope must be rope_table\(...\)'s contiguous float32 \[2, {M}, 8\]"):
            plan.step(h0.clone(), plan.lay_out(w), 1, k, v, kb, qb, bad, row0, 0, 1e-6)


def test_step_refuses_strided_masks_and_weights() -> None:
    """The kernel reads masks, weights and norms as packed rows: the same values through a
    strided view were read as other numbers (errors of 1.5 and 150 against the reference), now
    refused naming the tensor and its strides; a norm stack too short for the step as well."""
    M, W, F, H, D, L, P = 10, 32, 64, 4, 16, 2, 24
    h0, w, (k, v, kb, qb, pos, inv, row0) = _problem(M, W, F, H, D, L, P, torch.float32, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    w, rope = plan.lay_out(w), rope_table(pos, inv)
    strided_kb = torch.stack([kb, kb], 1)[:, 0]
    with pytest.raises(ValueError, match=r"key_blocks must be contiguous int32 on .*, got torch.int32 strides \(2,\)"):
        plan.step(h0.clone(), w, 1, k, v, strided_kb, qb, rope, row0, 0, 1e-6)
    with pytest.raises(ValueError, match=r"query_blocks must be contiguous int32 .*, got torch.int64"):
        plan.step(h0.clone(), w, 1, k, v, kb, qb.long(), rope, row0, 0, 1e-6)
    transposed = w.attn_mult.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    with pytest.raises(ValueError, match=r"expert weights: attn_mult must be contiguous torch.float32 \[2, 2, 32\]"):
        plan.step(h0.clone(), replace(w, attn_mult=transposed), 1, k, v, kb, qb, rope, row0, 0, 1e-6)
    with pytest.raises(ValueError, match=r"expert weights: down must be contiguous torch.float32 \[2, 32, 64\]"):
        plan.step(h0.clone(), replace(w, down=w.down.double()), 1, k, v, kb, qb, rope, row0, 0, 1e-6)
    with pytest.raises(ValueError, match="attn_mult holds 2 denoise steps, step 2 asked for"):
        plan.step(h0.clone(), w, 2, k, v, kb, qb, rope, row0, 0, 1e-6)
    # GATED / HAS_SHIFT follow the attention norm's: a missing MLP gate or shift was read from attn_mult
    half = replace(w, mlp_gate=None, mlp_shift=None, final_shift=None)
    match = r"mlp_gate missing: the gates go together .*; mlp_shift, final_shift missing: the shifts go together"
    with pytest.raises(ValueError, match=match):
        plan.step(h0.clone(), half, 1, k, v, kb, qb, rope, row0, 0, 1e-6)


def test_phase_times_decodes_the_trace() -> None:
    """Trace layout: per phase (last program done, program 0 past the barrier), then the final
    phase, then the launch start; times in ns -> us."""
    plan = ExpertStepPlan(10, 32, 64, 4, 16, 1, torch.device("cpu"), torch.float32)
    plan.enable_trace(layers=2)
    n = PHASES * 2 + 1
    stamps = []
    t = 1000
    for _ in range(n):
        stamps += [t + 3000, t + 4000]  # 3 us of work, 1 us of barrier
        t += 4000
    plan.trace.copy_(torch.tensor(stamps + [1000], dtype=torch.int64))
    rows = plan.phase_times()
    assert len(rows) == n and rows[PHASES + 1] == dict(layer=1, phase=1, work=3.0, barrier=1.0)
    assert rows[-1]["barrier"] == 0.0 and all(r["work"] == 3.0 for r in rows)


def _problem(M, W, F, H, D, L, P, dtype, gated, seed=0, pi0_blocks=False):
    """Random stacked weights / norms for 2 steps, a cache whose last 4 prefix keys are padding.
    pi0_blocks: pi0's suffix blocks (the state token [1], then the actions [2, 2, ...]: the state
    sees no action key); else pi0.5's (every suffix token in block 1)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)  # noqa: E731
    vec = lambda base: (base + 0.2 * torch.randn(2, L, W, generator=g)).to(DEVICE)  # noqa: E731
    fin = (1 + 0.2 * torch.randn(2, W, generator=g)).to(DEVICE)
    w = ExpertWeights(
        rnd(L, (H + 2) * D, W, scale=W**-0.5), rnd(L, W, H * D, scale=(H * D) ** -0.5),
        rnd(L, 2 * F, W, scale=W**-0.5), rnd(L, W, F, scale=F**-0.5),
        vec(1.0), vec(0.0) if gated else None, vec(1.0) if gated else None,
        vec(1.0), vec(0.0) if gated else None, vec(1.0) if gated else None,
        fin, (fin - 1) if gated else None,
    )  # fmt: skip
    k, v = rnd(L, P + M, D), rnd(L, P + M, D)
    kb = torch.full((P + M,), -(2**30), dtype=torch.int32)
    kb[P - 4 : P] = 2**30  # padded prefix keys: seen by no query
    qb = torch.ones(M, dtype=torch.int32)
    if pi0_blocks:
        qb[1:] = 2
    kb[P:] = qb
    inputs = (k, v, kb.to(DEVICE), qb.to(DEVICE))
    inputs += (torch.arange(P - 4, P - 4 + M, device=DEVICE), rope_inv_freq(D, 10000.0, DEVICE), P)
    return rnd(M, W), w, inputs


def _kernel_inputs(inputs):
    """`_problem`'s (k, v, kb, qb, positions, inv_freq, row0) as the kernel takes them: the RoPE
    angles as `rope_table`'s cos / sin (the reference computes its own from the positions)."""
    *head, pos, inv, row0 = inputs
    return (*head, rope_table(pos, inv), row0)


def _run_and_compare(shape, dtype, gated, tol, sms=None, cache_pad=0, pi0_blocks=False, **tiles):
    """cache_pad: the K / V caches as the first rows of longer ones whose extra rows hold NaN
    (the fused path passes a prompt bucket's slice of its cache): no kernel may read them."""
    M, W, F, H, D, L, P = shape
    h0, w, (k, v, kb, qb, pos, inv, row0) = _problem(M, W, F, H, D, L, P, dtype, gated, pi0_blocks=pi0_blocks)
    if cache_pad:
        k, v = (torch.cat([t, torch.full_like(t[:, :cache_pad], float("nan"))], 1)[:, : t.shape[1]] for t in (k, v))
    h_ref, x_ref, k_ref, v_ref = expert_step_ref(h0, w, 1, k, v, kb, qb, pos, inv, row0, 1e-6)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), dtype, sm_count=sms)
    plan.set_tiles(**tiles)
    h = h0.clone()
    x = plan.step(h, plan.lay_out(w), 1, k, v, kb, qb, rope_table(pos, inv), row0, 0, 1e-6)
    assert torch.equal(k[:, :row0], k_ref[:, :row0]) and torch.equal(v[:, :row0], v_ref[:, :row0])  # prefix kept
    suffix = slice(row0, row0 + M)
    _assert_all_close([(h, h_ref), (x, x_ref), (k[:, suffix], k_ref[:, suffix]), (v[:, suffix], v_ref[:, suffix])], tol)


# bf16 against the fp32-maths reference: cosine and max abs error as a share of the reference's
# largest value. Small shapes (interpreter): measured at most 1.4% and cosine 0.99996; the expert's
# activation scaled by 1.04 gives 3-4% and 0.99975. Real shapes (H200, 18 layers of bf16
# rounding, f83ccc1): 2.8% and 0.99979-0.99980.
BF16_SMALL = dict(cos=0.9999, rel=0.02)
BF16_REAL = dict(cos=0.9997, rel=0.04)


def _assert_all_close(pairs, tol) -> None:
    """Each (got, ref): within `tol` (torch's atol / rtol), or a BF16_* gate."""
    for got, ref in pairs:
        if "cos" in tol:
            got, ref = got.float(), ref.float()
            err, scale = (got - ref).abs().max().item(), ref.abs().max().item()
            assert cosine(got, ref) > tol["cos"] and err < tol["rel"] * scale, (cosine(got, ref), err, scale)
        else:
            torch.testing.assert_close(got.float(), ref.float(), **tol)


@pytest.mark.parametrize("gated", [True, False], ids=["pi05-adarms", "pi0-rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_kernel_matches_reference_small(dtype, gated) -> None:
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    _run_and_compare((10, 32, 64, 4, 16, 2, 24), dtype, gated, tol)


@pytest.mark.parametrize("gated", [True, False], ids=["pi05-adarms", "pi0-rmsnorm"])
def test_split_k_partials_over_several_tiles_and_splits(gated) -> None:
    """Several column tiles and K splits in the O and down projections: the row phases sum
    every split's partial."""
    tiles = dict(bn_o=16, ks_o=32, bn_d=16, ks_d=32, att_bn=16)  # 4 x 4 O and down units; 16-key blocks
    _run_and_compare((10, 64, 128, 4, 32, 2, 24), torch.float32, gated, dict(atol=1e-4, rtol=1e-4), **tiles)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_pairs_over_several_blocks_per_head(dtype) -> None:
    """Head dim 32 in 8-row blocks: each half of a head holds two blocks, so the QKV units read
    rows that `lay_out` moved (head dim 16 leaves them in place) and RoPE pairs them back."""
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    _run_and_compare((10, 32, 64, 4, 32, 2, 24), dtype, True, tol, bn_qkv=8)


@pytest.mark.parametrize("att_tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("gated", [True, False], ids=["pi05-adarms", "pi0-rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_over_several_tiles_and_key_splits(dtype, gated, att_tma) -> None:
    """3 query tiles x 3 key splits, merged by the combine phase; the tiles through pointer
    loads or TMA descriptors (`att_tma`), over caches that are slices of longer ones (34 keys:
    the last 16-key tile reaches past them, into rows of NaN); pi0's block mask with pi0's
    plain RMSNorm (the state token must not see the action keys)."""
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    tiles = dict(att_two_pass=False, att_bm=16, att_bn=16, att_splits=3, att_tma=att_tma)
    _run_and_compare((10, 32, 64, 4, 16, 2, 24), dtype, gated, tol, cache_pad=8, pi0_blocks=not gated, **tiles)


@pytest.mark.parametrize("sc", [(64, 16), (16, 32)], ids=["one-row-tile", "three-row-tiles"])
@pytest.mark.parametrize("gated", [True, False], ids=["pi05-adarms", "pi0-rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_pass_attention(dtype, gated, sc) -> None:
    """The two-pass attention (scores per (query tile, key tile), then P @ V per (query tile,
    column tile) with every key tile's rescale known first): 40 query rows against 34 keys in 3
    or 2 key tiles (the last reaching past the cache into rows of NaN), 16-column PV tiles (head
    dim 16 in one, the 32-wide heads in two); pi0's block mask with its plain RMSNorm."""
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    tiles = dict(att_two_pass=True, sc_bm=sc[0], sc_bn=sc[1], pv_bm=16, pv_bd=16)
    _run_and_compare((10, 32, 64, 4, 16, 2, 24), dtype, gated, tol, cache_pad=8, pi0_blocks=not gated, **tiles)
    _run_and_compare((10, 32, 64, 4, 32, 2, 24), dtype, gated, tol, cache_pad=8, pi0_blocks=not gated, **tiles)


def test_two_pass_workspace_grows_outside_capture_and_names_bad_tiles() -> None:
    """A longer cache than reserved grows the P workspace (outside a CUDA-graph capture), keeping
    the outgrown buffers alive (a graph captured earlier may still use them), and so do smaller
    key tiles (more row stats); tile settings the kernel cannot use are refused by name."""
    plan = ExpertStepPlan(10, 32, 64, 4, 16, 1, torch.device("cpu"), torch.float32)
    plan.set_tiles(att_two_pass=True, sc_bn=16)
    p, m, l_, cols = plan._scores_ws(34)
    assert cols == 48 and tuple(p.shape) == (40, 48) and m.numel() == l_.numel() == 3 * 40
    plan.reserve_keys(20)  # never shrinks
    assert plan._scores_ws(34)[3] == 48 and plan.att_p.numel() == 40 * 48
    first_p = plan.att_p
    assert plan._scores_ws(100)[3] == 112 and plan.att_p.numel() == 40 * 112
    assert any(t is first_p for t in plan._retired)
    plan.set_tiles(sc_bn=128)
    assert plan._scores_ws(100)[3] == 128  # P grows to 128 columns, the stats (1 tile) fit
    plan.set_tiles(sc_bn=16)
    _, m, l_, cols = plan._scores_ws(100)
    assert cols == 112 and m.numel() == l_.numel() == 7 * 40 and plan.att_stats.numel() >= 2 * 7 * 40
    with pytest.raises(ValueError, match="sc_bn 24: expected a power of two >= 16"):
        plan.set_tiles(sc_bn=24)
    plan = ExpertStepPlan(10, 32, 64, 4, 16, 1, torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="pv_bd 32 does not divide the head dim 16"):
        plan.set_tiles(pv_bd=32)


def test_step_refuses_a_slot_outside_the_plan() -> None:
    M, W, F, H, D, P = 10, 32, 64, 4, 16, 24
    h0, w, inputs = _problem(M, W, F, H, D, 2, P, torch.float32, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    with pytest.raises(ValueError, match="slot 1 outside the plan's 1 launches"):
        plan.step(h0.clone(), plan.lay_out(w), 1, *_kernel_inputs(inputs), 1, 1e-6)


def test_set_tiles_refuses_unknown_settings_and_bad_qkv_tiles() -> None:
    plan = ExpertStepPlan(10, 32, 64, 4, 16, 1, torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="unknown tile setting bn_x"):
        plan.set_tiles(bn_x=16)
    with pytest.raises(ValueError, match=r"bn_qkv 4: expected a power of two >= 8 dividing half the head dim \(8\)"):
        plan.set_tiles(bn_qkv=4)
    with pytest.raises(ValueError, match="head dim 24: the step kernel's QKV tiles need a multiple of 16"):
        ExpertStepPlan(10, 32, 64, 4, 24, 1, torch.device("cpu"), torch.float32)


def test_tma_attention_refuses_a_cache_it_cannot_describe() -> None:
    """att_tma's descriptors need [L, Tk, D] caches with 16-byte strides: a clear error naming
    what it got, before any launch."""
    M, W, F, H, D, L, P = 10, 32, 64, 4, 16, 2, 24
    h0, w, (k, v, kb, qb, pos, inv, row0) = _problem(M, W, F, H, D, L, P, torch.float32, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    plan.set_tiles(att_two_pass=False, att_tma=True)
    odd_k, odd_v = (torch.zeros(L, P + M, D + 1, device=DEVICE)[..., :D] for _ in "kv")  # 68-byte rows
    with pytest.raises(ValueError, match=r"the k cache must be \[L, Tk, 16\].*got shape \(2, 34, 16\), strides"):
        plan.step(h0.clone(), plan.lay_out(w), 1, odd_k, odd_v, kb, qb, rope_table(pos, inv), row0, 0, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [True, False], ids=["pi05-adarms", "pi0-rmsnorm"])
def test_step_kernel_matches_reference_gpu_real_shapes(gated) -> None:
    _run_and_compare((50, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, gated, BF16_REAL)


@pytest.mark.gpu
def test_step_kernel_attention_through_tma_gpu_real_shapes() -> None:
    _run_and_compare(
        (50, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, True, BF16_REAL, att_two_pass=False, att_tma=True
    )


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [True, False], ids=["pi05-adarms", "pi0-rmsnorm"])
def test_step_kernel_split_attention_gpu_real_shapes(gated) -> None:
    """The attention as key splits + combine (the default before the two-pass one)."""
    _run_and_compare((50, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, gated, BF16_REAL, att_two_pass=False)


@pytest.mark.gpu
def test_step_kernel_on_a_small_grid_gpu_real_shapes() -> None:
    """20 programs, Jetson Thor's SM count, with Thor's split attention: each program walks
    several units of every phase, and no program is free during QKV, so gate|up's weights are
    prefetched per tile."""
    _run_and_compare((50, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, True, BF16_REAL, sms=20, att_two_pass=False)


@pytest.mark.gpu
def test_step_kernel_over_a_longer_cache_gpu_real_shapes() -> None:
    """The default (two-pass on the H200) over caches that are slices of longer ones whose next
    rows hold NaN: the last 128-key tile reaches 6 rows past the 1018 keys."""
    _run_and_compare((50, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, True, BF16_REAL, cache_pad=8)


@pytest.mark.gpu
def test_two_pass_workspace_is_not_grown_inside_a_capture() -> None:
    """A launch inside a CUDA-graph capture over more keys than the workspace holds is refused
    with what to call (growing there would leave the graph on a buffer freed later)."""
    M, W, F, H, D, L, P = 10, 32, 64, 4, 16, 2, 24
    h0, w, inputs = _problem(M, W, F, H, D, L, P, torch.bfloat16, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device("cuda"), torch.bfloat16)
    plan.set_tiles(att_two_pass=True, sc_bn=16)
    plan.reserve_keys(16)  # one key tile; the launch reads 34 keys (3 tiles)
    graph, h, laid, args = torch.cuda.CUDAGraph(), h0.clone(), plan.lay_out(w), _kernel_inputs(inputs)
    with pytest.raises(ValueError, match=r"call plan.reserve_keys\(34\) before capturing"):
        with torch.cuda.graph(graph):
            plan.step(h, laid, 1, *args, 0, 1e-6)


@pytest.mark.gpu
def test_step_kernel_pi0_as_it_runs_gpu_real_shapes() -> None:
    """pi0's real suffix: 51 rows (the state token, then 50 actions) under its block mask (the
    state token does not see the action keys), plain RMSNorm."""
    _run_and_compare((51, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, False, BF16_REAL, pi0_blocks=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_kernel_odd_rows_with_pi0_blocks(dtype) -> None:
    """An odd row count (pi0's state token + an odd number of actions) and an odd prefix length."""
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    _run_and_compare((11, 32, 64, 4, 16, 2, 23), dtype, False, tol, pi0_blocks=True)


def test_gate_up_span_prefetch_only_with_enough_free_programs() -> None:
    """The QKV phase's free programs fetch gate|up's weights only when there are enough of them
    (80 QKV units: the H200's 52 free do it, 2 or 4 free do not) and the weights fit in L2."""

    def plan(sms: int) -> ExpertStepPlan:
        meta = torch.device("meta")
        return ExpertStepPlan(50, 1024, 4096, 8, 256, 1, meta, torch.bfloat16, gpu=True, sm_count=sms)

    assert plan(132)._prefetch_span()
    assert not plan(82)._prefetch_span() and not plan(20)._prefetch_span()
    small_l2 = plan(132)
    small_l2.set_tiles(l2_bytes=8 * 2**20)  # 16.8 MB of gate|up weights per layer do not fit
    assert not small_l2._prefetch_span()
    off = plan(132)
    off.set_tiles(prefetch=False)
    assert not off._prefetch_span()


def _run_with_update(shape, dtype, pi05: bool, A: int, tol, guided: bool = False, **tiles) -> None:
    """The step kernel's tail (`update=`) against the reference step + `denoise_update_ref`:
    pi0.5 (every row an action; the next input written over h, which the kernel just updated)
    and pi0 (a state row first; the time MLP's SiLU hidden layer into an fp32 buffer); `guided`:
    with real-time chunking's correction in the Euler step."""
    M, W, F, H, D, L, P = shape
    h0, w, (k, v, kb, qb, pos, inv, row0) = _problem(M, W, F, H, D, L, P, dtype, gated=pi05)
    HA = M if pi05 else M - 1
    g = torch.Generator().manual_seed(1)
    f32 = lambda *s: (torch.randn(*s, generator=g) * 0.3).to(DEVICE)  # noqa: E731
    x0, w_out, b_out, w_in, b_in = f32(HA, A), f32(A, W), f32(A), f32(W, A), f32(W)
    guide = None
    if guided:  # weights in [0, 1], some rows and dims not held at all
        weights = (torch.rand(HA, A, generator=g) * (torch.arange(HA) < HA - 2)[:, None]).to(DEVICE)
        guide = EulerGuide(f32(HA, A) * 3, weights, torch.tensor([0.7, 2.5], device=DEVICE))
    h_ref, y_ref, _, _ = expert_step_ref(h0, w, 1, k, v, kb, qb, pos, inv, row0, 1e-6)
    nxt_dtype = dtype if pi05 else torch.float32  # pi0's hidden layer stays fp32
    x_ref, nxt_ref = denoise_update_ref(
        y_ref[-HA:], x0, w_out, b_out, -0.1, w_in, b_in, nxt_dtype, silu=not pi05, guide=guide
    )
    if guided:  # the correction moved x: a tail that ignored it would fail below
        plain, _ = denoise_update_ref(y_ref[-HA:], x0, w_out, b_out, -0.1)
        assert float((plain - x_ref).abs().max()) > 0.05

    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), dtype)
    plan.set_tiles(**tiles)
    h, x = h0.clone(), x0.clone()
    nxt = h if pi05 else torch.zeros(HA, W, device=DEVICE)
    update = DenoiseUpdate(x, w_out, b_out, -0.1, w_in, b_in, nxt, silu=not pi05, guide=guide)
    y = plan.step(h, plan.lay_out(w), 1, k, v, kb, qb, rope_table(pos, inv), row0, 0, 1e-6, update=update)
    pairs = [(y, y_ref), (x, x_ref), (nxt, nxt_ref)]
    if not pi05:
        pairs.append((h, h_ref))  # pi0.5's h now holds the next input
    _assert_all_close(pairs, tol)


@pytest.mark.parametrize("pi05", [True, False], ids=["pi05-next-input-into-h", "pi0-silu-hidden"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_kernel_with_denoise_update_small(dtype, pi05) -> None:
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    _run_with_update((10, 32, 64, 4, 16, 2, 24), dtype, pi05, A=6, tol=tol)


@pytest.mark.parametrize("pi05", [True, False], ids=["pi05", "pi0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_kernel_with_guided_denoise_update_small(dtype, pi05) -> None:
    """Real-time chunking's correction in the tail's Euler step; the next input is made from the
    guided x."""
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else BF16_SMALL
    _run_with_update((10, 32, 64, 4, 16, 2, 24), dtype, pi05, A=6, tol=tol, guided=True)


def test_guided_denoise_tail_in_chunks() -> None:
    _run_with_update(
        (6, 512, 64, 2, 16, 1, 8), torch.float32, True, A=32, tol=dict(atol=1e-4, rtol=1e-4), guided=True,
        update_chunks=2,
    )  # fmt: skip


@pytest.mark.parametrize("pi05", [True, False], ids=["pi05-next-input-into-h", "pi0-silu-hidden"])
def test_denoise_tail_in_chunks(pi05) -> None:
    """The tail's (row, chunk) units as on the GPU, where a row's velocity is summed from two
    K-chunk partials and its next input written in two column chunks (here 2 x 256 of 512)."""
    _run_with_update(
        (6, 512, 64, 2, 16, 1, 8), torch.float32, pi05, A=32, tol=dict(atol=1e-4, rtol=1e-4), update_chunks=2
    )


@pytest.mark.parametrize("chunks", [1, 2])
def test_denoise_tail_of_the_last_step(chunks) -> None:
    """No next input (the last step): only the Euler step of x, the rest of the output as the
    reference's; h keeps the step's residual stream."""
    M, W, F, H, D, L, P = 6, 512, 64, 2, 16, 1, 8
    h0, w, (k, v, kb, qb, pos, inv, row0) = _problem(M, W, F, H, D, L, P, torch.float32, gated=True)
    g = torch.Generator().manual_seed(2)
    x0, w_out, b_out = (torch.randn(*s, generator=g).to(DEVICE) * 0.3 for s in ((M, 32), (32, W), (32,)))
    h_ref, y_ref, _, _ = expert_step_ref(h0, w, 1, k, v, kb, qb, pos, inv, row0, 1e-6)
    x_ref, _ = denoise_update_ref(y_ref, x0, w_out, b_out, -0.1)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    plan.set_tiles(update_chunks=chunks)
    h, x = h0.clone(), x0.clone()
    laid, update = plan.lay_out(w), DenoiseUpdate(x, w_out, b_out, -0.1)
    y = plan.step(h, laid, 1, k, v, kb, qb, rope_table(pos, inv), row0, 0, 1e-6, update=update)
    _assert_all_close([(y, y_ref), (x, x_ref), (h, h_ref)], dict(atol=1e-4, rtol=1e-4))


def test_denoise_tail_at_a_width_that_is_not_a_multiple_of_its_tile() -> None:
    """48 columns with a 64-column tile: the partial tile still counts (masked, not skipped)."""
    _run_with_update((10, 48, 64, 4, 16, 2, 24), torch.float32, True, A=6, tol=dict(atol=1e-4, rtol=1e-4))


def test_gpu_plan_k_step_is_a_power_of_two_dividing_the_width() -> None:
    """tl.arange needs a power of two: a 48-wide expert steps K by 16 (it once took 48 and only
    failed to build compiled); the real 1024-wide expert by 128."""
    meta = torch.device("meta")
    plan = lambda W: ExpertStepPlan(10, W, 4096, 8, 256, 1, meta, torch.float32, gpu=True, sm_count=132)  # noqa: E731
    assert plan(48).bk == 16
    assert plan(1024).bk == 128
    assert plan(96).bk == 32


def test_denoise_tail_chunks_fill_the_grid_once() -> None:
    """The GPU plan's default: as many chunks per action row as fit the grid once (H200, 50 rows
    of 1024: 2 chunks of 512 columns); a set chunk count must divide the row's tiles."""
    plan = ExpertStepPlan(50, 1024, 4096, 8, 256, 1, torch.device("meta"), torch.bfloat16, gpu=True, sm_count=132)
    assert plan._update_chunk(50, 256) == 512
    assert plan._update_chunk(30, 256) == 256  # 4 chunks x 30 rows <= 132
    plan.set_tiles(update_chunks=3)
    with pytest.raises(ValueError, match="update_chunks=3 does not divide the 4 tiles"):
        plan._update_chunk(50, 256)


def test_denoise_tail_workspace_is_sized_by_the_expert_width() -> None:
    """Velocity partials for 16-column chunks of a wide expert (4096) with few rows, + the old x."""
    plan = ExpertStepPlan(2, 4096, 64, 1, 16, 1, torch.device("meta"), torch.float32, gpu=True, sm_count=132)
    assert plan.update_ws.numel() == (4096 // 16 + 1) * 2 * 64


def test_step_kernel_refuses_an_update_with_more_rows() -> None:
    M, W, F, H, D, L, P = 10, 32, 64, 4, 16, 2, 24
    h0, w, inputs = _problem(M, W, F, H, D, L, P, torch.float32, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    z = lambda *s: torch.zeros(*s, device=DEVICE)  # noqa: E731
    update, laid = DenoiseUpdate(z(M + 1, 4), z(4, W), z(4), -0.1), plan.lay_out(w)
    with pytest.raises(ValueError, match="11 action rows, the step 10 rows"):
        plan.step(h0.clone(), laid, 1, *_kernel_inputs(inputs), 0, 1e-6, update=update)
    update = DenoiseUpdate(z(M, 4), z(4, W + 1), z(4), -0.1)
    with pytest.raises(ValueError, match=r"w_out / b_out must be \[4, 32\]"):
        plan.step(h0.clone(), laid, 1, *_kernel_inputs(inputs), 0, 1e-6, update=update)


@pytest.mark.gpu
@pytest.mark.parametrize("pi05", [True, False], ids=["pi05-next-input-into-h", "pi0-silu-hidden"])
def test_step_kernel_with_denoise_update_gpu_real_shapes(pi05) -> None:
    M = 50 if pi05 else 51
    _run_with_update((M, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, pi05, A=32, tol=BF16_REAL)


@pytest.mark.gpu
def test_step_kernel_with_guided_denoise_update_gpu_real_shapes() -> None:
    _run_with_update((50, 1024, 4096, 8, 256, 18, 968), torch.bfloat16, True, A=32, tol=BF16_REAL, guided=True)


def test_weights_must_be_laid_out_for_the_plan() -> None:
    """The kernel reads qkv with each head's rotate_half pairs side by side and gate|up
    interleaved, in blocks of the plan's bn_qkv / bn_gu (`lay_out`, once at load): plain weights,
    or a layout for other tiles, are refused by name; `lay_out` is a no-op on weights already laid
    out for the plan and keeps the plain rows recoverable (the reference reads those)."""
    M, W, F, H, D, P = 10, 32, 64, 4, 16, 24
    h0, w, inputs = _problem(M, W, F, H, D, 2, P, torch.float32, gated=True)
    plan = ExpertStepPlan(M, W, F, H, D, 1, torch.device(DEVICE), torch.float32)
    blocks = rf"= \({plan.bn_qkv}, {plan.bn_gu}\): pass plan.lay_out"
    with pytest.raises(ValueError, match=r"\(qkv, gate_up\) blocks \(0, 0\) \(0: plain\).*" + blocks):
        plan.step(h0.clone(), w, 1, *_kernel_inputs(inputs), 0, 1e-6)
    laid = plan.lay_out(w)
    assert (laid.qkv_block, laid.gu_block) == (plan.bn_qkv, plan.bn_gu) and plan.lay_out(laid) is laid
    # (head dim 16: one 8-row block per half, so qkv's pairing leaves its rows where they were)
    assert torch.equal(laid.plain_qkv(), w.qkv) and torch.equal(laid.plain_gate_up(), w.gate_up)
    assert not torch.equal(laid.gate_up, w.gate_up)
    plan.set_tiles(bn_gu=plan.bn_gu // 2)
    again = rf"blocks \({laid.qkv_block}, {laid.gu_block}\) .*= \({plan.bn_qkv}, {plan.bn_gu}\)"
    with pytest.raises(ValueError, match=again):
        plan.step(h0.clone(), laid, 1, *_kernel_inputs(inputs), 0, 1e-6)
    # laid out again for the new tiles, the kernel matches the reference (given either layout)
    h_ref, _, _, _ = expert_step_ref(h0, laid, 1, *inputs, 1e-6)
    torch.testing.assert_close(h_ref, expert_step_ref(h0, w, 1, *inputs, 1e-6)[0])
    h = h0.clone()
    plan.step(h, plan.lay_out(laid), 1, *_kernel_inputs(inputs), 0, 1e-6)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4)


def test_pair_halves_puts_each_rotate_half_pair_side_by_side() -> None:
    w = torch.arange(2 * 3 * 16.0).view(2, 48, 1)  # 2 layers, 3 heads of 16 rows
    p = pair_halves(w, 16, 4)
    first_head = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    assert p[0, :16, 0].tolist() == first_head and p[1, 16:32, 0].tolist() == [48 + 16 + r for r in first_head]
    assert torch.equal(pair_halves(p, 16, 4, undo=True), w)
    x, wk = torch.randn(5, 7), torch.randn(3 * 16, 7)  # a GEMM on the paired weight, columns put back
    torch.testing.assert_close(unpair_columns(x @ pair_halves(wk, 16, 4).T, 16, 4), x @ wk.T)
    with pytest.raises(ValueError, match="block 3 must divide half a head"):
        pair_halves(w, 16, 3)


def test_a_cache_of_another_dtype_than_the_plan_is_refused() -> None:
    """The kernel reads the K/V cache as the plan's dtype: an fp32 or fp16 cache beside a bf16
    plan is named, not read as the wrong numbers (or a late compile error on the GPU)."""
    meta, bf16, W, F, H, D, L, P, rows = torch.device("meta"), torch.bfloat16, 1024, 4096, 8, 256, 2, 968, 50
    plan = ExpertStepPlan(rows, W, F, H, D, 1, meta, bf16, gpu=True, sm_count=132)
    e = lambda *shape, dtype=bf16: torch.empty(*shape, dtype=dtype, device=meta)  # noqa: E731
    vec = e(1, L, W, dtype=torch.float32)
    w = ExpertWeights(e(L, (H + 2) * D, W), e(L, W, H * D), e(L, 2 * F, W), e(L, W, F), vec, vec, vec, vec, vec, vec,
                      e(1, W, dtype=torch.float32), e(1, W, dtype=torch.float32))  # fmt: skip
    for kv_dtype in (torch.float32, torch.float16):
        kv = e(L, P + rows, D, dtype=kv_dtype)
        with pytest.raises(ValueError, match=rf"k / v must be torch.bfloat16 \(the plan's dtype\), got {kv_dtype}"):
            plan.launch_args(
                e(rows, W), plan.lay_out(w), 0, kv, kv, e(P + rows, dtype=torch.int32),
                e(rows, dtype=torch.int32), e(2, rows, D // 2, dtype=torch.float32), P, 0, 1e-6,
            )  # fmt: skip
