"""flashrt_ros.kernels.ada_rms_norm (adaRMS, gated residual, fused pair) vs torch references."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from flashrt_ros.kernels.ada_rms_norm import (
    ada_rms_norm,
    ada_rms_norm_ref,
    gated_residual,
    gated_residual_ada_rms_norm,
    gated_residual_ada_rms_norm_ref,
    gated_residual_ref,
)

# h = residual + y * gate: with bf16 operands the fp32 product is exact, so kernel and reference
# round the same value once (bit-exact); fp32 operands may differ by an ulp where the GPU fuses an fma.
H_TOL = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.bfloat16: dict(atol=0, rtol=0)}


def _rand(*shape: int, dtype: torch.dtype, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,D", [(1, 48), (11, 130)])
def test_ada_rms_norm_matches_reference(T: int, D: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = _rand(T, D, dtype=dtype, g=g, scale=2.0)
    mod = _rand(3 * D, dtype=torch.float32, g=g, scale=0.5)  # precomputed at load: fp32
    y = ada_rms_norm(x, mod)
    torch.testing.assert_close(y.float(), ada_rms_norm_ref(x, mod).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_residual_ada_rms_norm_fused(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    T, D = 13, 96
    res, y = _rand(T, D, dtype=dtype, g=g), _rand(T, D, dtype=dtype, g=g)
    mod_prev = _rand(3 * D, dtype=dtype, g=g, scale=0.5)
    mod = _rand(3 * D, dtype=dtype, g=g, scale=0.5)
    gate = mod_prev[2 * D :]  # a view, as the pipeline passes it
    y2, h = gated_residual_ada_rms_norm(res, y, gate, mod)
    y2_ref, h_ref = gated_residual_ada_rms_norm_ref(res, y, gate, mod)
    torch.testing.assert_close(h, h_ref, **H_TOL[dtype])
    torch.testing.assert_close(y2.float(), y2_ref.float(), **TOL[dtype])


def test_batched_modulation_and_in_place_residual() -> None:
    """x [B, T, D] with a per-batch modulation [B, 3D] (one time per sample); h written in place."""
    g = torch.Generator().manual_seed(2)
    B, T, D = 3, 5, 48
    res, y = _rand(B, T, D, dtype=torch.float32, g=g), _rand(B, T, D, dtype=torch.float32, g=g)
    mod_prev, mod = _rand(B, 3 * D, dtype=torch.float32, g=g), _rand(B, 3 * D, dtype=torch.float32, g=g)
    gate = mod_prev[:, 2 * D :]  # [B, D] strided view
    y2_ref, h_ref = gated_residual_ada_rms_norm_ref(res, y, gate, mod)
    out = torch.empty(B, T, D, device=DEVICE)
    y2, h = gated_residual_ada_rms_norm(res, y, gate, mod, out=out, residual_out=res)
    assert y2.data_ptr() == out.data_ptr() and h.data_ptr() == res.data_ptr()
    torch.testing.assert_close(res, h_ref, **TOL[torch.float32])
    torch.testing.assert_close(y2, y2_ref, **TOL[torch.float32])
    # batched adaRMS alone, and the shared-modulation broadcast over a batch
    torch.testing.assert_close(ada_rms_norm(y, mod), ada_rms_norm_ref(y, mod), **TOL[torch.float32])
    torch.testing.assert_close(ada_rms_norm(y, mod[0]), ada_rms_norm_ref(y, mod[0]), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_residual_alone(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    res, y, gate = _rand(7, 130, dtype=dtype, g=g), _rand(7, 130, dtype=dtype, g=g), _rand(130, dtype=dtype, g=g)
    torch.testing.assert_close(gated_residual(res, y, gate), gated_residual_ref(res, y, gate), **H_TOL[dtype])


def test_rejects_bad_modulation_shape() -> None:
    x = torch.zeros(4, 48, device=DEVICE)
    with pytest.raises(ValueError, match=r"must be \[144\] or \[\d+, 144\], got \(96,\)"):
        ada_rms_norm(x, torch.zeros(2 * 48, device=DEVICE))


@pytest.mark.gpu
def test_ada_rms_norm_gpu_real_shapes() -> None:
    g = torch.Generator().manual_seed(4)
    T, D = 50, 1024
    res, y = _rand(T, D, dtype=torch.bfloat16, g=g), _rand(T, D, dtype=torch.bfloat16, g=g)
    mod_prev, mod = _rand(3 * D, dtype=torch.float32, g=g), _rand(3 * D, dtype=torch.float32, g=g)
    y2, h = gated_residual_ada_rms_norm(res, y, mod_prev[2 * D :], mod)
    y2_ref, h_ref = gated_residual_ada_rms_norm_ref(res, y, mod_prev[2 * D :], mod)
    torch.testing.assert_close(h.float(), h_ref.float(), **TOL[torch.bfloat16])  # fp32 gate: fma may differ
    torch.testing.assert_close(y2.float(), y2_ref.float(), **TOL[torch.bfloat16])
    # adaRMS alone (the expert's first norm of a step): the same rows, the same modulation
    torch.testing.assert_close(ada_rms_norm(y, mod).float(), ada_rms_norm_ref(y, mod).float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ada_rms_norm_uses_the_eps_it_is_given(dtype: torch.dtype) -> None:
    """Rows whose mean square is near eps, where eps is most of the denominator."""
    g = torch.Generator().manual_seed(7)
    T, D = 9, 130
    x, res, y = (_rand(T, D, dtype=dtype, g=g, scale=2e-3) for _ in range(3))
    mod, gate = _rand(3 * D, dtype=torch.float32, g=g, scale=0.5), _rand(D, dtype=dtype, g=g)
    for eps in (1e-5, 1e-6):
        got, want = ada_rms_norm(x, mod, eps), ada_rms_norm_ref(x, mod, eps)
        torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
        got = gated_residual_ada_rms_norm(res, y, gate, mod, eps)
        want = gated_residual_ada_rms_norm_ref(res, y, gate, mod, eps)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])
    assert (ada_rms_norm_ref(x, mod, 1e-5).float() - ada_rms_norm_ref(x, mod, 1e-6).float()).abs().max() > 0.1


def test_permuted_leading_dims() -> None:
    """[B, T, D] whose leading dims do not merge: copied in, default outputs as fresh rows."""
    g = torch.Generator().manual_seed(7)
    x = _rand(5, 2, 16, dtype=torch.float32, g=g).transpose(0, 1)  # [2, 5, 16]
    mod, gate = _rand(2, 48, dtype=torch.float32, g=g), _rand(16, dtype=torch.float32, g=g)
    y = _rand(2, 5, 16, dtype=torch.float32, g=g)
    torch.testing.assert_close(ada_rms_norm(x, mod), ada_rms_norm_ref(x, mod), **TOL[torch.float32])
    torch.testing.assert_close(gated_residual(x, y, gate), gated_residual_ref(x, y, gate), **H_TOL[torch.float32])


def test_empty_inputs_with_per_batch_modulation_and_gate() -> None:
    """No tokens (or no batches) with a [B, 3D] modulation or [B, D] gate: an empty result (the
    batch count was taken from numel, 1, and a right modulation refused as [3D] or [1, 3D])."""
    for shape in ((2, 0, 8), (0, 4, 8)):
        b = shape[0]
        x = torch.zeros(shape, device=DEVICE)
        assert ada_rms_norm(x, torch.zeros(b, 24, device=DEVICE)).shape == shape
        h = gated_residual(x, torch.zeros(shape, device=DEVICE), torch.zeros(b, 8, device=DEVICE))
        assert h.shape == shape
    x = torch.zeros(3, 8, dtype=torch.bfloat16, device=DEVICE)
    gate = torch.zeros(8, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"^out is torch.float32; expected torch.bfloat16, the dtype of the residual"):
        gated_residual(x, x, gate, out=torch.empty(3, 8, device=DEVICE))
    with pytest.raises(ValueError, match=r"^residual_out is torch.float32; expected torch.bfloat16"):
        gated_residual_ada_rms_norm(x, x, gate, torch.zeros(24, dtype=torch.bfloat16, device=DEVICE),
                                    residual_out=torch.empty(3, 8, device=DEVICE))  # fmt: skip
    assert gated_residual(x[:, :0], x[:, :0], gate[:0]).shape == (3, 0)  # elementwise: empty, not refused
    with pytest.raises(ValueError, match=r"x has an empty last dimension"):
        ada_rms_norm(x[:, :0], torch.zeros(0, dtype=torch.bfloat16, device=DEVICE))
