"""flashrt_ros.kernels.rms_norm vs its torch reference (CPU: Triton interpreter at small ragged shapes)."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from flashrt_ros.kernels.rms_norm import rms_norm, rms_norm_ref


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
    torch.testing.assert_close(rms_norm(x, w).float(), rms_norm_ref(x, w).float(), **TOL[torch.bfloat16])  # no residual


@pytest.mark.parametrize("T,D", [(1, 48), (37, 130), pytest.param(968, 2048, marks=pytest.mark.gpu)])
def test_rms_norm_fp8_out_is_row_scaled_e4m3(T: int, D: int) -> None:
    """An e4m3 `out` with `out_scale`: each row stored as kernels/fp8.quantize_rows stores the
    reference's fp32 row (largest |y| -> 448), the new residual as in bf16."""
    from flashrt_ros.kernels.fp8 import E4M3, dequantize_rows, quantize_rows

    x, r, w = _inputs(T, D, torch.bfloat16, seed=4)
    q, scale = torch.empty(T, D, device=DEVICE, dtype=E4M3), torch.empty(T, device=DEVICE)
    out, s = rms_norm(x, w, residual=r, out=q, out_scale=scale)
    assert out is q
    s_ref = rms_norm_ref(x, w, residual=r)[1]
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    xf = s_ref.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w.float())  # the fp32 row
    q_ref, scale_ref = quantize_rows(y)
    torch.testing.assert_close(scale, scale_ref, atol=0, rtol=1e-5)
    assert float(q.float().abs().amax(dim=1).min()) == 448.0  # every row uses the full range
    # the reference's e4m3 values, but for a rare element next to a rounding midpoint (rsqrt may
    # differ in the last fp32 bit): then one e4m3 step (2**-3 relative) away
    same = q.float() == q_ref.float()
    assert float(same.float().mean()) >= 0.99
    torch.testing.assert_close(dequantize_rows(q, scale), dequantize_rows(q_ref, scale_ref), atol=0, rtol=0.126)


