"""Dexmal's realtime-vla (v2) Triton backends as a third-party baseline (`--modes realtime-vla`).

Its code is not part of this repository (MIT-licensed, github.com/dexmal/realtime-vla-v2): pass
a checkout with `--realtime-vla PATH` (the folder holding `server/pi05_infer.py` and
`server/pi0_infer.py`). They are imported and run as they are; this module only lays our weights
out the way its converters lay out openpi's (`convert_from_jax_pi05.py`; here from our torch
names), gives it the same inputs and noise, and times its CUDA graph, so that its rows sit next
to ours in one `flashrt bench` run.

What it is given: the bench Case's images ([-1, 1], already 224 x 224), the prompt's token
embeddings, the state (pi0) and the noise, in bf16. Its graph overwrites the noise (the Euler
state) and, for pi0.5, the prompt rows (residual stream) in place, so a decision re-copies them
before the replay, as its `forward` does; the images stay (so do ours).
"""

from __future__ import annotations

import importlib
import importlib.util
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
from ..policies.config import PolicyConfig
from ..policies.pi0 import Pi0Model, sinusoidal_time_embedding
from .parity import chunk_parity
from .reference import Case
from .timing import Latency, time_call

log = logging.getLogger(__name__)

# its backend module per policy, and what they are built for (dims are written into its kernels)
MODULES = {"pi05": "pi05_infer", "pi0": "pi0_infer"}
STEPS = 10
PREFIX_WIDTH, EXPERT_WIDTH, HEAD_DIM = 2048, 1024, 256


def server_dir(repo: Path) -> Path:
    """The checkout's `server/` with both backend modules, or a FileNotFoundError that says so
    (the CLI asks before building anything)."""
    server = Path(repo).expanduser().resolve() / "server"
    if not all((server / f"{name}.py").is_file() for name in MODULES.values()):
        raise FileNotFoundError(
            f"--realtime-vla {repo}: no server/pi05_infer.py and server/pi0_infer.py there "
            "(expected a checkout of github.com/dexmal/realtime-vla-v2: scripts/fetch_realtime_vla.sh)"
        )
    return server


def load_backend(repo: Path, module: str = "pi05_infer") -> types.ModuleType:
    """Import `server/<module>.py` (pi05_infer, pi0_infer) from a realtime-vla-v2 checkout.

    It imports `transformers.AutoTokenizer` at module level for its tokenised-prompt path, which
    this benchmark does not take (it passes embeddings): without transformers installed a
    placeholder module stands in for that import only.
    """
    server = server_dir(repo)
    placeholder = None
    if "transformers" not in sys.modules and importlib.util.find_spec("transformers") is None:
        placeholder = types.ModuleType("transformers")
        placeholder.AutoTokenizer = None  # only its tokenised-prompt path uses it
        sys.modules["transformers"] = placeholder
    sys.path.insert(0, str(server))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(server))
        if placeholder is not None:  # its module keeps its own reference; nobody else sees it
            del sys.modules["transformers"]


