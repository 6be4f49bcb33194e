"""pi0 and pi0.5 flow-matching VLA policies: the plain-PyTorch reference.

One decision (openpi `sample_actions`):
  vision tokens (SigLIP, per view) ++ prompt tokens --prefix LM--> prefix_kv (cached once)
  x ~ N(0, 1) [B, horizon, action_dim]; t = 1 -> 0 in `num_steps` Euler steps of dt = -1/N:
      x += dt * v(x, t), where v runs the action expert over the suffix tokens, each layer
      attending to prefix_kv ++ the suffix's own keys.
pi0:   suffix = [state token, horizon action tokens]; time enters through an MLP on [action, time].
pi0.5: suffix = horizon action tokens; time drives every expert norm (adaRMS, gated residuals);
       the state is discretised into the prompt instead (see `prompt.py`).

Attention masks (openpi's cumsum rule): prefix tokens see every valid prefix token and never
the suffix; suffix tokens see every valid prefix token; inside the suffix a token sees the
tokens of its own block and earlier blocks (pi0: [state] [actions]; pi0.5: [actions]).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import PolicyConfig
from .gemma import GemmaStack, attend, rope_cos_sin
from .guidance import ChunkGuide, guided_velocity
from .siglip import SiglipVision

log = logging.getLogger(__name__)


@dataclass
class PrefixKV:
    """What every denoise step re-uses: per-layer roped keys and values of the prefix.

    keys[l], values[l]: [B, Hkv, P, head_dim]; valid: bool [B, P] (False = padding / absent view).
    """

    keys: list[Tensor]
    values: list[Tensor]
    valid: Tensor

    @property
    def num_valid(self) -> Tensor:
        return self.valid.sum(dim=-1)


def sinusoidal_time_embedding(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """t [B] -> [B, dim] = [sin | cos] over log-spaced periods (openpi), computed in fp64."""
    dtype = torch.float64 if t.device.type != "mps" else torch.float32
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2 * math.pi / period)[None, :] * t[:, None].to(dtype)
    return torch.cat([angle.sin(), angle.cos()], dim=1).to(torch.float32)


def suffix_blocks(cfg: PolicyConfig, device: torch.device) -> Tensor:
    """Block id of each suffix token (cumsum of openpi's att_mask): who may see whom."""
    if cfg.kind == "pi0":
        return torch.tensor([1] + [2] * cfg.horizon, device=device)
    return torch.ones(cfg.horizon, dtype=torch.long, device=device)


def suffix_attention_mask(cfg: PolicyConfig, prefix_valid: Tensor) -> Tensor:
    """bool [B, S, P + S]: suffix query i may see key j (valid prefix keys, then own blocks)."""
    b = prefix_valid.shape[0]
    blocks = suffix_blocks(cfg, prefix_valid.device)
    own = blocks[None, :] <= blocks[:, None]  # [S, S]
    s = own.shape[0]
    return torch.cat([prefix_valid[:, None, :].expand(b, s, -1), own[None].expand(b, s, s)], dim=2)


def prefix_attention_mask(prefix_valid: Tensor) -> Tensor:
    """bool [B, P, P]: bidirectional among valid prefix tokens; the prefix never sees the suffix."""
    return prefix_valid[:, None, :] & prefix_valid[:, :, None]


class Pi0Model(nn.Module):
    """Weights and maths of pi0 / pi0.5. Inputs are already tokenised and pre-processed."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.cfg = cfg
        e = cfg.expert
        self.vision = SiglipVision(cfg.vision)
        self.vision_proj = nn.Linear(cfg.vision.width, cfg.prefix.width)
        self.prefix_lm = GemmaStack(cfg.prefix, cfg.rms_norm_eps, vocab_size=cfg.vocab_size)
        self.expert = GemmaStack(e, cfg.rms_norm_eps, cond_dim=e.width if cfg.uses_adarms else None)
        self.action_in_proj = nn.Linear(cfg.action_dim, e.width)
        self.action_out_proj = nn.Linear(e.width, cfg.action_dim)
        if cfg.uses_adarms:
            self.time_mlp_in = nn.Linear(e.width, e.width)
            self.time_mlp_out = nn.Linear(e.width, e.width)
        else:
            self.state_proj = nn.Linear(cfg.state_dim, e.width)
            self.action_time_mlp_in = nn.Linear(2 * e.width, e.width)
            self.action_time_mlp_out = nn.Linear(e.width, e.width)

    # ---- precision -------------------------------------------------------------------------
    def set_precision(self, dtype: torch.dtype) -> Pi0Model:
        """Cast every parameter to what `param_dtype` says for this precision."""
        for name, param in self.named_parameters():
            param.data = param.data.to(param_dtype(name, dtype))
        return self

    @property
    def lm_dtype(self) -> torch.dtype:
        return self.prefix_lm.layers[0].self_attn.q_proj.weight.dtype

    # ---- prefix ----------------------------------------------------------------------------
    def embed_images(self, pixels: Tensor) -> Tensor:
        """pixels [B, V, 3, S, S] in [-1, 1] -> vision tokens [B, V*N, prefix width] (fp32)."""
        b, v = pixels.shape[:2]
        tokens = self.vision(pixels.flatten(0, 1).float())  # [B*V, N, Wv]
        return self.vision_proj(tokens).view(b, -1, self.cfg.prefix.width)

    def embed_prefix(self, pixels: Tensor, image_masks: Tensor, tokens: Tensor, token_masks: Tensor):
        """-> embeddings [B, P, Wp] and valid [B, P] with P = V*N + L."""
        img = self.embed_images(pixels)
        n = self.cfg.vision.num_tokens
        img_valid = image_masks.bool().repeat_interleave(n, dim=1)  # [B, V*N]
        txt = self.prefix_lm.embed(tokens)
        emb = torch.cat([img, txt.to(img.dtype)], dim=1)
        return emb, torch.cat([img_valid, token_masks.bool()], dim=1)

    def prefill(self, emb: Tensor, valid: Tensor) -> PrefixKV:
        """Run the prefix LM once (bidirectional over valid tokens) and keep its K/V."""
        stack, dtype = self.prefix_lm, self.lm_dtype
        positions = valid.long().cumsum(dim=1) - 1
        cos, sin = rope_cos_sin(positions, stack.spec.head_dim, self.cfg.rope_base, dtype)
        allowed = prefix_attention_mask(valid)
        h = emb.to(dtype)
        keys, values = [], []
        for layer in stack.layers:
            x, _ = layer.norm_in(h, None)
            q, k, v = layer.self_attn.qkv(x, cos, sin)
            keys.append(k)
            values.append(v)
            h = layer.finish(h, attend(q, k, v, allowed), None, None)
        return PrefixKV(keys, values, valid)

    # ---- suffix / denoise ------------------------------------------------------------------
    def time_condition(self, t: Tensor) -> Tensor:
        """pi0.5: t [B] -> adaRMS condition [B, We]; a function of t alone (precomputable)."""
        emb = sinusoidal_time_embedding(t, self.cfg.expert.width, self.cfg.min_period, self.cfg.max_period)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def embed_suffix(self, x_t: Tensor, t: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """-> suffix embeddings [B, S, We] (fp32) and the adaRMS condition (pi0.5) or None."""
        actions = self.action_in_proj(x_t.float())
        if self.cfg.uses_adarms:
            return actions, self.time_condition(t)
        if state is None:
            raise ValueError("pi0 needs the robot state for its state token")
        time = sinusoidal_time_embedding(t, self.cfg.expert.width, self.cfg.min_period, self.cfg.max_period)
        mixed = torch.cat([actions, time[:, None, :].expand_as(actions)], dim=2)
        action_time = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
        state_tok = self.state_proj(state.float())[:, None, :]
        return torch.cat([state_tok, action_time], dim=1), None

    def velocity(self, prefix: PrefixKV, x_t: Tensor, t: Tensor, state: Tensor | None = None) -> Tensor:
        """One evaluation of the flow field v(x_t, t) [B, horizon, action_dim] (fp32)."""
        stack, dtype = self.expert, self.lm_dtype
        emb, cond = self.embed_suffix(x_t, t, state)
        s = emb.shape[1]
        positions = prefix.num_valid[:, None] + torch.arange(s, device=emb.device)[None]
        cos, sin = rope_cos_sin(positions, stack.spec.head_dim, self.cfg.rope_base, dtype)
        allowed = suffix_attention_mask(self.cfg, prefix.valid)
        h = emb.to(dtype)
        for layer, pk, pv in zip(stack.layers, prefix.keys, prefix.values, strict=True):
            x, gate = layer.norm_in(h, cond)
            q, k, v = layer.self_attn.qkv(x, cos, sin)
            out = attend(q, torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2), allowed)
            h = layer.finish(h, out, gate, cond)
        h = stack.final_norm(h, cond)
        return self.action_out_proj(h[:, -self.cfg.horizon :].float())

    def noise(self, batch: int, generator: torch.Generator | None = None, device=None) -> Tensor:
        """x at t=1: N(0, 1) [B, horizon, action_dim] fp32."""
        shape = (batch, self.cfg.horizon, self.cfg.action_dim)
        return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)

    def denoise(
        self,
        prefix: PrefixKV | Callable[[], PrefixKV],
        noise: Tensor,
        state: Tensor | None = None,
        num_steps: int | None = None,
        guide: ChunkGuide | None = None,
    ) -> Tensor:
        """Euler-integrate the flow from noise (t=1) to actions (t=0) with dt = -1/N; with `guide`,
        each step's velocity is corrected towards the previous chunk (real-time chunking,
        policies/guidance.py).

        `prefix` may also be a function returning it, called every step: slower, and only
        there to prove that re-using the cache changes nothing.
        """
        steps = num_steps or self.cfg.num_steps
        x = noise.float()
        dt = -1.0 / steps
        for step in range(steps):
            t_now = 1.0 + step * dt
            t = torch.full((x.shape[0],), t_now, dtype=torch.float32, device=x.device)
            kv = prefix() if callable(prefix) else prefix
            if guide is None:
                v = self.velocity(kv, x, t, state)
            else:
                v = guided_velocity(lambda xs, kv=kv, t=t: self.velocity(kv, xs, t, state), x, t_now, guide, steps)
            x = x + dt * v
        return x

    @torch.no_grad()
    def sample_actions(
        self,
        pixels: Tensor,
        image_masks: Tensor,
        tokens: Tensor,
        token_masks: Tensor,
        state: Tensor | None = None,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
        num_steps: int | None = None,
        reuse_prefix: bool = True,
        guide: ChunkGuide | None = None,
    ) -> Tensor:
        """One full decision: [B, horizon, action_dim] fp32 (noise given, or drawn from `generator`)."""
        if noise is None:
            noise = self.noise(tokens.shape[0], generator, tokens.device)
        emb, valid = self.embed_prefix(pixels, image_masks, tokens, token_masks)
        prefix = self.prefill(emb, valid) if reuse_prefix else (lambda: self.prefill(emb, valid))
        return self.denoise(prefix, noise, state, num_steps, guide=guide)


def param_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """LeRobot's mixed precision: the two Gemma stacks' matmul weights and the token embedding
    in `dtype`; the vision tower, projector, all norms and the small action/time/state
    projections stay fp32 (they are cheap, and precision there is what keeps bf16 parity)."""
    in_stack = name.startswith(("prefix_lm.", "expert."))
    is_norm = "layernorm" in name or ".norm." in name
    return dtype if in_stack and not is_norm else torch.float32


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
