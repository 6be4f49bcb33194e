"""flashrt_ros.kernels.attention (multi-query flash attention with pi0/pi0.5 masks) vs an explicit-mask reference."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.attention import _launch_settings, _smem_bytes, attention, attention_key_blocks, attention_ref

# bf16: P is rounded to bf16 before the PV product (flash-attention practice) and the output is bf16.
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _qkv(Tq: int, Tk: int, H: int, D: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Tq, H, D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(Tk, D, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(Tk, D, generator=g).to(dtype).to(DEVICE)
    return q, k, v, g


def _openpi_suffix_mask(prefix_pad: torch.Tensor, suffix_att: torch.Tensor) -> torch.Tensor:
    """openpi's denoise-step mask, verbatim logic: [S, P + S] bool (True = attend)."""
    S, P = suffix_att.shape[0], prefix_pad.shape[0]
    prefix_2d = prefix_pad[None, :].expand(S, P)
    cumsum = torch.cumsum(suffix_att, dim=0)
    suffix_2d = cumsum[None, :] <= cumsum[:, None]  # make_att_2d_masks (suffix all non-padding)
    return torch.cat([prefix_2d, suffix_2d], dim=1)


@pytest.mark.parametrize("policy", ["pi0", "pi05"])
def test_key_blocks_reproduce_openpi_masks(policy: str) -> None:
    P, S = 9, 6
    prefix_pad = torch.tensor([1, 1, 1, 1, 0, 1, 1, 0, 0], dtype=torch.bool)
    suffix_att = torch.tensor([1, 1, 0, 0, 0, 0] if policy == "pi0" else [1, 0, 0, 0, 0, 0])
    suffix_blocks = torch.cumsum(suffix_att, 0)
    kb = attention_key_blocks(prefix_pad, suffix_blocks)
    ours = kb[None, :] <= suffix_blocks[:, None]
    assert kb.dtype == torch.int32 and kb.shape == (P + S,)
    assert torch.equal(ours, _openpi_suffix_mask(prefix_pad, suffix_att))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("policy", ["pi0", "pi05"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_suffix_attention_over_cached_prefix(policy: str, num_splits: int, dtype: torch.dtype) -> None:
    """Suffix queries over [prefix (padded) ++ suffix] keys, several key tiles, ragged sizes."""
    P, S, H, D = 23, 7, 3, 48
    q, k, v, g = _qkv(S, P + S, H, D, dtype, seed=num_splits)
    prefix_valid = torch.rand(P, generator=g) > 0.3
    suffix_att = torch.tensor([1, 1, 0, 0, 0, 0, 0] if policy == "pi0" else [1, 0, 0, 0, 0, 0, 0])
    blocks = torch.cumsum(suffix_att, 0).to(torch.int32).to(DEVICE)
    kb = attention_key_blocks(prefix_valid.to(DEVICE), blocks)
    o = attention(q, k, v, kb, blocks, num_splits=num_splits, block_m=16, block_n=16)
    torch.testing.assert_close(o.float(), attention_ref(q, k, v, kb, blocks).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_bidirectional_with_padding(dtype: torch.dtype) -> None:
    """Prefix self-attention: padded keys ignored; padded query rows finite (documented as unused)."""
    P, H, D = 37, 2, 32
    q, k, v, _ = _qkv(P, P, H, D, dtype, seed=5)
    valid = torch.ones(P, dtype=torch.bool)
    valid[30:] = False  # right padding, as the tokenizer pads the prompt
    kb = attention_key_blocks(valid.to(DEVICE))
    o = attention(q, k, v, kb, block_m=32, block_n=16)
    ref = attention_ref(q, k, v, kb)
    torch.testing.assert_close(o.float(), ref.float(), **TOL[dtype])
    assert bool(torch.isfinite(o.float()).all())


def test_fully_masked_rows_are_zero_not_nan() -> None:
    S, H, D = 3, 2, 16
    q, k, v, _ = _qkv(S, 5 + S, H, D, torch.float32, seed=6)
    kb = attention_key_blocks(torch.zeros(5, dtype=torch.bool, device=DEVICE), torch.tensor([1, 2, 2], device=DEVICE))
    qb = torch.tensor([0, 2, 2], dtype=torch.int32, device=DEVICE)  # query 0 sees nothing
    for splits in (1, 2):
        o = attention(q, k, v, kb, qb, num_splits=splits, block_n=16)
        assert torch.equal(o[0], torch.zeros_like(o[0]))
        torch.testing.assert_close(o, attention_ref(q, k, v, kb, qb), **TOL[torch.float32])


def test_no_mask_batched_strided_cache_views_and_out_buffer() -> None:
    """Batch dim, K/V as strided views of a [B, 2, T, D] cache, q as a view of a QKV buffer."""
    B, Tq, Tk, H, D = 2, 5, 19, 4, 32
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(B, Tq, (H + 2) * D, generator=g).to(DEVICE)
    q = qkv[..., : H * D].unflatten(-1, (H, D))  # token stride (H+2)*D
    cache = torch.randn(B, 2, Tk, D, generator=g).to(DEVICE)
    k, v = cache[:, 0], cache[:, 1]
    out = torch.empty(B, Tq, H, D, device=DEVICE)
    o = attention(q, k, v, out=out, block_n=16)
    assert o.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, attention_ref(q, k, v), **TOL[torch.float32])
    o2 = attention(q, k, v, scale=0.3, num_splits=2, block_n=16)
    torch.testing.assert_close(o2, attention_ref(q, k, v, scale=0.3), **TOL[torch.float32])


H200, SMALL_SMEM, FEW_SMS = (132, 227 * 1024), (132, 99 * 1024), (20, 227 * 1024)


@pytest.mark.parametrize("device", [H200, SMALL_SMEM, FEW_SMS, (132, 0)], ids=["h200", "99KB", "20SMs", "unknown"])
@pytest.mark.parametrize("D", [72, 128, 256, 512, 1024])
@pytest.mark.parametrize("rows", [400, 408, 3648, 5696, 7744], ids=lambda r: f"{r}rows")
def test_launch_settings_fit_the_gpu(device, D: int, rows: int) -> None:
    """Every heuristic launch fits the GPU's shared memory (unknown: 227 KB assumed), and a
    split of a compute-bound problem (8 warps) stays within one wave of the SMs."""
    sms, smem = device
    bm, bn, warps, stages, splits = _launch_settings(1, rows, rows // 8 + 50, D, sms, smem)
    assert _smem_bytes(bm, bn, D, stages) <= (smem or 227 * 1024)
    assert splits >= 1 and warps in (4, 8) and bm >= 16 and bn >= 16
    if warps == 8:
        assert splits == 1 or -(-rows // bm) * splits <= sms


def test_launch_settings_h200_choices() -> None:
    """The measured choices (docstring of _launch_settings): the pi0.5 prefix at 3 views on
    128 x 64 tiles, 8 warps, 2 stages, 2 key splits; the suffix on 32 x 64 with 8 splits."""
    assert _launch_settings(1, 968 * 8, 968, 256, *H200) == (128, 64, 8, 2, 2)
    assert _launch_settings(1, 50 * 8, 1018, 256, *H200) == (32, 64, 4, 2, 8)
    assert _launch_settings(1, 968 * 8, 968, 256, *SMALL_SMEM) == (64, 32, 4, 2, 1)
    assert _launch_settings(1, 968 * 8, 968, 256, None, 0)[-1] == 1  # interpreter: no split


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["pi0", "pi05"])
def test_attention_gpu_real_shapes(policy: str) -> None:
    H, D = 8, 256
    P, S = 3 * 256 + 200, (51 if policy == "pi0" else 50)
    q, k, v, g = _qkv(S, P + S, H, D, torch.bfloat16, seed=8)
    prefix_valid = torch.ones(P, dtype=torch.bool)
    prefix_valid[3 * 256 + 37 :] = False
    att = torch.tensor([1, 1] + [0] * 49) if policy == "pi0" else torch.tensor([1] + [0] * 49)
    blocks = torch.cumsum(att, 0).to(torch.int32).to(DEVICE)
    kb = attention_key_blocks(prefix_valid.to(DEVICE), blocks)
    ref = attention_ref(q, k, v, kb, blocks).float()
    for splits in (None, 1):  # heuristic split-KV and the single-pass kernel
        torch.testing.assert_close(
            attention(q, k, v, kb, blocks, num_splits=splits).float(), ref, **TOL[torch.bfloat16]
        )
    # the prefix itself: 968 tokens x 8 heads, bidirectional with padding
    qp, kp, vp, _ = _qkv(P, P, H, D, torch.bfloat16, seed=9)
    kbp = attention_key_blocks(prefix_valid.to(DEVICE))
    torch.testing.assert_close(
        attention(qp, kp, vp, kbp).float(), attention_ref(qp, kp, vp, kbp).float(), **TOL[torch.bfloat16]
    )


def test_an_integer_output_buffer_is_refused() -> None:
    q, k, v = torch.randn(3, 2, 16, device=DEVICE), torch.randn(5, 16, device=DEVICE), torch.randn(5, 16, device=DEVICE)
    with pytest.raises(ValueError, match="out is torch.int8; expected a floating-point buffer"):
        attention(q, k, v, out=torch.zeros(3, 2, 16, dtype=torch.int8, device=DEVICE))


def test_a_head_dim_of_0_is_refused_by_name() -> None:
    q = torch.zeros(2, 1, 0, device=DEVICE)
    with pytest.raises(ValueError, match=r"q has head dim 0 \(shape \(2, 1, 0\)\); expected at least 1"):
        attention(q, torch.zeros(3, 0, device=DEVICE), torch.zeros(3, 0, device=DEVICE))
