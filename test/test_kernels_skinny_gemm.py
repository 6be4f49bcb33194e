"""kernels.skinny_gemm (few-row GEMMs with fused norm / RoPE / GeGLU / gated residual, split-K
reduced in-kernel) vs the eager maths."""

import pytest
import torch
from kernel_fixtures import DEVICE

from kernels.rope import rope_inv_freq
from kernels.skinny_gemm import (
    GemmConfig,
    NormPrologue,
    Workspace,
    fold_shift,
    linear_gated_residual,
    linear_gated_residual_ref,
    norm_geglu,
    norm_geglu_ref,
    norm_linear,
    norm_linear_ref,
    norm_qkv_rope,
    norm_qkv_rope_ref,
)

# bf16: the kernel rounds x * mult (not the normed row) before the MMA and rounds epilogues once.
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
SPLITS = [None, GemmConfig(16, 16, 16, split=3, num_stages=1)]  # default tiles; forced 3-way split-K


def _data(M: int, K: int, N: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 2).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype).to(DEVICE)
    mult = (1 + 0.3 * torch.randn(K, generator=g)).to(DEVICE)
    shift = (0.2 * torch.randn(K, generator=g)).to(DEVICE)
    return x, w, mult, shift


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])


@pytest.mark.parametrize("config", SPLITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,K,N", [(1, 48, 16), (7, 96, 40), (50, 80, 24)])
def test_norm_linear_adarms_matches_reference(M, K, N, dtype, config) -> None:
    x, w, mult, shift = _data(M, K, N, dtype, M + K)
    y = norm_linear(x, w, NormPrologue(mult, fold_shift(shift, w)), config=config)
    _close(y, norm_linear_ref(x, w, mult, shift), dtype)
    plain = norm_linear(x, w, config=config)  # no prologue: a plain GEMM
    _close(plain, torch.nn.functional.linear(x, w), dtype)


@pytest.mark.parametrize("config", SPLITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_qkv_rope_writes_q_and_cache_rows(dtype, config) -> None:
    M, K, H, HK, D = 9, 64, 3, 1, 32
    x, w, mult, _ = _data(M, K, (H + 2 * HK) * D, dtype, 5)
    pos = torch.randperm(900, generator=torch.Generator().manual_seed(1))[:M].to(DEVICE)
    inv = rope_inv_freq(D, 10000.0, DEVICE)
    cache_k = torch.zeros(20, D, dtype=dtype, device=DEVICE)
    cache_v = torch.zeros(20, D, dtype=dtype, device=DEVICE)
    q, k, v = norm_qkv_rope(
        x, w, pos, inv, H, D, HK, k_out=cache_k[4 : 4 + M], v_out=cache_v[4 : 4 + M],
        norm=NormPrologue(mult), config=config,
    )  # fmt: skip
    q_ref, k_ref, v_ref = norm_qkv_rope_ref(x, w, pos, inv, H, D, HK, mult=mult)
    _close(q, q_ref, dtype)
    _close(cache_k[4 : 4 + M], k_ref[:, 0], dtype)
    _close(cache_v[4 : 4 + M], v_ref[:, 0], dtype)
    untouched = torch.cat([cache_k[:4], cache_k[4 + M :], cache_v[:4], cache_v[4 + M :]])
    assert bool((untouched == 0).all())


@pytest.mark.parametrize("config", SPLITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,K,F", [(3, 32, 24), (50, 64, 48)])
def test_norm_geglu_matches_reference(M, K, F, dtype, config) -> None:
    x, w, mult, shift = _data(M, K, 2 * F, dtype, F)
    y = norm_geglu(x, w, NormPrologue(mult, fold_shift(shift, w)), config=config)
    assert y.shape == (M, F)
    _close(y, norm_geglu_ref(x, w, mult, shift), dtype)


@pytest.mark.parametrize("config", SPLITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [True, False])
def test_linear_gated_residual_in_place(gated, dtype, config) -> None:
    x, w, _, _ = _data(11, 72, 40, dtype, 3)
    residual = torch.randn(11, 40, generator=torch.Generator().manual_seed(4)).to(dtype).to(DEVICE)
    gate = (torch.rand(40, generator=torch.Generator().manual_seed(6)) + 0.5).to(DEVICE) if gated else None
    expected = linear_gated_residual_ref(x, w, residual, gate)
    out = linear_gated_residual(x, w, residual, gate, config=config)
    assert out.data_ptr() == residual.data_ptr()
    _close(residual, expected, dtype)


def test_split_k_is_deterministic_and_counters_reset() -> None:
    """The last arrival reduces partials in split order: repeated calls are bit-identical,
    and every counter is back at zero afterwards (ready for a graph replay)."""
    x, w, mult, _ = _data(13, 96, 40, torch.float32, 9)
    ws = Workspace(DEVICE, floats=1 << 16, tiles=64)
    cfg = GemmConfig(16, 16, 16, split=4, num_stages=1)
    first = norm_linear(x, w, NormPrologue(mult), config=cfg, workspace=ws)
    for _ in range(3):
        assert torch.equal(norm_linear(x, w, NormPrologue(mult), config=cfg, workspace=ws), first)
    assert int(ws.counters.abs().sum()) == 0
    _close(first, norm_linear_ref(x, w, mult), torch.float32)


def test_bad_shapes_are_refused_with_the_reason() -> None:
    x, w, mult, _ = _data(4, 32, 16, torch.float32, 1)
    with pytest.raises(ValueError, match="expected a \\[M, K\\] and w \\[N, K\\]"):
        norm_linear(x, w[:, :16])
    with pytest.raises(ValueError, match="norm multiplier has shape \\(16,\\), expected \\(32,\\)"):
        norm_linear(x, w, NormPrologue(mult[:16]))
    with pytest.raises(ValueError, match="even number of rows"):
        norm_geglu(x, w[:15])
    with pytest.raises(ValueError, match="residual must be \\[4, 16\\]"):
        linear_gated_residual(x, w, torch.zeros(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="split-K workspace too small"):
        norm_linear(x, w, config=GemmConfig(16, 16, 16, split=2), workspace=Workspace(DEVICE, floats=8, tiles=1))


# ---- real shapes (GPU): the action expert's sub-layers at 50 tokens ---------------------------


@pytest.mark.gpu
def test_expert_sublayers_gpu_real_shapes() -> None:
    M, W, F, H, D = 50, 1024, 4096, 8, 256
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(M, W, device="cuda", generator=g).to(dt)
    wqkv = (torch.randn((H + 2) * D, W, device="cuda", generator=g) / 32).to(dt)
    wo = (torch.randn(W, H * D, device="cuda", generator=g) / 45).to(dt)
    wgu = (torch.randn(2 * F, W, device="cuda", generator=g) / 32).to(dt)
    wd = (torch.randn(W, F, device="cuda", generator=g) / 64).to(dt)
    mult = 1 + 0.1 * torch.randn(W, device="cuda", generator=g)
    shift = 0.1 * torch.randn(W, device="cuda", generator=g)
    gate = torch.rand(W, device="cuda", generator=g)
    pos = torch.arange(900, 900 + M, device="cuda")
    inv = rope_inv_freq(D, 10000.0, "cuda")
    q, k, v = norm_qkv_rope(h, wqkv, pos, inv, H, D, 1, norm=NormPrologue(mult, fold_shift(shift, wqkv)))
    for got, ref in zip((q, k, v), norm_qkv_rope_ref(h, wqkv, pos, inv, H, D, 1, mult=mult, shift=shift), strict=True):
        _close(got, ref, dt)
    y = norm_geglu(h, wgu, NormPrologue(mult, fold_shift(shift, wgu)))
    _close(y, norm_geglu_ref(h, wgu, mult, shift), dt)
    a = torch.randn(M, H * D, device="cuda", generator=g).to(dt)
    for x, w in ((a, wo), (y, wd)):
        expected = linear_gated_residual_ref(x, w, h, gate)
        _close(linear_gated_residual(x, w, h.clone(), gate), expected, dt)
