"""flashrt_ros.kernels.denoise_update (velocity projection + Euler step + next expert input, one launch) vs torch."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.denoise_update import EulerGuide, denoise_update, denoise_update_ref


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


def _guide(H, A, seed=3, t=0.6, c=3.0):
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(H, A, generator=g)
    weights[H // 2 :] = 0.0  # the rows past the previous chunk: not held
    target = torch.randn(H, A, generator=g) * 2
    return EulerGuide(target.to(DEVICE), weights.to(DEVICE), torch.tensor([t, c], device=DEVICE))


@pytest.mark.parametrize("shape", [(50, 32, 1024, 50), (7, 5, 48, 9)], ids=["pi05", "ragged"])
def test_guided_update_matches_torch(shape) -> None:
    """Real-time chunking's correction (policies/guidance.py, identity Jacobian) in the Euler
    step, and the next input made from the guided x; rows with zero weight take the plain step."""
    H, A, WE, rows = shape
    y, x, w_out, b_out, w_in, b_in = _problem(H, A, WE, rows)
    guide = _guide(H, A)
    x_ref, h_ref = denoise_update_ref(y[-H:], x, w_out, b_out, -0.1, w_in, b_in, torch.float32, guide=guide)
    plain, _ = denoise_update_ref(y[-H:], x, w_out, b_out, -0.1)
    h = torch.empty(H, WE, device=DEVICE)
    denoise_update(y[-H:], x, w_out, b_out, -0.1, w_in, b_in, h, guide=guide)
    torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-5)
    held = H // 2
    assert float((x[:held] - plain[:held]).abs().max()) > 0.05  # the guide moved the held rows
    torch.testing.assert_close(x[held:], plain[held:], atol=1e-5, rtol=1e-5)


def test_guided_update_with_zero_weights_is_the_plain_update() -> None:
    """No previous chunk: the guided kernel (captured once for every decision) with all weights
    zero gives the plain step exactly."""
    y, x, w_out, b_out, _, _ = _problem(50, 32, 64, 50)
    guide = _guide(50, 32)
    guide.weights.zero_()
    x_plain = x.clone()
    denoise_update(y, x_plain, w_out, b_out, -0.1)
    denoise_update(y, x, w_out, b_out, -0.1, guide=guide)
    assert torch.equal(x, x_plain)


def test_bad_guides_are_refused() -> None:
    y, x, w_out, b_out, _, _ = _problem(50, 32, 64, 50)
    guide = _guide(50, 32)
    with pytest.raises(ValueError, match=r"guide target must be contiguous fp32 \[50, 32\]"):
        denoise_update(y, x, w_out, b_out, -0.1, guide=EulerGuide(guide.target[:10], guide.weights, guide.tc))
    with pytest.raises(ValueError, match=r"guide tc must be fp32 \[2\]"):
        denoise_update(y, x, w_out, b_out, -0.1, guide=EulerGuide(guide.target, guide.weights, guide.tc[:1]))


@pytest.mark.gpu
def test_gpu_guided_real_shapes() -> None:
    test_guided_update_matches_torch((50, 32, 1024, 50))
    test_guided_update_with_zero_weights_is_the_plain_update()


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
    with pytest.raises(ValueError, match=r"y must be the expert's output rows \[H, WE\], got \(1, 50, 64\)"):
        denoise_update(y[None], x, w_out, b_out, -0.1)


def test_an_integer_h_next_is_refused() -> None:
    H, WE, A = 2, 16, 4
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g).to(DEVICE)  # noqa: E731
    with pytest.raises(ValueError, match="h_next is torch.int32; expected a floating-point buffer"):
        denoise_update(
            r(H, WE),
            r(H, A),
            r(A, WE),
            r(A),
            -0.1,
            r(WE, A),
            r(WE),
            torch.zeros(H, WE, dtype=torch.int32, device=DEVICE),
        )
