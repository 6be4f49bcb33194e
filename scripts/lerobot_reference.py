#!/usr/bin/env python3
"""Run LeRobot 0.6.1's PI05Policy / PI0Policy as the parity reference (issue 2).

Builds the official policy with *random* weights (seeded; every parameter re-drawn so that
nothing is trivially zero: LeRobot zero-inits the adaRMS dense layers and Gemma's (1+w) norm
weights), saves it in the LeRobot layout (`checkpoint/config.json`, `model.safetensors`,
normaliser pipelines), runs `predict_action_chunk` on fixed inputs and fixed noise, and
writes every input, output and a few intermediates to `io.safetensors` + `io.json`.

It needs LeRobot importable. On the GPU machine (no network), after
`bash scripts/fetch_parity_wheels.sh` here:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 scripts/lerobot_reference.py --policy pi05 --size full \
        --dtype float32 --device cuda --out /tmp/lr/pi05_fp32 --checkpoint /tmp/lr/pi05_fp32_ckpt

(the float32 checkpoint is 16.6 GB: keep it out of $OUT; io.safetensors is < 16 MiB and may go there.)

Locally (CPU, tiny): a Python 3.12 venv with torch 2.11 and the same wheels, e.g.
    PYTHONPATH=/tmp/site /tmp/lrvenv/bin/python scripts/lerobot_reference.py --policy pi0 \
        --size tiny --device cpu --out /tmp/lr_pi0_tiny

`--size tiny` mirrors `flashrt_ros.policies.config.PolicyConfig.tiny` (dims are written to
io.json under "model_dims"; LeRobot's config.json only names the Gemma variants, so a tiny
checkpoint's config.json still says gemma_2b/gemma_300m). The tiny model is obtained by
patching, in the policy's modeling module only, `get_gemma_config` and the two HF model
constructors it calls (see `_patch_tiny`); the computation itself is LeRobot's, unpatched.

Nothing here is imported by the package; it is a tool for the parity gate.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# sizes
# ---------------------------------------------------------------------------------------------
FULL_DIMS = {
    "vision": dict(image_size=224, patch_size=14, width=1152, depth=27, num_heads=16, mlp_dim=4304),
    "prefix": dict(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "expert": dict(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "vocab_size": 257152,
}
# mirrors flashrt_ros.policies.config.PolicyConfig.tiny
TINY_DIMS = {
    "vision": dict(image_size=56, patch_size=14, width=32, depth=2, num_heads=2, mlp_dim=64),
    "prefix": dict(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
    "expert": dict(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
    "vocab_size": 512,
}
DEFAULTS = {  # (views, prompt_len, chunk, steps); prompt_len differs per policy
    "full": {"views": 3, "prompt_len": {"pi05": 200, "pi0": 48}, "chunk": 50, "steps": 10},
    "tiny": {"views": 2, "prompt_len": {"pi05": 48, "pi0": 16}, "chunk": 10, "steps": 4},
}
MAX_DIM = 32  # LeRobot max_state_dim / max_action_dim (openpi pads to 32)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", choices=["pi05", "pi0"], required=True)
    p.add_argument("--size", choices=["tiny", "full"], default="tiny")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", default="cuda")
    p.add_argument("--views", type=int, default=None, help="cameras (default 3 full, 2 tiny)")
    p.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="tokenizer_max_length (default 200 pi05 / 48 pi0 full; 48 / 16 tiny)",
    )
    p.add_argument("--chunk", type=int, default=None, help="chunk_size (default 50 full, 10 tiny)")
    p.add_argument("--steps", type=int, default=None, help="num_inference_steps (default 10 full, 4 tiny)")
    p.add_argument("--state-dim", type=int, default=14, help="robot state dim (padded to 32 inside)")
    p.add_argument("--action-dim", type=int, default=14, help="robot action dim (output un-padded to it)")
    p.add_argument("--pad-frac", type=float, default=0.3, help="fraction of prompt tokens that are padding")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cam0-hw", default="480x640", help="HxW of camera 0 (resized with padding); others are square")
    p.add_argument("--std-matrix", type=float, default=0.02, help="std of re-drawn weights with ndim >= 2")
    p.add_argument("--std-vector", type=float, default=0.1, help="std of re-drawn biases / norm weights")
    p.add_argument(
        "--allow-tf32",
        action="store_true",
        help="keep torch's CUDA defaults (cuDNN convolutions in TF32: SigLIP's patch conv); by default a "
        "float32 run on CUDA turns TF32 off for cuDNN and matmuls so the reference is true float32",
    )
    p.add_argument("--no-checkpoint", action="store_true", help="skip writing the checkpoint")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="where to save the LeRobot checkpoint (default OUT/checkpoint); full size is "
        "~16.6 GB in float32, so on the GPU machine keep it out of $OUT",
    )
    p.add_argument(
        "--save-prefix-out",
        action="store_true",
        help="also save the prefix model's final hidden states (8 MB at full size; unused by LeRobot)",
    )
    p.add_argument(
        "--dump-keys",
        metavar="FILE",
        default=None,
        help="only write the state-dict key/shape/dtype list of the (meta-device) model and exit",
    )
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    a.cam0_h, a.cam0_w = (int(v) for v in a.cam0_hw.lower().split("x"))
    return a


# ---------------------------------------------------------------------------------------------
# LeRobot plumbing
# ---------------------------------------------------------------------------------------------
def _modules(policy_name):
    if policy_name == "pi05":
        from lerobot.policies.pi05 import configuration_pi05 as cfg_mod
        from lerobot.policies.pi05 import modeling_pi05 as mod
        from lerobot.policies.pi05 import processor_pi05 as proc_mod

        return mod, cfg_mod.PI05Config, mod.PI05Policy, proc_mod.make_pi05_pre_post_processors
    from lerobot.policies.pi0 import configuration_pi0 as cfg_mod
    from lerobot.policies.pi0 import modeling_pi0 as mod
    from lerobot.policies.pi0 import processor_pi0 as proc_mod

    return mod, cfg_mod.PI0Config, mod.PI0Policy, proc_mod.make_pi0_pre_post_processors


def _patch_tiny(mod, dims):
    """Shrink the model LeRobot builds, by patching names in `mod` (the policy's modeling module).

    - `get_gemma_config(variant)` -> tiny prefix / expert dims (variant names stay valid).
    - `PaliGemmaForConditionalGenerationWithPiGemma(config)`: before construction, set the SigLIP
      width/depth/heads/MLP, projector output (= prefix width) and the vocabulary. LeRobot's
      `PaliGemmaWithExpertModel.__init__` writes intermediate_size=4304 and projection_dim=2048
      into the HF config just before this call, so this is the one place to override them.
    - `PiGemmaForCausalLM(config)` (action expert): vocabulary (its lm_head is vocab x width).
    """
    orig_get = mod.get_gemma_config
    orig_pali = mod.PaliGemmaForConditionalGenerationWithPiGemma
    orig_expert = mod.PiGemmaForCausalLM
    vis, vocab = dims["vision"], dims["vocab_size"]

    def get_gemma_config(variant):
        orig_get(variant)  # keep LeRobot's validation of the name
        d = dims["prefix"] if variant == "gemma_2b" else dims["expert"]
        return mod.GemmaConfig(d["width"], d["depth"], d["mlp_dim"], d["num_heads"], d["num_kv_heads"], d["head_dim"])

    def pali(config):
        vc = config.vision_config
        vc.hidden_size = vis["width"]
        vc.num_hidden_layers = vis["depth"]
        vc.num_attention_heads = vis["num_heads"]
        vc.intermediate_size = vis["mlp_dim"]
        vc.patch_size = vis["patch_size"]
        vc.projection_dim = config.text_config.hidden_size
        config._vocab_size = vocab
        config.image_token_index = vocab
        config.text_config.vocab_size = vocab
        return orig_pali(config=config)

    def expert(config):
        config.vocab_size = vocab
        return orig_expert(config=config)

    mod.get_gemma_config = get_gemma_config
    mod.PaliGemmaForConditionalGenerationWithPiGemma = pali
    mod.PiGemmaForCausalLM = expert


def _make_config(cfg_cls, a, dims):
    from lerobot.configs import FeatureType, PolicyFeature

    res = dims["vision"]["image_size"]
    inputs = {
        f"observation.images.cam{i}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, res, res))
        for i in range(a.views)
    }
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(a.state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(a.action_dim,))}
    return cfg_cls(
        input_features=inputs,
        output_features=outputs,
        dtype=a.dtype,
        device=a.device,
        chunk_size=a.chunk,
        n_action_steps=a.chunk,
        num_inference_steps=a.steps,
        tokenizer_max_length=a.prompt_len,
        image_resolution=(res, res),
        max_state_dim=MAX_DIM,
        max_action_dim=MAX_DIM,
        push_to_hub=False,
    )


def _randomise(model, seed, std_matrix, std_vector):
    """Re-draw every parameter: N(0, std_matrix) for ndim >= 2, N(0, std_vector) otherwise.

    Drawn in float32 on the parameter's device with one seeded generator per device, in
    `named_parameters()` order (tied parameters once), then copied in: a bfloat16 parameter
    gets the float32 draw rounded, so a bf16 build holds the fp32 build's weights, rounded.
    """
    import torch

    gens = {}
    stats = {"matrices": 0, "vectors": 0, "numel": 0}
    with torch.no_grad():
        for _, p in model.named_parameters():
            dev = p.device
            if dev.type == "meta":
                continue
            key = str(dev)
            if key not in gens:
                gens[key] = torch.Generator(device=dev).manual_seed(seed)
            std = std_matrix if p.ndim >= 2 else std_vector
            draw = torch.empty(p.shape, dtype=torch.float32, device=dev).normal_(0.0, std, generator=gens[key])
            p.copy_(draw)
            stats["matrices" if p.ndim >= 2 else "vectors"] += 1
            stats["numel"] += p.numel()
    return stats


def _tied_groups(model):
    """Parameter names that share one tensor (what safetensors' save_model de-duplicates)."""
    groups = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [sorted(v) for v in groups.values() if len(v) > 1]


def dump_keys(a, mod, cfg_cls, pol_cls, dims):
    """Write `key  shape  dtype(float32 mode)  dtype(bfloat16 mode)` of the model built on `meta`."""
    import torch

    built = {}
    for dt in ("float32", "bfloat16"):
        a.dtype = dt
        config = _make_config(cfg_cls, a, dims)
        config.device = "meta"  # LeRobot's __init__ ends with .to(config.device)
        with torch.device("meta"):
            policy = pol_cls(config)
        built[dt] = policy
    sd32, sd16 = built["float32"].state_dict(), built["bfloat16"].state_dict()
    assert list(sd32) == list(sd16)
    total = 0
    lines = []
    for k, t in sd32.items():
        lines.append(
            f"{k}\t{tuple(t.shape)}\t{str(t.dtype).replace('torch.', '')}\t{str(sd16[k].dtype).replace('torch.', '')}"
        )
        total += t.numel()
    tied = _tied_groups(built["float32"])
    header = [
        f"# LeRobot {_ver('lerobot')} (transformers {_ver('transformers')}) {pol_cls.__name__}.state_dict(), "
        f"built on the meta device; dims={json.dumps(dims)}",
        f"# {len(sd32)} keys; {total} elements; tied parameter groups: {tied or 'none'}",
        "# key\tshape\tdtype with config.dtype=float32\tdtype with config.dtype=bfloat16",
    ]
    Path(a.dump_keys).parent.mkdir(parents=True, exist_ok=True)
    Path(a.dump_keys).write_text("\n".join(header + lines) + "\n")
    print(f"wrote {len(lines)} keys ({total / 1e9:.3f}B elements) to {a.dump_keys}; tied: {tied or 'none'}")
    return 0


def _ver(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def make_inputs(a, res, vocab):
    """Seeded CPU inputs: images float32 [0,1] [1,3,H,W] (cam0 --cam0-hw -> resize-with-pad),
    prompt token ids int64 [1,L] with the last pad_frac padded (id 0, mask False), state, noise."""
    import torch

    g = torch.Generator().manual_seed(a.seed + 1)
    images = {}
    for i in range(a.views):
        h, w = (a.cam0_h, a.cam0_w) if i == 0 else (res, res)
        # camera-like 8-bit values; LeRobot is fed the float32 image u8 / 255 (exact in float32)
        images[f"observation.images.cam{i}"] = torch.randint(0, 256, (1, 3, h, w), generator=g, dtype=torch.uint8)
    n_pad = int(round(a.prompt_len * a.pad_frac))
    n_valid = a.prompt_len - n_pad
    tokens = torch.zeros(1, a.prompt_len, dtype=torch.int64)
    tokens[0, :n_valid] = torch.randint(1, vocab, (n_valid,), generator=g)
    mask = torch.zeros(1, a.prompt_len, dtype=torch.bool)
    mask[0, :n_valid] = True
    state = torch.rand(1, a.state_dim, generator=g) * 2 - 1  # already normalised, in [-1, 1]
    noise = torch.randn(1, a.chunk, MAX_DIM, generator=g, dtype=torch.float32)
    return images, tokens, mask, state, noise


def make_stats(a, g):
    """Synthetic dataset statistics (all the kinds LeRobot's normaliser knows) for state and action."""
    import torch

    stats = {}
    for key, dim in (("observation.state", a.state_dim), ("action", a.action_dim)):
        mean = torch.randn(dim, generator=g) * 0.5
        std = torch.rand(dim, generator=g) + 0.5
        lo = mean - 2.5 * std
        hi = mean + 2.5 * std
        stats[key] = {
            "mean": mean,
            "std": std,
            "min": lo,
            "max": hi,
            "q01": mean - 2.0 * std,
            "q99": mean + 2.0 * std,
            "q10": mean - 1.2 * std,
            "q90": mean + 1.2 * std,
            "count": torch.tensor([1000]),
        }
    return stats


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def main(argv=None):
    a = parse_args(argv)
    d = DEFAULTS[a.size]
    a.views = a.views or d["views"]
    a.prompt_len = a.prompt_len or d["prompt_len"][a.policy]
    a.chunk = a.chunk or d["chunk"]
    a.steps = a.steps or d["steps"]
    dims = json.loads(json.dumps(FULL_DIMS if a.size == "full" else TINY_DIMS))

    import torch

    mod, cfg_cls, pol_cls, make_processors = _modules(a.policy)
    if a.size == "tiny":
        _patch_tiny(mod, dims)
    if a.dump_keys:
        return dump_keys(a, mod, cfg_cls, pol_cls, dims)

    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    if device.type == "cuda" and not a.allow_tf32:
        torch.backends.cudnn.allow_tf32 = False  # torch's default is True: the patch conv would run in TF32
        torch.backends.cuda.matmul.allow_tf32 = False  # the default already; LeRobot only changes it when compiling
    tf32 = {
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    t0 = time.perf_counter()
    config = _make_config(cfg_cls, a, dims)
    with torch.device(device):  # build in place (full size: no CPU init of 3.5B params)
        policy = pol_cls(config)
    policy.eval()
    t_build = time.perf_counter() - t0
    tied = _tied_groups(policy)
    rstats = _randomise(policy, a.seed, a.std_matrix, a.std_vector)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t_rand = time.perf_counter() - t0 - t_build

    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    res, vocab = dims["vision"]["image_size"], dims["vocab_size"]

    # ---- checkpoint in the LeRobot layout --------------------------------------------------
    ckpt = a.checkpoint or (out / "checkpoint")
    gstats = torch.Generator().manual_seed(a.seed + 2)
    dataset_stats = make_stats(a, gstats)
    saved = {}
    t_save = 0.0
    preprocessor = postprocessor = None
    if not a.no_checkpoint:
        ts = time.perf_counter()
        policy.save_pretrained(ckpt)
        # The processors' tokenizer step would download google/paligemma-3b-pt-224; give it a
        # stand-in (only its name is serialised) so the real pipelines and stat files are written.
        import lerobot.processor.tokenizer_processor as tp

        class _NoTokenizer:
            @staticmethod
            def from_pretrained(name, *args, **kwargs):
                return object()

        real_auto = tp.AutoTokenizer
        tp.AutoTokenizer = _NoTokenizer
        try:
            preprocessor, postprocessor = make_processors(config, dataset_stats=dataset_stats)
        finally:
            tp.AutoTokenizer = real_auto
        preprocessor.save_pretrained(ckpt)
        postprocessor.save_pretrained(ckpt)
        t_save = time.perf_counter() - ts
        from safetensors import safe_open

        for f in sorted(ckpt.iterdir()):
            entry = {"bytes": f.stat().st_size}
            if f.suffix == ".safetensors":
                with safe_open(str(f), "pt") as sf:
                    keys = list(sf.keys())
                    entry["num_keys"] = len(keys)
                    if f.name != "model.safetensors":
                        entry["keys"] = {
                            k: [list(sf.get_slice(k).get_shape()), sf.get_slice(k).get_dtype()] for k in keys
                        }
            elif f.suffix == ".json":
                entry["content"] = json.loads(f.read_text())
            saved[f.name] = entry
        sd_keys = set(policy.state_dict().keys())
        with safe_open(str(ckpt / "model.safetensors"), "pt") as sf:
            file_keys = set(sf.keys())
            file_dtypes = {}
            for k in file_keys:
                file_dtypes.setdefault(sf.get_slice(k).get_dtype(), 0)
                file_dtypes[sf.get_slice(k).get_dtype()] += 1
        saved["model.safetensors"]["dropped_from_state_dict"] = sorted(sd_keys - file_keys)
        saved["model.safetensors"]["extra_vs_state_dict"] = sorted(file_keys - sd_keys)
        saved["model.safetensors"]["dtype_counts"] = file_dtypes

    # ---- inputs ----------------------------------------------------------------------------
    images, tokens, mask, state, noise = make_inputs(a, res, vocab)
    batch = {k: (v.to(torch.float32) / 255.0).to(device) for k, v in images.items()}
    batch["observation.language.tokens"] = tokens.to(device)
    batch["observation.language.attention_mask"] = mask.to(device)
    batch["observation.state"] = state.to(device)
    noise_dev = noise.to(device)

    # Normaliser round trip example (LeRobot's own steps): raw state -> normalised, chunk -> raw.
    norm_example = {}
    if preprocessor is not None:
        from lerobot.processor import NormalizerProcessorStep, UnnormalizerProcessorStep

        nstep = next(s for s in preprocessor.steps if isinstance(s, NormalizerProcessorStep))
        ustep = next(s for s in postprocessor.steps if isinstance(s, UnnormalizerProcessorStep))
        # inverse of the state normalisation gives a "raw" state whose normalisation is our input
        raw_state = nstep._normalize_observation({"observation.state": state.clone()}, inverse=True)[
            "observation.state"
        ]
        re_norm = nstep._normalize_observation({"observation.state": raw_state.clone()}, inverse=False)[
            "observation.state"
        ]
        norm_example = {"raw_state": raw_state, "renormalised_state": re_norm, "unnormalise": ustep}

    # ---- capture intermediates while running the unmodified LeRobot path ---------------------
    cap = {}
    model = policy.model
    pwe = model.paligemma_with_expert

    orig_pre = policy._preprocess_images

    def pre_images(b):
        imgs, masks = orig_pre(b)
        cap["pre_images"] = [t.detach().clone() for t in imgs]
        cap["pre_img_masks"] = [t.detach().clone() for t in masks]
        return imgs, masks

    policy._preprocess_images = pre_images

    orig_embed_prefix = model.embed_prefix

    def embed_prefix(*args, **kw):
        embs, pad, att = orig_embed_prefix(*args, **kw)
        cap["prefix_embs"] = embs.detach().clone()
        cap["prefix_pad_masks"] = pad.detach().clone()
        cap["prefix_att_masks"] = att.detach().clone()
        return embs, pad, att

    model.embed_prefix = embed_prefix

    orig_fwd = pwe.forward

    def pwe_forward(*args, **kw):
        res_ = orig_fwd(*args, **kw)
        embeds = kw.get("inputs_embeds")
        if embeds is not None and embeds[1] is None and "prefix_kv" not in cap:
            cache = res_[1]
            layers = [(k, v) for k, v, *_ in cache]
            cap["prefix_kv"] = {0: layers[0], len(layers) - 1: layers[-1]}
            cap["prefix_num_layers"] = len(layers)
            cap["prefix_position_ids"] = kw["position_ids"].detach().clone()
            cap["prefix_att_4d"] = kw["attention_mask"].detach().clone()
            cap["prefix_out"] = res_[0][0].detach().clone()
        elif embeds is not None and embeds[0] is None and "suffix_position_ids" not in cap:
            cap["suffix_position_ids"] = kw["position_ids"].detach().clone()
            cap["suffix_att_4d"] = kw["attention_mask"].detach().clone()
            cap["suffix_in"] = embeds[1].detach().clone()
            cap["suffix_out_step0"] = res_[0][1].detach().clone()
        return res_

    pwe.forward = pwe_forward

    orig_embed_suffix = model.embed_suffix

    def embed_suffix(*args, **kw):
        r = orig_embed_suffix(*args, **kw)
        if "suffix_embs_step0" not in cap:
            cap["suffix_embs_step0"] = r[0].detach().clone()
            if r[3] is not None:
                cap["adarms_cond_step0"] = r[3].detach().clone()
        return r

    model.embed_suffix = embed_suffix

    orig_denoise = model.denoise_step
    cap["velocities"], cap["timesteps"], cap["x_t"] = [], [], []

    def denoise_step(*args, **kw):
        v = orig_denoise(*args, **kw)
        cap["velocities"].append(v.detach().clone())
        cap["timesteps"].append(kw["timestep"].detach().clone())
        cap["x_t"].append(kw["x_t"].detach().clone())
        return v

    model.denoise_step = denoise_step

    orig_sample = model.sample_actions

    def sample_actions(*args, **kw):
        r = orig_sample(*args, **kw)
        cap["chunk_padded"] = r.detach().clone()
        return r

    model.sample_actions = sample_actions

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    t1 = time.perf_counter()
    with torch.no_grad():
        chunk = policy.predict_action_chunk(batch, noise=noise_dev)
    sync()
    t_run = time.perf_counter() - t1
    # a second identical call: determinism check and a warm timing
    first = {k: cap[k] for k in ("velocities", "timesteps", "x_t")}
    cap["velocities"], cap["timesteps"], cap["x_t"] = [], [], []
    cap.pop("prefix_kv"), cap.pop("suffix_position_ids")
    t2 = time.perf_counter()
    with torch.no_grad():
        chunk2 = policy.predict_action_chunk(batch, noise=noise_dev)
    sync()
    t_run2 = time.perf_counter() - t2
    deterministic = bool(torch.equal(chunk, chunk2))
    cap.update(first)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None

    # ---- write io.safetensors / io.json ------------------------------------------------------
    from safetensors.torch import save_file

    def cpu(t):
        return t.detach().to("cpu").contiguous()

    T = {}
    desc = {}

    def put(key, t, what):
        T[key] = cpu(t)
        desc[key] = {"dtype": str(T[key].dtype).replace("torch.", ""), "shape": list(T[key].shape), "what": what}

    for i in range(a.views):
        k = f"observation.images.cam{i}"
        put(
            f"in.{k}",
            images[k],
            "input image uint8 [1,3,H,W]; LeRobot got float32 (this / 255) in [0,1] (cam0: resize-with-pad)",
        )
    put("in.observation.language.tokens", tokens, "prompt token ids int64 [1,L]; padding id 0 at the end")
    put("in.observation.language.attention_mask", mask, "prompt mask bool [1,L]; False = padding")
    put(
        "in.observation.state",
        state,
        "state as the model sees it (already normalised), [1,state_dim]"
        + (
            "; unused by pi05's model (pi05 puts the state in the prompt text)"
            if a.policy == "pi05"
            else "; padded with zeros to 32 (prepare_state) and fed to state_proj"
        ),
    )
    put("in.noise", noise, "x at t=1, float32 [1,chunk,32] (passed as sample_actions(noise=...))")
    for i, (img, m) in enumerate(zip(cap["pre_images"], cap["pre_img_masks"], strict=True)):
        if i == 0:  # the resized one; the others are just x * 2 - 1 (kept out to stay under 16 MiB)
            put(f"mid.pre_image.{i}", img, "after _preprocess_images: resize-with-pad, x*2-1, [1,3,res,res] float32")
        put(f"mid.pre_img_mask.{i}", m, "image mask bool [1]")
    put(
        "mid.prefix_embs",
        cap["prefix_embs"],
        "embed_prefix output [1, views*tokens + L, prefix width] (images then text)",
    )
    put("mid.prefix_pad_masks", cap["prefix_pad_masks"], "embed_prefix pad mask bool [1,P]")
    put("mid.prefix_position_ids", cap["prefix_position_ids"], "cumsum(pad)-1 over the prefix [1,P]")
    put(
        "mid.prefix_att_allowed",
        cap["prefix_att_4d"] == 0,
        "prefix attention allowed, bool [1,1,P,P] (LeRobot adds 0 where True, -2.3819763e38 where False)",
    )
    if a.save_prefix_out:
        put(
            "mid.prefix_out",
            cap["prefix_out"],
            "prefix hidden states after the final norm [1,P,width] (unused by LeRobot)",
        )
    n_layers = cap["prefix_num_layers"]
    for li, (k, v) in cap["prefix_kv"].items():
        put(
            f"mid.prefix_k.layer{li}",
            k,
            f"prefix K cache, after RoPE, [1,kv_heads,P,head_dim] (layer {li} of {n_layers})",
        )
        put(f"mid.prefix_v.layer{li}", v, f"prefix V cache [1,kv_heads,P,head_dim] (layer {li} of {n_layers})")
    put("mid.suffix_embs.step0", cap["suffix_embs_step0"], "embed_suffix output at t=1 [1,suffix_len,expert width]")
    if "adarms_cond_step0" in cap:
        put(
            "mid.adarms_cond.step0",
            cap["adarms_cond_step0"],
            "pi05 time conditioning (silu(time_mlp_out(silu(time_mlp_in(sincos(t)))))) [1,expert width]",
        )
    put("mid.suffix_position_ids.step0", cap["suffix_position_ids"], "suffix position ids [1,suffix_len]")
    put(
        "mid.suffix_att_allowed.step0",
        cap["suffix_att_4d"] == 0,
        "denoise attention allowed, bool [1,1,suffix_len,P+suffix_len] (keys: prefix cache, then suffix)",
    )
    put("mid.suffix_out.step0", cap["suffix_out_step0"], "expert hidden after final norm, step 0 [1,suffix_len,width]")
    put("mid.velocity.step0", cap["velocities"][0], "v(x, t=1) = first denoise_step output [1,chunk,32] float32")
    put("mid.velocities", torch.stack([cpu(v) for v in cap["velocities"]]), "all denoise velocities [steps,1,chunk,32]")
    put("mid.timesteps", torch.stack([cpu(t) for t in cap["timesteps"]]), "t of each step [steps,1]: 1, 1-1/N, ...")
    put("mid.x_t", torch.stack([cpu(x) for x in cap["x_t"]]), "x fed to each denoise step [steps,1,chunk,32]")
    put("out.chunk_padded", cap["chunk_padded"], "sample_actions output [1,chunk,32] (normalised action space)")
    put("out.chunk", chunk, "predict_action_chunk output = chunk_padded[..., :action_dim]")
    delta = cpu(chunk).float() - noise[..., : a.action_dim]
    put(
        "out.chunk_minus_noise",
        delta,
        "chunk - noise[..., :action_dim] = -mean velocity: compare this too, the noise term alone gives a high cosine",
    )
    if norm_example:
        put(
            "norm.raw_state",
            norm_example["raw_state"],
            "un-normalised state whose LeRobot normalisation is in.observation.state",
        )
        put("norm.renormalised_state", norm_example["renormalised_state"], "LeRobot NormalizerProcessorStep(raw_state)")
        un = norm_example["unnormalise"]._normalize_action(cpu(chunk).float(), inverse=True)
        put("norm.chunk_unnormalised", un, "LeRobot UnnormalizerProcessorStep(out.chunk): robot-space actions")
    save_file(T, str(out / "io.safetensors"))

    cos = torch.nn.functional.cosine_similarity
    info = {
        "policy": a.policy,
        "lerobot_class": pol_cls.__name__,
        "size": a.size,
        "dtype": a.dtype,
        "device": str(device),
        "device_name": torch.cuda.get_device_name()
        if device.type == "cuda"
        else (platform.processor() or platform.machine()),
        "seed": a.seed,
        "settings": {
            "views": a.views,
            "prompt_len": a.prompt_len,
            "valid_prompt_tokens": int(mask.sum()),
            "chunk_size": a.chunk,
            "num_inference_steps": a.steps,
            "state_dim": a.state_dim,
            "action_dim": a.action_dim,
            "max_state_dim": MAX_DIM,
            "max_action_dim": MAX_DIM,
            "image_resolution": res,
            "input_image_sizes": {k: list(v.shape[-2:]) for k, v in images.items()},
            "std_matrix": a.std_matrix,
            "std_vector": a.std_vector,
        },
        "model_dims": dims,
        "randomised": rstats,
        "tied_parameter_groups": tied,
        "param_dtypes": _dtype_summary(policy),
        "tf32": tf32,
        "attn_implementation": {
            "vision": getattr(pwe.paligemma.model.vision_tower.config, "_attn_implementation", None),
            "prefix": getattr(pwe.paligemma.model.language_model.config, "_attn_implementation", None),
            "expert": getattr(pwe.gemma_expert.model.config, "_attn_implementation", None),
        },
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "lerobot": _ver("lerobot"),
            "transformers": _ver("transformers"),
            "tokenizers": _ver("tokenizers"),
            "safetensors": _ver("safetensors"),
            "numpy": _ver("numpy"),
            "cuda": torch.version.cuda,
        },
        "timing_s": {
            "build": round(t_build, 3),
            "randomise": round(t_rand, 3),
            "save": round(t_save, 3),
            "predict_first": round(t_run, 4),
            "predict_second": round(t_run2, 4),
        },
        "peak_memory_gib": peak,
        "deterministic_repeat": deterministic,
        "checkpoint_dir": None if a.no_checkpoint else str(ckpt),
        "checkpoint_files": saved,
        "dataset_stats_keys": {k: sorted(v) for k, v in dataset_stats.items()},
        "tensors": desc,
        "summary": {
            "chunk_abs_max": float(cpu(chunk).float().abs().max()),
            "chunk_std": float(cpu(chunk).float().std()),
            "chunk_minus_noise_std": float(delta.std()),
            "velocity0_std": float(cpu(cap["velocities"][0]).std()),
            "cos(chunk, noise)": float(cos(cpu(chunk).float().flatten(), noise[..., : a.action_dim].flatten(), dim=0)),
        },
        "how_to_compare": "feed in.* (images uint8 -> /255 float32, tokens, mask, state, noise) to the model"
        " re-implemented and loaded from checkpoint/; compare out.chunk and out.chunk_minus_noise (max abs, cosine); "
        "mid.* localise a mismatch.",
    }
    (out / "io.json").write_text(json.dumps(info, indent=1, default=str))

    s = info["summary"]
    print(
        f"{pol_cls.__name__} {a.size} {a.dtype} on {info['device_name']}: views={a.views} prompt={a.prompt_len} "
        f"chunk={a.chunk} steps={a.steps} params={rstats['numel'] / 1e6:.1f}M"
    )
    print(
        f"  build {t_build:.1f}s, randomise {t_rand:.1f}s, save {t_save:.1f}s, predict {t_run * 1e3:.1f} ms "
        f"(second {t_run2 * 1e3:.1f} ms), peak {peak if peak is None else round(peak, 2)} GiB, "
        f"deterministic={deterministic}"
    )
    print(
        f"  chunk {tuple(chunk.shape)} |max| {s['chunk_abs_max']:.4f} std {s['chunk_std']:.4f}; "
        f"chunk-noise std {s['chunk_minus_noise_std']:.4f}; v0 std {s['velocity0_std']:.4f}"
    )
    print(
        f"  wrote {out / 'io.safetensors'} ({len(T)} tensors), {out / 'io.json'}"
        + ("" if a.no_checkpoint else f", {ckpt}/ ({', '.join(sorted(saved))})")
    )
    if not all(math.isfinite(v) for v in (s["chunk_abs_max"], s["chunk_std"])):
        print("  WARNING: non-finite chunk")
        return 1
    return 0


def _dtype_summary(policy):
    out = {}
    for name, p in policy.named_parameters():
        dt = str(p.dtype).replace("torch.", "")
        out.setdefault(dt, {"count": 0, "numel": 0, "examples": []})
        out[dt]["count"] += 1
        out[dt]["numel"] += p.numel()
        if len(out[dt]["examples"]) < 6:
            out[dt]["examples"].append(name)
    return out


if __name__ == "__main__":
    sys.exit(main())
