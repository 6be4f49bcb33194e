"""Parity with LeRobot 0.6.1 on identical inputs and noise (the gate for the reference path).

`scripts/lerobot_reference.py` (run where LeRobot is installed) writes a LeRobot-layout
checkpoint plus io.safetensors / io.json: inputs, intermediates and LeRobot's chunk. Here OUR
loader reads the checkpoint and OUR model runs the same inputs; errors are fp64 cosines and
max abs differences of the chunk, of chunk - noise (the noise alone already gives a high
cosine), and of intermediates that localise a mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..policies.checkpoint import load_model, read_config
from ..policies.config import GemmaSpec, PolicyConfig, SiglipSpec
from ..policies.preprocess import images_to_pixels

GATES = {"float32": 0.99999, "bfloat16": 0.999}


def compare(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    a, b = ours.double().flatten().cpu(), ref.double().flatten().cpu()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    return {"max_abs": (a - b).abs().max().item(), "cosine": cos, "ref_abs_max": b.abs().max().item()}


def chunk_parity(chunk: torch.Tensor, ref: torch.Tensor, noise: torch.Tensor) -> dict:
    """The chunk against the fp32 reference's (same inputs and noise), and the same for chunk
    minus noise: the noise both start from already gives the chunks a high cosine."""
    return {"chunk": compare(chunk, ref), "chunk_minus_noise": compare(chunk - noise, ref - noise)}


def reference_config(ref: dict, checkpoint: Path, dtype: str) -> PolicyConfig:
    """Full size: LeRobot's config.json says it all. Tiny: the dims come from io.json.

    io.json's `views` counts the cameras that fed LeRobot; a checkpoint's `empty_cameras` add
    blank, masked views after them, as LeRobot and the node both run them."""
    s = ref["settings"]
    base = read_config(checkpoint, "lerobot")
    cfg = base.replace(
        dtype=dtype,
        num_views=s["views"] + base.empty_cameras,
        prompt_len=s["prompt_len"],
        horizon=s["chunk_size"],
        num_steps=s["num_inference_steps"],
    )
    if ref.get("size") == "tiny":
        dims = ref["model_dims"]
        cfg = cfg.replace(
            vision=SiglipSpec(**dims["vision"]),
            prefix=GemmaSpec(**dims["prefix"]),
            expert=GemmaSpec(**dims["expert"]),
            vocab_size=dims["vocab_size"],
        )
    return cfg


def _pixels(io: dict, cfg: PolicyConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The cameras in `io` ([1, 3, H, W], uint8 or float in [0, 1]), then the checkpoint's empty
    cameras as absent views: the same pixels and masks the node feeds the model."""
    cams = [io[f"in.observation.images.cam{i}"][0].permute(1, 2, 0) for i in range(cfg.camera_views)]
    return images_to_pixels(cams + [None] * cfg.empty_cameras, cfg.vision.image_size, device)


def _camera_tokens(tokens: torch.Tensor, cfg: PolicyConfig, dim: int) -> torch.Tensor:
    """`tokens` without the empty cameras' image tokens (along `dim`): LeRobot's intermediates
    in io were taken without them, and masked they change nothing else."""
    per_view = cfg.vision.num_tokens
    start, stop = cfg.camera_views * per_view, cfg.num_views * per_view
    keep = [i for i in range(tokens.shape[dim]) if not start <= i < stop]
    return tokens.index_select(dim, torch.tensor(keep, device=tokens.device))


def run_parity(io_file: Path, checkpoint: Path, dtype: str | None = None, device: str = "cpu") -> dict:
    """Our chunk vs LeRobot's for the inputs in `io_file` (its .json sits beside it)."""
    ref = json.loads(io_file.with_suffix(".json").read_text())
    io = load_file(str(io_file))
    dtype = dtype or ref["dtype"]
    dev = torch.device(device)
    cfg = reference_config(ref, checkpoint, dtype)
    model, info = load_model(checkpoint, cfg, device=dev)
    pixels, masks = _pixels(io, cfg, dev)
    tokens = io["in.observation.language.tokens"].to(dev)
    tmask = io["in.observation.language.attention_mask"].to(dev).bool()
    raw_state = io["in.observation.state"].to(dev).float()
    state = torch.zeros(1, cfg.state_dim, device=dev)
    state[:, : raw_state.shape[1]] = raw_state
    noise = io["in.noise"].to(dev)
    dof = io["out.chunk"].shape[-1]
    with torch.no_grad():
        emb, valid = model.embed_prefix(pixels, masks, tokens, tmask)
        prefix = model.prefill(emb, valid)
        chunk = model.denoise(prefix, noise, state)
        v0 = model.velocity(prefix, noise, torch.ones(1, device=dev), state)
    results = {
        "policy": ref["policy"],
        "size": ref.get("size"),
        "ours_dtype": dtype,
        "lerobot_dtype": ref["dtype"],
        "device": str(dev),
        "views": {"cameras": cfg.camera_views, "empty": cfg.empty_cameras},
        "load_seconds": info.seconds,
        "chunk": compare(chunk[..., :dof], io["out.chunk"]),
        "chunk_minus_noise": compare(chunk[..., :dof] - noise[..., :dof], io["out.chunk_minus_noise"]),
        "pre_image0": compare(pixels[:, 0], io["mid.pre_image.0"]),
        "prefix_embs": compare(_camera_tokens(emb, cfg, 1), io["mid.prefix_embs"]),
        "velocity_step0": compare(v0, io["mid.velocity.step0"]),
    }
    for key in sorted(k for k in io if k.startswith("mid.prefix_k.layer")):
        layer = int(key.removeprefix("mid.prefix_k.layer"))
        results[f"prefix_k_layer{layer}"] = compare(_camera_tokens(prefix.keys[layer], cfg, 2), io[key])
    gate = GATES[dtype]
    results["gate"] = {"chunk_cosine_min": gate, "passed": results["chunk"]["cosine"] >= gate}
    return results


def report(results: dict) -> str:
    lines = [
        f"parity {results['policy']} ({results['size']}) ours={results['ours_dtype']} "
        f"lerobot={results['lerobot_dtype']} on {results['device']}"
    ]
    for name, r in results.items():
        if isinstance(r, dict) and "cosine" in r:
            lines.append(f"  {name:<22} cosine {r['cosine']:.9f}  max_abs {r['max_abs']:.3e}")
    g = results["gate"]
    lines.append(f"  gate: chunk cosine >= {g['chunk_cosine_min']}: {'PASS' if g['passed'] else 'FAIL'}")
    return "\n".join(lines)
