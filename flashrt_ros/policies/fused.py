"""Fused pi0 / pi0.5: the same maths as `pi0.py`, built for one fast decision on a GPU.

What changes against the reference (and why it is exact or where it rounds):
* weights re-laid out once at load: Q|K|V in one matrix, gate|up in one, everything in the
  run dtype (bf16); in the prefix each sub-layer is one cuBLAS GEMM plus one Triton epilogue,
  except the LM's gate|up, one Triton GEMM with the GeGLU in its epilogue (PREFIX_MLP);
* the action expert's pass of a denoise step (all layers + the final norm) is ONE persistent
  launch (`kernels/expert_step.py`; weights stacked over layers) where the suffix fits its
  64-row tile, which is every real pi0 / pi0.5 config; otherwise (`velocity`) the per-op path;
* work that depends only on the denoise time is done once at load for the configured step
  schedule: pi0.5's time MLP and every adaRMS modulation (scale, shift, gate) of every layer;
  pi0's time half of `action_time_mlp_in`;
* the last prefix layer stops after its K/V (its attention/MLP output is never read);
* persistent named buffers (`pixels`, `tokens`, `token_valid`, `state`, `noise`, `prefix_k`,
  `prefix_v`, `actions`): a decision writes inputs into them, replays the captured graphs
  (the prefix stage as vision, then the prefix LM ("language"), so that the host can tokenise
  while vision runs; the denoise stage: all Euler steps) and reads `actions`.
  Inside a replay nothing is allocated, nothing syncs with the host and no Python runs per op;
* shape buckets: present cameras are packed to the front and the prompt is cut to the smallest
  length bucket that holds it, with graphs per view count (vision) and per (view count, bucket),
  so absent cameras and prompt padding cost nothing (exactly: neither is visible to any query
  nor takes a position).
On a CPU the same code runs eagerly (Triton interpreter), which is how CI checks parity.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

from flashrt_ros.kernels._common import is_interpreting
from flashrt_ros.kernels.ada_rms_norm import ada_rms_norm, gated_residual_ada_rms_norm
from flashrt_ros.kernels.attention import attention
from flashrt_ros.kernels.denoise_update import DenoiseUpdate, EulerGuide, guided_velocity_ref
from flashrt_ros.kernels.euler import euler_step
from flashrt_ros.kernels.expert_step import (
    UPDATE_MAX_ACTIONS,
    ExpertStepPlan,
    ExpertWeights,
    rope_table,
    unpair_columns,
)
from flashrt_ros.kernels.fp8 import E4M3, quantize_rows, quantize_rows_kernel
from flashrt_ros.kernels.gate_up_geglu import gate_up_geglu, interleave_block, interleave_gate_up
from flashrt_ros.kernels.geglu import geglu
from flashrt_ros.kernels.gelu import bias_gelu
from flashrt_ros.kernels.layer_norm import layer_norm
from flashrt_ros.kernels.linear_f32 import linear_f32
from flashrt_ros.kernels.packed_attention import packed_attention
from flashrt_ros.kernels.prefix_attention import prefix_attention, supports_prefix_attention
from flashrt_ros.kernels.preprocess import preprocess_image
from flashrt_ros.kernels.rms_norm import rms_norm
from flashrt_ros.kernels.rope import qkv_rope, rope_inv_freq

from . import cuda_graphs
from .config import PolicyConfig
from .guidance import ChunkGuide, step_table
from .host_staging import CopyGuard, PackedInputs, PinnedBuffers
from .pi0 import Pi0Model, sinusoidal_time_embedding, suffix_blocks

log = logging.getLogger(__name__)

# SigLIP's attention (per view 256 tokens, 16 heads of dim 72), backends in this order: on the H200
# cuDNN 10.6 us per layer (3 views, its workspace memset included), flash 12.4, memory-efficient 17.5
# (bench/attention.py, docs/results/attention_20261129_211334.json)
VISION_SDPA = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# "triton": kernels/packed_attention.py, read straight from the QKV GEMM's output and written in
# the O GEMM's layout; "sdpa": torch's SDPA with the backends above. The captured vision stage
# (H200, 3 views): 2.013 vs 2.064 ms, lower in each of 5 alternating rounds (bench/fused_ab.py)
VISION_ATTENTION = "triton"
# its launch, "BMxBN,wWARPS,sSTAGES", or None for the kernel's default (kernels/packed_attention.py)
VISION_ATTENTION_TILES: str | None = None
VISIBLE, MASKED = -(2**30), 2**30  # key block ids: seen by every query / by none (kernels/attention.py)
# Row norms' warps (None: the kernels' width default). Alone, fewer warps measured faster (SigLIP
# LayerNorm 2 warps 2.93 vs 3.23 us, prefix RMSNorm 4 warps 3.58 vs 3.77; bench/row_norms.py), but
# inside the captured stages the vision stage was ~10 us slower with 2 and the prefix's 4 tied
# (bench/fused_ab.py, docs/results/fused_ab_20261129_222332.json)
VISION_NORM_WARPS: int | None = None
PREFIX_NORM_WARPS: int | None = None
# SigLIP's O and fc2 GEMMs without their bias epilogue, the bias added by the LayerNorm after each
# (kernels/layer_norm.py `x_bias`): a GEMM with a bias goes to cuBLASLt, whose kernel for fc2
# (768 x 4304 -> 1152) took 20.7 us against 16.1 for cuBLAS's plain GEMM (bench/gemm_shapes.py).
# The captured vision stage (H200, pi0.5, 3 views; bench/fused_ab.py, 7 alternating rounds):
# 1.882 vs 2.058 ms, lower in every round (docs/results/fused_ab_vision_bias_67eea7e.log)
VISION_BIAS_IN_NORM = True
# The prefix LM's attention launch, "BMxBN,wWARPS,sSTAGES,kSPLITS" (e.g. "128x32,w8,s3,k2"), or None
# for the kernel's heuristic (on the H200 at 3 views: 128 x 64 tiles, 8 warps, 2 stages, 2 key
# splits; 92 us per prefix faster in place than 64 x 32 on 4 warps, 3 stages, no split, which is
# "64x32,w4,s3,k1"; bench/fused_ab.py A/Bs candidates in the captured stage)
PREFIX_ATTENTION_TILES: str | None = None
# The prefix LM's attention kernel: "tma" (kernels/prefix_attention.py: 64-row tiles on TMA
# descriptors, no key split; sm_90+, one K/V head of dim <= 256, else "split") or "split"
# (kernels/attention.py with the launch above: 128-row tiles, key splits + combine). H200, 3 views:
# 24.9 vs 32.6 us + a 4.2 us combine per layer alone (bench/attention.py); the captured prefix
# stage 8.134 vs 8.254 ms (bench/fused_ab.py, 7 alternating rounds)
PREFIX_ATTENTION = "tma"
# The prefix LM's gate|up GEMM + GeGLU: "triton" (one GEMM with the GeGLU in its epilogue,
# kernels/gate_up_geglu.py; sm_90+, else cuBLAS) or "cublas" (cuBLAS GEMM, then kernels/geglu.py).
# H200: 183.5 vs 199.7 us per layer alone (968 rows, cold weights, bench/gate_up_geglu.py), the
# captured prefix stage 8.247 vs 8.342 ms (bench/fused_ab.py, 5 alternating rounds, noisy)
PREFIX_MLP = "triton"
# With prefix_mlp_fp8, the prefix layers from this one on run their gate|up in FP8; the first ones
# stay bf16: layer 0 reads the raw embeddings (vision tokens, scaled prompt embeddings), and its FP8
# error was most of the chunk's. pi0, 3 views, random weights, simulated (bench/fp8_sim.py's
# rounding): FP8 in every layer cosine 0.99884, layers 1-16 0.99952, layers 0-8 0.99872, 9-17 0.99998
PREFIX_MLP_FP8_FROM = 1
# With prefix_mlp_fp8, the prefix layers from this one on (and from PREFIX_MLP_FP8_FROM) also run
# their down projection in FP8: the GeGLU output quantised per row (kernels/fp8.py), then
# cuBLASLt's row-scaled FP8 GEMM (torch._scaled_mm, where this torch and GPU have it); None: bf16.
# H200, pi0.5, 3 views (bench/fp8_prefix_ab.py, 7 alternating rounds): prefix stage 6.499 vs 6.832
# ms for gate|up alone, chunk cosine 0.999456 vs 0.999679 (pi0: 5.948 vs 6.200 ms, 0.999349 vs
# 0.999372); from layer 9: 6.684 ms, 0.999669
PREFIX_DOWN_FP8_FROM: int | None = 1


def _attention_tiles(spec: str | None, name: str = "PREFIX_ATTENTION_TILES", splits: bool = True) -> dict[str, int]:
    """ "128x32,w8,s3,k2" -> attention launch keywords (without ",kSPLITS" where `splits` is
    False: the packed vision kernel has none); None -> {} (the kernel's default)."""
    if spec is None:
        return {}
    keys = dict(w="num_warps", s="num_stages", k="num_splits") if splits else dict(w="num_warps", s="num_stages")
    try:
        tile, *rest = spec.split(",")
        bm, bn = (int(t) for t in tile.split("x"))
        out = {keys[p[0]]: int(p[1:]) for p in rest}
        if len(rest) != len(keys) or len(out) != len(keys):
            raise ValueError
    except (ValueError, KeyError, IndexError) as err:
        want = (
            "BMxBN,wWARPS,sSTAGES,kSPLITS, e.g. 128x32,w8,s3,k2"
            if splits
            else "BMxBN,wWARPS,sSTAGES, e.g. 64x128,w4,s2"
        )
        raise ValueError(f"{name} {spec!r}: expected {want}") from err
    return dict(block_m=bm, block_n=bn, **out)


def check_settings() -> None:
    """Raise a ValueError naming the first invalid module setting (the attention settings are
    read at capture: `capture` checks them before recording anything)."""
    if VISION_ATTENTION not in ("triton", "sdpa"):
        raise ValueError(f"VISION_ATTENTION {VISION_ATTENTION!r}: expected 'triton' or 'sdpa'")
    if PREFIX_ATTENTION not in ("tma", "split"):
        raise ValueError(f"PREFIX_ATTENTION {PREFIX_ATTENTION!r}: expected 'tma' or 'split'")
    if PREFIX_MLP not in ("triton", "cublas"):
        raise ValueError(f"PREFIX_MLP {PREFIX_MLP!r}: expected 'triton' or 'cublas'")
    _attention_tiles(VISION_ATTENTION_TILES, "VISION_ATTENTION_TILES", splits=False)
    _attention_tiles(PREFIX_ATTENTION_TILES)


@dataclass
class GemmaW:
    """One decoder layer, re-laid out: x @ qkv.T -> [q | k | v]; x @ gate_up.T -> [gate | up]."""

    qkv: Tensor
    o: Tensor
    gate_up: Tensor
    down: Tensor
    norm_in: Tensor | None  # RMSNorm weights (None where adaRMS modulations are used)
    norm_post: Tensor | None
    gate_up_scale: Tensor | None = None  # row scales where gate_up is held in FP8 (kernels/fp8.py)
    down_scale: Tensor | None = None  # the same for down


@dataclass
class SiglipW:
    ln1: tuple[Tensor, Tensor]
    qkv: tuple[Tensor, Tensor]
    out: tuple[Tensor, Tensor]
    ln2: tuple[Tensor, Tensor]
    fc1: tuple[Tensor, Tensor]
    fc2: tuple[Tensor, Tensor]


def _gemma(layer, dtype) -> GemmaW:
    a, m = layer.self_attn, layer.mlp
    cat = lambda *ws: torch.cat([w.weight.detach() for w in ws]).to(dtype).contiguous()  # noqa: E731
    norm = lambda n: n.weight.detach().float().contiguous() if hasattr(n, "weight") else None  # noqa: E731
    return GemmaW(
        qkv=cat(a.q_proj, a.k_proj, a.v_proj),
        o=cat(a.o_proj),
        gate_up=cat(m.gate_proj, m.up_proj),
        down=cat(m.down_proj),
        norm_in=norm(layer.input_layernorm),
        norm_post=norm(layer.post_attention_layernorm),
    )


def _siglip(layer, dtype) -> SiglipW:
    wb = lambda mod: (mod.weight.detach().to(dtype).contiguous(), mod.bias.detach().to(dtype).contiguous())  # noqa: E731
    a = layer.self_attn
    qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach().to(dtype).contiguous()
    qkv_b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach().to(dtype).contiguous()
    return SiglipW(
        wb(layer.layer_norm1),
        (qkv_w, qkv_b),
        wb(a.out_proj),
        wb(layer.layer_norm2),
        wb(layer.mlp.fc1),
        wb(layer.mlp.fc2),
    )


def _linear_before_norm(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """x @ weight.T for a LayerNorm to read: with VISION_BIAS_IN_NORM the GEMM runs without its
    bias, returned for the norm to add; else the bias is in the GEMM's epilogue (None returned)."""
    if VISION_BIAS_IN_NORM:
        return x @ weight.t(), bias
    return F.linear(x, weight, bias), None


def _linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """SigLIP's fc1: GEMM + bias + GELU(tanh). On CUDA one cuBLASLt GEMM with its GELU-bias
    epilogue (its GELU is the tanh form, applied in fp32 before rounding; saves a pass over the
    768 x 4304 activation per layer); elsewhere the GEMM + the Triton epilogue (the CPU
    `_addmm_activation` uses the erf GELU, not SigLIP's)."""
    if x.is_cuda:
        return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
    return bias_gelu(F.linear(x, weight), bias)


def require_kernel_device(device: torch.device) -> None:
    """The fused path's Triton kernels run on a CUDA device, or on the CPU only under Triton's
    interpreter. Elsewhere it would build (and a pipeline then release the reference weights)
    while every launch fails ("0 active drivers"): refuse before anything is built."""
    if device.type == "cuda" or (device.type == "cpu" and is_interpreting()):
        return
    raise RuntimeError(
        f"the fused path needs a CUDA device (or, on a CPU, the Triton interpreter: TRITON_INTERPRET=1); "
        f"the model is on {device}: use backend 'reference' (or 'auto') there"
    )


class FusedPi0:
    """A Pi0Model compiled into re-laid-out weights, static buffers and (on CUDA) graphs of its stages."""

    def __init__(
        self,
        model: Pi0Model,
        dtype: torch.dtype = torch.bfloat16,
        prompt_buckets: tuple[int, ...] = (64, 128),
        prefix_mlp_fp8: bool = False,
        guided: bool = False,
    ):
        """guided: every Euler step corrected towards a previous chunk (real-time chunking,
        policies/guidance.py; `set_guide` sets it before a decision, none: weights of zero, the
        plain step). Off, the denoise graphs are the unguided ones.

        prefix_mlp_fp8: the prefix LM's MLP GEMMs in FP8 (e4m3 weights and inputs, one scale
        per row): gate|up from layer PREFIX_MLP_FP8_FROM on, down from PREFIX_DOWN_FP8_FROM; bf16
        runs only, where the fused gate|up kernel runs (else a warning and bf16). H200, 3 views:
        gate|up 107 vs 179 us per layer, down 55 vs 88: a speed / accuracy trade the deployment
        opts into (the chunk's cosine vs the fp32 reference drops from ~0.99999 to ~0.9995;
        docs/results/README.md)."""
        require_kernel_device(next(model.parameters()).device)
        cfg: PolicyConfig = model.cfg
        if cfg.prefix.num_kv_heads != 1:  # pi0 / pi0.5's Gemma: one; the build went on and every decision failed
            raise ValueError(
                f"the fused path's K/V cache holds one KV head, the model has {cfg.prefix.num_kv_heads}; "
                "expected backend 'reference' for it"
            )
        self.cfg, self.dtype, self.guided = cfg, dtype, guided
        # Prompt-length buckets: a decision runs the smallest one that holds its prompt, so a short
        # prompt does not pay for 200 padded tokens. Each bucket has its own pair of graphs.
        self.buckets = sorted({b for b in prompt_buckets if 0 < b < cfg.prompt_len} | {cfg.prompt_len})
        self.bucket = cfg.prompt_len
        # Views in the current decision's prefix: present cameras are packed to the front and only
        # they run, with graphs per view count (see set_images).
        self.views = cfg.num_views
        # frames set so far (set_images / set_frames / set_pixels), and (that count, views) when the
        # vision stage last ran: the language stage reads its image tokens, which must be of these
        self.frames_serial = 0
        self._vision_of: tuple[int, int] | None = None
        # (views, bucket) of the prefix in the K/V cache: the denoise reads that layout, which new
        # inputs (set_images / set_inputs) do not change until the prefix runs again
        self.cached: tuple[int, int] | None = None
        # prefix stages that wrote the K/V cache (each call of `language`, each replay of its graph):
        # a holder of the cache's key checks that none ran since it stored it (engine/prefix_cache.py)
        self.prefix_serial = 0
        dev = self.device = next(model.parameters()).device
        f32 = lambda t: t.detach().float().contiguous()  # noqa: E731
        with torch.no_grad():
            v = model.vision
            conv = v.embeddings.patch_embedding
            self._patch_embedding(conv, v.embeddings.position_embedding.weight.detach())
            self.vision_layers = [_siglip(layer, dtype) for layer in v.encoder.layers]
            self.post_ln = (v.post_layernorm.weight.detach().to(dtype), v.post_layernorm.bias.detach().to(dtype))
            self.proj = (model.vision_proj.weight.detach().to(dtype), model.vision_proj.bias.detach().to(dtype))
            self.embed = model.prefix_lm.embed_tokens.weight.detach().to(dtype)
            self.embed_scale = float(torch.tensor(math.sqrt(cfg.prefix.width), dtype=dtype))
            self.prefix_layers = [_gemma(layer, dtype) for layer in model.prefix_lm.layers]
            # the prefix's gate|up rows interleaved in blocks (kernels/gate_up_geglu.py) where its
            # fused GEMM can run: both PREFIX_MLP paths read that layout (0: plain [gate; up])
            self.mlp_block = interleave_block(cfg.prefix.mlp_dim, dev)
            for w in self.prefix_layers if self.mlp_block else ():
                w.gate_up = interleave_gate_up(w.gate_up, self.mlp_block)
            self.prefix_mlp_fp8 = self._use_fp8(prefix_mlp_fp8)
            self._quantize_prefix_mlp()
            self.expert_layers = [_gemma(layer, dtype) for layer in model.expert.layers]
            self.final_norm = f32(model.expert.norm.weight) if not cfg.uses_adarms else None
            self.action_in = (f32(model.action_in_proj.weight), f32(model.action_in_proj.bias))
            self.action_out = (f32(model.action_out_proj.weight), f32(model.action_out_proj.bias))
            self._precompute_time(model)
        self._allocate(dev)
        self.inv_freq = rope_inv_freq(cfg.prefix.head_dim, cfg.rope_base, dev)  # before any capture
        # ("vision", views), ("language" | "denoise", views, bucket) -> the stage's graph
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    # ---- load-time work ----------------------------------------------------------------------
    def _quantize_prefix_mlp(self) -> None:
        """With prefix_mlp_fp8: the MLP weights of the layers that run FP8 to row-scaled e4m3.
        The last layer never runs its MLP (only its K/V are read), so it is left as it is."""
        if not self.prefix_mlp_fp8:
            return
        runs = range(PREFIX_MLP_FP8_FROM, len(self.prefix_layers) - 1)
        if not runs:
            log.warning("prefix_mlp_fp8: no prefix layer from %d runs an MLP: all stay bf16", PREFIX_MLP_FP8_FROM)
            self.prefix_mlp_fp8 = False
            return
        down_from = self._fp8_down_from()
        for i in runs:
            w = self.prefix_layers[i]
            w.gate_up, w.gate_up_scale = quantize_rows(w.gate_up)
            if down_from is not None and i >= down_from:
                w.down, w.down_scale = quantize_rows(w.down)

    def _fp8_down_from(self) -> int | None:
        """The first prefix layer whose down projection runs in FP8 (None: none): needs
        prefix_mlp_fp8 and torch._scaled_mm with row scales on this device (a small probe; where
        it fails, a warning and bf16 down projections)."""
        if not self.prefix_mlp_fp8 or PREFIX_DOWN_FP8_FROM is None:
            return None
        try:  # row scales of 1..16 on a product whose exact value is known
            ones = torch.ones(16, 16, device=self.device)
            scale = torch.arange(1.0, 17.0, device=self.device)
            got = torch._scaled_mm(
                ones.to(E4M3), ones.to(E4M3).t(), scale_a=scale[:, None], scale_b=scale[None, :],
                out_dtype=torch.bfloat16,
            )  # fmt: skip
            if not torch.equal(got.float(), 16 * scale[:, None] * scale[None, :]):
                raise RuntimeError("wrong product with row scales")
        except Exception as err:  # whatever this torch / GPU lacks: bf16 down projections
            log.warning("FP8 down projection unavailable here (torch._scaled_mm: %s): it stays bf16", err)
            return None
        return max(PREFIX_DOWN_FP8_FROM, PREFIX_MLP_FP8_FROM)

    def _use_fp8(self, wanted: bool) -> bool:
        """Whether the prefix MLP runs in FP8: asked for, in a bf16 run, and where the
        fused gate|up kernel runs (sm_90+ or the interpreter) with PREFIX_MLP "triton"."""
        if not wanted:
            return False
        if self.dtype != torch.bfloat16:
            raise ValueError(f"prefix_mlp_fp8 needs a bfloat16 run, got {self.dtype} (FP8 replaces bf16 GEMM operands)")
        spec = self.cfg.prefix
        if not self._prefix_mlp_fused() or spec.width % 16 or spec.mlp_dim % 16:
            log.warning(
                "prefix_mlp_fp8 asked for, but the fused gate|up kernel does not run here (%s, PREFIX_MLP %r, "
                "width %d and MLP width %d, FP8 rows need multiples of 16): the prefix MLP stays bf16",
                self.device,
                PREFIX_MLP,
                spec.width,
                spec.mlp_dim,
            )
            return False
        return True

    def _patch_embedding(self, conv: torch.nn.Conv2d, pos: Tensor) -> None:
        """SigLIP's stride-p patch conv as one GEMM over unfolded patches: one copy + one cuBLAS
        call instead of a cuDNN conv, two layout transposes and an add (~90 us for 3 views on the
        H200). The conv bias + position embedding (`patch_pos`) are added by the first
        LayerNorm's fused residual add (one bf16 rounding more than addmm's added input, which cost
        a 2 us copy first). K (3 p^2 = 588) is zero-padded to a multiple of 8 for aligned bf16 rows."""
        width, k = conv.weight.shape[0], conv.weight[0].numel()
        k_pad = -(-k // 8) * 8
        w = torch.zeros(width, k_pad, dtype=self.dtype, device=conv.weight.device)
        w[:, :k] = conv.weight.detach().reshape(width, k)
        self.patch_w = w
        self.patch_pos = (pos.float() + conv.bias.detach().float()).to(self.dtype).repeat(self.cfg.num_views, 1)
        self.patches = torch.zeros(self.patch_pos.shape[0], k_pad, dtype=self.dtype, device=w.device)

    def _precompute_time(self, model: Pi0Model) -> None:
        """Everything that depends only on t, for t = 1, 1 - 1/N, ..., 1/N."""
        cfg, n = self.cfg, self.cfg.num_steps
        t = torch.tensor([1.0 + i * (-1.0 / n) for i in range(n)], device=self.device)
        if cfg.uses_adarms:
            cond = model.time_condition(t)  # [N, We]
            layers = model.expert.layers
            mods = [
                [
                    torch.cat(layer.input_layernorm.modulation(cond), -1)[:, 0],
                    torch.cat(layer.post_attention_layernorm.modulation(cond), -1)[:, 0],
                ]
                for layer in layers
            ]
            self.mod = torch.stack([torch.stack(m, 1) for m in mods], 1).float().contiguous()  # [N, L, 2, 3We]
            self.mod_final = torch.cat(model.expert.norm.modulation(cond), -1)[:, 0].float().contiguous()
        else:
            we = cfg.expert.width
            temb = sinusoidal_time_embedding(t, we, cfg.min_period, cfg.max_period)  # [N, We]
            w = model.action_time_mlp_in.weight.detach().float()
            at_in_action = w[:, :we]
            time_bias = temb @ w[:, we:].T + model.action_time_mlp_in.bias.float()  # [N, We]
            # action_in folded into the MLP's first layer (equal up to fp32 rounding): its hidden
            # layer is silu(x @ at_hidden.T + at_hidden_bias[step]), straight from the actions
            w_in, b_in = self.action_in
            self.at_hidden = (at_in_action @ w_in).contiguous()  # [We, A]
            self.at_hidden_bias = (time_bias + at_in_action @ b_in).contiguous()  # [N, We]
            self.at_out = (model.action_time_mlp_out.weight.detach().float(), model.action_time_mlp_out.bias.float())
            self.state_proj = (model.state_proj.weight.detach().float(), model.state_proj.bias.detach().float())

    def _expert_weights(self) -> ExpertWeights:
        """The expert stacked over layers for the step kernel; the per-layer GemmaW tensors
        become views of the stacks, so the weights are held once."""
        cfg, we, n = self.cfg, self.cfg.expert.width, self.cfg.num_steps
        stacks = {}
        for name in ("qkv", "o", "gate_up", "down"):
            stacks[name] = torch.stack([getattr(w, name) for w in self.expert_layers])
            for i, w in enumerate(self.expert_layers):
                setattr(w, name, stacks[name][i])
        if cfg.uses_adarms:
            scale, shift, gate = self.mod.split(we, dim=-1)  # [N, L, 2, We] each
            final_scale, final_shift, _ = self.mod_final.split(we, dim=-1)
            c = lambda t: t.contiguous()  # noqa: E731
            norms = (c(1 + scale[:, :, 0]), c(shift[:, :, 0]), c(gate[:, :, 0]))
            norms += (c(1 + scale[:, :, 1]), c(shift[:, :, 1]), c(gate[:, :, 1]), c(1 + final_scale), c(final_shift))
        else:
            per_step = lambda ts: torch.stack([torch.stack(ts)] * n).contiguous()  # noqa: E731
            attn = per_step([1 + w.norm_in for w in self.expert_layers])
            mlp = per_step([1 + w.norm_post for w in self.expert_layers])
            norms = (attn, None, None, mlp, None, None, torch.stack([1 + self.final_norm] * n), None)
        # qkv's rotate_half pairs side by side and gate|up interleaved, for the kernel's one-MMA
        # tiles; the per-layer views follow the new layouts (`velocity` reads them through
        # `expert_qkv_block` / `expert_gu_block`), so the old stacks are freed
        laid = self.step_plan.lay_out(
            ExpertWeights(stacks["qkv"], stacks["o"], stacks["gate_up"], stacks["down"], *norms)
        )
        for i, w in enumerate(self.expert_layers):
            w.qkv, w.gate_up = laid.qkv[i], laid.gate_up[i]
        self.expert_qkv_block, self.expert_gu_block = laid.qkv_block, laid.gu_block
        return laid

    def _allocate(self, dev: torch.device) -> None:
        cfg = self.cfg
        s, p, hd = cfg.vision.image_size, cfg.prefix_len, cfg.prefix.head_dim
        sl = cfg.suffix_len
        self.pixels = torch.full((cfg.num_views, 3, s, s), -1.0, dtype=self.dtype, device=dev)
        self.view_valid = torch.ones(cfg.num_views, dtype=torch.bool, device=dev)
        # tokens, their mask and the state: views of one device buffer that one copy fills (host_staging.py)
        self._inputs = PackedInputs(
            {
                "tokens": ((cfg.prompt_len,), torch.long),
                "token_valid": ((cfg.prompt_len,), torch.bool),
                "state": ((cfg.state_dim,), torch.float32),
            },
            dev,
        )
        self.tokens, self.token_valid, self.state = (self._inputs.device[n] for n in ("tokens", "token_valid", "state"))
        self.noise = torch.zeros(cfg.horizon, cfg.action_dim, dtype=torch.float32, device=dev)
        self.actions = torch.zeros(cfg.horizon, cfg.action_dim, dtype=torch.float32, device=dev)
        # real-time chunking's guide (guided): target and weights, views of one buffer that one
        # queued copy fills; (t, c) per Euler step, written by the first guide and again only when
        # beta changes (until then the weights are zero and the table unread)
        self._guide = torch.zeros(2, cfg.horizon, cfg.action_dim, dtype=torch.float32, device=dev)
        self.guide_target, self.guide_weights = self._guide[0], self._guide[1]
        self._guide_beta: float | None = None
        self.guide_tc = torch.zeros(cfg.num_steps, 2, dtype=torch.float32, device=dev)
        self._guide_host = PinnedBuffers(dev)
        self.prefix_emb = torch.zeros(p, cfg.prefix.width, dtype=self.dtype, device=dev)
        self.prefix_k = torch.zeros(cfg.prefix.depth, p + sl, hd, dtype=self.dtype, device=dev)
        self.prefix_v = torch.zeros_like(self.prefix_k)
        self.key_blocks = torch.zeros(p + sl, dtype=torch.int32, device=dev)
        self.suffix_pos = torch.zeros(sl, dtype=torch.long, device=dev)
        # cos / sin of the suffix's RoPE angles for the step kernel (rope_table), once per decision
        self.suffix_rope = torch.zeros(2, sl, cfg.expert.head_dim // 2, dtype=torch.float32, device=dev)
        self.suffix_state = torch.zeros(1, cfg.expert.width, dtype=torch.float32, device=dev)
        self.suffix_in = torch.zeros(sl, cfg.expert.width, dtype=self.dtype, device=dev)  # expert input rows
        self.at_u = torch.zeros(cfg.horizon, cfg.expert.width, dtype=torch.float32, device=dev)  # pi0's MLP hidden
        self.query_blocks = suffix_blocks(cfg, dev).to(torch.int32).contiguous()
        self._suffix_arange = torch.arange(sl, device=dev)
        # the host's noise (where it is not drawn on the device) and the chunk through page-locked buffers
        self._noise_host, self._actions_host = PinnedBuffers(dev), PinnedBuffers(dev)
        self._frames_dev: dict[int, Tensor] = {}  # the frames on the GPU, per run of same-size views
        # the last frames and the guard of their copies: kept referenced until those are done
        self._frames_copied, self._frames_held = CopyGuard(dev), []
        # the expert's pass of a step as one persistent launch (kernels/expert_step.py), where it fits
        e = cfg.expert
        self.step_plan = None
        # the expert's qkv / gate|up layouts (kernels/expert_step.pair_halves, kernels/gate_up_geglu.py; 0: plain)
        self.expert_qkv_block, self.expert_gu_block = 0, 0
        try:
            if cfg.action_dim > UPDATE_MAX_ACTIONS:
                limit = UPDATE_MAX_ACTIONS
                raise ValueError(f"its denoise tail holds {limit} action dims, the policy has {cfg.action_dim}")
            self.step_plan = ExpertStepPlan(
                sl, e.width, e.mlp_dim, e.num_heads, e.head_dim, cfg.num_steps, dev, self.dtype
            )
        except ValueError as err:
            log.warning("expert step kernel not used (%s): the expert runs as separate kernels", err)
        if self.step_plan is not None:
            if self.step_plan.att_two_pass:  # its attention workspace, before any capture
                self.step_plan.reserve_keys(self.prefix_k.shape[1])
            self.expert_weights = self._expert_weights()
            log.info("%s", self.step_plan.describe())

    def buffers(self) -> dict[str, Tensor]:
        """The named static buffers a decision reads and writes (capsules do not hold them yet:
        they hold the pipeline's generator, chunk counter and last chunk)."""
        names = (
            "pixels",
            "view_valid",
            "tokens",
            "token_valid",
            "state",
            "noise",
            "actions",
            "prefix_k",
            "prefix_v",
            "key_blocks",
            "suffix_pos",
            "suffix_rope",
            "suffix_state",
        )
        names += ("guide_target", "guide_weights", "guide_tc") if self.guided else ()
        return {n: getattr(self, n) for n in names}

    # ---- inputs ------------------------------------------------------------------------------
    def set_images(self, images: list[Tensor | None]) -> None:
        """uint8 HxWx3 frames (on the device) -> `pixels` via the preprocess kernel; None = absent.

        Present views are packed to the front and the decision runs only them (the graphs of
        that view count). Exact: an absent view's tokens are masked out of attention and take no
        position (positions count valid tokens), and the prefix attends bidirectionally, so
        neither their presence nor the order of the present views changes the result."""
        present = [img for img in images if img is not None]
        self._check_present(present, len(images))
        for j, img in enumerate(present):
            preprocess_image(img, self.cfg.vision.image_size, out=self.pixels[j])
        self._set_views(len(present))

    def set_frames(self, frames: list[np.ndarray | None]) -> None:
        """uint8 HxWx3 frames on the host (None = absent) -> `pixels`, as `set_images`: each run of
        consecutive present frames of one size is copied into one GPU buffer kept for that size
        and pre-processed in one launch (per-frame launches cost ~0.1-0.2 ms of host time each on
        the H100 hosts). A frame in page-locked memory (engine/frame_pool.py) is copied by a
        queued copy; one in pageable memory is staged by the driver first, which holds this
        thread. The frames stay referenced until their copies are done (the next call waits for
        them), so that a pool does not hand their memory out again under a queued copy."""
        self._frames_copied.wait()
        self._frames_held = []
        present = [f for f in frames if f is not None]
        self._check_present(present, len(frames))
        wrong = [f"{f.dtype}" for f in present if f.dtype != np.uint8]
        if wrong:
            raise ValueError(f"frames must be uint8 (0..255), got {', '.join(wrong)}")
        try:
            start = 0
            for run in _same_shape_runs(present):
                shape = (len(run), *run[0].shape)
                dev = self._frames_dev.get(start)
                if dev is None or tuple(dev.shape) != shape:
                    dev = self._frames_dev[start] = torch.empty(shape, dtype=torch.uint8, device=self.device)
                for i, frame in enumerate(run):  # (contiguous: as it is; a flipped view cannot be a tensor)
                    dev[i].copy_(torch.from_numpy(np.ascontiguousarray(frame)), non_blocking=True)
                preprocess_image(dev, self.cfg.vision.image_size, out=self.pixels[start : start + len(run)])
                start += len(run)
        finally:  # also after a failure: copies may have been queued from these frames
            self._frames_copied.issued()
            self._frames_held = present
        self._set_views(len(present))

    def _check_present(self, present: list, given: int) -> None:
        """One entry per view at most (None: absent), each HxWx3 or HxWx4 (RGB, or RGBA whose
        fourth channel the kernel skips; the Pipeline takes HxWx3 only, as the reference does)."""
        if given > self.pixels.shape[0]:  # as the reference refuses: a view the model has no slot for
            raise ValueError(f"{given} views given (None for an absent one); this path holds {self.pixels.shape[0]}")
        shapes = [tuple(f.shape) for f in present if f.ndim != 3 or f.shape[2] not in (3, 4)]
        if shapes:
            raise ValueError(f"frames must be HxWx3 (RGB) or HxWx4 (RGBA), got shape {shapes[0]}")

    def set_pixels(self, pixels: Tensor, valid: list[bool]) -> None:
        """Pre-processed pixels [V, 3, S, S] and which views are present (host bools), packed
        like `set_images`. Shapes are checked first: a copy would broadcast a [1, S, S] view."""
        want = tuple(self.pixels.shape[1:])
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != want or len(valid) != pixels.shape[0]:
            raise ValueError(
                f"pixels {tuple(pixels.shape)} with {len(valid)} valid flags; expected "
                f"[V, {', '.join(map(str, want))}] with one flag per view"
            )
        present = [i for i, ok in enumerate(valid) if ok]
        if len(present) > self.pixels.shape[0]:
            raise ValueError(f"{len(present)} views present; this path holds {self.pixels.shape[0]}")
        for j, i in enumerate(present):
            self.pixels[j].copy_(pixels[i])
        self._set_views(len(present))

    def _set_views(self, n: int) -> None:
        self.frames_serial += 1
        if n == 0:  # no camera at all: one masked view keeps the shapes; the prompt alone conditions
            self.pixels[0].fill_(-1.0)
            self.view_valid[0] = False
            self.views = 1
        else:
            self.view_valid[:n] = True
            self.views = n

    def set_inputs(self, tokens: Tensor, token_valid: Tensor, state: Tensor, noise: Tensor) -> None:
        """Copy a decision's inputs in and pick its prompt bucket (host tensors: no device sync).
        Shapes are checked first: a copy would broadcast a [A] noise row over the whole chunk."""
        want = {
            "tokens": (tuple(tokens.shape), tuple(self.tokens.shape)),
            "token_valid": (tuple(token_valid.shape), tuple(self.token_valid.shape)),
            "noise": (tuple(noise.shape), tuple(self.noise.shape)),
        }
        wrong = [f"{name} {got} (expected {shape})" for name, (got, shape) in want.items() if got != shape]
        if state.dim() != 1 or state.shape[0] > self.state.shape[0]:
            wrong.append(f"state {tuple(state.shape)} (expected a vector of at most {self.state.shape[0]} values)")
        if wrong:
            raise ValueError("fused path inputs of the wrong shape: " + ", ".join(wrong))
        valid = np.flatnonzero(_host_array(token_valid))
        used = int(valid[-1]) + 1 if valid.size else 1
        self.bucket = next(b for b in self.buckets if b >= used)
        host = self._inputs.host()  # numpy views of the page-locked twin
        host["tokens"][:] = _host_array(tokens)
        host["token_valid"][:] = _host_array(token_valid)
        host["state"][:] = 0.0
        host["state"][: state.shape[-1]] = _host_array(state)
        self._inputs.upload()
        if noise.device == self.device:
            self.noise.copy_(noise)
        else:
            staged = self._noise_host.get("noise", tuple(self.noise.shape), self.noise.dtype)
            staged.copy_(noise)
            self._noise_host.copy(self.noise, staged)
            self._noise_host.issued()

    def set_guide(self, guide: ChunkGuide | None) -> None:
        """The previous chunk the next denoise is guided towards (host or device tensors; queued
        copies), or None: weights of zero, which the guided step turns into the plain one."""
        if not self.guided:
            if guide is None:
                return
            raise ValueError("this fused path was built without guidance (FusedPi0(guided=True))")
        if guide is None:
            self.guide_weights.zero_()
            return
        if guide.jacobian != "identity":
            raise ValueError(
                f"the fused path guides with the identity Jacobian; jacobian {guide.jacobian!r} needs the reference "
                "backend (autograd through the expert)"
            )
        want = tuple(self.guide_target.shape)
        if tuple(guide.target.shape) != want:
            raise ValueError(f"guide of shape {tuple(guide.target.shape)}, expected {list(want)} (horizon, action_dim)")
        # the graphs read the step table: rewritten in place, through a page-locked buffer (a copy
        # from pageable memory would wait here for the vision graph queued before it)
        new_beta, on_host = guide.max_guidance != self._guide_beta, guide.target.device.type == "cpu"
        table = self._guide_host.get("tc", tuple(self.guide_tc.shape), torch.float32) if new_beta else None
        staged = self._guide_host.get("guide", tuple(self._guide.shape), torch.float32) if on_host else None
        if table is not None:  # (each get waits for the copies queued from the group before)
            table.copy_(step_table(self.cfg.num_steps, guide.max_guidance))
            self._guide_host.copy(self.guide_tc, table)
            self._guide_beta = guide.max_guidance
        if staged is None:
            self.guide_target.copy_(guide.target)
            self.guide_weights.copy_(guide.weights)
        else:
            host = staged.numpy()
            host[0], host[1] = guide.target.cpu().numpy(), guide.weights.cpu().numpy()
            self._guide_host.copy(self._guide, staged)
        if new_beta or on_host:
            self._guide_host.issued()

    def _euler_guide(self, step: int) -> EulerGuide | None:
        return EulerGuide(self.guide_target, self.guide_weights, self.guide_tc[step]) if self.guided else None

    def actions_to_host(self) -> Tensor:
        """The chunk [H, A] fp32 on the host, the caller's own copy: queued into a page-locked
        buffer and waited for (the decision's one host sync)."""
        host = self._actions_host.get("actions", tuple(self.actions.shape), self.actions.dtype)
        self._actions_host.copy(host, self.actions)
        self._actions_host.issued()
        self._actions_host.wait()
        return host.clone()

    # ---- stages ------------------------------------------------------------------------------
    @property
    def prefix_rows(self) -> int:
        """Prefix tokens of the current inputs' shape bucket: the present views' image tokens +
        the prompt bucket (what the next prefix stage builds)."""
        return self.views * self.cfg.vision.num_tokens + self.bucket

    @property
    def cached_shape(self) -> tuple[int, int]:
        """(views, bucket) of the prefix in the K/V cache, which the denoise reads."""
        if self.cached is None:
            raise RuntimeError("the denoise needs a prefix in the K/V cache: run the prefix stage first")
        return self.cached

    @property
    def cached_rows(self) -> int:
        """Prefix tokens in the K/V cache (what the denoise attends to): the shape the last prefix
        stage ran at, which a denoise on the cached prefix keeps after new inputs arrive."""
        views, bucket = self.cached_shape
        return views * self.cfg.vision.num_tokens + bucket

    def vision(self, out: Tensor | None = None) -> Tensor:
        """pixels of the current views [v, 3, S, S] -> projected vision tokens [v*N, Wp] (into
        `out` if given: the prefix stage writes them straight into `prefix_emb`)."""
        spec, v = self.cfg.vision, self.views
        heads, hd, n = spec.num_heads, spec.width // spec.num_heads, spec.num_tokens
        g, p = spec.image_size // spec.patch_size, spec.patch_size
        patches = self.patches[: v * n]
        unfolded = self.pixels[:v].view(v, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5)  # [v, gy, gx, c, py, px]
        patches[:, : 3 * p * p].view(v, g, g, 3, p, p).copy_(unfolded)
        # the patch conv; its bias + the position embedding join as the first LayerNorm's residual
        mlp_out, h = patches @ self.patch_w.t(), self.patch_pos[: v * n]
        eps, nw = spec.layer_norm_eps, VISION_NORM_WARPS
        check_settings()
        tiles = _attention_tiles(VISION_ATTENTION_TILES, "VISION_ATTENTION_TILES", splits=False)
        mlp_bias = None  # the bias of the GEMM before each LayerNorm, where the norm adds it
        for w in self.vision_layers:
            y, h = layer_norm(mlp_out, *w.ln1, eps=eps, residual=h, num_warps=nw, x_bias=mlp_bias)
            a = self._vision_attention(F.linear(y, *w.qkv), v, n, heads, hd, tiles)
            o, o_bias = _linear_before_norm(a, *w.out)
            y, h = layer_norm(o, *w.ln2, eps=eps, residual=h, num_warps=nw, x_bias=o_bias)
            mlp_out, mlp_bias = _linear_before_norm(_linear_gelu_tanh(y, *w.fc1), *w.fc2)
        y, _ = layer_norm(mlp_out, *self.post_ln, eps=eps, residual=h, num_warps=nw, x_bias=mlp_bias)
        weight, bias = self.proj
        return torch.addmm(bias, y, weight.t(), out=out)

    @staticmethod
    def _vision_attention(qkv: Tensor, v: int, n: int, heads: int, hd: int, tiles: dict[str, int]) -> Tensor:
        """SigLIP's attention per view: qkv [v*n, 3*heads*hd] -> [v*n, heads*hd] (`tiles`: the
        packed kernel's launch keywords)."""
        if VISION_ATTENTION == "triton":
            return packed_attention(qkv, heads, n, **tiles)
        q, k, val = qkv.view(v, n, 3, heads, hd).permute(2, 0, 3, 1, 4)
        with sdpa_kernel(VISION_SDPA, set_priority=True):
            a = F.scaled_dot_product_attention(q, k, val)
        return a.transpose(1, 2).reshape(v * n, -1)

    def prefix(self) -> None:
        """Vision + prompt -> prefix_k / prefix_v of every layer (+ the suffix's positions): the
        vision stage, then the language stage."""
        self.vision_stage()
        self.language()

    def vision_stage(self) -> None:
        """The current views' pixels -> their rows of `prefix_emb` (the image tokens). It reads
        no prompt token, so it can run while the host still tokenises the prompt
        (engine/pipeline.py); nothing but the next `language` reads what it writes."""
        self.vision(out=self.prefix_emb[: self.views * self.cfg.vision.num_tokens])
        self._vision_of = (self.frames_serial, self.views)

    def _check_vision_ran(self) -> None:
        """The language stage on image tokens of other frames, or of another view count (rows of
        an earlier decision's, or rows no vision wrote) would build a wrong prefix without an error."""
        if self._vision_of != (self.frames_serial, self.views):
            ran = "never ran" if self._vision_of is None else f"last ran on earlier ones (views: {self._vision_of[1]})"
            raise RuntimeError(
                f"the language stage needs the vision stage on the current frames (views: {self.views}); it {ran}: "
                "run 'vision' first, or 'prefix'"
            )

    def language(self) -> None:
        """Image tokens (from `vision_stage`) + prompt -> prefix_k / prefix_v of every layer (+ the
        suffix's positions).

        Only the first `self.bucket` prompt tokens are used: the rest are padding (right-padded
        prompts), which no query may see, so leaving them out changes nothing."""
        self._check_vision_ran()
        self.prefix_serial += 1  # first: a prefix that fails half-way is not the one counted before
        cfg, b = self.cfg, self.bucket
        p = self.prefix_rows
        n_img = p - b
        prompt = torch.index_select(self.embed, 0, self.tokens[:b], out=self.prefix_emb[n_img:p])
        prompt.mul_(self.embed_scale)  # the same bf16 product as embedding(...) * scale
        valid = torch.cat(
            [self.view_valid[: self.views].repeat_interleave(cfg.vision.num_tokens), self.token_valid[:b]]
        )
        positions = valid.long().cumsum(0) - 1
        self.key_blocks[:p] = torch.where(valid, VISIBLE, MASKED).to(torch.int32)
        self.key_blocks[p : p + cfg.suffix_len] = self.query_blocks
        self.suffix_pos.copy_(valid.sum() + self._suffix_arange)
        if self.step_plan is not None:
            rope_table(self.suffix_pos, self.inv_freq, out=self.suffix_rope)
        self._decoder(self.prefix_layers, self.prefix_emb[:p], positions, cfg.prefix, rows=slice(0, p))
        self.cached = (self.views, b)

    def _decoder(self, layers: list[GemmaW], h: Tensor, positions: Tensor, spec, rows: slice) -> None:
        """The prefix LM: bidirectional over valid prefix tokens; keeps K/V, drops the last output."""
        mlp_out = None
        kb = self.key_blocks[rows]
        eps, nw, tiles = self.cfg.rms_norm_eps, PREFIX_NORM_WARPS, _attention_tiles(PREFIX_ATTENTION_TILES)
        for i, w in enumerate(layers):
            if mlp_out is None:
                x = rms_norm(h, w.norm_in, eps, num_warps=nw)
            else:
                x, h = rms_norm(mlp_out, w.norm_in, eps, residual=h, num_warps=nw)
            if i == len(layers) - 1:  # only this layer's K/V are ever read: no queries
                self._qkv_into_cache(i, x, w, positions, spec, rows, kv_only=True)
                return
            q = self._qkv_into_cache(i, x, w, positions, spec, rows)
            if self._prefix_attention_tma():
                a = prefix_attention(q, self.prefix_k[i, rows], self.prefix_v[i, rows], kb)
            else:
                a = attention(q, self.prefix_k[i, rows], self.prefix_v[i, rows], key_blocks=kb, **tiles)
            o = F.linear(a.view(a.shape[0], -1), w.o)
            mlp_out, h = self._prefix_mlp(o, h, w)

    def _prefix_mlp(self, o: Tensor, h: Tensor, w: GemmaW) -> tuple[Tensor, Tensor]:
        """h + o -> the new residual h, normed, through the MLP: (MLP output, new h)."""
        eps, nw = self.cfg.rms_norm_eps, PREFIX_NORM_WARPS
        if w.gate_up_scale is not None:  # FP8: the norm writes e4m3 rows + their scales
            x = torch.empty(o.shape, dtype=E4M3, device=o.device)
            scale = o.new_empty(o.shape[0], dtype=torch.float32)
            _, h = rms_norm(o, w.norm_post, eps, residual=h, num_warps=nw, out=x, out_scale=scale)
            act = gate_up_geglu(x, w.gate_up, self.mlp_block, x_scale=scale, w_scale=w.gate_up_scale)
            if w.down_scale is not None:
                aq, a_scale = quantize_rows_kernel(act)
                down = torch._scaled_mm(
                    aq, w.down.t(), scale_a=a_scale[:, None], scale_b=w.down_scale[None, :], out_dtype=o.dtype
                )
                return down, h
        else:
            x, h = rms_norm(o, w.norm_post, eps, residual=h, num_warps=nw)
            if self._prefix_mlp_fused():
                act = gate_up_geglu(x, w.gate_up, self.mlp_block)
            else:
                act = geglu(F.linear(x, w.gate_up), interleave=self.mlp_block)
        return F.linear(act, w.down), h

    def _prefix_attention_tma(self) -> bool:
        """Whether the prefix LM's attention runs on kernels/prefix_attention.py (PREFIX_ATTENTION,
        where it can: sm_90+ with room for its tiles at this dtype, or the interpreter; one K/V head,
        head dim a power of two <= 256)."""
        spec = self.cfg.prefix
        return (
            PREFIX_ATTENTION == "tma"
            and spec.num_kv_heads == 1
            and supports_prefix_attention(self.device, self.dtype, spec.head_dim)
        )

    def _prefix_mlp_fused(self) -> bool:
        """Whether the prefix LM's gate|up GEMM carries the GeGLU (PREFIX_MLP, where it can run)."""
        return PREFIX_MLP == "triton" and self.mlp_block > 0

    def _qkv_into_cache(
        self,
        layer: int,
        x: Tensor,
        w: GemmaW,
        positions: Tensor,
        spec,
        rows: slice,
        kv_only: bool = False,
        pairs: int = 0,
    ) -> Tensor:
        """One QKV GEMM + the RoPE epilogue: roped K and V land in rows `rows` of this layer's
        cache (the prefix's rows in the prefix stage, the suffix's in `velocity`); returns q.
        kv_only: the GEMM over the K|V rows of the weight only (q empty): the prefix's last layer,
        ~17.8 us of GEMM at 3 views for 2560 columns of which 512 are read; 7.5 us for the 512.
        pairs: the block of a qkv weight laid out by `pair_halves` (the expert's, for the step
        kernel): the GEMM's columns are put back in head order first."""
        heads = 0 if kv_only else spec.num_heads
        y = F.linear(x, w.qkv[spec.num_heads * spec.head_dim :] if kv_only else w.qkv)
        if pairs:
            y = unpair_columns(y, spec.head_dim, pairs)
        q, _, _ = qkv_rope(
            y,
            positions,
            heads,
            spec.head_dim,
            spec.num_kv_heads,
            k_out=self.prefix_k[layer, rows],
            v_out=self.prefix_v[layer, rows],
            inv_freq=self.inv_freq,
        )
        return q

    def denoise(self) -> None:
        """All Euler steps over the cached prefix: noise -> actions (in place). pi0's state token
        is made here, from this decision's state: a denoise on a re-used prefix takes its own."""
        cfg = self.cfg
        if not cfg.uses_adarms:
            self.suffix_state.copy_(F.linear(self.state, *self.state_proj))
        x = self.actions
        x.copy_(self.noise)
        dt = -1.0 / cfg.num_steps
        if self.step_plan is None:
            for step in range(cfg.num_steps):
                v = self.velocity(step, x)
                if self.guided:  # as the kernels' guided Euler step
                    t, c = self.guide_tc[step, 0], self.guide_tc[step, 1]
                    v = guided_velocity_ref(v, x, self.guide_target, self.guide_weights, t, c)
                euler_step(x, v, dt)
            return
        # one launch per step: the step kernel, ending with velocity + Euler step + the next
        # input's first part (pi0.5's action_in(x), written straight into the input rows; pi0's
        # time-MLP hidden layer, whose output projection (linear_f32) fills the rows after the
        # state token)
        self.step_plan.barriers.zero_()
        h, adarms = self.suffix_in, cfg.uses_adarms
        for step in range(cfg.num_steps):
            if step == 0 and adarms:
                linear_f32(x, *self.action_in, out=h)
            elif step == 0:
                h.copy_(self._suffix_input(0, x))
            elif not adarms:  # the state token, then the MLP's output (the step kernel overwrote both)
                h[:1].copy_(self.suffix_state)
                linear_f32(self.at_u, *self.at_out, out=h[1:])
            if step + 1 == cfg.num_steps:
                nxt = ()
            elif adarms:
                nxt = (*self.action_in, h)
            else:
                nxt = (self.at_hidden, self.at_hidden_bias[step + 1], self.at_u)
            update = DenoiseUpdate(x, *self.action_out, dt, *nxt, silu=not adarms, guide=self._euler_guide(step))
            self.expert_pass(step, h, update)

    def _suffix_input(self, step: int, x: Tensor) -> Tensor:
        """Noisy actions (and pi0's state token) -> the expert's input rows [S, We] in the run dtype."""
        if self.cfg.uses_adarms:
            return F.linear(x, *self.action_in).to(self.dtype)
        at = F.linear(F.silu(F.linear(x, self.at_hidden, self.at_hidden_bias[step])), *self.at_out)
        return torch.cat([self.suffix_state, at]).to(self.dtype)

    def expert_pass(self, step: int, h: Tensor, update: DenoiseUpdate | None = None) -> Tensor:
        """The expert's whole pass on its input rows `h` (updated in place) as one persistent
        launch (kernels/expert_step.py), optionally ending with the denoise `update`; returns
        the final norm's output [S, We]."""
        cfg = self.cfg
        p = self.cached_rows
        keys = slice(0, p + cfg.suffix_len)
        return self.step_plan.step(
            h, self.expert_weights, step, self.prefix_k[:, keys], self.prefix_v[:, keys], self.key_blocks[keys],
            self.query_blocks, self.suffix_rope, p, step, cfg.rms_norm_eps, update=update,
        )  # fmt: skip

    def velocity(self, step: int, x: Tensor) -> Tensor:
        """The expert as separate kernels (cuBLAS GEMMs + Triton norms / RoPE / attention /
        GeGLU): the path for suffixes the step kernel does not hold (more than 64 tokens)."""
        cfg, spec = self.cfg, self.cfg.expert
        h = self._suffix_input(step, x)
        p = self.cached_rows
        own, seen = slice(p, p + cfg.suffix_len), slice(0, p + cfg.suffix_len)  # suffix rows; all keys
        mlp_out, gate = None, None
        for i, w in enumerate(self.expert_layers):
            x_n, h, gate_in = self._norm(step, i, 0, h, mlp_out, gate, w.norm_in)
            q = self._qkv_into_cache(i, x_n, w, self.suffix_pos, spec, own, pairs=self.expert_qkv_block)
            a = attention(
                q,
                self.prefix_k[i, seen],
                self.prefix_v[i, seen],
                key_blocks=self.key_blocks[seen],
                query_blocks=self.query_blocks,
            )
            x_n, h, gate = self._norm(step, i, 1, h, F.linear(a.view(a.shape[0], -1), w.o), gate_in, w.norm_post)
            mlp_out = F.linear(geglu(F.linear(x_n, w.gate_up), interleave=self.expert_gu_block), w.down)
        y, _, _ = self._norm(step, None, 0, h, mlp_out, gate, self.final_norm)
        return F.linear(y[-cfg.horizon :].float(), *self.action_out)

    def _norm(
        self,
        step: int,
        layer: int | None,
        which: int,
        h: Tensor,
        branch: Tensor | None,
        gate: Tensor | None,
        weight: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """h (+ branch * gate) -> normed x; returns (x, new h, this norm's gate for its branch)."""
        eps = self.cfg.rms_norm_eps
        if not self.cfg.uses_adarms:
            if branch is None:
                return rms_norm(h, weight, eps), h, None
            x, h = rms_norm(branch, weight, eps, residual=h)
            return x, h, None
        mod = self.mod_final[step] if layer is None else self.mod[step, layer, which]
        width = h.shape[-1]
        if branch is None:
            return ada_rms_norm(h, mod, eps), h, mod[2 * width :]
        x, h = gated_residual_ada_rms_norm(h, branch, gate, mod, eps)
        return x, h, mod[2 * width :]

    def describe(self) -> str:
        """What runs in each stage (for the log on the robot)."""
        cuda = self.device.type == "cuda"
        fc1 = "fc1 + GELU in the cuBLASLt epilogue" if cuda else "fc1 GEMM + Triton bias_gelu"
        gemm = "cuBLAS" if cuda else "torch"
        if self.step_plan is not None:
            expert = f"{self.step_plan.describe()}, ending with the denoise update (velocity + Euler step"
            expert += " + next input)" if self.cfg.uses_adarms else " + time-MLP hidden layer), then linear_f32"
        else:
            expert = f"the expert as separate kernels ({gemm} GEMMs + Triton norms / RoPE / attention / GeGLU)"
        expert += "; the Euler step guided (real-time chunking)" if self.guided else ""
        views = f"views 1..{self.cfg.num_views}"
        graphs = f"CUDA graphs: vision per {views}, language and denoise per ({views}, prompt bucket {self.buckets})"
        graphs = graphs if cuda else "no graphs (CPU)"
        vision_attn = "Triton packed attention" if VISION_ATTENTION == "triton" else "torch SDPA (cuDNN first)"
        mlp = "gate|up GEMM with the GeGLU epilogue (Triton)" if self._prefix_mlp_fused() else f"{gemm} gate|up + geglu"
        if self.prefix_mlp_fp8:  # what was built, read from the weights
            first = next(i for i, w in enumerate(self.prefix_layers) if w.gate_up_scale is not None)
            down = next((i for i, w in enumerate(self.prefix_layers) if w.down_scale is not None), None)
            mlp = f"from layer {first} an FP8 (e4m3, row scales) " + mlp
            mlp += f", FP8 down (cuBLASLt) from layer {down}" if down is not None else ", bf16 down"
        prefix_attn = "attention (TMA, no key split)" if self._prefix_attention_tma() else "attention"
        if VISION_ATTENTION == "triton" and VISION_ATTENTION_TILES:
            vision_attn += f" at {VISION_ATTENTION_TILES}"
        if VISION_BIAS_IN_NORM:
            fc1 += "; O / fc2 biases added by the LayerNorm after them"
        return (
            f"vision: patch-embedding GEMM, {len(self.vision_layers)} SigLIP layers (Triton LayerNorm, {gemm}, "
            f"{vision_attn}, {fc1}); prefix LM: {len(self.prefix_layers)} layers ({gemm} GEMMs, Triton rms_norm / "
            f"qkv_rope / {prefix_attn}, {mlp}); denoise x{self.cfg.num_steps}: {expert}; {graphs}"
        )

    # ---- graphs ------------------------------------------------------------------------------
    def capture(self, warmup: int = 2) -> None:
        """Record the vision stage of every view count and the language and denoise stages of
        every (view count, prompt bucket) as CUDA graphs (after a warm-up that compiles the
        kernels); the graphs share one memory pool (they replay one after another, and each
        writes its results into the static buffers only)."""
        check_settings()
        if self.device.type != "cuda":
            return
        chosen = self.views, self.bucket
        pool = torch.cuda.graph_pool_handle()
        shapes = [(v, b) for v in range(1, self.cfg.num_views + 1) for b in self.buckets]
        self.graphs = {}  # none of an earlier capture's pool stays
        self._compile_frame_kernel()
        try:
            for views, bucket in tqdm(shapes, desc="capturing CUDA graphs", disable=len(shapes) < 4, leave=False):
                self.views, self.bucket = views, bucket
                cuda_graphs.warm_up(lambda: (self.prefix(), self.denoise()), self.device, warmup)
                stages = (("language", self.language), ("denoise", self.denoise))
                if ("vision", views) not in self.graphs:  # one per view count
                    stages = (("vision", self.vision_stage), *stages)
                for name, fn in stages:
                    key = ("vision", views) if name == "vision" else (name, views, bucket)
                    self.graphs[key] = cuda_graphs.capture(fn, self.device, pool=pool, warmup=0)
        finally:  # also after a failed capture: the inputs' shape back, and no claim on the K/V
            self.views, self.bucket = chosen
            self.cached = None  # the cache holds the warm-ups' last shape, not a prefix of these inputs
        log.info(
            "captured CUDA graphs: vision for views 1..%d, language + denoise for views 1..%d x prompt buckets %s",
            self.cfg.num_views,
            self.cfg.num_views,
            self.buckets,
        )

    def _compile_frame_kernel(self) -> None:
        """The frame pre-processing kernel runs outside the graphs, so no warm-up compiles it: the
        first decision would (~0.6 s with Triton's cache empty). One tiny frame compiles the
        variant every camera size uses (kernels/preprocess.py), written into a buffer laid out as
        one view's pixels (the variant depends on the output's layout), not into the inputs."""
        frame = torch.zeros((1, 2, 2, 3), dtype=torch.uint8, device=self.device)
        preprocess_image(frame, self.cfg.vision.image_size, out=torch.empty_like(self.pixels[:1]))

    def run(self, stage: str) -> None:
        """One stage, from its graph where one was captured: `vision` at the current inputs' view
        count, `language` at their shape, `prefix` (the two), `denoise` at the shape of the
        prefix in the cache."""
        if stage == "prefix":
            self.run("vision")
            self.run("language")
            return
        if stage == "vision":
            key = ("vision", self.views)
        elif stage == "language":
            key = ("language", self.views, self.bucket)
        elif stage == "denoise":
            key = ("denoise", *self.cached_shape)
        else:
            raise ValueError(f"unknown stage {stage!r}; expected 'vision', 'language', 'prefix' or 'denoise'")
        graph = self.graphs.get(key)
        if graph is None:
            {"vision": self.vision_stage, "language": self.language, "denoise": self.denoise}[stage]()
            return
        if stage == "language":  # a replay runs no Python: check, count and record what the graph builds
            self._check_vision_ran()
            self.prefix_serial += 1
        graph.replay()
        if stage == "vision":
            self._vision_of = (self.frames_serial, self.views)
        elif stage == "language":
            self.cached = key[1:]

    def sample_actions(self, noise: Tensor | None = None) -> Tensor:
        """Prefix + denoise on the current inputs; returns the `actions` buffer [H, A] fp32."""
        if noise is not None:
            self.noise.copy_(noise)
        self.run("prefix")
        self.run("denoise")
        return self.actions


def _same_shape_runs(frames: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Consecutive frames of one shape, in order (the views keep their order in `pixels`)."""
    runs: list[list[np.ndarray]] = []
    for frame in frames:
        if runs and runs[-1][0].shape == frame.shape:
            runs[-1].append(frame)
        else:
            runs.append([frame])
    return runs


def _host_array(t: Tensor) -> np.ndarray:
    """A tensor's values as a host numpy array (a view for a CPU tensor numpy can read; bf16 and
    fp8, which it cannot, as fp32)."""
    t = t.detach().cpu()
    try:
        return t.numpy()
    except TypeError:
        return t.float().numpy()
