"""flashrt_ros.kernels.layer_norm (SigLIP LayerNorm, optionally with the residual add) vs torch."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from flashrt_ros.kernels.layer_norm import layer_norm, layer_norm_ref


def _inputs(T: int, D: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, D, generator=g) * 2 + 3).to(dtype).to(DEVICE)  # non-zero mean
    r = torch.randn(T, D, generator=g).to(dtype).to(DEVICE)
    w = (1 + 0.3 * torch.randn(D, generator=g)).to(dtype).to(DEVICE)
    b = (0.3 * torch.randn(D, generator=g)).to(dtype).to(DEVICE)
    return x, r, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 48), (9, 130), (37, 96)])
def test_layer_norm_matches_reference(T: int, D: int, dtype: torch.dtype) -> None:
    x, _, w, b = _inputs(T, D, dtype, seed=T)
    torch.testing.assert_close(layer_norm(x, w, b).float(), layer_norm_ref(x, w, b).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_fused_residual(dtype: torch.dtype) -> None:
    x, r, w, b = _inputs(13, 130, dtype, seed=5)
    y, s = layer_norm(x, w, b, residual=r)
    y_ref, s_ref = layer_norm_ref(x, w, b, residual=r)
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    torch.testing.assert_close(y.float(), y_ref.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 48), (13, 130)])
def test_layer_norm_adds_the_gemm_bias(T: int, D: int, dtype: torch.dtype) -> None:
    """`x_bias`: the bias of the GEMM before the norm, added (and rounded) before the residual,
    bit for bit as the reference; y and s differ from the norm of x alone."""
    x, r, w, b = _inputs(T, D, dtype, seed=T + 20)
    xb = (torch.randn(D, generator=torch.Generator().manual_seed(3)) * 2).to(dtype).to(DEVICE)
    y, s = layer_norm(x, w, b, residual=r, x_bias=xb)
    y_ref, s_ref = layer_norm_ref(x, w, b, residual=r, x_bias=xb)
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    torch.testing.assert_close(y.float(), y_ref.float(), **TOL[dtype])
    _, s_plain = layer_norm_ref(x, w, b, residual=r)
    assert not torch.equal(s, s_plain)
    with pytest.raises(ValueError, match=rf"x_bias must be a contiguous \[{D}\] tensor"):
        layer_norm(x, w, b, residual=r, x_bias=xb[:-1])


def test_layer_norm_no_affine_in_place_residual() -> None:
    x, r, _, _ = _inputs(6, 48, torch.float32, seed=6)
    y_ref, s_ref = layer_norm_ref(x, None, None, residual=r)
    y, s = layer_norm(x, None, None, residual=r, residual_out=r)
    assert s.data_ptr() == r.data_ptr()
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(r, s_ref, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("with_x_bias", [False, True])
def test_layer_norm_gpu_real_shape(with_x_bias: bool) -> None:
    x, r, w, b = _inputs(3 * 256, 1152, torch.bfloat16, seed=7)
    xb = b.flip(0) if with_x_bias else None
    y, s = layer_norm(x, w, b, residual=r, x_bias=xb)
    y_ref, s_ref = layer_norm_ref(x, w, b, residual=r, x_bias=xb)
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    torch.testing.assert_close(y.float(), y_ref.float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_uses_the_eps_it_is_given(dtype: torch.dtype) -> None:
    """Rows whose variance is near eps, where eps is most of the denominator."""
    x, r, w, b = _inputs(9, 130, dtype, seed=11)
    small = ((x.float() - 3) * 1e-3).to(dtype)
    for eps in (1e-5, 1e-6):
        got, want = layer_norm(small, w, b, eps), layer_norm_ref(small, w, b, eps)
        torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    assert (layer_norm_ref(small, w, b, 1e-5).float() - layer_norm_ref(small, w, b, 1e-6).float()).abs().max() > 0.1


def test_layer_norm_permuted_leading_dims() -> None:
    """Leading dims that do not merge: the input is copied, the default outputs are new rows."""
    x = torch.randn(5, 2, 16, device=DEVICE).transpose(0, 1)
    r = torch.randn(2, 5, 16, device=DEVICE)
    w, b = torch.randn(16, device=DEVICE), torch.randn(16, device=DEVICE)
    torch.testing.assert_close(layer_norm(x, w, b), layer_norm_ref(x, w, b), **TOL[torch.float32])
    y, s = layer_norm(x, w, b, residual=r)
    y_ref, s_ref = layer_norm_ref(x, w, b, residual=r)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)


def test_layer_norm_refuses_no_features_and_a_residual_out_of_another_dtype() -> None:
    x = torch.randn(4, 48).to(torch.bfloat16).to(DEVICE)
    with pytest.raises(ValueError, match=r"residual_out is torch.float32; expected torch.bfloat16"):
        layer_norm(x, None, None, residual=x, residual_out=torch.empty(4, 48, device=DEVICE))
    with pytest.raises(ValueError, match=r"x has an empty last dimension"):
        layer_norm(x[:, :0], None, None)