def rope_pairs(w: Tensor, head_dim: int) -> Tensor:
    """[in, heads * head_dim] with each head's rotate_half halves (HF / openpi) -> the same
    columns with the halves interleaved (d, d + head_dim / 2 side by side), the layout its
    RoPE epilogue expects (`convert_from_jax_pi05.py` does this reshape on the JAX kernels)."""
    i = w.shape[0]
    return w.reshape(i, -1, 2, head_dim // 2).transpose(2, 3).reshape(i, -1)


def _stack(layers, fn, dtype: torch.dtype) -> Tensor:
    """[layers, ...]: fn per layer, each cast as it is made (the fp32 folding of a whole 2B-param
    stack at once would hold ~8 GB)."""
    return torch.stack([fn(layer).to(dtype) for layer in layers])


def _t(w: Tensor) -> Tensor:
    """A torch Linear weight [out, in] as a JAX kernel [in, out], in fp32 for the folding."""
    return w.detach().float().t()


def _qkv(layer, fold: Tensor | None) -> Tensor:
    """One layer's q | k | v kernel [in, (H + 2) D]: q and k in RoPE pairs, the norm folded in."""
    a, hd = layer.self_attn, layer.self_attn.spec.head_dim
    q, k, v = _t(a.q_proj.weight), _t(a.k_proj.weight), _t(a.v_proj.weight)
    if fold is not None:
        q, k, v = q * fold[:, None], k * fold[:, None], v * fold[:, None]
    return torch.cat([rope_pairs(q, hd), rope_pairs(k, hd), v], dim=1)


def _fold(norm) -> Tensor:
    """A Gemma RMSNorm's (1 + w), which its kernels take folded into the next kernel's rows."""
    return 1 + norm.weight.detach().float()


def _gemma_layers(layers, prefix: str, fold: bool, dtype: torch.dtype) -> dict[str, Tensor]:
    """A Gemma stack's per-layer kernels under its names (`encoder_` / `decoder_`); with `fold`
    the layer's RMSNorm weights are folded into q / k / v and gate / up (plain RMSNorm layers)."""

    def mlp_in(proj: str):
        return lambda x: _t(getattr(x.mlp, proj).weight) * (_fold(x.post_attention_layernorm)[:, None] if fold else 1)

    return {
        f"{prefix}_attn_qkv_w": _stack(layers, lambda x: _qkv(x, _fold(x.input_layernorm) if fold else None), dtype),
        f"{prefix}_attn_o_w": _stack(layers, lambda x: _t(x.self_attn.o_proj.weight), dtype),
        f"{prefix}_ffn_gate_w": _stack(layers, mlp_in("gate_proj"), dtype),
        f"{prefix}_ffn_up_w": _stack(layers, mlp_in("up_proj"), dtype),
        f"{prefix}_ffn_down_w": _stack(layers, lambda x: _t(x.mlp.down_proj.weight), dtype),
    }


def _vision(model: Pi0Model, dtype: torch.dtype) -> dict[str, Tensor]:
    """SigLIP and the projector: [in, out] kernels, q | k | v side by side, a HWC patch kernel."""
    v = model.vision
    vl = v.encoder.layers

    def qkv(x) -> Tensor:
        a = x.self_attn
        return torch.cat([_t(a.q_proj.weight), _t(a.k_proj.weight), _t(a.v_proj.weight)], dim=1)

    def qkv_bias(x) -> Tensor:
        a = x.self_attn
        return torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])

    per_layer = {
        "attn_qkv_w": qkv,
        "attn_qkv_b": qkv_bias,
        "attn_o_w": lambda x: _t(x.self_attn.out_proj.weight),
        "attn_o_b": lambda x: x.self_attn.out_proj.bias,
        "ffn_up_w": lambda x: _t(x.mlp.fc1.weight),
        "ffn_up_b": lambda x: x.mlp.fc1.bias,
        "ffn_down_w": lambda x: _t(x.mlp.fc2.weight),
        "ffn_down_b": lambda x: x.mlp.fc2.bias,
        "pre_attn_norm_w": lambda x: x.layer_norm1.weight,
        "pre_attn_norm_b": lambda x: x.layer_norm1.bias,
        "pre_ffn_norm_w": lambda x: x.layer_norm2.weight,
        "pre_ffn_norm_b": lambda x: x.layer_norm2.bias,
    }
    return {
        "vision_patch_embedding_w": v.embeddings.patch_embedding.weight.detach().float().permute(2, 3, 1, 0),
        "vision_patch_embedding_b": v.embeddings.patch_embedding.bias,
        "vision_position_embedding": v.embeddings.position_embedding.weight,
        **{f"vision_{name}": _stack(vl, fn, dtype) for name, fn in per_layer.items()},
        "vision_final_norm_w": v.post_layernorm.weight,
        "vision_final_norm_b": v.post_layernorm.bias,
        "encoder_multi_modal_projector_w": _t(model.vision_proj.weight),
        "encoder_multi_modal_projector_b": model.vision_proj.bias,
    }


