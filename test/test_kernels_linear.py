"""kernels.linear (bf16 GEMM + bias (+ GELU tanh) through TMA, for SigLIP's GEMMs) vs torch."""

import pytest
import torch
from kernel_fixtures import DEVICE, TOL

from kernels.linear import LinearTiles, linear, linear_ref

SMALL = LinearTiles(32, 32, 16, 2, 4, 2)  # several tiles and K steps at test sizes, in both groupings


def _problem(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) * K**-0.5).to(dtype).to(DEVICE)
    return x, w, (0.5 * torch.randn(N, generator=g)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("gelu", [False, True], ids=["bias", "bias_gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 64, 32), (37, 72, 40), (100, 24, 88)], ids=["even", "ragged", "tall"])
def test_matches_torch(shape, dtype, gelu) -> None:
    """Ragged M / N / K: TMA zero-fills the loads past the edges and clips the stores."""
    M, N, K = shape
    x, w, b = _problem(M, N, K, dtype)
    out = torch.full((M, N), 7.0, dtype=dtype, device=DEVICE)
    linear(x, w, b, gelu=gelu, out=out, tiles=SMALL)
    torch.testing.assert_close(out, linear_ref(x, w, b, gelu), **TOL[dtype])


def test_default_tiles_and_allocated_output() -> None:
    x, w, b = _problem(40, 48, 64, torch.float32)
    torch.testing.assert_close(linear(x, w, b), linear_ref(x, w, b), **TOL[torch.float32])


def test_bad_arguments_are_refused() -> None:
    x, w, b = _problem(8, 16, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="w / b must be"):
        linear(x, w[:, :16], b)
    with pytest.raises(ValueError, match="must share a float dtype"):
        linear(x, w.float(), b)
    with pytest.raises(ValueError, match="out must be"):
        linear(x, w, b, out=torch.empty(8, 24, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="16-byte aligned"):
        x31, w31, _ = _problem(8, 16, 31, torch.bfloat16)
        linear(x31, w31, b)  # a 62-byte row stride cannot be a TMA stride


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["o", "fc2"])
def test_siglip_shapes_gpu(name) -> None:
    """The two SigLIP GEMMs the fused path runs here (3 views: 768 rows), at its tiles."""
    from flashrt_ros.policies.fused import VISION_LINEAR_TILES

    N, K = {"o": (1152, 1152), "fc2": (1152, 4304)}[name]
    x, w, b = _problem(768, N, K, torch.bfloat16)
    got = linear(x, w, b, tiles=VISION_LINEAR_TILES)
    torch.testing.assert_close(got, linear_ref(x, w, b), atol=2e-2, rtol=2e-2)
