"""SigLIP So400m/14 vision tower and PaliGemma's linear projector (reference, plain torch).

Pre-LN ViT with no pooling head: patch conv -> + learned positions -> N x [LN, MHA, +, LN,
GELU-tanh MLP, +] -> final LN -> Linear(width -> LM width). Sub-module names follow the
Hugging Face layout so checkpoint keys map by prefix alone (see `checkpoint.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import SiglipSpec


class SiglipAttention(nn.Module):
    def __init__(self, spec: SiglipSpec):
        super().__init__()
        self.num_heads = spec.num_heads
        self.head_dim = spec.width // spec.num_heads
        self.q_proj = nn.Linear(spec.width, spec.width)
        self.k_proj = nn.Linear(spec.width, spec.width)
        self.v_proj = nn.Linear(spec.width, spec.width)
        self.out_proj = nn.Linear(spec.width, spec.width)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape  # [B, T, W]
        shape = (b, t, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(b, t, -1)
        return self.out_proj(out)


class SiglipMLP(nn.Module):
    def __init__(self, spec: SiglipSpec):
        super().__init__()
        self.fc1 = nn.Linear(spec.width, spec.mlp_dim)
        self.fc2 = nn.Linear(spec.mlp_dim, spec.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, spec: SiglipSpec):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(spec.width, eps=spec.layer_norm_eps)
        self.self_attn = SiglipAttention(spec)
        self.layer_norm2 = nn.LayerNorm(spec.width, eps=spec.layer_norm_eps)
        self.mlp = SiglipMLP(spec)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, spec: SiglipSpec):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, spec.width, kernel_size=spec.patch_size, stride=spec.patch_size)
        self.position_embedding = nn.Embedding(spec.num_tokens, spec.width)

    def forward(self, pixels: Tensor) -> Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))  # [B, W, g, g]
        tokens = patches.flatten(2).transpose(1, 2)  # [B, g*g, W]
        return tokens + self.position_embedding.weight[None]


class SiglipEncoder(nn.Module):
    def __init__(self, spec: SiglipSpec):
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(spec) for _ in range(spec.depth))


class SiglipVision(nn.Module):
    """pixels [B, 3, S, S] in [-1, 1] -> vision tokens [B, (S/14)^2, width]."""

    def __init__(self, spec: SiglipSpec):
        super().__init__()
        self.embeddings = SiglipEmbeddings(spec)
        self.encoder = SiglipEncoder(spec)
        self.post_layernorm = nn.LayerNorm(spec.width, eps=spec.layer_norm_eps)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
