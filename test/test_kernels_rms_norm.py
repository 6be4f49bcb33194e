"""kernels.rms_norm vs its torch reference (CPU: Triton interpreter at small ragged shapes)."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from kernels.rms_norm import rms_norm, rms_norm_ref


def _inputs(T: int, D: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, D, generator=g) * 3).to(dtype).to(DEVICE)
    r = torch.randn(T, D, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(D, generator=g) * 0.5).to(dtype).to(DEVICE)
    return x, r, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 48), (7, 96), (37, 130)])
def test_rms_norm_matches_reference(T: int, D: int, dtype: torch.dtype) -> None:
    x, _, w = _inputs(T, D, dtype)
    y = rms_norm(x, w)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.float(), rms_norm_ref(x, w).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 48), (13, 130)])
def test_rms_norm_fused_residual(T: int, D: int, dtype: torch.dtype) -> None:
    x, r, w = _inputs(T, D, dtype, seed=1)
    y, s = rms_norm(x, w, residual=r)
    y_ref, s_ref = rms_norm_ref(x, w, residual=r)
    # The new residual is one rounded add: bit-exact in every dtype.
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    torch.testing.assert_close(y.float(), y_ref.float(), **TOL[dtype])


def test_rms_norm_static_buffers_in_place_and_strided_rows() -> None:
    """out= / residual_out= aliasing the residual, rows that are slices of a wider buffer."""
    T, D = 5, 96
    x, r, w = _inputs(T, D, torch.float32, seed=2)
    wide = torch.zeros(T, 3 * D, device=DEVICE)
    wide[:, D : 2 * D] = x
    x_view = wide[:, D : 2 * D]  # row stride 3*D
    y_ref, s_ref = rms_norm_ref(x, w, residual=r)
    out = torch.empty(T, D, device=DEVICE)
    y, s = rms_norm(x_view, w, residual=r, out=out, residual_out=r)
    assert y.data_ptr() == out.data_ptr() and s.data_ptr() == r.data_ptr()
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(r, s_ref, atol=0, rtol=0)


def test_rms_norm_no_weight_and_folded_weight() -> None:
    x, _, w = _inputs(9, 48, torch.float32, seed=3)
    torch.testing.assert_close(rms_norm(x, None), rms_norm_ref(x, None), **TOL[torch.float32])
    folded = 1.0 + w
    torch.testing.assert_close(rms_norm(x, folded, unit_offset=False), rms_norm_ref(x, w), **TOL[torch.float32])


def test_rms_norm_3d_input_and_zero_rows() -> None:
    x, _, w = _inputs(6, 48, torch.bfloat16, seed=4)
    x3 = x.view(2, 3, 48)
    torch.testing.assert_close(rms_norm(x3, w).float(), rms_norm_ref(x3, w).float(), **TOL[torch.bfloat16])
    assert rms_norm(x[:0], w).shape == (0, 48)


@pytest.mark.gpu
@pytest.mark.parametrize("T,D", [(968, 2048), (51, 1024)])
def test_rms_norm_gpu_real_shapes(T: int, D: int) -> None:
    x, r, w = _inputs(T, D, torch.bfloat16, seed=5)
    y, s = rms_norm(x, w, residual=r)
    y_ref, s_ref = rms_norm_ref(x, w, residual=r)
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    torch.testing.assert_close(y.float(), y_ref.float(), **TOL[torch.bfloat16])
