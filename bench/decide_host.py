"""Where the node's decision spends its wall time outside the GPU's work, and what overlapping
the host's tokenising with vision gains. GPU.

    python bench/decide_host.py [--policy pi05] [--views 3] [--rounds 5] [--iters 20] [--gap-ms 20] [--out DIR]

`Pipeline.decide` as the node calls it (full-size random weights in bf16, 480x640 frames in the
frame pool's page-locked memory, a ~150-token prompt: bench/prefix_reuse.py's set-up), with the
prefix run (new frame ids) and re-used (the same ids), each `--gap-ms` after the last and also
back to back (gap 0). Two modes in alternating rounds on one pipeline: "serial" is the path as it
was before the split (all host work first: tokens, checks, the prefix key; then the prefix stage
as one CUDA graph of vision + prefix LM, captured here), "overlapped" the current one (on new
frames the vision graph is queued first and the host makes the tokens while it runs; then the
prefix LM's own graph). Each host step is timed with the monotonic clock by wrapping it; the
table gives each step's median microseconds per decision, then the wall time of `decide`
(median, p90) in each mode and their ratio. The chunks of both modes must be equal.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from flashrt_ros.bench.args import number_at_least, require_cuda
from flashrt_ros.bench.timing import write_result
from flashrt_ros.engine import pipeline as pipeline_module
from flashrt_ros.engine.pipeline import Pipeline
from flashrt_ros.policies import cuda_graphs
from flashrt_ros.policies import fused as fused_module
from flashrt_ros.policies import policy as policy_module
from flashrt_ros.policies.policy import Observation

DOF = 14
SPENT: dict[str, float] = defaultdict(float)  # step -> seconds in the current decision


def timed_step(owner: object, name: str, label: str) -> None:
    """Wrap owner.name so that its host time adds to SPENT[label]."""
    original = getattr(owner, name)

    def run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - t0

    setattr(owner, name, run)


def instrument() -> None:
    timed_step(pipeline_module.Pipeline, "_host_inputs", "tokens + checks + prefix key")
    timed_step(pipeline_module.PrefixCache, "lookup", "prefix cache lookup")
    timed_step(pipeline_module.PrefixCache, "builds_whatever_the_prompt", "prefix cache: runs whatever the prompt?")
    timed_step(pipeline_module.PrefixKey, "frames_of", "frame ids checked")
    timed_step(policy_module.Policy, "check_frames", "frames checked")
    timed_step(fused_module.FusedPi0, "set_frames", "frames: upload + pre-processing launch")
    timed_step(fused_module.FusedPi0, "set_inputs", "tokens / state / noise to the GPU")
    timed_step(fused_module.FusedPi0, "run", "graph launches")
    timed_step(fused_module.FusedPi0, "actions_to_host", "chunk to the host (wait for the GPU + copy)")
    timed_step(pipeline_module._Timer, "mark", "CUDA event marks")
    timed_step(pipeline_module._Timer, "resolve", "event read-out")
    timed_step(policy_module.Policy, "postprocess", "un-normalise (postprocess)")


MODES = ("serial", "overlapped")


def one_prefix_graph(fused: fused_module.FusedPi0) -> Callable[[str], None]:
    """`fused.run` as it was before the split: the prefix stage (vision + prefix LM) as one CUDA
    graph, captured here at the current shape."""
    shape = fused.views, fused.bucket
    graph = cuda_graphs.capture(fused.prefix, fused.device)

    def run(stage: str) -> None:
        if stage != "prefix":
            fused_module.FusedPi0.run(fused, stage)  # the class's: timed by `instrument`
            return
        assert (fused.views, fused.bucket) == shape, "one input shape per run of this bench"
        t0 = time.perf_counter()
        fused.prefix_serial += 1
        graph.replay()
        fused.cached = shape
        SPENT["graph launches"] += time.perf_counter() - t0

    return run


def set_mode(pipe: Pipeline, mode: str, serial_run: Callable[[str], None]) -> None:
    pipe.vision_first = mode == "overlapped"
    if mode == "serial":
        pipe.fused.run = serial_run
    else:
        vars(pipe.fused).pop("run", None)


def one_round(pipe: Pipeline, obs: Observation, n: int, gap_s: float, reuse: bool, first_id: int) -> dict:
    steps: dict[str, list[float]] = defaultdict(list)
    walls, chunks = [], []
    gen = torch.Generator(device=pipe.policy.device).manual_seed(7)
    for i in range(n):
        ids = tuple((first_id if reuse else first_id + i, v) for v in range(len(obs.images)))
        x = dataclasses.replace(obs, frame_ids=ids)
        # as the node does on each camera's thread when a frame arrives, untimed
        x = dataclasses.replace(x, images=[pipe.frame_pool.copy(f) for f in obs.images])
        noise = pipe.policy.model.noise(1, gen, pipe.policy.device)
        if reuse and i == 0:
            pipe.decide(x, noise)  # builds the prefix the others re-use
        time.sleep(gap_s)
        SPENT.clear()
        t0 = time.perf_counter()
        decision = pipe.decide(x, noise)
        walls.append((time.perf_counter() - t0) * 1e6)
        assert decision.prefix_reused == reuse, decision.prefix_reused
        chunks.append(decision.actions)
        for label, s in SPENT.items():
            steps[label].append(s * 1e6)
    return {"walls": walls, "steps": steps, "chunks": chunks}


def main() -> None:
    from prefix_reuse import full_size_observation, rounds_parser  # bench/ is on sys.path when run as a script

    ap = rounds_parser(__doc__)
    ap.add_argument("--gap-ms", type=number_at_least(0.0), default=20.0)
    args = ap.parse_args()
    require_cuda(ap, "decide_host.py")
    dev = torch.device("cuda")
    policy, obs, tokens = full_size_observation(args.policy, args.views, DOF, dev)
    pipe = Pipeline(policy, backend="fused", release_reference=True)
    for i in range(3):  # warm-up, uninstrumented; sets the inputs' shape for the one-graph prefix
        pipe.decide(dataclasses.replace(obs, frame_ids=tuple((-1 - i, v) for v in range(args.views))))
    serial_run = one_prefix_graph(pipe.fused)
    for mode in MODES:
        set_mode(pipe, mode, serial_run)
        pipe.decide(dataclasses.replace(obs, frame_ids=tuple((mode, v) for v in range(args.views))))
    instrument()
    cases = [(gap, reuse) for gap in (args.gap_ms, 0.0) for reuse in (False, True)]
    found: dict[tuple, dict] = {}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            set_mode(pipe, mode, serial_run)
            for c, (gap, reuse) in enumerate(cases):
                first_id = 10**6 * (1 + c + 10 * r)
                got = one_round(pipe, obs, args.iters, gap / 1e3, reuse, first_id)
                slot = found.setdefault((mode, gap, reuse), {"walls": [], "steps": defaultdict(list), "chunks": []})
                slot["walls"] += got["walls"]
                slot["chunks"] += got["chunks"]
                for label, v in got["steps"].items():
                    slot["steps"][label] += v
    print(f"{args.policy} {args.views}v bf16, {tokens} prompt tokens, {args.views}x480x640 frames from the host")
    print(f"{args.rounds} alternating rounds x {args.iters} decisions per mode and case; median us per decision")
    results = {}
    for gap, reuse in cases:
        case = f"prefix {'re-used' if reuse else 'run'}, gap {gap:g} ms"
        got = {m: found[(m, gap, reuse)] for m in MODES}
        same = all(np.array_equal(a, b) for a, b in zip(*(got[m]["chunks"] for m in MODES), strict=True))
        print(f"\n{case}{'' if same else '  (CHUNKS DIFFER)'}")
        print(f"{'':48}" + "".join(f"{m:>12}" for m in MODES))
        for label in sorted(set().union(*(got[m]["steps"] for m in MODES))):
            medians = (statistics.median(got[m]["steps"][label]) if got[m]["steps"].get(label) else 0.0 for m in MODES)
            print(f"{label:48}" + "".join(f"{v:>12.1f}" for v in medians))
        walls = {m: np.array(got[m]["walls"]) for m in MODES}
        for q, what in ((50, "wall median"), (90, "wall p90"), (99, "wall p99")):
            print(f"{what:48}" + "".join(f"{np.percentile(walls[m], q):>12.1f}" for m in MODES))
        ratio = np.median(walls["serial"]) / np.median(walls["overlapped"])
        print(f"{'serial / overlapped (median wall)':48}{ratio:>12.3f}")
        results[case] = {
            m: {
                "wall_median_us": float(np.median(walls[m])),
                "wall_p90_us": float(np.percentile(walls[m], 90)),
                "wall_p99_us": float(np.percentile(walls[m], 99)),
                "steps_median_us": {k: statistics.median(v) for k, v in got[m]["steps"].items() if v},
            }
            for m in MODES
        } | {"chunks_equal": same, "serial_over_overlapped": float(ratio)}
    write_result(args.out, "decide_host", dev, policy=args.policy, views=args.views, results=results)


if __name__ == "__main__":
    main()
