"""Reading the prototypes' clock marks: each kernel's thread 0 writes clock64() at fixed points of
every layer into a [layers, grid, events] int64 tensor; an interval is read on one SM's clock."""

from __future__ import annotations

import torch

SM_MHZ = 1980.0  # the H200's SM clock under load (nvidia-smi clocks.max.sm): cycles -> us


def span_medians(spans: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each [layers, CTAs] span of cycles -> its median in us over the CTAs and the inner layers
    (the first and last layers are dropped: launch and drain)."""
    return {name: float(v[1:-1].flatten().median()) / SM_MHZ for name, v in spans.items()}


def show_spans(spans: dict[str, torch.Tensor], width: int = 36) -> dict[str, float]:
    """`span_medians`, each printed on its own indented line."""
    out = span_medians(spans)
    for name, us in out.items():
        print(f"    {name:<{width}} {us:6.2f} us")
    return out
