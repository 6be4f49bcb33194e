"""flashrt_ros.kernels.denoise_update (velocity projection + Euler step + next expert input, one launch) vs torch."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.denoise_update import denoise_update, denoise_update_ref


def _problem(H, A, WE, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, WE, generator=g).to(torch.bfloat16).to(DEVICE)  # the expert's output rows
    x = torch.randn(H, A, generator=g).to(DEVICE)
    w_out, b_out = (torch.randn(A, WE, generator=g) * WE**-0.5).to(DEVICE), torch.randn(A, generator=g).to(DEVICE)
    w_in, b_in = (torch.randn(WE, A, generator=g) * A**-0.5).to(DEVICE), torch.randn(WE, generator=g).to(DEVICE)
    return y, x, w_out, b_out, w_in, b_in


@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape", [(50, 32, 1024, 50), (50, 32, 1024, 51), (7, 5, 48, 9)], ids=["pi05", "pi0", "ragged"]
)
def test_update_and_next_input_match_torch(shape, h_dtype) -> None:
    """pi0.5's 50 action rows, pi0's 51 rows (state token first: the actions are the last 50),
    and ragged sizes that are not multiples of any tile."""
    H, A, WE, rows = shape
    y, x, w_out, b_out, w_in, b_in = _problem(H, A, WE, rows)
    x_ref, h_ref = denoise_update_ref(y[-H:], x, w_out, b_out, -0.1, w_in, b_in, h_dtype)
    h = torch.empty(H, WE, dtype=h_dtype, device=DEVICE)
    denoise_update(y[-H:], x, w_out, b_out, -0.1, w_in, b_in, h)
    torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=1e-5)
    # bf16: one rounding step (2**-7 relative); near zero the fp32 sums may differ in the last bits
    tol = dict(atol=1e-5, rtol=1e-5) if h_dtype == torch.float32 else dict(atol=1e-4, rtol=8e-3)
    torch.testing.assert_close(h, h_ref, **tol)


@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_silu_next_input_matches_torch(h_dtype) -> None:
    """pi0: the next input is the action-time MLP's hidden layer, SiLU(x @ W.T + b) (fp32)."""
    y, x, w_out, b_out, w_in, b_in = _problem(50, 32, 1024, 51)
    x_ref, h_ref = denoise_update_ref(y[-50:], x, w_out, b_out, -0.1, w_in, b_in, h_dtype, silu=True)
    h = torch.empty(50, 1024, dtype=h_dtype, device=DEVICE)
    denoise_update(y[-50:], x, w_out, b_out, -0.1, w_in, b_in, h, silu=True)
    tol = dict(atol=1e-5, rtol=1e-5) if h_dtype == torch.float32 else dict(atol=1e-4, rtol=8e-3)
    torch.testing.assert_close(h, h_ref, **tol)
    assert float((h_ref.float() - torch.nn.functional.linear(x_ref, w_in, b_in)).abs().max()) > 0.1  # SiLU applied


@pytest.mark.gpu
@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_gpu_real_shapes(h_dtype) -> None:
    """Compiled, at pi0.5's and pi0's shapes (plain and SiLU next input)."""
    for shape in [(50, 32, 1024, 50), (50, 32, 1024, 51)]:
        test_update_and_next_input_match_torch(shape, h_dtype)
    test_silu_next_input_matches_torch(h_dtype)


def test_update_without_next_input_leaves_the_rest() -> None:
    y, x, w_out, b_out, _, _ = _problem(50, 32, 64, 51)
    x_ref, _ = denoise_update_ref(y[-50:], x, w_out, b_out, -0.25)
    denoise_update(y[-50:], x, w_out, b_out, -0.25)
    torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=1e-5)


def test_bad_shapes_are_refused() -> None:
    y, x, w_out, b_out, w_in, b_in = _problem(50, 32, 64, 50)
    with pytest.raises(ValueError, match="w_out / b_out must be"):
        denoise_update(y, x, w_out[:, :32], b_out, -0.1)
    with pytest.raises(ValueError, match="h_next must be contiguous"):
        denoise_update(y, x, w_out, b_out, -0.1, w_in, b_in, torch.empty(50, 32, device=DEVICE))
    with pytest.raises(ValueError, match="x must be contiguous fp32"):
        denoise_update(y, x.double(), w_out, b_out, -0.1)
