"""Where the node's decision spends its wall time outside the GPU's work, before and after the
host staging (policies/host_staging.py). GPU.

    python bench/decide_host.py [--policy pi05] [--views 3] [--rounds 5] [--iters 20] [--gap-ms 20] [--out DIR]

`Pipeline.decide` as the node calls it (full-size random weights in bf16, 480x640 frames from the
host, a ~150-token prompt: bench/prefix_reuse.py's set-up), with the prefix run (new frame ids)
and re-used (the same ids), each `--gap-ms` after the last and also back to back (gap 0). Two
modes in alternating rounds on one pipeline: "before" puts back the host path of e8a30fe (frames
uploaded one by one from pageable memory and pre-processed one launch each, inputs copied from
pageable memory one by one, five timing events made per decision, the chunk read back with
`.cpu()`), "after" is the current one (tokens, mask and state packed into one queued copy from
page-locked memory; frames in page-locked memory from the node's frame pool, copied there before
the decision as the node does when they arrive, uploaded by queued copies into GPU buffers kept
per size and pre-processed in one launch per run of same-size views; the chunk read back
through a page-locked buffer; events made once). Each host step is timed with the monotonic
clock by wrapping it; the table gives each step's median microseconds per decision, then the
wall time of `decide` (median, p90) in each mode and their ratio. The chunks of both modes must
be equal.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict

import numpy as np
import torch

from flashrt_ros.bench.timing import write_result
from flashrt_ros.engine import pipeline as pipeline_module
from flashrt_ros.engine.pipeline import Pipeline
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
    timed_step(fused_module.FusedPi0, "set_frames", "frames: upload + pre-processing launch")
    timed_step(fused_module.FusedPi0, "set_images", "frames: pre-processing launch (before)")
    timed_step(fused_module.FusedPi0, "set_inputs", "tokens / state / noise to the GPU")
    timed_step(fused_module.FusedPi0, "run", "graph launches")
    timed_step(fused_module.FusedPi0, "actions_to_host", "chunk to the host (wait for the GPU + copy)")
    timed_step(pipeline_module._Timer, "mark", "CUDA event marks")
    timed_step(pipeline_module._Timer, "resolve", "event read-out")
    original_post = policy_module.Policy.postprocess

    def postprocess(self, chunk, state):
        t0 = time.perf_counter()
        if chunk.device.type == "cuda":  # before: the read-back waits for the GPU here
            torch.cuda.current_stream().synchronize()
        t1 = time.perf_counter()
        out = original_post(self, chunk, state)
        SPENT["chunk to the host (wait for the GPU + copy)"] += t1 - t0
        SPENT["read-back + un-normalise (postprocess)"] += time.perf_counter() - t1
        return out

    policy_module.Policy.postprocess = postprocess


def run_fused_before(
    self: Pipeline, obs: Observation, noise: torch.Tensor, timer, hold=None
) -> tuple[torch.Tensor, bool]:
    """Pipeline._run_fused and FusedPi0.set_inputs as they were at e8a30fe."""
    fused, dev, cache = self.fused, self.policy.device, self.prefix_cache
    tokens, token_mask, state, key = self._host_inputs(obs)
    now = cache.clock()
    reuse = cache.lookup(key, build=fused.prefix_serial, now=now)
    if not reuse:
        t0 = time.perf_counter()
        frames = [
            None if img is None else torch.from_numpy(np.ascontiguousarray(img)).to(dev, non_blocking=True)
            for img in obs.images
        ]
        SPENT["frames: upload (before)"] += time.perf_counter() - t0
        fused.set_images(frames)
    t0 = time.perf_counter()
    used = int(token_mask.nonzero().max()) + 1 if bool(token_mask.any()) else 1
    fused.bucket = next(b for b in fused.buckets if b >= used)
    fused.tokens.copy_(tokens, non_blocking=True)
    fused.token_valid.copy_(token_mask, non_blocking=True)
    fused.state.zero_()
    fused.state[: state.shape[-1]].copy_(state, non_blocking=True)
    fused.noise.copy_(noise[0], non_blocking=True)
    SPENT["tokens / state / noise to the GPU"] += time.perf_counter() - t0
    timer.mark("preprocess")
    if not reuse:
        cache.forget()
        fused.run("prefix")
        cache.store(key, fused.prefix_serial, built_at=now)
        timer.mark("prefix")
    fused.run("denoise")
    timer.mark("denoise")
    return fused.actions[None], reuse


AFTER = Pipeline._run_fused


def set_mode(pipe: Pipeline, mode: str) -> None:
    Pipeline._run_fused = run_fused_before if mode == "before" else AFTER
    pipe._events = None if mode == "before" else []  # None: the timer makes its events per decision


def one_round(pipe: Pipeline, obs: Observation, n: int, gap_s: float, reuse: bool, first_id: int, pooled: bool) -> dict:
    steps: dict[str, list[float]] = defaultdict(list)
    walls, chunks = [], []
    gen = torch.Generator(device=pipe.policy.device).manual_seed(7)
    for i in range(n):
        ids = tuple((first_id if reuse else first_id + i, v) for v in range(len(obs.images)))
        x = dataclasses.replace(obs, frame_ids=ids)
        if pooled:  # as the node does on each camera's thread when a frame arrives, untimed
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
    ap.add_argument("--gap-ms", type=float, default=20.0)
    args = ap.parse_args()

    dev = torch.device("cuda")
    policy, obs, tokens = full_size_observation(args.policy, args.views, DOF, dev)
    pipe = Pipeline(policy, backend="fused", release_reference=True)
    for mode in ("before", "after"):  # warm-up, uninstrumented
        set_mode(pipe, mode)
        for i in range(3):
            pipe.decide(dataclasses.replace(obs, frame_ids=tuple((-1 - i, v) for v in range(args.views))))
    instrument()
    cases = [(gap, reuse) for gap in (args.gap_ms, 0.0) for reuse in (False, True)]
    found: dict[tuple, dict] = {}
    for r in range(args.rounds):
        for mode in ("before", "after") if r % 2 == 0 else ("after", "before"):
            set_mode(pipe, mode)
            for c, (gap, reuse) in enumerate(cases):
                first_id = 10**6 * (1 + c + 10 * r)
                got = one_round(pipe, obs, args.iters, gap / 1e3, reuse, first_id, pooled=mode == "after")
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
        before, after = found[("before", gap, reuse)], found[("after", gap, reuse)]
        same = all(np.array_equal(a, b) for a, b in zip(before["chunks"], after["chunks"], strict=True))
        print(f"\n{case}{'' if same else '  (CHUNKS DIFFER)'}")
        print(f"{'':48}{'before':>12}{'after':>12}")
        for label in sorted(set(before["steps"]) | set(after["steps"])):
            b, a = (statistics.median(x["steps"][label]) if x["steps"].get(label) else 0.0 for x in (before, after))
            print(f"{label:48}{b:>12.1f}{a:>12.1f}")
        walls = {m: np.array(x["walls"]) for m, x in (("before", before), ("after", after))}
        for q, what in ((50, "wall median"), (90, "wall p90")):
            print(f"{what:48}" + "".join(f"{np.percentile(walls[m], q):>12.1f}" for m in ("before", "after")))
        ratio = np.median(walls["before"]) / np.median(walls["after"])
        print(f"{'before / after (median wall)':48}{ratio:>12.3f}")
        results[case] = {
            m: {
                "wall_median_us": float(np.median(walls[m])),
                "wall_p90_us": float(np.percentile(walls[m], 90)),
                "wall_p99_us": float(np.percentile(walls[m], 99)),
                "steps_median_us": {k: statistics.median(v) for k, v in x["steps"].items() if v},
            }
            for m, x in (("before", before), ("after", after))
        } | {"chunks_equal": same}
    write_result(args.out, "decide_host", dev, policy=args.policy, views=args.views, results=results)


if __name__ == "__main__":
    main()
