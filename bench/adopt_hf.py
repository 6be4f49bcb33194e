"""The adopt layer on unmodified Hugging Face modules at pi0.5's prefix shapes: SigLIP So400m/14 over
3 views and Gemma 2B over 968 tokens (what openpi's and LeRobot's PyTorch pi0 / pi0.5 build on),
random weights, bf16, batch 1. In one run: the modules eager, under torch.compile, and adopted
(`flashrt_ros.adopt.accelerate`: the replacements that passed its gates), median / p90 / p99 over
alternating rounds, and the parity of each against an fp32 copy of the same modules.

    python bench/adopt_hf.py [--vision-layers 27] [--lm-layers 18] [--iters 50] [--out DIR]
    python bench/adopt_hf.py --tiny          # CPU smoke run (Triton's interpreter), tiny dims

This measures kernel replacement alone, on a model that keeps its own launches, attention and
Python: the fused policy path (`flashrt bench`) is the pipeline built around the same kernels.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from collections.abc import Mapping

import torch
from torch import nn

from flashrt_ros.bench.args import out_folder, require_cuda


def build(tiny: bool, vision_layers: int, lm_layers: int) -> tuple[nn.Module, dict]:
    """SigLIP + Gemma as one module, and its example inputs."""
    import transformers

    if tiny:
        vis = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, image_size=28, patch_size=14)
        lm = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, head_dim=16)
        views, tokens = 2, 16
    else:
        vis = dict(hidden_size=1152, intermediate_size=4304, num_attention_heads=16, image_size=224, patch_size=14)
        lm = dict(hidden_size=2048, intermediate_size=16384, num_attention_heads=8, head_dim=256)
        views, tokens = 3, 968
    vision = transformers.SiglipVisionModel(
        transformers.SiglipVisionConfig(
            num_hidden_layers=vision_layers,
            hidden_act="gelu_pytorch_tanh",
            vision_use_head=False,  # pi0 / pi0.5 take the tokens, not the pooled output
            **vis,
        )
    )
    language = transformers.GemmaModel(
        transformers.GemmaConfig(
            vocab_size=1024,  # the prefix enters as embeddings: the vocabulary is not on the path
            num_hidden_layers=lm_layers,
            num_key_value_heads=1,
            hidden_act="gelu_pytorch_tanh",
            hidden_activation="gelu_pytorch_tanh",
            **lm,
        )
    )
    with torch.no_grad():  # Gemma inits its norm weights to 0: draw them, so that 1 + w matters
        for name, p in language.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)
    model = nn.ModuleDict({"vision": vision, "language": language})
    size = vis["image_size"]
    inputs = {
        "pixels": torch.randn(views, 3, size, size),
        "embeds": torch.randn(1, tokens, lm["hidden_size"]),
    }
    return model, inputs


def run(model: Mapping[str, nn.Module], inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One prefix: the vision tokens of every view and the LM's last hidden states."""
    tokens = model["vision"](pixel_values=inputs["pixels"]).last_hidden_state
    hidden = model["language"](inputs_embeds=inputs["embeds"]).last_hidden_state
    return tokens, hidden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny dims on the CPU (interpreter): a smoke run")
    ap.add_argument("--vision-layers", type=int, default=27, help="SigLIP layers (>= 1)")
    ap.add_argument("--lm-layers", type=int, default=18, help="Gemma layers (>= 1)")
    ap.add_argument(
        "--iters", type=int, default=50, help="timed calls per mode (a multiple of 5: 5 alternating rounds)"
    )
    ap.add_argument(  # checked here: a bad mode failed at torch.compile, after minutes of gates
        "--compile-mode", default="default", choices=("default", "reduce-overhead", "max-autotune")
    )
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    if args.iters < 10 or args.iters % 5:
        ap.error(f"--iters must be a multiple of 5 (5 alternating rounds), at least 10, got {args.iters}")
    if min(args.vision_layers, args.lm_layers) < 1:
        ap.error(f"--vision-layers and --lm-layers must be >= 1, got {args.vision_layers} and {args.lm_layers}")
    if not args.tiny:
        require_cuda(ap, "the full-size run (or --tiny for a CPU smoke test)")
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.vision_layers, args.lm_layers = min(args.vision_layers, 2), min(args.lm_layers, 2)

    from flashrt_ros.adopt import Gates, accelerate
    from flashrt_ros.adopt.gate import parity
    from flashrt_ros.bench.timing import HEADER, Latency, time_call, write_result

    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    torch.manual_seed(0)
    model, inputs = build(args.tiny, args.vision_layers, args.lm_layers)
    reference = _fp32_outputs(model, inputs, device)
    model = model.to(device, dtype).eval()
    inputs = {k: v.to(device, dtype) for k, v in inputs.items()}

    rounds = 5
    gates = Gates(latency=not args.tiny, rounds=rounds, iters=args.iters // rounds)
    report = accelerate(model, lambda: run(model, inputs), gates)
    print(report.table())

    with report.unpatched():
        t0 = time.perf_counter()
        compiled = {name: torch.compile(part, mode=args.compile_mode) for name, part in model.items()}
        with torch.no_grad():
            run(compiled, inputs)
        compile_s = time.perf_counter() - t0
        with torch.no_grad():
            outs = {"eager": run(model, inputs), "compile": run(compiled, inputs)}
    with torch.no_grad():
        outs["adopt"] = run(model, inputs)

    def timed(mode: str) -> list[float]:
        call = (lambda: run(compiled, inputs)) if mode == "compile" else (lambda: run(model, inputs))
        if mode == "adopt":
            return time_call(call, gates.iters, 2, device)
        with report.unpatched():
            return time_call(call, gates.iters, 2, device)

    samples: dict[str, list[float]] = {m: [] for m in outs}
    with torch.no_grad():
        for i in range(rounds):  # alternating: the order turns each round, so no mode always follows another
            modes = list(samples)[i % len(samples) :] + list(samples)[: i % len(samples)]
            for mode in modes:
                samples[mode] += timed(mode)
    lat = {m: Latency.from_samples(f"prefix {m}", s) for m, s in samples.items()}
    par = {m: parity(reference, [t.float() for t in o]) for m, o in outs.items()}

    print(f"\nHF SigLIP ({args.vision_layers} layers) + Gemma ({args.lm_layers} layers), {dtype}, {device}")
    print(HEADER + "   cos vs fp32   max abs")
    for m in outs:
        print(f"{lat[m].row()}   {par[m].cos:.6f}   {par[m].max_abs:.3g}")
    print(f"adopted: {', '.join(report.kept) or 'nothing'}; compile ({args.compile_mode}) took {compile_s:.1f} s")
    eager, adopt, comp = (lat[m].median_ms for m in ("eager", "adopt", "compile"))
    print(f"adopt vs eager {eager / adopt:.3f}x, vs compile {comp / adopt:.3f}x (medians)")
    write_result(
        args.out,
        "adopt_hf",
        device,
        settings=dict(vars(args), out=str(args.out), dtype=str(dtype), **_hf_versions(model)),
        adopt=report.to_dict(),
        latency={m: v.to_dict() for m, v in lat.items()},
        parity_vs_fp32={m: v.to_dict() for m, v in par.items()},
        compile_s=compile_s,
    )


def _hf_versions(model: nn.Module) -> dict:
    """What decides the eager modules' code and speed: transformers' version and each model's
    attention implementation (sdpa or eager)."""
    import transformers

    attention = {name: getattr(part.config, "_attn_implementation", None) for name, part in model.items()}
    return {"transformers": transformers.__version__, "attn_implementation": attention}


def _fp32_outputs(model: nn.Module, inputs: dict, device: torch.device) -> list[torch.Tensor]:
    """The same modules and inputs in fp32 (TF32 off): the parity reference."""
    ref = copy.deepcopy(model).to(device, torch.float32).eval()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # the patch conv too
    try:
        with torch.no_grad():
            out = [t.float() for t in run(ref, {k: v.to(device) for k, v in inputs.items()})]
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    del ref
    return out


if __name__ == "__main__":
    main()
