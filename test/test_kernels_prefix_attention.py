"""flashrt_ros.kernels.prefix_attention (the prefix LM's attention on TMA descriptors) vs the fp32 reference
and vs kernels.attention, the split kernel it replaces in the fused path."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL, offline_builds

from flashrt_ros.kernels.attention import attention, attention_key_blocks, attention_ref
from flashrt_ros.kernels.prefix_attention import prefix_attention, supports_prefix_attention

# the tests that launch the kernel (the offline builds and the argument checks run anywhere)
needs_tma = pytest.mark.skipif(
    DEVICE == "cuda" and not supports_prefix_attention(torch.device("cuda")), reason="needs sm_90+ (TMA)"
)


def _problem(T: int, H: int, D: int, valid: int, dtype: torch.dtype, seed: int, holes: tuple[int, ...] = ()):
    """q [T, H, D], one K/V head [T, D], key_blocks of the first `valid` tokens less `holes`
    (a missing camera's tokens sit between valid ones)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g).to(dtype).to(DEVICE) for shape in ((T, H, D), (T, D), (T, D)))
    ok = torch.arange(T) < valid
    ok[list(holes)] = False
    return q, k, v, attention_key_blocks(ok.to(DEVICE))


@needs_tma
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "T,H,D,valid,holes",
    [(1, 1, 16, 1, ()), (37, 4, 32, 30, (2, 3)), (50, 2, 64, 50, ()), (21, 8, 16, 5, (0,)), (70, 3, 128, 64, (40,))],
)
def test_prefix_attention_matches_reference(T, H, D, valid, holes, dtype) -> None:
    """Ragged query rows (T * H not a multiple of the tile) and keys (Tk not a multiple of the
    key tile: the TMA loads past Tk are zero rows, hidden by key_blocks), masked keys at the
    end and in the middle; every query row sees the same valid keys."""
    q, k, v, kb = _problem(T, H, D, valid, dtype, seed=T * H + D, holes=holes)
    out = prefix_attention(q, k, v, kb)
    assert out.shape == q.shape and out.dtype == dtype
    want = attention_ref(q.float(), k.float(), v.float(), key_blocks=kb)
    torch.testing.assert_close(out.float(), want, **TOL[dtype])


@needs_tma
def test_prefix_attention_equals_the_split_kernel() -> None:
    """The same maths as kernels.attention with key splits + combine (what the fused path ran
    before), and the same as a softmax that drops the masked keys altogether."""
    q, k, v, kb = _problem(45, 4, 32, 40, torch.float32, seed=2, holes=(7,))
    out = prefix_attention(q, k, v, kb)
    split = attention(q, k, v, key_blocks=kb, num_splits=2)
    torch.testing.assert_close(out, split, **TOL[torch.float32])
    keep = kb <= 0
    dense = torch.softmax(torch.einsum("thd,kd->thk", q, k[keep]) * 32**-0.5, -1) @ v[keep]
    torch.testing.assert_close(out, dense, **TOL[torch.float32])


@needs_tma
def test_prefix_attention_scale_and_static_buffer() -> None:
    q, k, v, kb = _problem(9, 2, 16, 9, torch.float32, seed=3)
    out = torch.full((10, 2, 16), 7.0, device=DEVICE)
    assert prefix_attention(q, k, v, kb, scale=0.3, out=out[:9]).data_ptr() == out.data_ptr()
    want = attention_ref(q, k, v, key_blocks=kb, scale=0.3)
    torch.testing.assert_close(out[:9], want, **TOL[torch.float32])
    assert bool((out[9] == 7.0).all())  # past T: untouched


@needs_tma
def test_prefix_attention_without_visible_keys_gives_zeros() -> None:
    """Every key masked (no valid token at all): zeros, not NaN."""
    q, k, v, kb = _problem(12, 2, 16, 0, torch.float32, seed=4)
    out = prefix_attention(q, k, v, kb)
    assert bool((out == 0).all())