def _expert_pi05(model: Pi0Model, dtype: torch.dtype) -> dict[str, Tensor]:
    """pi0.5's expert: adaRMS modulation kernels as they are (its build runs the time MLP and
    the modulations per step, and scales the action output by -1 / steps itself)."""
    ex = model.expert
    return {
        **_gemma_layers(ex.layers, "decoder", fold=False, dtype=dtype),
        "decoder_pre_attn_norm_mod_w": _stack(ex.layers, lambda x: _t(x.input_layernorm.dense.weight), dtype),
        "decoder_pre_attn_norm_mod_b": _stack(ex.layers, lambda x: x.input_layernorm.dense.bias, dtype),
        "decoder_pre_ffn_norm_mod_w": _stack(ex.layers, lambda x: _t(x.post_attention_layernorm.dense.weight), dtype),
        "decoder_pre_ffn_norm_mod_b": _stack(ex.layers, lambda x: x.post_attention_layernorm.dense.bias, dtype),
        "decoder_final_norm_mod_w": _t(ex.norm.dense.weight),
        "decoder_final_norm_mod_b": ex.norm.dense.bias,
        "decoder_time_embeds": time_embeddings(model),
        "decoder_time_mlp_in_w": _t(model.time_mlp_in.weight),
        "decoder_time_mlp_in_b": model.time_mlp_in.bias,
        "decoder_time_mlp_out_w": _t(model.time_mlp_out.weight),
        "decoder_time_mlp_out_b": model.time_mlp_out.bias,
        "decoder_action_in_proj_w": _t(model.action_in_proj.weight),
        "decoder_action_in_proj_b": model.action_in_proj.bias,
        "decoder_action_out_proj_w": _t(model.action_out_proj.weight),
        "decoder_action_out_proj_b": model.action_out_proj.bias,
    }


def _expert_pi0(model: Pi0Model, dtype: torch.dtype) -> dict[str, Tensor]:
    """pi0's expert as its build takes it: norms folded like the prefix LM's; action_in_proj
    composed with the action half of action_time_mlp_in, and that layer's time half (with both
    biases) precomputed per step as `time_biases`; the final norm and the Euler step's
    dt = -1 / steps folded into the action output."""
    ex, width = model.expert, model.cfg.expert.width
    w_in = model.action_time_mlp_in.weight.detach().float()  # [width, 2 width]: (actions | time) in
    w_act, w_time = w_in[:, :width], w_in[:, width:]
    a = model.action_in_proj
    fused_bias = model.action_time_mlp_in.bias.float() + a.bias.float() @ w_act.t()
    dt = -1.0 / model.cfg.num_steps
    return {
        **_gemma_layers(ex.layers, "decoder", fold=True, dtype=dtype),
        "decoder_state_in_proj_w": _t(model.state_proj.weight),
        "decoder_state_in_proj_b": model.state_proj.bias,
        "decoder_action_fused_in_proj_w": (w_act @ a.weight.float()).t(),
        "decoder_action_fused_time_biases": fused_bias + time_embeddings(model).to(w_time.device) @ w_time.t(),
        "decoder_action_mlp_w": _t(model.action_time_mlp_out.weight),
        "decoder_action_mlp_b": model.action_time_mlp_out.bias,
        "decoder_action_fused_out_proj_w": _t(model.action_out_proj.weight) * _fold(ex.norm)[:, None] * dt,
        "decoder_action_fused_out_proj_b": model.action_out_proj.bias.float() * dt,
    }


@torch.no_grad()
def convert(model: Pi0Model, prompt_embeds: Tensor, dtype: torch.dtype = torch.bfloat16) -> dict[str, Tensor]:
    """Our weights in its layout and names (its build takes bf16; the tests check the layout in
    fp32), as its converters lay out openpi's: Gemma RMSNorm weights (1 + w) folded into the
    kernels after them, q and k columns in interleaved RoPE pairs, [in, out] kernels;
    `prompt_embeds` [tokens, width] become its `language_embeds`."""
    expert = {"pi05": _expert_pi05, "pi0": _expert_pi0}[model.cfg.kind]
    w = {
        **_vision(model, dtype),
        **_gemma_layers(model.prefix_lm.layers, "encoder", fold=True, dtype=dtype),
        **expert(model, dtype),
        "language_embeds": prompt_embeds,
    }
    return {k: t.detach().to(dtype).contiguous() for k, t in w.items()}


