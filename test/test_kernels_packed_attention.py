"""flashrt_ros.kernels.packed_attention (per-sequence multi-head attention read from a fused QKV output) vs
torch's own SDPA maths in fp32."""

import pytest
import torch
import torch.nn.functional as F
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.packed_attention import packed_attention, packed_attention_ref

# bf16: P is rounded to bf16 before the PV product and the output is bf16
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _qkv(seqs: int, T: int, H: int, D: int, dtype: torch.dtype, seed: int, extra_cols: int = 0) -> torch.Tensor:
    """[seqs * T, 3 H D] (a column slice of a wider buffer when extra_cols > 0: strided rows)."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(seqs * T, 3 * H * D + extra_cols, generator=g).to(dtype).to(DEVICE)
    return buf[:, : 3 * H * D]


def _sdpa(qkv: torch.Tensor, H: int, T: int) -> torch.Tensor:
    """torch's SDPA in fp32, as the eager SigLIP calls it (independent of our reference)."""
    rows, width = qkv.shape
    q, k, v = qkv.float().view(rows // T, T, 3, H, width // (3 * H)).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(rows, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seqs,T,H,D", [(1, 5, 1, 16), (3, 19, 2, 24), (2, 40, 3, 72)])
def test_matches_sdpa_at_ragged_shapes(seqs: int, T: int, H: int, D: int, dtype: torch.dtype) -> None:
    """Sequence lengths that are no multiple of the tiles, head dims padded to the next power of
    two (72 -> 128, SigLIP's), several query / key tiles (16-row tiles over 40 tokens)."""
    qkv = _qkv(seqs, T, H, D, dtype, seed=T)
    want = _sdpa(qkv, H, T)
    out = packed_attention(qkv, H, T, block_m=16, block_n=16)
    assert out.shape == (seqs * T, H * D) and out.dtype == dtype
    torch.testing.assert_close(out.float(), want, **TOL[dtype])
    torch.testing.assert_close(packed_attention_ref(qkv, H, T).float(), want, **TOL[dtype])


def test_sequences_do_not_see_each_other() -> None:
    """Changing one sequence's keys and values leaves every other sequence's output unchanged."""
    T, H, D = 9, 2, 16
    qkv = _qkv(3, T, H, D, torch.float32, seed=1)
    before = packed_attention(qkv, H, T, block_m=16, block_n=16)
    qkv[T : 2 * T, H * D :] += 3.0  # the middle sequence's k and v
    after = packed_attention(qkv, H, T, block_m=16, block_n=16)
    assert torch.equal(after[:T], before[:T]) and torch.equal(after[2 * T :], before[2 * T :])
    assert not torch.allclose(after[T : 2 * T], before[T : 2 * T])


def test_strided_rows_out_buffer_and_scale() -> None:
    T, H, D = 12, 2, 8
    qkv = _qkv(2, T, H, D, torch.float32, seed=2, extra_cols=5)
    assert qkv.stride(0) == 3 * H * D + 5
    out = torch.full((2 * T, H * D), float("nan"), device=DEVICE)
    got = packed_attention(qkv, H, T, scale=0.3, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, packed_attention_ref(qkv, H, T, scale=0.3), **TOL[torch.float32])


@pytest.mark.parametrize(
    "shape,heads,seq,match",
    [((10, 12), 3, 5, "not 3 x 3 heads"), ((10, 18), 3, 4, "not whole sequences of 4"), ((6,), 1, 1, "2-D")],
)
def test_bad_shapes_are_refused(shape, heads: int, seq: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        packed_attention(torch.zeros(shape, device=DEVICE), heads, seq)


def test_bad_out_buffer_is_refused() -> None:
    qkv = _qkv(1, 4, 1, 16, torch.float32, seed=3)
    with pytest.raises(ValueError, match=r"out must be torch.float32 \[4, 16\]"):
        packed_attention(qkv, 1, 4, out=torch.zeros(4, 17, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("views", [1, 3])
def test_siglip_shapes_gpu(views: int) -> None:
    """SigLIP at its real shape: 256 tokens per view, 16 heads of dim 72, bf16; the default
    launch and four others, one with a single stage (`bench/packed_attention_probe.py` also
    replays launches from a CUDA graph, each in its own process)."""
    T, H, D = 256, 16, 72
    qkv = _qkv(views, T, H, D, torch.bfloat16, seed=views)
    want = _sdpa(qkv, H, T)
    torch.testing.assert_close(packed_attention(qkv, H, T).float(), want, **TOL[torch.bfloat16])
    for bm, bn, w, s in ((32, 64, 4, 2), (64, 128, 4, 2), (128, 64, 8, 2), (128, 128, 8, 1)):
        out = packed_attention(qkv, H, T, block_m=bm, block_n=bn, num_warps=w, num_stages=s)
        torch.testing.assert_close(out.float(), want, **TOL[torch.bfloat16])


def test_integer_qkv_is_refused() -> None:
    with pytest.raises(ValueError, match="qkv must be fp32, bf16 or fp16, got torch.int32"):
        packed_attention(torch.ones(4, 48, dtype=torch.int32, device=DEVICE), 1, 4)
