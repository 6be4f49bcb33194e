"""Row-scaled FP8 (e4m3): the format of the prefix LM's FP8 gate|up GEMM (`precision` fp8).

Each row of a matrix keeps one fp32 scale, ``t ~ scale[:, None] * q`` with ``q`` in e4m3 and the
row's largest magnitude mapped to e4m3's largest finite value (448). Weights are quantised once
at load (`quantize_rows`, rows = output channels); activations per token inside the norm that
produces them (`kernels.rms_norm.rms_norm(..., out=e4m3 buffer, out_scale=...)`). A row of zeros
gets the scale of a tiny amax, so it stays zeros and never divides by zero.
"""

from __future__ import annotations

import torch

__all__ = ["E4M3", "E4M3_MAX", "MIN_AMAX", "dequantize_rows", "quantize_rows"]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_AMAX = 1e-12  # floor of a row's amax (the kernels use the same)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] (any float dtype) -> (e4m3 [N, K], fp32 scales [N]), computed in fp32."""
    if t.dim() != 2:
        raise ValueError(f"quantize_rows wants [N, K], got {tuple(t.shape)}")
    tf = t.float()
    scale = tf.abs().amax(dim=1).clamp(min=MIN_AMAX) / E4M3_MAX  # [N]
    return (tf / scale[:, None]).to(E4M3), scale.contiguous()


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 values an e4m3 matrix and its row scales stand for."""
    return q.float() * scale[:, None]