def revision(repo: Path) -> str:
    """The checkout's commit: its own git (only where it has a .git: inside another checkout, git
    would answer with that one's HEAD), else the REVISION file written where it was exported."""
    repo = Path(repo).expanduser()  # as server_dir reads it
    if (repo / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            )
            if out.returncode == 0:
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    rev = repo / "REVISION"
    return rev.read_text().strip() if rev.is_file() else "unknown"


def time_embeddings(model: Pi0Model) -> Tensor:
    """[steps, expert width]: the sinusoidal embedding of t = 1, 1 - 1/N, ... (its
    `prepare_adarms_cond`), from our function; its time MLP runs on them at build."""
    cfg = model.cfg
    t = 1.0 - torch.arange(cfg.num_steps, dtype=torch.float64) / cfg.num_steps
    return sinusoidal_time_embedding(t, cfg.expert.width, cfg.min_period, cfg.max_period)


def check_shapes(cfg: PolicyConfig, views: int) -> None:
    """What its kernels are written for, said before anything is built (the CLI asks before any
    mode runs, so a run that cannot include it stops in a second, not after the other modes)."""
    problems = []
    if cfg.kind not in MODULES:
        problems.append(f"policy {cfg.kind} (its backends: {', '.join(MODULES)})")
    if cfg.num_steps != STEPS:
        problems.append(f"{cfg.num_steps} steps (its build hard-codes {STEPS})")
    dims = (cfg.prefix.width, cfg.expert.width, cfg.prefix.head_dim)
    if dims != (PREFIX_WIDTH, EXPERT_WIDTH, HEAD_DIM):
        problems.append(f"widths / head dim {dims} (its kernels: {(PREFIX_WIDTH, EXPERT_WIDTH, HEAD_DIM)})")
    if cfg.action_dim != 32 or cfg.state_dim != 32:
        problems.append(f"action / state dims {cfg.action_dim} / {cfg.state_dim} (its kernels: 32)")
    keys = views * cfg.vision.num_tokens + cfg.prompt_len + cfg.horizon + (cfg.kind == "pi0")
    if keys > 1024:
        problems.append(f"{keys} keys (its softmax holds a row of at most 1024)")
    if problems:
        raise ValueError("realtime-vla cannot run this configuration: " + "; ".join(problems))


