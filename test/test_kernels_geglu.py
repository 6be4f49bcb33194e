"""flashrt_ros.kernels.geglu (Gemma gate|up GeGLU) vs the torch reference."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from flashrt_ros.kernels.gate_up_geglu import interleave_block, interleave_gate_up
from flashrt_ros.kernels.geglu import geglu, geglu_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,F", [(1, 48), (9, 130), (37, 96)])
def test_geglu_matches_reference(T: int, F: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(F + T)
    gu = (torch.randn(T, 2 * F, generator=g) * 3).to(dtype).to(DEVICE)
    y = geglu(gu)
    assert y.shape == (T, F) and y.dtype == dtype
    torch.testing.assert_close(y.float(), geglu_ref(gu).float(), **TOL[dtype])


def test_geglu_reference_is_hf_gemma_activation() -> None:
    gu = torch.randn(4, 2 * 32, dtype=torch.float64)
    gate, up = gu.chunk(2, dim=-1)
    hf = torch.nn.functional.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(geglu_ref(gu.float()).double(), hf, atol=1e-6, rtol=1e-6)


def test_geglu_extreme_inputs_finite_and_strided_rows() -> None:
    gu = torch.tensor([[-100.0, -10.0, 0.0, 10.0, 100.0, 1.0, 1.0, 1.0, 1.0, 1.0]], device=DEVICE)
    y = geglu(gu)
    assert bool(torch.isfinite(y).all())
    torch.testing.assert_close(y, geglu_ref(gu), **TOL[torch.float32])
    wide = torch.randn(6, 3 * 48, device=DEVICE)
    out = torch.empty(6, 48, device=DEVICE)
    geglu(wide[:, : 2 * 48], out=out)  # rows with stride 3*48
    torch.testing.assert_close(out, geglu_ref(wide[:, : 2 * 48]), **TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.parametrize("T,F", [(968, 16384), (50, 4096)])
def test_geglu_gpu_real_shapes(T: int, F: int) -> None:
    gu = torch.randn(T, 2 * F, device=DEVICE).to(torch.bfloat16)
    torch.testing.assert_close(geglu(gu).float(), geglu_ref(gu).float(), **TOL[torch.bfloat16])


def _interleaved(gu: torch.Tensor, block: int) -> torch.Tensor:
    """gate|up columns in the layout of a GEMM on `interleave_gate_up`'s weight."""
    return interleave_gate_up(gu.T, block).T.contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,F,block", [(9, 48, 16), (37, 96, 32), (5, 160, 16)])
def test_geglu_on_interleaved_columns(T: int, F: int, block: int, dtype: torch.dtype) -> None:
    """`interleave=block`: what the fused path runs after a GEMM on the interleaved weight."""
    gu = (torch.randn(T, 2 * F, generator=torch.Generator().manual_seed(T + F)) * 3).to(dtype).to(DEVICE)
    y = geglu(_interleaved(gu, block), interleave=block)
    torch.testing.assert_close(y.float(), geglu_ref(gu).float(), **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("T,F", [(968, 16384), (50, 4096)])
def test_geglu_interleaved_gpu_real_shapes(T: int, F: int) -> None:
    """The prefix LM's and the expert's MLP widths, with the block the fused path picks here."""
    block = interleave_block(F, torch.device(DEVICE))
    gu = torch.randn(T, 2 * F, device=DEVICE).to(torch.bfloat16)
    y = geglu(_interleaved(gu, block), interleave=block)
    torch.testing.assert_close(y.float(), geglu_ref(gu).float(), **TOL[torch.bfloat16])
