"""flashrt_ros.kernels.linear_f32 (pi0's fp32 action-time projection, cast into the expert's input rows) vs torch."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.linear_f32 import linear_f32, linear_f32_ref


def _problem(M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(DEVICE)
    w = (torch.randn(N, K, generator=g) * K**-0.5).to(DEVICE)
    return x, w, torch.randn(N, generator=g).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(50, 1024, 1024), (9, 40, 72), (70, 48, 33)], ids=["pi0", "ragged", "two_row_tiles"])
def test_matches_torch_into_a_row_slice(shape, dtype) -> None:
    """Written into rows 1.. of a bigger buffer (row 0 is pi0's state token): row 0 untouched."""
    M, N, K = shape
    x, w, b = _problem(M, N, K)
    buf = torch.full((M + 1, N), 7.0, dtype=dtype, device=DEVICE)
    linear_f32(x, w, b, out=buf[1:])
    want = linear_f32_ref(x, w, b, dtype)
    # fp32: tf32x3 on the GPU is fp32-accurate to ~1e-6 relative; bf16: one rounding of the same value
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=1e-5, rtol=8e-3)
    torch.testing.assert_close(buf[1:], want, **tol)
    assert bool((buf[0] == 7.0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(50, 1024, 32), (50, 1024, 1024)], ids=["pi05_action_in", "pi0_time_mlp_out"])
def test_gpu_real_shapes(shape, dtype) -> None:
    """The compiled path (tf32x3 tensor cores, its own tiles) at the fused path's two uses."""
    test_matches_torch_into_a_row_slice(shape, dtype)


def test_bad_arguments_are_refused() -> None:
    x, w, b = _problem(8, 16, 32)
    with pytest.raises(ValueError, match="x must be fp32"):
        linear_f32(x.bfloat16(), w, b, torch.empty(8, 16, device=DEVICE))
    with pytest.raises(ValueError, match="w / b must be"):
        linear_f32(x, w[:, :16], b, torch.empty(8, 16, device=DEVICE))
    with pytest.raises(ValueError, match="out must be"):
        linear_f32(x, w, b, torch.empty(8, 17, device=DEVICE))


def test_an_integer_output_buffer_is_refused() -> None:
    x, w, b = torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE), torch.randn(4, device=DEVICE)
    with pytest.raises(ValueError, match="out is torch.int32; expected a floating-point buffer"):
        linear_f32(x, w, b, torch.zeros(2, 4, dtype=torch.int32, device=DEVICE))


def test_a_batched_x_is_refused_by_name() -> None:
    w, b = torch.randn(8, 4, device=DEVICE), torch.randn(8, device=DEVICE)
    with pytest.raises(ValueError, match=r"x and w must be 2-D \[M, K\] / \[N, K\], got \(2, 3, 4\)"):
        linear_f32(torch.randn(2, 3, 4, device=DEVICE), w, b, torch.empty(6, 8, device=DEVICE))
