"""Latency of the reference (eager) policy, optionally under torch.compile, at full size.

Random weights (nothing to download), real shapes: pi0.5 with 3 views, 200 prompt tokens,
chunk 50, 10 steps, batch 1 by default. Reports the full decision and denoise-only
(cached prefix), median/p90/p99 over >= 10 decisions
(`flashrt bench`'s minimum; 50 by default), and peak GPU memory.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..policies.config import PolicyConfig
from ..policies.pi0 import Pi0Model
from ..policies.policy import random_init
from .timing import Latency, time_call, time_parts

log = logging.getLogger(__name__)


@contextlib.contextmanager
def true_fp32() -> Iterator[None]:
    """fp32 maths in fp32: the reference chunks that parity is measured against (cuBLAS's and
    cuDNN's TF32 would round their inputs to 10-bit mantissas)."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@contextlib.contextmanager
def vision_in(model: Pi0Model, dtype: torch.dtype | None) -> Iterator[None]:
    """The reference's SigLIP and projector in `dtype` inside the block (None: as they are), then
    back to their own tensors. LeRobot's bf16 mode keeps them fp32, and so does the reference; a
    compile baseline with them in bf16 as well is the stronger one for the fused path to beat."""
    if dtype is None:
        yield
        return
    params = [p for module in (model.vision, model.vision_proj) for p in module.parameters()]
    kept = [p.data for p in params]
    try:
        for p in params:
            p.data = p.data.to(dtype)
        yield
    finally:
        for p, data in zip(params, kept, strict=True):
            p.data = data


@dataclass
class Case:
    """The benchmark inputs of one decision (batch 1), built on the device."""

    pixels: torch.Tensor
    image_masks: torch.Tensor
    tokens: torch.Tensor
    token_masks: torch.Tensor
    state: torch.Tensor
    noise: torch.Tensor
    views: int

    @classmethod
    def make(cls, cfg: PolicyConfig, device: torch.device, views: int, prompt_fill: float = 0.75, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        s = cfg.vision.image_size
        n_valid = max(1, int(cfg.prompt_len * prompt_fill))
        tokens = torch.randint(4, min(cfg.vocab_size, 32000), (1, cfg.prompt_len), generator=g, device=device)
        masks = torch.zeros(1, cfg.prompt_len, dtype=torch.bool, device=device)
        masks[:, :n_valid] = True
        image_masks = torch.zeros(1, cfg.num_views, dtype=torch.bool, device=device)
        image_masks[:, :views] = True
        return cls(
            pixels=torch.rand(1, cfg.num_views, 3, s, s, generator=g, device=device) * 2 - 1,
            image_masks=image_masks,
            tokens=tokens * masks,
            token_masks=masks,
            state=torch.randn(1, cfg.state_dim, generator=g, device=device),
            noise=torch.randn(1, cfg.horizon, cfg.action_dim, generator=g, device=device),
            views=views,
        )

    def args(self) -> tuple:
        return self.pixels, self.image_masks, self.tokens, self.token_masks, self.state


def build_random(cfg: PolicyConfig, device: torch.device, seed: int = 0) -> Pi0Model:
    t0 = time.perf_counter()
    with torch.device(device):
        model = Pi0Model(cfg)
    random_init(model, seed).set_precision(getattr(torch, cfg.dtype)).eval()
    log.info("built random %s (%s) on %s in %.1f s", cfg.kind, cfg.dtype, device, time.perf_counter() - t0)
    return model


def measure_reference(model: Pi0Model, case: Case, iters: int, warmup: int, label: str) -> dict[str, Latency]:
    """The eager reference's decision rows (`time_decision`)."""
    with torch.no_grad():
        return time_decision(
            lambda: model.prefill(*model.embed_prefix(*case.args()[:4])),
            lambda prefix: model.denoise(prefix, case.noise, case.state),
            iters, warmup, case.noise.device, label,
        )  # fmt: skip


def time_decision(
    prefix: Callable[[], object],
    denoise: Callable[[object], object],
    iters: int,
    warmup: int,
    device: torch.device,
    label: str,
) -> dict[str, Latency]:
    """The rows every mode reports: the full decision (`prefix()`, then `denoise` of what it
    returned), its prefix and denoise as they ran inside it (they add up to it), and the denoise
    alone over one cached prefix."""
    held: dict = {}

    def run_prefix() -> None:
        held["prefix"] = prefix()

    split = time_parts(
        [("prefix", run_prefix), ("denoise", lambda: denoise(held["prefix"]))], iters, warmup, device, f"{label} full"
    )
    cached = prefix()
    alone = time_call(lambda: denoise(cached), iters, warmup, device, label)
    return {
        "full": Latency.from_samples(f"{label} full decision", split["total"]),
        "prefix": Latency.from_samples(f"{label} prefix in decision", split["prefix"]),
        "denoise_in_decision": Latency.from_samples(f"{label} denoise in decision", split["denoise"]),
        "denoise": Latency.from_samples(f"{label} denoise only", alone),
    }