def test_rms_norm_fp8_out_needs_its_scale() -> None:
    from flashrt_ros.kernels.fp8 import E4M3

    x, _, w = _inputs(4, 32, torch.bfloat16)
    unscaled = r"out is torch.float8_e4m3fn; expected float32, bfloat16 or float16 \(8-bit floats need row scales"
    with pytest.raises(ValueError, match=unscaled):
        rms_norm(x, w, out=torch.empty(4, 32, device=DEVICE, dtype=E4M3))
    with pytest.raises(ValueError, match="out_scale goes with an e4m3 out"):  # e5m2 has no scaled store
        rms_norm(x, w, out=torch.empty(4, 32, device=DEVICE, dtype=torch.float8_e5m2), out_scale=torch.empty(4))
    with pytest.raises(ValueError, match="out_scale goes with an e4m3 out"):
        rms_norm(x, w, out_scale=torch.empty(4, device=DEVICE))
    with pytest.raises(ValueError, match=r"out_scale: expected a contiguous \[4\] float32 tensor on \S+, got \(3,\)"):
        rms_norm(x, w, out=torch.empty(4, 32, device=DEVICE, dtype=E4M3), out_scale=torch.empty(3, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,D", [(1, 48), (37, 130), pytest.param(968, 16384, marks=pytest.mark.gpu)])
def test_quantize_rows_kernel_equals_the_torch_rounding(T: int, D: int, dtype: torch.dtype) -> None:
    """kernels/fp8.quantize_rows_kernel (the FP8 down projection's input; on the GPU the hardware
    e4m3 conversion) rounds as the torch reference: the same e4m3 values and scales, zero rows
    kept zero. 968 x 16384: the prefix LM's GeGLU output at 3 views."""
    from flashrt_ros.kernels.fp8 import quantize_rows, quantize_rows_kernel

    x, _, _ = _inputs(T, D, dtype, seed=5)
    x[0] = 0
    q, scale = quantize_rows_kernel(x)
    q_ref, scale_ref = quantize_rows(x)
    torch.testing.assert_close(scale, scale_ref, atol=0, rtol=1e-6)
    torch.testing.assert_close(q.float(), q_ref.float(), atol=0, rtol=0)
    assert bool((q[0].float() == 0).all())
    with pytest.raises(ValueError, match="out must be e4m3 and scale float32"):
        quantize_rows_kernel(x, out=torch.empty(T, D, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_uses_the_eps_it_is_given(dtype: torch.dtype) -> None:
    """Rows whose mean square is near eps: there eps is most of the denominator, and a kernel that
    used another eps (or its default) would be far off the reference."""
    x, r, w = _inputs(9, 130, dtype, seed=3)
    small = (x.float() * 1e-3).to(dtype)
    for eps in (1e-5, 1e-6):
        torch.testing.assert_close(rms_norm(small, w, eps).float(), rms_norm_ref(small, w, eps).float(), **TOL[dtype])
        y, _ = rms_norm(small, w, eps, residual=(r.float() * 1e-3).to(dtype))
        y_ref, _ = rms_norm_ref(small, w, eps, residual=(r.float() * 1e-3).to(dtype))
        torch.testing.assert_close(y.float(), y_ref.float(), **TOL[dtype])
    assert (rms_norm_ref(small, w, 1e-5).float() - rms_norm_ref(small, w, 1e-6).float()).abs().max() > 0.1


def test_rms_norm_permuted_leading_dims() -> None:
    """An input whose leading dims do not merge into rows is copied (rows_2d); the default outputs
    were allocated in its permuted layout and refused as "out cannot be viewed" (an out never passed)."""
    x = torch.randn(5, 2, 16, device=DEVICE).transpose(0, 1)  # [2, 5, 16], last dim contiguous
    r, w = torch.randn(2, 5, 16, device=DEVICE), torch.randn(16, device=DEVICE)
    torch.testing.assert_close(rms_norm(x, w), rms_norm_ref(x, w), **TOL[torch.float32])
    y, s = rms_norm(x, w, residual=r)
    y_ref, s_ref = rms_norm_ref(x, w, residual=r)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)


def test_quantize_rows_kernel_refuses_integer_rows() -> None:
    from flashrt_ros.kernels.fp8 import quantize_rows_kernel

    with pytest.raises(ValueError, match="x must be fp32, bf16 or fp16 to quantize, got torch.int32"):
        quantize_rows_kernel(torch.ones(2, 3, dtype=torch.int32, device=DEVICE))


def test_rms_norm_refuses_no_features_and_a_residual_out_of_another_dtype() -> None:
    """A residual_out of another dtype than x rounded the sum to it and normed that, not the
    bf16 sum the reference norms; an empty feature dim crashed in a reshape."""
    x, r, w = _inputs(4, 48, torch.bfloat16, seed=6)
    with pytest.raises(ValueError, match=r"residual_out is torch.float32; expected torch.bfloat16, the dtype of x"):
        rms_norm(x, w, residual=r, residual_out=torch.empty(4, 48, device=DEVICE))
    with pytest.raises(ValueError, match=r"x has an empty last dimension \(shape \(4, 0\)\); a norm needs at least 1"):
        rms_norm(x[:, :0], None)


def test_rms_norm_refuses_outputs_whose_rows_overlap_or_that_share_memory() -> None:
    """An expanded out kept only the rows written last; out and residual_out in one buffer
    returned the normed rows as the new residual."""
    x, r, w = _inputs(4, 32, torch.float32)
    with pytest.raises(ValueError, match=r"out's rows overlap \(row stride 0 for rows of 32\)"):
        rms_norm(x, w, out=torch.empty(32, device=DEVICE).expand(4, 32))
    with pytest.raises(ValueError, match=r"residual_out's rows overlap \(row stride 16 for rows of 32\)"):
        rms_norm(x, w, residual=r, residual_out=torch.empty(80, device=DEVICE).as_strided((4, 32), (16, 1)))
    buffer = torch.empty(6, 32, device=DEVICE)
    for out, residual_out in ((buffer[:4], buffer[:4]), (buffer[:4], buffer[2:])):
        with pytest.raises(ValueError, match="out and residual_out share memory; expected two separate buffers"):
            rms_norm(x, w, residual=r, out=out, residual_out=residual_out)
    _, s = rms_norm(x, w, residual=r, out=buffer[:2].reshape(4, 16).repeat(1, 2), residual_out=buffer[2:])
    torch.testing.assert_close(s, rms_norm_ref(x, w, residual=r)[1], atol=0, rtol=0)  # apart: as before


@pytest.mark.parametrize("T,D", [(3, 48), pytest.param(968, 2048, marks=pytest.mark.gpu)])
def test_a_nan_row_gets_a_nan_scale_as_in_the_torch_rounding(T: int, D: int) -> None:
    """max and maximum drop a NaN: the row's scale came out finite where quantize_rows' is NaN,
    and on the interpreter (which stores NaN into e4m3 as a finite value) the NaN was gone."""
    from flashrt_ros.kernels.fp8 import E4M3, dequantize_rows, quantize_rows, quantize_rows_kernel

    x, _, w = _inputs(T, D, torch.bfloat16, seed=7)
    x[1, 5] = float("nan")
    _, scale = quantize_rows_kernel(x)
    _, scale_ref = quantize_rows(x)
    assert torch.isnan(scale[1]) and torch.isnan(scale_ref[1])
    torch.testing.assert_close(scale[[0, 2]], scale_ref[[0, 2]], atol=0, rtol=1e-6)
    q, s = torch.empty(T, D, dtype=E4M3, device=DEVICE), torch.empty(T, device=DEVICE)
    rms_norm(x, w, out=q, out_scale=s)
    rows = dequantize_rows(q, s)
    assert bool(torch.isnan(rows[1]).all()) and bool(torch.isfinite(rows[[0, 2]]).all())
