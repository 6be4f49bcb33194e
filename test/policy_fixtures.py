"""Shared builders for the policy tests: tiny configs, seeded models, real-format inputs."""

from __future__ import annotations

import torch

from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.pi0 import Pi0Model
from flashrt_ros.policies.policy import random_init


def tiny_model(kind: str = "pi05", seed: int = 0, **overrides) -> Pi0Model:
    return random_init(Pi0Model(PolicyConfig.tiny(kind, **overrides)), seed).eval()


def tiny_inputs(cfg: PolicyConfig, batch: int = 2, seed: int = 1, valid_tokens: int = 12) -> dict:
    """Pixels, masks, tokens (right-padded), state and noise for `sample_actions`."""
    g = torch.Generator().manual_seed(seed)
    s = cfg.vision.image_size
    tokens = torch.randint(4, cfg.vocab_size, (batch, cfg.prompt_len), generator=g)
    token_masks = torch.zeros(batch, cfg.prompt_len, dtype=torch.bool)
    token_masks[:, :valid_tokens] = True
    tokens[~token_masks] = 0
    return dict(
        pixels=torch.rand(batch, cfg.num_views, 3, s, s, generator=g) * 2 - 1,
        image_masks=torch.ones(batch, cfg.num_views, dtype=torch.bool),
        tokens=tokens,
        token_masks=token_masks,
        state=torch.randn(batch, cfg.state_dim, generator=g),
        noise=torch.randn(batch, cfg.horizon, cfg.action_dim, generator=g),
    )


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def assert_parity(out: torch.Tensor, ref: torch.Tensor, *, max_abs: float, cos: float, noise=None) -> None:
    """A reduced-precision chunk against its fp32 reference: max abs error (which a wrong scale,
    e.g. a mis-sized Euler step, moves while the cosine barely changes) and cosine; with
    `noise`, also the cosine of chunk - noise (what the denoise added)."""
    err = (out.double() - ref.double()).abs().max().item()
    c = cosine(out, ref)
    assert err < max_abs and c > cos, f"max abs {err:.3e} (limit {max_abs:g}), cosine {c:.9f} (limit {cos})"
    if noise is not None:
        moved = cosine(out - noise, ref - noise)
        assert moved > cos, f"cosine of chunk - noise {moved:.9f} (limit {cos})"
