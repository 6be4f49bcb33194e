"""Would FP8 (e4m3) GEMMs keep the action chunk? A simulation on any device, before any FP8
kernel is written: the chosen GEMMs of the fp32 reference model get fake-quantised operands
(weights per output channel, activations per row, each scaled to e4m3's range, rounded to e4m3 and
back to fp32: what a row-wise scaled FP8 GEMM with fp32 accumulation computes), and the chunk is
compared with the unquantised model's for the same inputs and noise (cosine, max abs).

    python bench/fp8_sim.py [--policy pi05] [--views 3] [--device cpu] [--parts prefix_lm,vision]
                            [--format e4m3|e4m3_block128|bf16] [--only q_proj,k_proj,...]

`--format e4m3_block128` scales per 1 x 128 block of an activation row and per 128 x 128 tile of a
weight (fine-grained scaling) instead of per row / output channel. `--format bf16` rounds the
same operands to bf16 instead: the scale against which to read FP8's
numbers (the fused bf16 path measures cosine ~0.99999 against the fp32 reference).

Full size in fp32 needs ~12 GB of memory; on a CPU one decision takes minutes.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_ros.bench.args import at_least, out_folder
from flashrt_ros.bench.parity import chunk_parity
from flashrt_ros.bench.reference import Case, build_random
from flashrt_ros.bench.timing import write_result
from flashrt_ros.policies.config import PolicyConfig

E4M3_MAX = 448.0
PARTS = {"prefix_lm": "prefix_lm.", "vision": "vision.", "expert": "expert."}


def _fake_e4m3(t: torch.Tensor, dims) -> torch.Tensor:
    """t rounded to e4m3 with one fp32 scale per slice over `dims` (amax -> 448), dequantised."""
    scale = t.abs().amax(dim=dims, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (t / scale).to(torch.float8_e4m3fn).to(t.dtype) * scale


def fake_fp8(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x rounded to e4m3 with one fp32 scale per slice along `dim`, dequantised."""
    return _fake_e4m3(x, dim)


def fake_fp8_blocks(x: torch.Tensor, dim: int, block: int = 128) -> torch.Tensor:
    """e4m3 with one scale per `block` consecutive elements along the last (K) dim, and for a
    weight (dim=1) per 128 x 128 tile: DeepSeek-V3's fine-grained FP8 scaling."""
    *lead, k = x.shape
    if k % block:
        return fake_fp8(x, dim)
    if dim == 1 and x.dim() == 2 and x.shape[0] % block == 0:  # weight [N, K]: 128 x 128 tiles
        return _fake_e4m3(x.reshape(x.shape[0] // block, block, k // block, block), (1, 3)).reshape(x.shape)
    return _fake_e4m3(x.reshape(*lead, k // block, block), -1).reshape(x.shape)  # activations: 1 x 128 per row


def fake_bf16(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


FORMATS = {"e4m3": fake_fp8, "e4m3_block128": fake_fp8_blocks, "bf16": fake_bf16}


class FakeQuantLinear(nn.Module):
    """nn.Linear with fake-quantised operands: weight per output channel, input per row."""

    def __init__(self, linear: nn.Linear, fmt: str):
        super().__init__()
        self.quant = FORMATS[fmt]
        self.weight = nn.Parameter(self.quant(linear.weight.detach(), dim=1), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.quant(x, dim=-1), self.weight, self.bias)


def quantise(model: nn.Module, prefixes: tuple[str, ...], fmt: str, only: tuple[str, ...] = ()) -> int:
    """Swap every nn.Linear under the given module-name prefixes (and, with `only`, whose name
    ends with one of those) for a FakeQuantLinear."""
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.startswith(prefixes) and (not only or n.endswith(only))
    ]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, FakeQuantLinear(getattr(owner, child), fmt))
    return len(names)


def decide(model: nn.Module, case: Case) -> torch.Tensor:
    with torch.no_grad():
        return model.sample_actions(
            case.pixels, case.image_masks, case.tokens, case.token_masks, state=case.state, noise=case.noise
        )[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05")
    ap.add_argument("--views", type=at_least(1), default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--parts", default="prefix_lm,vision", help=f"comma-separated, from {', '.join(PARTS)}")
    ap.add_argument("--format", default="e4m3", choices=sorted(FORMATS))
    ap.add_argument(
        "--only", default="", help="comma-separated linear names, e.g. q_proj,k_proj,v_proj,gate_proj,up_proj"
    )
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if any(part not in PARTS for part in parts) or len(set(parts)) < len(parts):
        # before the model is built: the fp32 reference decision takes minutes on a CPU at full size
        ap.error(f"--parts: expected distinct names from {', '.join(PARTS)}, got {args.parts!r}")
    dev = torch.device(args.device)
    cfg = PolicyConfig.preset(args.policy, num_views=args.views, dtype="float32")
    model = build_random(cfg, dev)
    case = Case.make(cfg, dev, args.views)
    t0 = time.perf_counter()
    ref = decide(model, case)
    print(f"fp32 reference decision: {time.perf_counter() - t0:.1f} s")
    results = {}
    done: list[str] = []
    for part in parts:  # cumulative: each row adds one part to the FP8 set
        n = quantise(model, (PARTS[part],), args.format, tuple(o for o in args.only.split(",") if o))
        done.append(part)
        got = decide(model, case)
        # the chunk minus the noise too: both chunks start from one noise, which lifts the chunk's cosine
        parity = chunk_parity(got, ref, case.noise[0])
        results["+".join(done)] = r = dict(parity["chunk"], minus_noise=parity["chunk_minus_noise"], linears=n)
        where = f"{args.format} GEMM operands in {'+'.join(done):<24} ({n:3d} more linears)"
        print(
            f"{where}: cosine {r['cosine']:.6f} (chunk - noise {r['minus_noise']['cosine']:.6f}), "
            f"max abs {r['max_abs']:.3e} (chunk |max| {r['ref_abs_max']:.2f})"
        )
    write_result(
        args.out,
        "fp8_sim",
        dev,
        policy=args.policy,
        views=args.views,
        format=args.format,
        only=args.only,
        results=results,
    )


if __name__ == "__main__":
    main()
