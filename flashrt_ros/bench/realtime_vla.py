"""Dexmal's realtime-vla (v2) pi0.5 Triton backend as a third-party baseline (`--modes realtime-vla`).

Its code is not part of this repository (MIT-licensed, github.com/dexmal/realtime-vla-v2): pass
a checkout with `--realtime-vla PATH` (the folder holding `server/pi05_infer.py`). It is imported
and run as it is; this module only lays our weights out the way its `convert_from_jax_pi05.py`
does from openpi's JAX tree (here from our torch names), gives it the same inputs and noise, and
times its CUDA graph, so that its rows sit next to ours in one `flashrt bench` run.

What it is given: the bench Case's images ([-1, 1], already 224 x 224), the prompt's token
embeddings (all `prompt_len` rows, the valid count in `valid_encoder_len`, as its tokenised
path does) and the noise in bf16. Its graph overwrites the prompt rows (residual stream) and
the noise (Euler state) in place, so a decision re-copies both before the replay, as its
`forward` does; the images stay (so do ours).
"""

from __future__ import annotations

import importlib
import logging
import math
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
from torch import Tensor

from ..policies import cuda_graphs
from ..policies.pi0 import Pi0Model, sinusoidal_time_embedding
from .parity import chunk_parity
from .reference import Case
from .timing import Latency, time_call

log = logging.getLogger(__name__)

# what its pi0.5 backend is built for (dims are written into its kernels)
STEPS = 10
PREFIX_WIDTH, EXPERT_WIDTH, HEAD_DIM = 2048, 1024, 256


def load_backend(repo: Path) -> types.ModuleType:
    """Import `server/pi05_infer.py` from a realtime-vla-v2 checkout.

    It imports `transformers.AutoTokenizer` at module level for its tokenised-prompt path, which
    this benchmark does not take (it passes embeddings): without transformers installed a
    placeholder module stands in for that import only.
    """
    server = Path(repo).expanduser().resolve() / "server"
    if not (server / "pi05_infer.py").is_file() or not (server / "pi0_infer.py").is_file():
        raise FileNotFoundError(
            f"--realtime-vla {repo}: no server/pi05_infer.py and server/pi0_infer.py there "
            "(expected a checkout of github.com/dexmal/realtime-vla-v2)"
        )
    if importlib.util.find_spec("transformers") is None and "transformers" not in sys.modules:
        placeholder = types.ModuleType("transformers")
        placeholder.AutoTokenizer = None  # only its tokenised-prompt path uses it
        sys.modules["transformers"] = placeholder
    sys.path.insert(0, str(server))
    try:
        return importlib.import_module("pi05_infer")
    finally:
        sys.path.remove(str(server))


