"""How long the node takes from its parameters to its first chunk: the checkpoint's load, the
fused path's build (weights re-laid out), the kernels' compile and the CUDA graphs' capture, and
the node's warm-up decision and its first live one; with Triton's cache empty (the first start
on a machine) and filled (every later start). GPU (`--tiny`: a CPU smoke run of the same steps).

    python bench/startup.py [--policy pi05] [--views 3] [--out DIR] [--tiny] [--profile]

The parent writes a random checkpoint in LeRobot's layout (fp32 weights; the tiny tokenizer's
512-row token embedding, where PaliGemma's 257,152 rows would add 2.1 GB in fp32) with identity
statistics, then starts one process per case with TRITON_CACHE_DIR on one folder: "cold" finds
it empty, "warm" finds what "cold" left there. Each process does what the node's start-up does
(`read_policy`, `PolicySource.build`, `Pipeline(backend="fused", release_reference=True)`,
`Pipeline.warm_up` on black 480x640 frames), times each step, then, 0.5 s later (a node waits for
its first inputs at least that long), decides on three 480x640 frames and a ~150-token prompt:
the first decision, and the median of the next ten, back to back. The checkpoint is read from
the page cache (the parent has just written it): a robot's first read from its disk comes on top.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flashrt_ros.bench.args import at_least, out_folder

DOF = 14
CASES = ("cold", "warm")
PROFILE_MARK = "first decision, slowest calls (cProfile):"
IDLE_BEFORE_FIRST_S = 0.5  # between the warm-up and the first decision: a node waits for inputs that long


def write_checkpoint(kind: str, views: int, folder: Path, tiny: bool) -> float:
    """A random policy saved as LeRobot saves one, with identity statistics; returns its GB."""
    from flashrt_ros.policies.checkpoint import WEIGHTS_FILE, save_model
    from flashrt_ros.policies.policy import build_policy

    cfg = policy_config(kind, views, tiny).replace(dtype="float32")
    dev = "cpu" if tiny or not torch.cuda.is_available() else "cuda"
    policy = build_policy(cfg, tokenizer(), seed=0, device=dev, action_dof=DOF)
    save_model(policy.model, folder, layout="lerobot", robot_dof=DOF)
    del policy
    if dev == "cuda":  # the children need the memory, not this process's allocator cache
        torch.cuda.empty_cache()
    stats = {"mode": "identity", "norm_stats": {"state": {}, "actions": {}}}
    (folder / "norm_stats.json").write_text(json.dumps(stats))
    return (folder / WEIGHTS_FILE).stat().st_size / 1e9


def policy_config(kind: str, views: int, tiny: bool):
    from flashrt_ros.policies.config import PolicyConfig

    if tiny:
        return PolicyConfig.tiny(kind, num_views=views)
    return PolicyConfig.preset(kind, num_views=views, dtype="bfloat16").replace(vocab_size=512)


def tokenizer() -> str:
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    return str(tiny_tokenizer_path())


def start(kind: str, views: int, folder: Path, tiny: bool, later: int = 10, profile: bool = False) -> dict[str, float]:
    """The node's start-up steps, timed (seconds), then its first decisions (milliseconds); with
    `profile`, the first decision's slowest calls go to stderr (what a first decision does once)."""
    from flashrt_ros.policies import fused as fused_module

    spent: dict[str, float] = {}
    capture = fused_module.FusedPi0.capture

    def timed_capture(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return capture(self, *args, **kwargs)
        finally:
            spent["kernels + graphs (capture) s"] = time.perf_counter() - t0

    fused_module.FusedPi0.capture = timed_capture
    t0 = time.perf_counter()
    dev = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    torch.zeros(1, device=dev)
    spent["torch + CUDA context s"] = time.perf_counter() - t0

    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies.policy import read_policy

    t = time.perf_counter()
    source = read_policy(policy_config(kind, views, tiny), tokenizer(), checkpoint=folder)
    policy = source.build(dev, action_dof=DOF)
    spent["checkpoint load s"] = time.perf_counter() - t
    t = time.perf_counter()
    pipe = Pipeline(policy, backend="fused", release_reference=True)
    build_s = time.perf_counter() - t  # the re-layout and the capture, which timed_capture reports apart
    spent["fused build without the capture s"] = build_s - spent.get("kernels + graphs (capture) s", 0.0)
    from prefix_reuse import node_observation  # bench/ is on sys.path when run as a script

    obs, _ = node_observation(policy, views, DOF)
    spent["warm-up decision ms"] = pipe.warm_up(DOF, obs.prompt, (480, 640))
    time.sleep(IDLE_BEFORE_FIRST_S)
    t = time.perf_counter()
    with first_decision_profile(profile):
        pipe.decide(with_ids(obs, 0))
    spent["first decision ms"] = (time.perf_counter() - t) * 1e3
    spent["to the first chunk s"] = time.perf_counter() - t0 - IDLE_BEFORE_FIRST_S
    times = []
    for i in range(1, later + 1):
        t = time.perf_counter()
        pipe.decide(with_ids(obs, i))
        times.append((time.perf_counter() - t) * 1e3)
    spent["later decisions, median ms"] = statistics.median(times)
    return spent


@contextlib.contextmanager
def first_decision_profile(on: bool):
    """cProfile around the first decision; its 15 largest cumulative times printed to stderr."""
    if not on:
        yield
        return
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        print(PROFILE_MARK, file=sys.stderr)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(15)


def with_ids(obs, i: int):
    """`obs` under frame ids no decision saw before (the prefix runs each time)."""
    return dataclasses.replace(obs, frame_ids=tuple((i, v) for v in range(len(obs.images))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="pi05", choices=["pi05", "pi0"])
    ap.add_argument("--views", type=at_least(1), default=3)
    ap.add_argument("--out", type=out_folder, default="bench_results")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU: a smoke run of the steps")
    ap.add_argument("--profile", action="store_true", help="print the first decision's slowest calls (cProfile)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a checkpoint folder: time one start
    args = ap.parse_args()
    if args.child:
        later = 2 if args.tiny else 10
        spent = start(args.policy, args.views, Path(args.child), args.tiny, later=later, profile=args.profile)
        print("STARTUP " + json.dumps(spent), flush=True)
        return
    if not args.tiny and not torch.cuda.is_available():  # else minutes and an 11 GB checkpoint first
        ap.error("the full-size start-up needs a CUDA GPU (or --tiny for a CPU smoke run)")
    with tempfile.TemporaryDirectory() as tmp:
        folder, cache = Path(tmp) / "checkpoint", Path(tmp) / "triton_cache"
        t = time.perf_counter()
        gb = write_checkpoint(args.policy, args.views, folder, args.tiny)
        print(f"wrote a random {args.policy} checkpoint ({gb:.2f} GB, fp32) in {time.perf_counter() - t:.0f} s")
        found = {case: run_child(args, folder, cache, case) for case in CASES}
    rows = list(found["cold"])
    print(f"\n{args.policy} {args.views} views, {'tiny, CPU' if args.tiny else 'full size, bf16 fused'}")
    print(f"{'step':42}" + "".join(f"{c:>12}" for c in CASES))
    for row in rows:
        print(f"{row:42}" + "".join(f"{found[c][row]:>12.2f}" for c in CASES))
    from flashrt_ros.bench.timing import write_result

    dev = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    write_result(Path(args.out), "startup", dev, policy=args.policy, views=args.views, checkpoint_gb=gb, results=found)


def run_child(args: argparse.Namespace, folder: Path, cache: Path, case: str) -> dict[str, float]:
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    if args.tiny:  # the kernels on a CPU
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, __file__, "--child", str(folder), "--policy", args.policy, "--views", str(args.views)]
    cmd += (["--tiny"] if args.tiny else []) + (["--profile"] if args.profile else [])
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("STARTUP ")), None)
    if run.returncode != 0 or line is None:
        raise SystemExit(f"start-up run failed ({run.returncode}):\n{run.stderr[-3000:]}")
    if args.profile:  # the child's profile, after its marker
        print(f"\n{case}: " + run.stderr[run.stderr.find(PROFILE_MARK) :])
    return json.loads(line.removeprefix("STARTUP "))


if __name__ == "__main__":
    main()
