"""What real-time chunking costs a decision on the fused path, and its parity. GPU.

    python bench/rtc_cost.py [--policy pi05] [--views 3] [--rounds 5] [--iters 20] [--out DIR]

Full-size random weights in bf16, three 480x640 frames from the host, a ~150-token prompt
(bench/decide_host.py's set-up). Three modes in alternating rounds, each a full decision (new frame
ids) and one on the re-used prefix (the same ids: the denoise alone on the GPU):

- ``plain``: a pipeline built without rtc (the unguided denoise graphs);
- ``guided, no hold``: built with rtc, deciding without a hold (the guided graphs, weights 0);
- ``guided, held``: the same pipeline held to an executing chunk (shift 2, 3 actions delayed).

The table gives `Pipeline.decide`'s wall time (median, p90, p99) and the denoise stage's GPU time
(CUDA events) per mode, with the ratio to ``plain``. Parity: ``guided, no hold`` against ``plain``
for the same noise (max abs difference: the zero-weight correction must change nothing), and the
held fused chunk against the reference backend's held chunk (identity Jacobian, same noise and
hold): max abs error and cosine, beside the unguided pair's.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from flashrt_ros.bench.args import require_cuda
from flashrt_ros.bench.parity import compare
from flashrt_ros.bench.timing import write_result
from flashrt_ros.engine.pipeline import Pipeline
from flashrt_ros.engine.real_time_chunking import ExecutingChunk, RtcSettings, hold
from flashrt_ros.policies.policy import Observation

DOF = 14
STEP_NS = 20_000_000
MODES = ("plain", "guided, no hold", "guided, held")


def main() -> None:
    from prefix_reuse import full_size_observation, rounds_parser  # bench/ is on sys.path when run as a script

    ap = rounds_parser(__doc__)
    args = ap.parse_args()
    require_cuda(ap, "rtc_cost.py")
    dev = torch.device("cuda")
    policy, obs, tokens = full_size_observation(args.policy, args.views, DOF, dev)
    cfg = policy.cfg
    noise = policy.model.noise(1, torch.Generator(device=dev).manual_seed(1), dev)
    pipes = {"plain": Pipeline(policy, backend="fused"), "guided": Pipeline(policy, backend="fused", rtc=RtcSettings())}
    executing = ExecutingChunk(pipes["plain"].decide(obs, noise).actions, 0, STEP_NS)
    held = hold(executing, 2 * STEP_NS, 5 * STEP_NS, cfg.horizon, RtcSettings())

    def decide(mode: str, o: Observation, reuse: bool | None = None) -> tuple[float, float, np.ndarray]:
        """One decision's wall and denoise microseconds and its chunk; `reuse`: whether it must
        have re-used the prefix (else the row it is timed for is not what it says)."""
        pipe = pipes["plain" if mode == "plain" else "guided"]
        t0 = time.perf_counter()
        d = pipe.decide(o, noise, hold=held if mode == "guided, held" else None)
        wall = (time.perf_counter() - t0) * 1e6
        if reuse is not None and d.prefix_reused != reuse:
            raise SystemExit(f"{mode}: a decision timed as prefix_reused={reuse} had prefix_reused={d.prefix_reused}")
        return wall, d.timings_ms["denoise"] * 1e3, d.actions

    # parity first (and warm-up): the chunks of each mode, and the reference backend's
    chunks = {m: decide(m, obs)[2] for m in MODES}
    ref = Pipeline(policy, backend="reference", rtc=RtcSettings())
    ref_plain = ref.decide(obs, noise).actions
    ref_held = ref.decide(obs, noise, hold=held).actions
    held_vs_ref = compare(torch.from_numpy(chunks["guided, held"]), torch.from_numpy(ref_held))
    plain_vs_ref = compare(torch.from_numpy(chunks["plain"]), torch.from_numpy(ref_plain))
    parity = {
        "no hold vs plain, max abs": float(np.abs(chunks["guided, no hold"] - chunks["plain"]).max()),
        "held fused vs held reference, max abs": held_vs_ref["max_abs"],
        "held fused vs held reference, cosine": held_vs_ref["cosine"],
        "plain fused vs plain reference, max abs": plain_vs_ref["max_abs"],
        "plain fused vs plain reference, cosine": plain_vs_ref["cosine"],
        "held rows from the executing chunk, max abs": float(
            np.abs(chunks["guided, held"][: held.delay] - held.target[: held.delay]).max()
        ),
        "held rows from the executing chunk unguided, max abs": float(
            np.abs(chunks["plain"][: held.delay] - held.target[: held.delay]).max()
        ),
    }
    del ref
    found = {(m, reuse): {"wall": [], "denoise": []} for m in MODES for reuse in (False, True)}
    for r in range(args.rounds):
        for m in MODES if r % 2 == 0 else tuple(reversed(MODES)):
            for reuse in (False, True):
                if reuse:  # untimed: the prefix of the frames the re-used decisions see, built here
                    decide(m, dataclasses.replace(obs, frame_ids=(0,) * args.views))
                for i in range(args.iters):
                    ids = (0,) * args.views if reuse else tuple((r, i, v, m) for v in range(args.views))
                    wall, den, _ = decide(m, dataclasses.replace(obs, frame_ids=ids), reuse)
                    found[(m, reuse)]["wall"].append(wall)
                    found[(m, reuse)]["denoise"].append(den)
    # (a line of its own: the progress bars before it end without a newline)
    print(f"\n{args.policy} {args.views}v bf16, {tokens} prompt tokens, {args.views}x480x640 frames from the host")
    print(f"{args.rounds} alternating rounds x {args.iters} decisions per mode and case; microseconds")
    print(f"hold: shift {held.shift}, {held.delay} actions delayed, overlap {held.overlap} of {cfg.horizon}\n")
    print(f"{'case':28}{'mode':18}{'wall p50':>10}{'p90':>10}{'p99':>10}{'denoise p50':>13}{'wall ratio':>12}")
    results = {}
    for reuse in (False, True):
        case = "prefix re-used" if reuse else "full decision"
        base = np.median(found[("plain", reuse)]["wall"])
        for m in MODES:
            w, d = np.array(found[(m, reuse)]["wall"]), np.array(found[(m, reuse)]["denoise"])
            row = {
                "wall_median_us": float(np.median(w)),
                "wall_p90_us": float(np.percentile(w, 90)),
                "wall_p99_us": float(np.percentile(w, 99)),
                "denoise_median_us": float(np.median(d)),
                "wall_ratio_to_plain": float(np.median(w) / base),
            }
            results[f"{case}, {m}"] = row
            print(
                f"{case:28}{m:18}{row['wall_median_us']:>10.1f}{row['wall_p90_us']:>10.1f}{row['wall_p99_us']:>10.1f}"
                f"{row['denoise_median_us']:>13.1f}{row['wall_ratio_to_plain']:>12.3f}"
            )
    print()
    for k, v in parity.items():
        print(f"{k:55}{v:.6g}")
    write_result(args.out, "rtc_cost", dev, policy=args.policy, views=args.views, results=results, parity=parity)


if __name__ == "__main__":
    main()
