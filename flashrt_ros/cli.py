"""`flashrt` command line: benchmarks and quick checks without ROS.

flashrt bench [--policy pi05] [--views 1,2,3] [--modes eager,compile,fused] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from .bench.timing import HEADER, Latency, environment


def _bench(args: argparse.Namespace) -> int:
    from .bench.reference import Case, build_random, measure_reference
    from .policies.config import PolicyConfig

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    results: dict = {"env": environment(device), "settings": vars(args).copy(), "runs": []}
    rows: list[Latency] = []
    for kind in args.policy.split(","):
        preset = kind + ("_tiny" if args.tiny else "")
        cfg = PolicyConfig.preset(
            preset, dtype=args.dtype, num_views=max(args.views), num_steps=args.steps, horizon=args.horizon
        )
        model = build_random(cfg, device, args.seed)
        for views in args.views:
            case = Case.make(cfg, device, views)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            label = f"{kind} {views}v eager"
            lat = measure_reference(model, case, args.iters, args.warmup, label)
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            rows += lat.values()
            results["runs"].append(
                {
                    "policy": kind,
                    "views": views,
                    "mode": "eager",
                    "peak_gib": peak,
                    **{k: v.to_dict() for k, v in lat.items()},
                }
            )
        del model
    print(HEADER)
    for row in rows:
        print(row.row())
    for run in results["runs"]:
        if run["peak_gib"] is not None:
            print(f"peak memory {run['policy']} {run['views']}v {run['mode']}: {run['peak_gib']:.2f} GiB")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"bench_{time.strftime('%Y%m%d_%H%M%S')}.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path}")
    return 0


def _views(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashrt", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="decision latency of the policies (reference eager, compile, fused)")
    b.add_argument("--policy", default="pi05", help="comma list of pi05, pi0")
    b.add_argument("--views", type=_views, default=[3], help="comma list of view counts, e.g. 1,2,3")
    b.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--horizon", type=int, default=50)
    b.add_argument("--iters", type=int, default=50)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--device", default=None)
    b.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke runs)")
    b.add_argument("--out", default=None, help="folder for the JSON result")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "bench":
        return _bench(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
