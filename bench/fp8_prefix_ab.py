"""The FP8 choices of the prefix stage, A/B in one process: each variant is its own FusedPi0
(bf16; FP8 gate|up; FP8 gate|up + FP8 down from a layer on) built from the same random pi0.5 or
pi0, its prefix stage timed from its CUDA graph in alternating rounds, and its chunk compared with
the fp32 reference (same inputs and noise). GPU only.

    python bench/fp8_prefix_ab.py [--policy pi05] [--views 3] [--rounds 7] [--down-from 1,9] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import flashrt_ros.policies.fused as fused_mod
from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.parity import chunk_parity
from flashrt_ros.bench.reference import Case, build_random, true_fp32
from flashrt_ros.bench.stages import load_case
from flashrt_ros.bench.timing import write_result
from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.fused import FusedPi0


def _stage_ms(fused: FusedPi0, stage: str, replays: int = 20) -> float:
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fused.run(stage)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--down-from", default="1,9", help="comma list of PREFIX_DOWN_FP8_FROM values to try")
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "fp8_prefix_ab.py")
    dev = torch.device("cuda")
    cfg = PolicyConfig.preset(args.policy, num_views=args.views, dtype="float32")
    model = build_random(cfg, dev)
    case = Case.make(cfg, dev, args.views)
    with true_fp32():  # the reference as flashrt bench takes it
        ref = model.sample_actions(*case.args(), noise=case.noise)[0]
    variants = {"bf16": (False, None), "fp8 gate|up": (True, None)}
    variants.update({f"fp8 gate|up + down from {d}": (True, int(d)) for d in args.down_from.split(",") if d})
    built, results = {}, {}
    for name, (fp8, down_from) in variants.items():
        fused_mod.PREFIX_DOWN_FP8_FROM = down_from
        fused = FusedPi0(model, torch.bfloat16, prefix_mlp_fp8=fp8)
        down = any(w.down_scale is not None for w in fused.prefix_layers)
        if fp8 != fused.prefix_mlp_fp8 or (down_from is not None) != down:  # a row must run what it is named
            raise RuntimeError(f"{name}: not what was built here: {fused.describe()}")
        load_case(fused, case)
        fused.capture()
        chunk = fused.sample_actions().clone()
        built[name] = fused
        results[name] = dict(parity=chunk_parity(chunk, ref, case.noise[0]), prefix_ms=[], full_ms=[])
    fused_mod.PREFIX_DOWN_FP8_FROM = None
    for _ in range(args.rounds):
        for name, fused in built.items():
            results[name]["prefix_ms"].append(_stage_ms(fused, "prefix"))
            results[name]["full_ms"].append(_stage_ms(fused, "prefix") + _stage_ms(fused, "denoise"))
    head = f"{'prefix ms':>10} {'prefix+denoise':>15} {'cosine':>9} {'- noise':>9} {'max abs':>9}"
    print(f"{args.policy} {args.views}v{'':<30} {head}")
    for name, r in results.items():
        r["prefix_median_ms"] = statistics.median(r["prefix_ms"])
        r["full_median_ms"] = statistics.median(r["full_ms"])
        p, q = r["parity"]["chunk"], r["parity"]["chunk_minus_noise"]
        print(
            f"{name:<36} {r['prefix_median_ms']:10.3f} {r['full_median_ms']:15.3f} "
            f"{p['cosine']:9.6f} {q['cosine']:9.6f} {p['max_abs']:9.2e}"
        )
    write_result(args.out, "fp8_prefix_ab", dev, policy=args.policy, views=args.views, results=results)


if __name__ == "__main__":
    main()
