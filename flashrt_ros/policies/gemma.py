"""Gemma decoder pieces shared by the prefix model (Gemma 2B) and the action expert (300M).

Reference maths, written for clarity; the precision choices mirror openpi / LeRobot so that
a bf16 run is comparable: norms compute in fp32 and cast back, attention probabilities are
softmaxed in fp32, RoPE's cos/sin are cast to the activation dtype (as Hugging Face does).
Module names follow the Hugging Face layout so checkpoints map by prefix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import GemmaSpec

# openpi's additive mask value (finite, so fully masked rows stay finite).
MASK_VALUE = -2.3819763e38


class RMSNorm(nn.Module):
    """Gemma RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        y = _normalize(x, self.eps) * (1.0 + self.weight.float())
        return y.to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """pi0.5's adaptive RMSNorm: scale, shift and a residual gate come from the time condition.

    dense(cond) -> [scale | shift | gate]; y = norm(x) * (1 + scale) + shift. The gate scales
    the branch output in the following residual add (`x + branch * gate`).
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def modulation(self, cond: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, cond] -> three [B, 1, D] tensors; depends on time only, so it can be precomputed."""
        scale, shift, gate = self.dense(cond)[:, None, :].chunk(3, dim=-1)
        return scale, shift, gate

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        scale, shift, gate = self.modulation(cond)
        y = _normalize(x, self.eps) * (1.0 + scale.float()) + shift.float()
        return y.to(x.dtype), gate.to(x.dtype)


def _normalize(x: Tensor, eps: float) -> Tensor:
    var = x.float().square().mean(dim=-1, keepdim=True)
    return x.float() * torch.rsqrt(var + eps)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    return x + y if gate is None else x + y * gate


def rope_cos_sin(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] (int) -> cos, sin [B, 1, T, head_dim] (HF 'rotate_half' layout)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Masked multi-query attention, the reference the fused kernel is checked against.

    q [B, H, Tq, hd]; k, v [B, Hkv, Tk, hd]; allowed bool [B, Tq, Tk] -> [B, Tq, H*hd].
    """
    b, h, tq, hd = q.shape
    rep = h // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * hd**-0.5
    scores = scores + torch.where(allowed[:, None], 0.0, MASK_VALUE).to(scores.dtype)
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    return (probs @ v).transpose(1, 2).reshape(b, tq, h * hd)


class GemmaAttention(nn.Module):
    def __init__(self, spec: GemmaSpec):
        super().__init__()
        self.spec = spec
        self.q_proj = nn.Linear(spec.width, spec.num_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.width, bias=False)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, W] -> roped q [B, H, T, hd], roped k and v [B, Hkv, T, hd]."""
        b, t, _ = x.shape
        hd = self.spec.head_dim
        q = self.q_proj(x).view(b, t, -1, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class GemmaMLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, spec: GemmaSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.up_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.down_proj = nn.Linear(spec.mlp_dim, spec.width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaLayer(nn.Module):
    def __init__(self, spec: GemmaSpec, eps: float, cond_dim: int | None):
        super().__init__()
        self.self_attn = GemmaAttention(spec)
        self.mlp = GemmaMLP(spec)
        norm = (lambda: AdaRMSNorm(spec.width, cond_dim, eps)) if cond_dim else (lambda: RMSNorm(spec.width, eps))
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()

    def norm_in(self, x: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor | None]:
        return _apply_norm(self.input_layernorm, x, cond)

    def finish(self, h: Tensor, attn_out: Tensor, gate: Tensor | None, cond: Tensor | None) -> Tensor:
        """Everything after attention: o_proj, gated residual, post-norm, MLP, gated residual."""
        h = gated_residual(h, self.self_attn.o_proj(attn_out.to(h.dtype)), gate)
        x, gate = _apply_norm(self.post_attention_layernorm, h, cond)
        return gated_residual(h, self.mlp(x), gate)


def _apply_norm(norm: nn.Module, x: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor | None]:
    return norm(x, cond) if isinstance(norm, AdaRMSNorm) else norm(x)


class GemmaStack(nn.Module):
    """A stack of decoder layers plus the final norm; the prefix model also embeds tokens."""

    def __init__(self, spec: GemmaSpec, eps: float, vocab_size: int | None = None, cond_dim: int | None = None):
        super().__init__()
        self.spec = spec
        if vocab_size:
            self.embed_tokens = nn.Embedding(vocab_size, spec.width)
        self.layers = nn.ModuleList(GemmaLayer(spec, eps, cond_dim) for _ in range(spec.depth))
        self.norm = AdaRMSNorm(spec.width, cond_dim, eps) if cond_dim else RMSNorm(spec.width, eps)

    def embed(self, tokens: Tensor) -> Tensor:
        """Token embedding times sqrt(width), the scale rounded to the weight dtype (as HF does)."""
        w = self.embed_tokens.weight
        return F.embedding(tokens, w) * torch.tensor(math.sqrt(self.spec.width), dtype=w.dtype)

    def final_norm(self, x: Tensor, cond: Tensor | None) -> Tensor:
        return _apply_norm(self.norm, x, cond)[0]
