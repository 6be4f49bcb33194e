"""flashrt_ros.kernels.gelu (bias + GELU-tanh epilogue of SigLIP's fc1) vs the torch reference."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from flashrt_ros.kernels.gelu import bias_gelu, bias_gelu_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,N", [(1, 48), (13, 130), (37, 96)])
def test_bias_gelu_matches_reference(T: int, N: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(T * N)
    x = (torch.randn(T, N, generator=g) * 4).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE)
    torch.testing.assert_close(bias_gelu(x, b).float(), bias_gelu_ref(x, b).float(), **TOL[dtype])


def test_bias_gelu_reference_is_torch_gelu_tanh() -> None:
    x, b = torch.randn(5, 40, dtype=torch.float64) * 5, torch.randn(40, dtype=torch.float64)
    hf = torch.nn.functional.gelu(x + b, approximate="tanh")
    torch.testing.assert_close(bias_gelu_ref(x.float(), b.float()).double(), hf, atol=1e-6, rtol=1e-6)


def test_bias_gelu_in_place_no_bias_and_extremes() -> None:
    # to fp32's ends: x / exp(80) is not ~0 for x near -3e38 (it gave -5.4e3); torch gives -0
    x = torch.tensor([[-3e38, -1e36, -1e4, -30.0, -3.0, -1e-3, 0.0, 1e-3, 3.0, 30.0, 1e4, 3e38]], device=DEVICE)
    ref = bias_gelu_ref(x, None)
    y = bias_gelu(x, None, out=x)
    assert y.data_ptr() == x.data_ptr() and bool(torch.isfinite(x).all())
    torch.testing.assert_close(x, ref, **TOL[torch.float32])
    nan = bias_gelu(torch.tensor([[float("-inf"), float("nan")]], device=DEVICE), None)
    assert bool(nan.isnan().all())  # as torch's tanh form: -inf * 0 and NaN, not a finite number


@pytest.mark.gpu
def test_bias_gelu_gpu_real_shape() -> None:
    x = torch.randn(3 * 256, 4304, device=DEVICE).to(torch.bfloat16)
    b = torch.randn(4304, device=DEVICE).to(torch.bfloat16)
    torch.testing.assert_close(bias_gelu(x, b).float(), bias_gelu_ref(x, b).float(), **TOL[torch.bfloat16])


def test_bias_gelu_permuted_leading_dims() -> None:
    x = torch.randn(5, 2, 16, device=DEVICE).transpose(0, 1)
    b = torch.randn(16, device=DEVICE)
    torch.testing.assert_close(bias_gelu(x, b), bias_gelu_ref(x, b), **TOL[torch.float32])


def test_bias_gelu_of_no_features_is_empty() -> None:
    """A zero-width last dim crashed in rows_2d's reshape(-1, 0)."""
    assert bias_gelu(torch.zeros(3, 0, device=DEVICE), torch.zeros(0, device=DEVICE)).shape == (3, 0)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_unscaled_8_bit_outputs_are_refused_by_the_row_ops(dtype: torch.dtype) -> None:
    """Stored without a row scale, values past e4m3's 448 saturate, and the interpreter dropped
    e4m3's rounding carry (125.997 -> 64): bias_gelu, geglu, layer_norm and adaRMS gave wrong
    numbers without a word. Only rms_norm (with out_scale) and quantize_rows_kernel write 8 bits."""
    from flashrt_ros.kernels.ada_rms_norm import ada_rms_norm
    from flashrt_ros.kernels.geglu import geglu
    from flashrt_ros.kernels.layer_norm import layer_norm

    x = torch.randn(2, 8, device=DEVICE)
    out = torch.empty(2, 8, dtype=dtype, device=DEVICE)
    for run in (
        lambda: bias_gelu(x, None, out=out),
        lambda: geglu(torch.randn(2, 16, device=DEVICE), out=out),
        lambda: layer_norm(x, None, None, out=out),
        lambda: ada_rms_norm(x, torch.zeros(24, device=DEVICE), out=out),
    ):
        with pytest.raises(ValueError, match=rf"out is {dtype}; expected float32, bfloat16 or float16"):
            run()
