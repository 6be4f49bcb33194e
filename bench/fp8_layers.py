"""Which prefix layers can run their gate|up GEMM in FP8? The fp32 reference with the prefix LM's
gate_proj / up_proj fake-quantised (bench/fp8_sim.py's rounding) in chosen layers only, each
set's chunk against the unquantised one (same inputs, noise). CPU is fine (~40 s per decision).

    python bench/fp8_layers.py [--policy pi0] [--views 3] [--device cpu] [--out DIR]

What it decided (2026-12-01, docs/results/fp8_sim_gate_up_layers_*.log): layer 0 (it reads the
raw embeddings) carries most of the error, so `fused.PREFIX_MLP_FP8_FROM` = 1.
"""

from __future__ import annotations

import argparse
import re
import time

import torch
import torch.nn.functional as F
from fp8_sim import decide, fake_fp8, fake_fp8_blocks
from torch import nn

from flashrt_ros.bench.args import out_folder
from flashrt_ros.bench.parity import chunk_parity
from flashrt_ros.bench.reference import Case, build_random
from flashrt_ros.bench.timing import write_result
from flashrt_ros.policies.config import PolicyConfig

GU, DOWN = r"mlp\.(gate|up)_proj", r"mlp\.down_proj"
L1_16, L9_16 = r"layers\.([1-9]|1[0-6])\.", r"layers\.(9|1[0-6])\."
# name: [(regex over the linear's module name, rounding), ...]: the first match rounds a linear
LAYER_SETS = {
    "all": [(GU, fake_fp8)],
    "all, 1 x 128 blocks": [(GU, fake_fp8_blocks)],
    "layers 1-16": [(r"layers\.([1-9]|1[0-6])\." + GU, fake_fp8)],
    "layers 2-15": [(r"layers\.([2-9]|1[0-5])\." + GU, fake_fp8)],
    "layers 0-8": [(r"layers\.[0-8]\." + GU, fake_fp8)],
    "layers 9-17": [(r"layers\.(9|1[0-7])\." + GU, fake_fp8)],
}
# with --down: gate|up in layers 1-16 plus down in some layers (its input scaled per 1 x 128 block,
# or per row)
DOWN_SETS = {
    "gu 1-16 + down 9-16": [(L1_16 + GU, fake_fp8), (L9_16 + DOWN, fake_fp8_blocks)],
    "gu 1-16 + down 1-16": [(L1_16 + GU, fake_fp8), (L1_16 + DOWN, fake_fp8_blocks)],
    "gu 1-16 + down 9-16 rows": [(L1_16 + GU, fake_fp8), (L9_16 + DOWN, fake_fp8)],
    "gu 1-16 + down 1-16 rows": [(L1_16 + GU, fake_fp8), (L1_16 + DOWN, fake_fp8)],
}
# with --attn: the shipped MLP set plus the attention projections (rows scaled) in layers 1-16
QKV, O = r"self_attn\.[qkv]_proj", r"self_attn\.o_proj"
MLP_1_16 = [(L1_16 + GU, fake_fp8), (L1_16 + DOWN, fake_fp8)]
ATTN_SETS = {
    "mlp 1-16 (shipped)": MLP_1_16,
    "+ qkv 1-16": MLP_1_16 + [(L1_16 + QKV, fake_fp8)],
    "+ o 1-16": MLP_1_16 + [(L1_16 + O, fake_fp8)],
    "+ qkv, o 1-16": MLP_1_16 + [(L1_16 + QKV, fake_fp8), (L1_16 + O, fake_fp8)],
    "+ gate|up 0": MLP_1_16 + [(r"layers\.0\." + GU, fake_fp8)],
}


class SwitchableFP8(nn.Module):
    """A linear whose operands are fake-quantised while its name matches the active set."""

    active: list[tuple[str, object]] = []  # [(regex, rounding)], shared by all

    def __init__(self, linear: nn.Linear, name: str):
        super().__init__()
        self.linear, self.name = linear, name

    @property
    def weight(self) -> torch.Tensor:  # the model reads its dtype from q_proj.weight
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rnd = next((r for pattern, r in SwitchableFP8.active if re.search(pattern, self.name)), None)
        if rnd is None:
            return self.linear(x)
        return F.linear(rnd(x, dim=-1), rnd(self.linear.weight, dim=1), self.linear.bias)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi0")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--down", action="store_true", help="the down projection's sets (DOWN_SETS) instead")
    ap.add_argument("--attn", action="store_true", help="the attention projections' sets (ATTN_SETS) instead")
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cfg = PolicyConfig.preset(args.policy, num_views=args.views, dtype="float32")
    model = build_random(cfg, dev)
    for name, m in list(model.named_modules()):
        mlp = name.endswith(("gate_proj", "up_proj", "down_proj", "q_proj", "k_proj", "v_proj", "o_proj"))
        if isinstance(m, nn.Linear) and name.startswith("prefix_lm.") and mlp:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, SwitchableFP8(m, name))
    case = Case.make(cfg, dev, args.views)
    ref = decide(model, case)
    results = {}
    sets = ATTN_SETS if args.attn else DOWN_SETS if args.down else LAYER_SETS
    for label, active in sets.items():
        SwitchableFP8.active = active
        t0 = time.perf_counter()
        parity = chunk_parity(decide(model, case), ref, case.noise[0])  # minus the noise: see fp8_sim.py
        results[label] = r = dict(parity["chunk"], minus_noise=parity["chunk_minus_noise"])
        took = time.perf_counter() - t0
        what = f"{args.policy} FP8 {label:<26}"
        print(
            f"{what} cosine {r['cosine']:.6f} (chunk - noise {r['minus_noise']['cosine']:.6f}) "
            f"max abs {r['max_abs']:.3e} ({took:.0f} s)"
        )
    write_result(args.out, "fp8_layers", dev, policy=args.policy, views=args.views, results=results)


if __name__ == "__main__":
    main()
