"""kernels.gate_up_geglu (gate|up GEMM with the GeGLU epilogue) vs the torch reference."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from kernels.gate_up_geglu import gate_up_geglu, gate_up_geglu_ref, supports_gate_up_geglu

pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not supports_gate_up_geglu(torch.device("cuda")), reason="needs sm_90+ (TMA)"
)


def _operands(T: int, K: int, F: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(2 * F, K, generator=g) * K**-0.5).to(dtype).to(DEVICE)
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,K,F", [(1, 16, 16), (37, 40, 48), (70, 128, 96), (129, 64, 200)])
def test_gate_up_geglu_matches_reference(T: int, K: int, F: int, dtype: torch.dtype) -> None:
    """Ragged rows, K and F (tiles of 16-64 on the interpreter): clipped stores, zero-filled
    loads, and gate tiles that run into the up rows all land on the reference."""
    x, w = _operands(T, K, F, dtype, seed=T + K + F)
    y = gate_up_geglu(x, w)
    assert y.shape == (T, F) and y.dtype == dtype
    want = gate_up_geglu_ref(x, w)
    torch.testing.assert_close(y.float(), want.float(), **TOL[dtype])


def test_gate_up_geglu_writes_the_static_buffer_only_in_its_rows() -> None:
    x, w = _operands(20, 32, 48, torch.float32, seed=1)
    big = torch.full((24, 48), 7.0, device=DEVICE)
    out = big[:20]
    assert gate_up_geglu(x, w, out=out) is out
    torch.testing.assert_close(out, gate_up_geglu_ref(x, w), **TOL[torch.float32])
    assert bool((big[20:] == 7.0).all())  # rows past T untouched


def test_gate_up_geglu_equals_gemm_then_geglu_kernel() -> None:
    """The same maths as the two-kernel path it replaces (F.linear, then kernels.geglu)."""
    from kernels.geglu import geglu

    x, w = _operands(33, 64, 80, torch.float32, seed=3)
    torch.testing.assert_close(gate_up_geglu(x, w), geglu(x @ w.T), **TOL[torch.float32])


@pytest.mark.parametrize(
    "x_shape,w_shape,match",
    [
        ((4, 32), (63, 32), r"w_gu must be \[2F, 32\]"),
        ((4, 32), (64, 16), r"w_gu must be \[2F, 32\]"),
        ((4, 6), (8, 6), "multiple of 16 bytes"),
        ((4, 32, 1), (64, 32), r"x must be \[T, K\]"),
    ],
)
def test_gate_up_geglu_rejects_bad_operands(x_shape, w_shape, match) -> None:
    x, w = torch.zeros(x_shape, device=DEVICE), torch.zeros(w_shape, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        gate_up_geglu(x, w)


def test_gate_up_geglu_rejects_mixed_dtypes_and_bad_out() -> None:
    x, w = _operands(4, 32, 16, torch.float32, seed=5)
    with pytest.raises(ValueError, match="x and w_gu differ"):
        gate_up_geglu(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="out has shape"):
        gate_up_geglu(x, w, out=torch.empty(4, 17, device=DEVICE))


@pytest.mark.gpu
def test_gate_up_geglu_gpu_real_shape() -> None:
    """The prefix LM's MLP input at 3 views (968 rows, 2048 -> 2 x 16384), bf16."""
    x, w = _operands(968, 2048, 16384, torch.bfloat16, seed=7)
    y = gate_up_geglu(x, w)
    want = gate_up_geglu_ref(x, w).float()
    torch.testing.assert_close(y.float(), want, **TOL[torch.bfloat16])
    cos = torch.nn.functional.cosine_similarity(y.float().flatten(), want.flatten(), dim=0)
    assert float(cos) > 0.9999
