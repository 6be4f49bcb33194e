#!/usr/bin/env python3
"""Parity of our reference policy with LeRobot 0.6.1 (see flashrt_ros/bench/parity.py).

  python3 scripts/lerobot_parity.py --ref /tmp/lr/pi05_fp32 [--checkpoint DIR] [--dtype bfloat16] [--json F]

--ref is the --out folder of scripts/lerobot_reference.py (io.safetensors + io.json).
Exit code 0 only if the chunk cosine passes the gate (>= 0.99999 fp32, >= 0.999 bf16); 1 if it
does not; 2 for inputs that cannot be used (a missing folder or file, a checkpoint refused).
The --json file holds the run's environment (commit, versions, device) beside the results.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_ros.bench.parity import report, run_parity  # noqa: E402
from flashrt_ros.bench.timing import environment, finite_or_null  # noqa: E402
from flashrt_ros.policies.checkpoint import CheckpointError  # noqa: E402


def _input_problem(ref: Path, checkpoint: Path, json_out: str | None) -> str | None:
    """What makes the run unusable before it starts (it loads a full-size model first)."""
    for name in ("io.safetensors", "io.json"):
        if not (ref / name).is_file():
            return f"--ref {ref}: no {name} there; expected the --out folder of scripts/lerobot_reference.py"
    if not checkpoint.is_dir():
        return f"--checkpoint {checkpoint}: no such folder; expected the checkpoint the reference was made from"
    if json_out and not Path(json_out).resolve().parent.is_dir():
        return f"--json {json_out}: its folder does not exist"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, type=Path)
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: REF/checkpoint")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: the reference's")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    checkpoint = a.checkpoint or a.ref / "checkpoint"
    problem = _input_problem(a.ref, checkpoint, a.json)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        results = run_parity(a.ref / "io.safetensors", checkpoint, a.dtype, a.device)
    except CheckpointError as exc:
        print(f"--checkpoint {checkpoint}: {exc}", file=sys.stderr)
        return 2
    print(report(results))
    if a.json:
        payload = finite_or_null({"env": environment(torch.device(a.device)), **results})
        Path(a.json).write_text(json.dumps(payload, indent=2, allow_nan=False))
    return 0 if results["gate"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
