"""flashrt_ros.kernels.euler (in-place Euler update of the denoise loop) vs torch."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.euler import euler_step, euler_step_ref


@pytest.mark.parametrize("v_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1), (1, 50, 32), (3, 7, 5)])
def test_euler_in_place_float_dt(shape: tuple[int, ...], v_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(DEVICE)
    v = torch.randn(*shape, generator=g).to(v_dtype).to(DEVICE)
    ref = euler_step_ref(x, v, -0.1)
    out = euler_step(x, v, -0.1)
    assert out.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, ref, atol=1e-6, rtol=1e-6)


def test_euler_tensor_dt_and_out_buffer() -> None:
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(2, 50, 32, generator=g).to(DEVICE), torch.randn(2, 50, 32, generator=g).to(DEVICE)
    dt = torch.tensor([-0.25], device=DEVICE)
    out = torch.empty_like(x)
    x_before = x.clone()
    euler_step(x, v, dt, out=out)
    torch.testing.assert_close(out, euler_step_ref(x, v, dt), atol=1e-6, rtol=1e-6)
    assert torch.equal(x, x_before)


def test_euler_ten_steps_from_noise() -> None:
    """The full loop x1 -> x0 with a constant velocity lands on x1 - v exactly (up to rounding)."""
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(1, 50, 32, generator=g).to(DEVICE), torch.randn(1, 50, 32, generator=g).to(DEVICE)
    x0 = x - v
    for _ in range(10):
        euler_step(x, v, -1.0 / 10)
    torch.testing.assert_close(x, x0, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_euler_gpu_bf16_velocity() -> None:
    x = torch.randn(1, 50, 32, device=DEVICE)
    v = torch.randn(1, 50, 32, device=DEVICE).to(torch.bfloat16)
    ref = euler_step_ref(x, v, -0.1)
    euler_step(x, v, -0.1)
    torch.testing.assert_close(x, ref, atol=1e-6, rtol=1e-6)


def test_euler_refuses_an_integer_output() -> None:
    """An int buffer would silently truncate x + dt * v."""
    x = torch.randn(4, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"out is torch.int32; expected a floating-point buffer"):
        euler_step(x, torch.randn(4, 3, device=DEVICE), -0.1, out=torch.zeros(4, 3, dtype=torch.int32, device=DEVICE))
    # unscaled e4m3: 125.997 was stored as 64 on the interpreter (e4m3's rounding carry dropped)
    with pytest.raises(ValueError, match=r"out is torch.float8_e4m3fn; expected float32, bfloat16 or float16"):
        euler_step(x, x, -0.1, out=torch.zeros(4, 3, dtype=torch.float8_e4m3fn, device=DEVICE))