def test_prefix_attention_rejects_bad_operands() -> None:
    q, k, v, kb = _problem(8, 2, 32, 8, torch.float32, seed=5)
    with pytest.raises(ValueError, match=r"q must be a contiguous \[T, H, D\]"):
        prefix_attention(q.transpose(0, 1), k, v, kb)
    with pytest.raises(ValueError, match=r"k and v must be \[Tk, 32\] \(one K/V head\)"):
        prefix_attention(q, k[:, :16], v, kb)
    with pytest.raises(ValueError, match="head dim 24: expected a power of two from 16 to 256"):
        prefix_attention(q[..., :24].contiguous(), k[:, :24].contiguous(), v[:, :24].contiguous(), kb)
    with pytest.raises(ValueError, match="q, k, v differ"):
        prefix_attention(q, k.to(torch.bfloat16), v, kb)
    with pytest.raises(ValueError, match=r"key_blocks must be a contiguous int32 \[8\]"):
        prefix_attention(q, k, v, kb.long())
    with pytest.raises(ValueError, match=r"key_blocks must be a contiguous int32 \[8\].*\(stride \(2,\)\)"):
        prefix_attention(q, k, v, kb.repeat_interleave(2)[::2])
    with pytest.raises(ValueError, match="out must be a contiguous"):
        prefix_attention(q, k, v, kb, out=torch.empty_like(q, dtype=torch.float64))
    with pytest.raises(ValueError, match="k and v hold no keys"):  # was Triton's "shape must be positive"
        prefix_attention(q, k[:0], v[:0], kb[:0])


@needs_tma
@pytest.mark.gpu
def test_prefix_attention_gpu_real_shape() -> None:
    """The prefix LM's attention at 3 views (968 tokens, 930 valid, 8 heads, d 256), bf16,
    against the fp32 reference and the split kernel."""
    q, k, v, kb = _problem(968, 8, 256, 930, torch.bfloat16, seed=7, holes=(300, 301))
    out = prefix_attention(q, k, v, kb).float()
    want = attention_ref(q.float(), k.float(), v.float(), key_blocks=kb)
    torch.testing.assert_close(out, want, **TOL[torch.bfloat16])
    cos = torch.nn.functional.cosine_similarity(out.flatten(), want.flatten(), dim=0)
    assert float(cos) > 0.9999
    torch.testing.assert_close(out, attention(q, k, v, key_blocks=kb).float(), **TOL[torch.bfloat16])


def test_supported_only_where_the_tiles_fit() -> None:
    """The GPU tiles need 164 KB at bf16 and head dim 256, 320 KB at fp32: fp32 there falls back
    to kernels/attention.py (227 KB GPUs); the interpreter runs everything."""
    from flashrt_ros.kernels.attention import _smem_bytes
    from flashrt_ros.kernels.prefix_attention import GPU_TILES

    need = lambda elem: _smem_bytes(GPU_TILES["BM"], GPU_TILES["BN"], 256, GPU_TILES["num_stages"], elem)  # noqa: E731
    assert need(2) == 163840 and need(4) > 227 * 1024
    assert not supports_prefix_attention(torch.device(DEVICE), head_dim=24)  # not one TMA box
    if DEVICE == "cuda" and supports_prefix_attention(torch.device("cuda")):
        assert not supports_prefix_attention(torch.device("cuda"), torch.float32, 256)
        assert supports_prefix_attention(torch.device("cuda"), torch.float32, 64)


def test_gpu_launch_builds_for_hopper_and_thor() -> None:
    """The GPU launch (64-row tiles, 64-key tiles, 2 stages, 4 warps, head dim 256) built
    offline with Triton's own ptxas: within the 227 KB of shared memory of Hopper and Thor, no
    spills."""
    for r in offline_builds("flashrt_ros.kernels.prefix_attention").values():
        if "unsupported_by_ptxas" in r:
            continue  # Triton 3.6's ptxas (the H200 box's) predates sm_110
        assert r["target"] and 0 < r["shared"] <= 227 * 1024
        assert r["registers"] is None or 0 < r["registers"] <= 255
        assert r["stack_bytes"] in (None, 0)