def rope_pairs(w: Tensor, head_dim: int) -> Tensor:
    """[in, heads * head_dim] with each head's rotate_half halves (HF / openpi) -> the same
    columns with the halves interleaved (d, d + head_dim / 2 side by side), the layout its
    RoPE epilogue expects (`convert_from_jax_pi05.py` does this reshape on the JAX kernels)."""
    i = w.shape[0]
    return w.reshape(i, -1, 2, head_dim // 2).transpose(2, 3).reshape(i, -1)


def _stack(layers, fn) -> Tensor:
    return torch.stack([fn(layer) for layer in layers])


def _t(w: Tensor) -> Tensor:
    """A torch Linear weight [out, in] as a JAX kernel [in, out], in fp32 for the folding."""
    return w.detach().float().t()


@torch.no_grad()
def convert(model: Pi0Model, prompt_embeds: Tensor, dtype: torch.dtype = torch.bfloat16) -> dict[str, Tensor]:
    """Our pi0.5 weights in its layout and names (its build takes bf16; the tests check the
    layout in fp32). Like its converter: the prefix LM's RMSNorm weights (1 + w) folded into the
    q / k / v and gate / up kernels, q and k columns in interleaved RoPE pairs; `prompt_embeds`
    [prompt_len, width] become its `language_embeds`."""
    if model.cfg.kind != "pi05":
        raise ValueError(f"realtime-vla's backend here is its pi0.5 one; got a {model.cfg.kind} model")
    v, lm, ex = model.vision, model.prefix_lm, model.expert
    hd = lm.spec.head_dim
    vl = v.encoder.layers

    def qkv(layer, fold: Tensor | None) -> Tensor:
        a = layer.self_attn
        q, k, val = _t(a.q_proj.weight), _t(a.k_proj.weight), _t(a.v_proj.weight)
        if fold is not None:
            q, k, val = q * fold[:, None], k * fold[:, None], val * fold[:, None]
        return torch.cat([rope_pairs(q, hd), rope_pairs(k, hd), val], dim=1)

    def lm_fold(norm) -> Tensor:
        return 1 + norm.weight.detach().float()

    w = {
        "vision_patch_embedding_w": v.embeddings.patch_embedding.weight.detach().float().permute(2, 3, 1, 0),
        "vision_patch_embedding_b": v.embeddings.patch_embedding.bias,
        "vision_position_embedding": v.embeddings.position_embedding.weight,
        "vision_attn_qkv_w": _stack(
            vl,
            lambda x: torch.cat(
                [_t(x.self_attn.q_proj.weight), _t(x.self_attn.k_proj.weight), _t(x.self_attn.v_proj.weight)], dim=1
            ),
        ),  # fmt: skip
        "vision_attn_qkv_b": _stack(
            vl, lambda x: torch.cat([x.self_attn.q_proj.bias, x.self_attn.k_proj.bias, x.self_attn.v_proj.bias])
        ),
        "vision_attn_o_w": _stack(vl, lambda x: _t(x.self_attn.out_proj.weight)),
        "vision_attn_o_b": _stack(vl, lambda x: x.self_attn.out_proj.bias),
        "vision_ffn_up_w": _stack(vl, lambda x: _t(x.mlp.fc1.weight)),
        "vision_ffn_up_b": _stack(vl, lambda x: x.mlp.fc1.bias),
        "vision_ffn_down_w": _stack(vl, lambda x: _t(x.mlp.fc2.weight)),
        "vision_ffn_down_b": _stack(vl, lambda x: x.mlp.fc2.bias),
        "vision_pre_attn_norm_w": _stack(vl, lambda x: x.layer_norm1.weight),
        "vision_pre_attn_norm_b": _stack(vl, lambda x: x.layer_norm1.bias),
        "vision_pre_ffn_norm_w": _stack(vl, lambda x: x.layer_norm2.weight),
        "vision_pre_ffn_norm_b": _stack(vl, lambda x: x.layer_norm2.bias),
        "vision_final_norm_w": v.post_layernorm.weight,
        "vision_final_norm_b": v.post_layernorm.bias,
        "encoder_multi_modal_projector_w": _t(model.vision_proj.weight),
        "encoder_multi_modal_projector_b": model.vision_proj.bias,
        "encoder_attn_qkv_w": _stack(lm.layers, lambda x: qkv(x, lm_fold(x.input_layernorm))),
        "encoder_attn_o_w": _stack(lm.layers, lambda x: _t(x.self_attn.o_proj.weight)),
        "encoder_ffn_gate_w": _stack(
            lm.layers, lambda x: _t(x.mlp.gate_proj.weight) * lm_fold(x.post_attention_layernorm)[:, None]
        ),
        "encoder_ffn_up_w": _stack(
            lm.layers, lambda x: _t(x.mlp.up_proj.weight) * lm_fold(x.post_attention_layernorm)[:, None]
        ),
        "encoder_ffn_down_w": _stack(lm.layers, lambda x: _t(x.mlp.down_proj.weight)),
        "decoder_time_embeds": time_embeddings(model),
        "decoder_time_mlp_in_w": _t(model.time_mlp_in.weight),
        "decoder_time_mlp_in_b": model.time_mlp_in.bias,
        "decoder_time_mlp_out_w": _t(model.time_mlp_out.weight),
        "decoder_time_mlp_out_b": model.time_mlp_out.bias,
        "decoder_action_in_proj_w": _t(model.action_in_proj.weight),
        "decoder_action_in_proj_b": model.action_in_proj.bias,
        "decoder_pre_attn_norm_mod_w": _stack(ex.layers, lambda x: _t(x.input_layernorm.dense.weight)),
        "decoder_pre_attn_norm_mod_b": _stack(ex.layers, lambda x: x.input_layernorm.dense.bias),
        "decoder_pre_ffn_norm_mod_w": _stack(ex.layers, lambda x: _t(x.post_attention_layernorm.dense.weight)),
        "decoder_pre_ffn_norm_mod_b": _stack(ex.layers, lambda x: x.post_attention_layernorm.dense.bias),
        "decoder_attn_qkv_w": _stack(ex.layers, lambda x: qkv(x, None)),
        "decoder_attn_o_w": _stack(ex.layers, lambda x: _t(x.self_attn.o_proj.weight)),
        "decoder_ffn_gate_w": _stack(ex.layers, lambda x: _t(x.mlp.gate_proj.weight)),
        "decoder_ffn_up_w": _stack(ex.layers, lambda x: _t(x.mlp.up_proj.weight)),
        "decoder_ffn_down_w": _stack(ex.layers, lambda x: _t(x.mlp.down_proj.weight)),
        "decoder_action_out_proj_w": _t(model.action_out_proj.weight),
        "decoder_action_out_proj_b": model.action_out_proj.bias,
        "decoder_final_norm_mod_w": _t(ex.norm.dense.weight),
        "decoder_final_norm_mod_b": ex.norm.dense.bias,
        "language_embeds": prompt_embeds,
    }
    return {k: t.detach().to(dtype).contiguous() for k, t in w.items()}


def revision(repo: Path) -> str:
    """The checkout's commit (git, or a REVISION file written where it was exported)."""
    repo = Path(repo)
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    rev = repo / "REVISION"
    return rev.read_text().strip() if rev.is_file() else "unknown"


def time_embeddings(model: Pi0Model) -> Tensor:
    """[steps, expert width]: the sinusoidal embedding of t = 1, 1 - 1/N, ... (its
    `prepare_adarms_cond`), from our function; its time MLP runs on them at build."""
    cfg = model.cfg
    t = 1.0 - torch.arange(cfg.num_steps, dtype=torch.float64) / cfg.num_steps
    return sinusoidal_time_embedding(t, cfg.expert.width, cfg.min_period, cfg.max_period)


def check_shapes(model: Pi0Model, views: int) -> None:
    """What its kernels are written for, said before anything is built."""
    cfg = model.cfg
    problems = []
    if cfg.kind != "pi05":
        problems.append(f"policy {cfg.kind} (its pi0.5 backend only)")
    if cfg.num_steps != STEPS:
        problems.append(f"{cfg.num_steps} steps (its build hard-codes {STEPS})")
    dims = (cfg.prefix.width, cfg.expert.width, cfg.prefix.head_dim)
    if dims != (PREFIX_WIDTH, EXPERT_WIDTH, HEAD_DIM):
        problems.append(f"widths / head dim {dims} (its kernels: {(PREFIX_WIDTH, EXPERT_WIDTH, HEAD_DIM)})")
    if cfg.action_dim != 32:
        problems.append(f"action dim {cfg.action_dim} (its kernels: 32)")
    keys = views * cfg.vision.num_tokens + cfg.prompt_len + cfg.horizon
    if keys > 1024:
        problems.append(f"{keys} keys (its softmax holds a row of at most 1024)")
    if problems:
        raise ValueError("realtime-vla cannot run this configuration: " + "; ".join(problems))


class RealtimeVla:
    """Its `Pi05Inference` on our weights, with the Case's inputs in its buffers."""

    def __init__(self, backend: types.ModuleType, model: Pi0Model, case: Case):
        check_shapes(model, case.views)
        cfg = model.cfg
        with torch.no_grad():
            self.embeds = model.prefix_lm.embed(case.tokens)[0].to(torch.bfloat16)
        weights = convert(model, self.embeds)
        self.views = case.views
        self.noise = case.noise[0].to(torch.bfloat16)
        self.n_valid = int(case.token_masks[0].sum())
        self.prompt_len = cfg.prompt_len
        t0 = time.perf_counter()
        self.inf = backend.Pi05Inference(weights, case.views, cfg.horizon, discrete_state_input=False)
        self.build_s = time.perf_counter() - t0
        del weights
        b = self.inf.buffers
        b["observation_images_normalized"].copy_(case.pixels[0, : case.views].permute(0, 2, 3, 1))
        start = case.views * cfg.vision.num_tokens
        b["valid_encoder_len"].fill_(start + self.n_valid)
        b["decoder_rope_weights"].copy_(self.inf.get_decoder_rope_weights(self.n_valid))
        self.prompt_rows = b["encoder_x"][start : start + self.prompt_len]
        self._backend = backend
        self.denoise_graph = None

    def decide(self) -> None:
        """One decision as its `forward` runs it: the overwritten inputs back in, the graph."""
        self.prompt_rows.copy_(self.embeds)
        self.inf.buffers["diffusion_noise"].copy_(self.noise)
        self.inf.infer_graph.replay()

    def chunk(self) -> Tensor:
        return self.inf.buffers["diffusion_noise"].float()

    def capture_denoise(self) -> None:
        """Its 10 denoise steps alone (its `transformer_decoder`) as one graph, over the prefix
        K / V the last decision left: its denoise-only row."""

        def run() -> None:
            self.inf.buffers["diffusion_noise"].copy_(self.noise)
            self._backend.transformer_decoder(self.inf.weights, self.inf.buffers, self.inf.encoder_seq_len)

        self.denoise_graph = cuda_graphs.capture(run, self.noise.device)


def measure_realtime_vla(
    repo: Path, model: Pi0Model, case: Case, iters: int, warmup: int, label: str, ref_chunk: Tensor
) -> tuple[dict[str, Latency], dict, float]:
    """Build it on our weights, time its full decision and its denoise alone, check parity."""
    check_shapes(model, case.views)
    backend = load_backend(repo)
    rt = RealtimeVla(backend, model, case)
    log.info("realtime-vla (%s) built and captured in %.1f s", repo, rt.build_s)
    dev = case.noise.device
    rows = {"full": Latency.from_samples(f"{label} full decision", time_call(rt.decide, iters, warmup, dev, label))}
    rt.decide()
    parity = chunk_parity(rt.chunk(), ref_chunk[0], case.noise[0])
    rt.capture_denoise()
    alone = time_call(rt.denoise_graph.replay, iters, warmup, dev, label)
    rows["denoise"] = Latency.from_samples(f"{label} denoise only", alone)
    if not math.isfinite(parity["chunk"]["cosine"]):
        log.warning("realtime-vla's chunk is not finite: its timing rows stand, its parity does not")
    return rows, parity, rt.build_s