class RealtimeVla:
    """Its `Pi05Inference` / `Pi0Inference` on our weights, with the Case's inputs in its buffers.

    pi0.5: its graph runs over every prompt row and masks the padding with `valid_encoder_len`
    (its tokenised path). pi0: its prefix has no padding mask (every prompt row is attended), so
    it gets the valid rows only; its prefix is then that many rows shorter than ours (our graph
    runs the whole prompt bucket), which favours it slightly.
    """

    def __init__(self, backend: types.ModuleType, model: Pi0Model, case: Case):
        check_shapes(model.cfg, case.views)
        cfg = model.cfg
        self.kind, self.backend = cfg.kind, backend
        mask = case.token_masks[0].bool()
        self.n_valid = int(mask.sum())
        if not mask[: self.n_valid].all():  # its valid length / its prompt rows assume right padding
            raise ValueError("realtime-vla takes a right-padded prompt: valid tokens first, then padding")
        with torch.no_grad():
            embeds = model.prefix_lm.embed(case.tokens)[0].to(torch.bfloat16)
        self.embeds = embeds if cfg.kind == "pi05" else embeds[: self.n_valid]
        weights = convert(model, self.embeds)
        self.noise = case.noise[0].to(torch.bfloat16)
        t0 = time.perf_counter()
        if cfg.kind == "pi05":
            self.inf = backend.Pi05Inference(weights, case.views, cfg.horizon, discrete_state_input=False)
        else:
            self.inf = backend.Pi0Inference(weights, case.views, cfg.horizon)
        self.build_s = time.perf_counter() - t0
        self.inf.checkpoint = None  # its pi0.5 build keeps the dict it was given: its weights are copied
        del weights
        b = self.inf.buffers
        b["observation_images_normalized"].copy_(case.pixels[0, : case.views].permute(0, 2, 3, 1))
        self.prompt_rows = None
        if cfg.kind == "pi05":
            start = case.views * cfg.vision.num_tokens
            b["valid_encoder_len"].fill_(start + self.n_valid)
            b["decoder_rope_weights"].copy_(self.inf.get_decoder_rope_weights(self.n_valid))
            self.prompt_rows = b["encoder_x"][start : start + cfg.prompt_len]  # its graph overwrites them
        else:  # its graph copies the prompt in itself
            b["observation_state_normalized"].copy_(case.state[0])

    def decide(self) -> None:
        """One decision as its `forward` runs it: the inputs its graph overwrites back in, the graph."""
        if self.prompt_rows is not None:
            self.prompt_rows.copy_(self.embeds)
        self.inf.buffers["diffusion_noise"].copy_(self.noise)
        self.inf.infer_graph.replay()

    def chunk(self) -> Tensor:
        """The last decision's actions [horizon, action dim] (its Euler state, in place of the noise)."""
        return self.inf.buffers["diffusion_noise"].float()

    def capture_stages(self) -> dict[str, torch.cuda.CUDAGraph]:
        """Its stages as graphs of its own functions, each replayed alone (its decision graph has
        no split), under the bench's row keys: vision (`vision_encoder`), the prefix (the prompt
        rows in, vision, `transformer_encoder`) and the 10 denoise steps (`transformer_decoder`)
        over the prefix K / V the last decision left."""
        inf, fns = self.inf, self.backend
        b, w, views = inf.buffers, inf.weights, inf.num_views
        seq = b["encoder_x"].shape[0]  # its prefix rows (encoder_seq_len)
        start = views * 256  # its image tokens per view
        prompt = b["encoder_x"][start : start + len(self.embeds)]

        def prefix() -> None:
            prompt.copy_(self.embeds)
            fns.vision_encoder(w, b, views)
            fns.transformer_encoder(w, b, seq)

        def denoise() -> None:
            b["diffusion_noise"].copy_(self.noise)
            fns.transformer_decoder(w, b, seq)

        stages = {"vision": lambda: fns.vision_encoder(w, b, views), "prefix_alone": prefix, "denoise": denoise}
        return {key: cuda_graphs.capture(fn, self.noise.device) for key, fn in stages.items()}


def measure_realtime_vla(
    repo: Path, model: Pi0Model, case: Case, iters: int, warmup: int, label: str, ref_chunk: Tensor
) -> tuple[dict[str, Latency], dict, float]:
    """Build it on our weights, time its full decision and its stages alone, check parity."""
    backend = load_backend(repo, MODULES[model.cfg.kind])
    rt = RealtimeVla(backend, model, case)
    log.info("realtime-vla %s (%s) built and captured in %.1f s", model.cfg.kind, repo, rt.build_s)
    dev = case.noise.device
    rows = {"full": Latency.from_samples(f"{label} full decision", time_call(rt.decide, iters, warmup, dev, label))}
    rt.decide()
    parity = chunk_parity(rt.chunk(), ref_chunk[0], case.noise[0])
    # its vision_encoder stops before the final LayerNorm and the projector, which ours includes
    names = {"denoise": "denoise only", "prefix_alone": "prefix alone", "vision": "vision w/o head"}
    try:  # its stages through its own functions: a failure here keeps the decision row and parity
        graphs = rt.capture_stages()
    except Exception as exc:
        log.warning("realtime-vla's stages could not be captured alone (%s: %s): decision row only",
                    type(exc).__name__, exc)  # fmt: skip
        graphs = {}
    for key, name in names.items():
        graph = graphs.get(key)
        if graph is not None:
            rows[key] = Latency.from_samples(f"{label} {name}", time_call(graph.replay, iters, warmup, dev, label))
    if not math.isfinite(parity["chunk"]["cosine"]):
        log.warning("realtime-vla's chunk is not finite: its timing rows stand, its parity does not")
    return rows, parity, rt.build_s
