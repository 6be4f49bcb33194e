"""In-graph A/B of a module-level setting of the fused path (`flashrt_ros/policies/fused.py`):
the vision and prefix stages (pi0.5, random weights, bf16) captured and timed for each value,
alternating over rounds in one process. A kernel that wins alone can lose inside the stage (cold
weights, neighbours): this measures the choice where it runs. GPU only.

    python bench/fused_ab.py "VISION_NORM_WARPS=none;2" ["PREFIX_ATTENTION_TILES=none;128x32,w8,s3,k2" ...]
                             [--rounds 3] [--out DIR]

Values are separated by `;`, each an integer, `none` or a string; a new choice to measure becomes
such a module-level setting of fused.py first. A setting of another module of the package is named
by its path under `flashrt_ros` (`kernels.<module>.NAME`; the programmatic-dependent-launch A/B
of 2026-12-02 ran `"kernels._common.PDL=1;0"` on the code at ff91910).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from types import ModuleType

import torch

import flashrt_ros.policies.fused as fused_mod
from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.reference import Case, build_random
from flashrt_ros.bench.stages import load_case
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.fused import FusedPi0


def parse_value(text: str) -> int | str | None:
    if text.lower() == "none":
        return None
    return int(text) if text.lstrip("-").isdigit() else text


def parse_setting(text: str) -> tuple[ModuleType, str, list[int | str | None]]:
    path, _, values = text.partition("=")
    module_path, _, name = path.rpartition(".")
    module = importlib.import_module(f"flashrt_ros.{module_path}") if module_path else fused_mod
    if not hasattr(module, name) or not values:
        raise SystemExit(f"{text!r}: expected NAME=v1;v2 with NAME a setting of fused.py (or module.NAME)")
    return module, name, [parse_value(v) for v in values.split(";")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+", help="NAME=v1;v2: values to alternate (one setting at a time)")
    ap.add_argument("--views", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "fused_ab.py")
    settings = [parse_setting(s) for s in args.settings]
    dev = torch.device("cuda")
    cfg = PolicyConfig.preset("pi05", num_views=args.views, dtype="bfloat16")
    fused = FusedPi0(build_random(cfg, dev), torch.bfloat16)
    load_case(fused, Case.make(cfg, dev, args.views))
    results: dict[str, list[float]] = {}
    for module, name, values in settings:
        default = getattr(module, name)
        for rnd in range(args.rounds):
            for value in values:
                setattr(module, name, value)
                for stage in ("vision", "prefix"):
                    ms = graph_ms(getattr(fused, stage), replays=20)
                    results.setdefault(f"{stage} {name}={value}", []).append(ms)
                    print(f"round {rnd}: {stage:<7} {name}={value!s:<6} {ms:.4f} ms", flush=True)
        setattr(module, name, default)
    print()
    for key, values in results.items():
        print(f"{key:<36} median of rounds {statistics.median(values):.4f} ms")
    write_result(args.out, "fused_ab", dev, views=args.views, results=results)


if __name__ == "__main__":
    main()
