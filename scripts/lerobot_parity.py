#!/usr/bin/env python3
"""Parity of our reference policy with LeRobot 0.6.1 (see flashrt_ros/bench/parity.py).

  python3 scripts/lerobot_parity.py --ref /tmp/lr/pi05_fp32 [--checkpoint DIR] [--dtype bfloat16] [--json F]

--ref is the --out folder of scripts/lerobot_reference.py (io.safetensors + io.json).
Exit code 0 only if the chunk cosine passes the gate (>= 0.99999 fp32, >= 0.999 bf16).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_ros.bench.parity import report, run_parity  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, type=Path)
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: REF/checkpoint")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: the reference's")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = run_parity(a.ref / "io.safetensors", a.checkpoint or a.ref / "checkpoint", a.dtype, a.device)
    print(report(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0 if results["gate"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
