"""flashrt_ros.kernels.rope (RoPE and the fused QKV epilogue) vs the HF Gemma reference."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.rope import qkv_rope, qkv_rope_ref, rope, rope_inv_freq, rope_ref

# fp32: angles up to ~1000 rad, so allow a few fp32 ulps of the angle through cos/sin.
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _positions(T: int, g: torch.Generator, start: int = 0) -> torch.Tensor:
    # Non-contiguous positions (prefix padding shifts suffix positions), up to ~1000.
    return (start + torch.randperm(1000, generator=g)[:T]).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,H,d", [(1, 1, 16), (7, 3, 48), (37, 2, 32)])
def test_rope_matches_reference(T: int, H: int, d: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(T)
    q = torch.randn(T, H, d, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(T, 1, d, generator=g).to(dtype).to(DEVICE)
    pos = _positions(T, g)
    q_rot, k_rot = rope(q, k, pos)
    q_ref, k_ref = rope_ref(q, k, pos)
    torch.testing.assert_close(q_rot.float(), q_ref.float(), **TOL[dtype])
    torch.testing.assert_close(k_rot.float(), k_ref.float(), **TOL[dtype])


def test_rope_in_place_q_only_int32_positions() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 4, 32, generator=g).to(DEVICE)
    pos = torch.arange(3, 8, dtype=torch.int32, device=DEVICE)
    q_ref, _ = rope_ref(q, None, pos)
    q_rot, k_rot = rope(q, None, pos, q_out=q)
    assert k_rot is None and q_rot.data_ptr() == q.data_ptr()
    torch.testing.assert_close(q, q_ref, **TOL[torch.float32])


def test_rope_refuses_a_strided_inv_freq() -> None:
    """The kernel reads inv_freq as packed fp32: the right values through a stride-2 view gave
    angles off by up to 3.7 (no error). Refused, with what was expected."""
    q = torch.randn(5, 4, 32, device=DEVICE)
    pos = torch.arange(5, device=DEVICE)
    inv = rope_inv_freq(32, 10000.0, DEVICE)
    strided = torch.stack([inv, inv], 1)[:, 0]
    assert torch.equal(strided, inv) and not strided.is_contiguous()
    with pytest.raises(ValueError, match=r"inv_freq must be contiguous fp32 \[16\], got torch.float32 \[16\]"):
        rope(q, None, pos, inv_freq=strided)
    torch.testing.assert_close(rope(q, None, pos, inv_freq=inv)[0], rope_ref(q, None, pos)[0], **TOL[torch.float32])


def test_rope_position_zero_is_identity() -> None:
    q = torch.randn(3, 2, 16).to(DEVICE)
    q_rot, _ = rope(q, None, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    torch.testing.assert_close(q_rot, q, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_rope_writes_into_kv_cache_slice(dtype: torch.dtype) -> None:
    """Fused epilogue: q to its buffer, k/v into rows [P, P+T) of a [L, 2, P+T, d] cache."""
    g = torch.Generator().manual_seed(2)
    T, H, d, P = 11, 3, 48, 6
    qkv = torch.randn(T, (H + 2) * d, generator=g).to(dtype).to(DEVICE)
    pos = _positions(T, g, start=P)
    cache = torch.full((2, 2, P + T, d), 7.0, dtype=dtype, device=DEVICE)  # [layers, K|V, tokens, d]
    q_out = torch.empty(T, H, d, dtype=dtype, device=DEVICE)
    q, k, v = qkv_rope(qkv, pos, H, d, q_out=q_out, k_out=cache[1, 0, P:], v_out=cache[1, 1, P:])
    q_ref, k_ref, v_ref = qkv_rope_ref(qkv, pos, H, d)
    torch.testing.assert_close(q.float(), q_ref.float(), **TOL[dtype])
    torch.testing.assert_close(cache[1, 0, P:].float(), k_ref[:, 0].float(), **TOL[dtype])
    torch.testing.assert_close(cache[1, 1, P:], v_ref[:, 0], atol=0, rtol=0)
    # nothing outside the destination rows was touched
    assert bool((cache[0] == 7.0).all()) and bool((cache[1, :, :P] == 7.0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("HK", [1, 2])
def test_kv_only_epilogue_matches_the_full_one(HK: int, dtype: torch.dtype) -> None:
    """num_heads=0 (a K|V-only GEMM, the prefix's last layer): exactly the k / v that the full QKV
    epilogue writes from the same GEMM's k|v columns (and the reference's), into cache rows or
    new tensors, from rows with a stride; nothing else in the cache is written."""
    g = torch.Generator().manual_seed(4 + HK)
    T, H, d, P = 9, 3, 32, 5
    qkv = torch.randn(T, (H + 2 * HK) * d, generator=g).to(dtype).to(DEVICE)
    pos = _positions(T, g, start=P)
    cache = torch.full((2, P + T, HK, d), 7.0, dtype=dtype, device=DEVICE)
    kv = qkv[:, H * d :]  # rows strided by the full width
    q, k, v = qkv_rope(kv, pos, 0, d, num_kv_heads=HK, k_out=cache[0, P:], v_out=cache[1, P:])
    _, k_full, v_full = qkv_rope(qkv, pos, H, d, num_kv_heads=HK)
    _, k_ref, v_ref = qkv_rope_ref(qkv, pos, H, d, num_kv_heads=HK)
    assert q.shape == (T, 0, d)
    assert torch.equal(k, k_full) and torch.equal(v, v_full)
    torch.testing.assert_close(k.float(), k_ref.float(), **TOL[dtype])
    torch.testing.assert_close(v, v_ref, atol=0, rtol=0)
    assert bool((cache[:, :P] == 7.0).all())
    _, k_new, v_new = qkv_rope(kv, pos, 0, d, num_kv_heads=HK)  # outputs allocated
    assert torch.equal(k_new, k_full) and torch.equal(v_new, v_full)


def test_qkv_rope_allocates_outputs_and_multi_kv_heads() -> None:
    g = torch.Generator().manual_seed(3)
    T, H, HK, d = 4, 4, 2, 16
    qkv = torch.randn(T, (H + 2 * HK) * d, generator=g).to(DEVICE)
    pos = _positions(T, g)
    out = qkv_rope(qkv, pos, H, d, num_kv_heads=HK)
    ref = qkv_rope_ref(qkv, pos, H, d, num_kv_heads=HK)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.parametrize("T,P", [(968, 0), (50, 968)])
def test_qkv_rope_gpu_real_shapes(T: int, P: int) -> None:
    g = torch.Generator().manual_seed(4)
    H, d = 8, 256
    qkv = torch.randn(T, (H + 2) * d, generator=g).to(torch.bfloat16).to(DEVICE)
    pos = torch.arange(P, P + T, device=DEVICE)
    cache = torch.zeros(2, P + T, d, dtype=torch.bfloat16, device=DEVICE)
    q, k, v = qkv_rope(qkv, pos, H, d, k_out=cache[0, P:], v_out=cache[1, P:])
    q_ref, k_ref, v_ref = qkv_rope_ref(qkv, pos, H, d)
    torch.testing.assert_close(q.float(), q_ref.float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(cache[0, P:].float(), k_ref[:, 0].float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(cache[1, P:], v_ref[:, 0], atol=0, rtol=0)
    # K|V only (the prefix LM's last layer): the same k / v from the k|v columns alone
    _, k_kv, v_kv = qkv_rope(qkv[:, H * d :], pos, 0, d)
    assert torch.equal(k_kv[:, 0], cache[0, P:]) and torch.equal(v_kv[:, 0], cache[1, P:])
    # fp32 angles at real positions: the in-kernel cos/sin must be accurate, not approximate
    q32 = torch.randn(T, H, d, generator=g).to(DEVICE)
    torch.testing.assert_close(rope(q32, None, pos)[0], rope_ref(q32, None, pos)[0], atol=1e-4, rtol=1e-4)


def test_integer_output_buffers_are_refused() -> None:
    """The kernel stores floats: an integer q_out / k_out would truncate them silently."""
    q, pos = torch.randn(3, 2, 8, device=DEVICE), torch.arange(3, device=DEVICE)
    with pytest.raises(ValueError, match="q_out is torch.int32; expected a floating-point buffer"):
        rope(q, None, pos, q_out=torch.zeros(3, 2, 8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="k_out is torch.int16; expected a floating-point buffer"):
        qkv_rope(
            torch.randn(3, 32, device=DEVICE), pos, 2, 8, k_out=torch.zeros(3, 1, 8, dtype=torch.int16, device=DEVICE)
        )


def test_rope_names_a_query_it_cannot_view_as_tokens() -> None:
    q = torch.randn(3, 2, 4, 16, device=DEVICE).transpose(0, 1)  # [B, T, H, d], B and T do not merge
    positions = torch.zeros(2, 3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match=r"q \(2, 3, 4, 16\) \(strides .*\) cannot be viewed as \[tokens, 4, 16\]"):
        rope(q, None, positions)
