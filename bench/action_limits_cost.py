"""What the action limits cost the decision thread: ``ActionLimits.apply`` on a pi0.5-sized chunk
(50 x 14 float32) with all three limits set, for a chunk within them and for one far beyond them
(every value limited). Medians and p99 over 2000 calls (--calls), on this machine's CPU.

    python bench/action_limits_cost.py      (after `source scripts/env.sh`)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flashrt_ros.engine.action_limits import ActionLimits


def percentiles_us(limits: ActionLimits, actions: np.ndarray, state: np.ndarray, calls: int = 2000) -> tuple:
    for _ in range(100):  # warm-up
        limits.apply(actions, state)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        limits.apply(actions, state)
        times.append((time.perf_counter() - t0) * 1e6)
    return np.percentile(times, 50), np.percentile(times, 99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per chunk (after 100 untimed)")
    args = ap.parse_args()
    if args.calls < 100:
        ap.error(f"--calls must be at least 100 (a p99 of fewer is one sample), got {args.calls}")
    limits = ActionLimits.from_lists([f"j{i}" for i in range(14)], [-1.0], [1.0], [0.05])
    rng = np.random.default_rng(0)
    within = (np.cumsum(rng.uniform(-0.04, 0.04, (50, 14)), axis=0) * 0.3).astype(np.float32)
    beyond = rng.normal(0, 2, (50, 14)).astype(np.float32)
    state = np.zeros(14)
    for name, chunk in (("within its limits", within), ("far beyond them (every value limited)", beyond)):
        p50, p99 = percentiles_us(limits, chunk, state, args.calls)
        print(f"chunk {name}: p50 {p50:.0f} us, p99 {p99:.0f} us")


if __name__ == "__main__":
    main()
