"""flashrt_ros.kernels.gate_up_geglu (gate|up GEMM with the GeGLU epilogue) vs the torch reference."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL, offline_builds

from flashrt_ros.kernels.gate_up_geglu import (
    gate_up_geglu,
    gate_up_geglu_ref,
    interleave_block,
    interleave_gate_up,
    supports_gate_up_geglu,
)

pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not supports_gate_up_geglu(torch.device("cuda")), reason="needs sm_90+ (TMA)"
)


def _operands(T: int, K: int, F: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(2 * F, K, generator=g) * K**-0.5).to(dtype).to(DEVICE)
    return x, w


def _fused(x: torch.Tensor, w: torch.Tensor, block: int, out: torch.Tensor | None = None) -> torch.Tensor:
    return gate_up_geglu(x, interleave_gate_up(w, block), block, out=out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,K,F,block", [(1, 16, 16, 16), (37, 40, 48, 16), (70, 128, 96, 32), (129, 64, 192, 64)])
def test_gate_up_geglu_matches_reference(T: int, K: int, F: int, block: int, dtype: torch.dtype) -> None:
    """Ragged rows and K (row tiles of 16-64 on the interpreter): clipped stores and
    zero-filled loads land on the reference computed from the plain [gate; up] weight."""
    x, w = _operands(T, K, F, dtype, seed=T + K + F)
    y = _fused(x, w, block)
    assert y.shape == (T, F) and y.dtype == dtype
    want = gate_up_geglu_ref(x, w)
    torch.testing.assert_close(y.float(), want.float(), **TOL[dtype])


def test_gate_up_geglu_writes_the_static_buffer_only_in_its_rows() -> None:
    x, w = _operands(20, 32, 48, torch.float32, seed=1)
    big = torch.full((24, 48), 7.0, device=DEVICE)
    out = big[:20]
    assert _fused(x, w, 16, out=out) is out
    torch.testing.assert_close(out, gate_up_geglu_ref(x, w), **TOL[torch.float32])
    assert bool((big[20:] == 7.0).all())  # rows past T untouched


def test_gate_up_geglu_equals_gemm_then_geglu_kernel() -> None:
    """The same maths as the two-kernel path it replaces (the GEMM, then kernels.geglu), on
    the plain weight and on the interleaved one (what the fused path's cuBLAS variant runs)."""
    from flashrt_ros.kernels.geglu import geglu

    x, w = _operands(33, 64, 80, torch.float32, seed=3)
    wi = interleave_gate_up(w, 16)
    torch.testing.assert_close(gate_up_geglu(x, wi, 16), geglu(x @ w.T), **TOL[torch.float32])
    torch.testing.assert_close(geglu(x @ wi.T, interleave=16), geglu(x @ w.T), **TOL[torch.float32])


def test_interleave_layout_and_block_choice() -> None:
    w = torch.arange(8.0).repeat_interleave(2).view(8, 2)  # rows 0..7: gate 0..3, up 4..7
    assert interleave_gate_up(w, 2)[:, 0].tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    with pytest.raises(ValueError, match="F a multiple of block 3"):
        interleave_gate_up(w, 3)
    dev = torch.device(DEVICE)
    big = 128 if DEVICE == "cuda" else 64
    assert interleave_block(16384, dev) == big and interleave_block(48, dev) == 16
    assert interleave_block(40, dev) == 0  # no power-of-two block >= 16 divides 40


@pytest.mark.parametrize(
    "x_shape,w_shape,match",
    [
        ((4, 32), (63, 32), r"w_gu must be \[2F, 32\] interleaved"),
        ((4, 32), (64, 16), r"w_gu must be \[2F, 32\] interleaved"),
        ((4, 32), (48, 32), r"in blocks of 16 \(>= 16, dividing F\)"),
        ((4, 6), (64, 6), "multiple of 16 bytes"),
        ((4, 32, 1), (64, 32), r"x must be \[T, K\]"),
    ],
)
def test_gate_up_geglu_rejects_bad_operands(x_shape, w_shape, match) -> None:
    x, w = torch.zeros(x_shape, device=DEVICE), torch.zeros(w_shape, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        gate_up_geglu(x, w, 16)


def test_gate_up_geglu_rejects_mixed_dtypes_bad_out_and_blocks() -> None:
    x, w = _operands(4, 32, 48, torch.float32, seed=5)
    with pytest.raises(ValueError, match="x and w_gu differ"):
        gate_up_geglu(x, w.to(torch.bfloat16), 16)
    with pytest.raises(ValueError, match="out has shape"):
        gate_up_geglu(x, w, 16, out=torch.empty(4, 47, device=DEVICE))
    with pytest.raises(ValueError, match="out is torch.bfloat16, expected torch.float32"):
        gate_up_geglu(x, w, 16, out=torch.empty(4, 48, device=DEVICE, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="block 24: expected 16, 32, 64 or 128"):
        gate_up_geglu(x, w, 24)


def test_geglu_interleave_must_divide_the_width() -> None:
    from flashrt_ros.kernels.geglu import geglu

    with pytest.raises(ValueError, match="interleave 32: expected 0 or a block that divides F = 48"):
        geglu(torch.zeros(2, 96, device=DEVICE), interleave=32)


@pytest.mark.gpu
def test_gate_up_geglu_gpu_real_shape() -> None:
    """The prefix LM's MLP input at 3 views (968 rows, 2048 -> 2 x 16384), bf16."""
    x, w = _operands(968, 2048, 16384, torch.bfloat16, seed=7)
    y = _fused(x, w, 128)
    want = gate_up_geglu_ref(x, w).float()
    torch.testing.assert_close(y.float(), want, **TOL[torch.bfloat16])
    cos = torch.nn.functional.cosine_similarity(y.float().flatten(), want.flatten(), dim=0)
    assert float(cos) > 0.9999


def test_gpu_launch_builds_for_hopper_and_thor() -> None:
    """The GPU launch (128 x 256 x 64 tiles, 4 stages, 8 warps) built offline with Triton's own
    ptxas: within the 227 KB of shared memory of Hopper and Thor, no spills."""
    results = offline_builds("flashrt_ros.kernels.gate_up_geglu")
    for r in results.values():
        if "unsupported_by_ptxas" in r:
            continue  # Triton 3.6's ptxas (the H200 box's) predates sm_110
        assert r["target"] and 0 < r["shared"] <= 227 * 1024
        assert r["registers"] is None or 0 < r["registers"] <= 255
        assert r["stack_bytes"] in (None, 0)


def _fp8_operands(T: int, K: int, F: int, block: int, seed: int):
    """bf16 x and [gate; up] w, their row-scaled e4m3 forms (w interleaved), and the fp32
    values those stand for (the reference's operands)."""
    from flashrt_ros.kernels.fp8 import dequantize_rows, quantize_rows

    x, w = _operands(T, K, F, torch.bfloat16, seed)
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(interleave_gate_up(w, block))
    w_deq = dequantize_rows(*quantize_rows(w))  # row scales: the same per row in either layout
    return (x, w), (xq, xs, wq, ws), (dequantize_rows(xq, xs), w_deq)


@pytest.mark.parametrize("T,K,F,block", [(1, 32, 16, 16), (37, 96, 48, 16), (70, 128, 128, 64)])
def test_gate_up_geglu_fp8_matches_its_dequantised_reference(T: int, K: int, F: int, block: int) -> None:
    """e4m3 operands with row scales: the kernel's fp32 accumulation and scale epilogue equal
    the reference on the values the FP8 operands stand for (to the bf16 output's rounding),
    and stay near the unquantised product."""
    (x, w), (xq, xs, wq, ws), (x_deq, w_deq) = _fp8_operands(T, K, F, block, seed=T + F)
    y = gate_up_geglu(xq, wq, block, x_scale=xs, w_scale=ws)
    assert y.shape == (T, F) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), gate_up_geglu_ref(x_deq, w_deq).float(), atol=2e-2, rtol=2e-2)
    exact = gate_up_geglu_ref(x.float(), w.float()).flatten()
    cos = torch.nn.functional.cosine_similarity(y.float().flatten(), exact, dim=0)
    assert float(cos) > 0.99  # e4m3 rounds to ~2**-4 relative; a row of K = 32 averages little of it


def test_gate_up_geglu_fp8_needs_both_scales() -> None:
    (_, _), (xq, xs, wq, ws), _ = _fp8_operands(8, 32, 16, 16, seed=2)
    with pytest.raises(ValueError, match=r"x_scale: expected a contiguous \[8\] float32"):
        gate_up_geglu(xq, wq, 16, w_scale=ws)
    with pytest.raises(ValueError, match=r"w_scale: expected a contiguous \[32\] float32 .* got \(16,\)"):
        gate_up_geglu(xq, wq, 16, x_scale=xs, w_scale=ws[:16])
    with pytest.raises(ValueError, match="x_scale / w_scale are for FP8"):
        x, w = _operands(8, 32, 16, torch.float32, seed=2)
        gate_up_geglu(x, interleave_gate_up(w, 16), 16, x_scale=xs)
    with pytest.raises(ValueError, match="only e4m3"):
        gate_up_geglu(xq.to(torch.float8_e5m2), wq.to(torch.float8_e5m2), 16, x_scale=xs, w_scale=ws)
    with pytest.raises(ValueError, match="out is torch.float32, expected torch.bfloat16"):
        gate_up_geglu(xq, wq, 16, x_scale=xs, w_scale=ws, out=torch.empty(8, 16, device=DEVICE))


@pytest.mark.gpu
def test_gate_up_geglu_fp8_gpu_real_shape() -> None:
    """FP8 at the prefix LM's shape (968 rows, 2048 -> 2 x 16384) against the dequantised
    reference and the unquantised bf16 product."""
    (x, w), (xq, xs, wq, ws), (x_deq, w_deq) = _fp8_operands(968, 2048, 16384, 128, seed=8)
    y = gate_up_geglu(xq, wq, 128, x_scale=xs, w_scale=ws).float()
    torch.testing.assert_close(y, gate_up_geglu_ref(x_deq, w_deq).float(), atol=2e-2, rtol=2e-2)
    cos = torch.nn.functional.cosine_similarity(y.flatten(), gate_up_geglu_ref(x, w).float().flatten(), dim=0)
    assert float(cos) > 0.998  # measured 0.99855: two e4m3 GEMMs multiplied by the GeGLU


def test_fp8_launch_builds_for_hopper_and_thor() -> None:
    """The FP8 launch (e4m3 wgmma, 128-byte K stages) built offline like the bf16 one."""
    results = offline_builds("flashrt_ros.kernels.gate_up_geglu", fp8=True)
    for r in results.values():
        if "unsupported_by_ptxas" in r:
            continue
        assert r["target"] and 0 < r["shared"] <= 227 * 1024
        assert r["registers"] is None or 0 < r["registers"] <= 255
        assert r["stack_bytes"] in (None, 0)
