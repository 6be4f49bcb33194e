"""Where a fused decision's GPU time goes: each stage run once, un-graphed, under the torch
profiler (kernel device times and launch counts), next to the stage's graph-replay time (the
difference is launch gaps). GPU only.

    python bench/profile_fused.py [--policy pi05] [--views 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.stages import random_fused
from flashrt_ros.bench.timing import environment, time_call


def kernel_table(fn) -> tuple[list[dict], list[dict]]:
    """Per kernel name: calls and device time; and every kernel in launch order (name, us)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    device = [e for e in prof.events() if (getattr(e, "device_time", 0) or 0) > 0 and e.device_type.name == "CUDA"]
    device.sort(key=lambda e: e.time_range.start)
    sequence = [dict(kernel=e.name[:60], us=round(e.device_time, 2)) for e in device]
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count > 0:
            rows.append(dict(kernel=e.key[:90], calls=e.count, total_us=t, per_call_us=t / e.count))
    rows.sort(key=lambda r: -r["total_us"])
    return rows, sequence


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "profile_fused.py")
    dev = torch.device("cuda")
    _, _, fused = random_fused(args.policy, args.views, dev, model_dtype="bfloat16")
    report = {"env": environment(dev), "policy": args.policy, "views": args.views}
    for stage in ("vision", "prefix", "denoise"):  # vision: part of the prefix graph, here un-graphed
        stage_ms = sorted(time_call(lambda s=stage: fused.run(s), 30, 5, dev))[15]
        rows, sequence = kernel_table(getattr(fused, stage))
        busy_ms = sum(r["total_us"] for r in rows) / 1e3
        launches = sum(r["calls"] for r in rows)
        how = "graph" if (stage, fused.views, fused.bucket) in fused.graphs else "eager"
        print(f"\n== {stage}: {how} {stage_ms:.3f} ms, kernels busy {busy_ms:.3f} ms, {launches} launches")
        print(f"{'kernel':<70} {'calls':>6} {'total us':>9} {'us/call':>8}")
        for r in rows[:22]:
            print(f"{r['kernel'][:70]:<70} {r['calls']:6d} {r['total_us']:9.1f} {r['per_call_us']:8.2f}")
        # one layer in launch order: around the 5th attention kernel (vision: SDPA, prefix: ours)
        marks = [i for i, r in enumerate(sequence) if "attn" in r["kernel"] or "sdpa" in r["kernel"]]
        if len(marks) > 5:
            print("one layer in launch order:")
            for r in sequence[marks[4] - 6 : marks[5] - 6]:
                print(f"    {r['kernel']:<60} {r['us']:8.2f}")
        report[stage] = dict(ms=stage_ms, run_as=how, busy_ms=busy_ms, launches=launches)
        report[stage] |= dict(kernels=rows, sequence=sequence)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile_{args.policy}_{args.views}v_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
