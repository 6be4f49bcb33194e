"""The node's decision path (engine.pipeline.Pipeline.decide) with the prefix run and re-used. GPU.

    python bench/prefix_reuse.py [--policy pi05] [--views 3] [--iters 100] [--eager-iters 10] [--out DIR]

Full-size random weights in bf16 (a 512-row token embedding, for the tiny tokenizer), `views`
cameras of 480x640 uint8 frames from the host, the tiny tokenizer with a prompt filled to about
150 tokens (the 200-token bucket, as the headline's Case), a 14-dim joint state. Each round takes
one noise and three decisions: the first on frame ids no decision saw (the prefix runs), the
second on the same ids (the prefix is re-used; for pi0 with a moved joint state, which goes into
its denoise), and an untimed full decision on the second's inputs under new ids, which the
re-used chunk must equal: the parity line gives the largest difference and the lowest cosine.
The first two are timed as the node times them (wall clock around `decide`, the host sync that
reads the chunk included), each `--gap-ms` after the decision before it, as in a node deciding
at up to 1000/gap Hz: a re-use does not find the GPU busy with the decision before it.

Baselines in the same run: the reference eager pipeline, paired the same way, and the reference
under torch.compile per stage (`flashrt bench`'s compile mode: its full decision, and its denoise
alone over a cached prefix, which is what a re-using compiled decision would cost).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time

import numpy as np
import torch
from tqdm import tqdm

from flashrt_ros.bench.args import at_least, number_at_least, out_folder, require_cuda
from flashrt_ros.bench.parity import compare
from flashrt_ros.bench.reference import Case, true_fp32
from flashrt_ros.bench.stages import measure_compiled
from flashrt_ros.bench.timing import HEADER, Latency, write_result
from flashrt_ros.engine.pipeline import Decision, Pipeline
from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.policy import Observation, Policy, build_policy
from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

DOF = 14


def long_prompt(policy: Policy, frames: list[np.ndarray], state: np.ndarray, fill: float = 0.75) -> tuple[str, int]:
    """A prompt whose tokens (pi0.5: with the state's) take about `fill` of the prompt length."""
    words = "pick up the red cube and place it gently in the blue bowl on the left".split()
    prompt, used = "", 0
    cfg = policy.cfg
    while used < fill * cfg.prompt_len:
        longer = f"{prompt} {words[len(prompt.split()) % len(words)]}".strip()
        tokens, mask, _ = policy.prepare_prompt_state(Observation(frames, state, longer))
        if int(mask.sum()) > cfg.prompt_len - 8:
            break
        prompt, used = longer, int(mask.sum())
    return prompt, used


def rounds_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of the benches that compare modes of one decision in alternating rounds on a
    full-size policy (decide_host.py, rtc_cost.py); a script adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--policy", default="pi05", choices=["pi05", "pi0"])
    ap.add_argument("--views", type=at_least(1), default=3)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--iters", type=at_least(1), default=20, help="decisions per round, mode and case")
    ap.add_argument("--out", type=out_folder, default="out")
    return ap


def full_size_observation(kind: str, views: int, dof: int, dev: torch.device) -> tuple[Policy, Observation, int]:
    """pi0 / pi0.5 at full size in bf16 with random weights, and what a node would hand it: `views`
    480x640 frames from the host and a prompt of ~3/4 of the prompt length (`long_prompt`); also
    the prompt's token count. The vocabulary is the tiny tokenizer's 512 words (a policy refuses a
    tokenizer that is not its own): the embedding table is the one part it shrinks, and a decision
    only gathers rows of it."""
    cfg = PolicyConfig.preset(kind, num_views=views, dtype="bfloat16").replace(vocab_size=512)
    policy = build_policy(cfg, tiny_tokenizer_path(), seed=0, device=dev, action_dof=dof)
    return policy, *node_observation(policy, views, dof)


def node_observation(policy: Policy, views: int, dof: int) -> tuple[Observation, int]:
    """What a node hands `policy`: `views` random 480x640 frames, a random `dof` state and a
    prompt of ~3/4 of the prompt length (`long_prompt`); also the prompt's token count."""
    rng = np.random.default_rng(0)
    state = rng.uniform(-1, 1, dof).astype(np.float32)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(views)]
    prompt, tokens = long_prompt(policy, frames, state)
    return Observation(frames, state, prompt), tokens


def timed(pipe: Pipeline, obs: Observation, noise: torch.Tensor, gap_s: float) -> tuple[Decision, float]:
    """One decision `gap_s` after the last, and its wall milliseconds."""
    time.sleep(gap_s)
    t0 = time.perf_counter()
    decision = pipe.decide(obs, noise)
    return decision, (time.perf_counter() - t0) * 1e3


def rounds(pipe: Pipeline, obs: Observation, n: int, label: str, first_id: int, gap_s: float) -> dict:
    """`n` rounds of three decisions with one noise: the prefix run on new frame ids (timed), the
    prefix re-used with the same ids (timed; for pi0 on a moved joint state, which its denoise
    takes), and a full decision on that second observation with new ids, which the re-used chunk
    must equal."""
    dev = pipe.policy.device
    gen = torch.Generator(device=dev).manual_seed(1)
    rng = np.random.default_rng(2)
    moved = not pipe.policy.cfg.state_in_prompt  # pi0.5's state is in its prompt: moved, it runs the prefix
    ran, reused, worst, cosines = [], [], 0.0, []
    for i in tqdm(range(n), desc=label, leave=False):
        ids = tuple((first_id + i, v) for v in range(len(obs.images)))
        state = obs.state + rng.normal(0, 0.05, obs.state.shape).astype(np.float32) if moved else obs.state
        first = dataclasses.replace(obs, frame_ids=ids)
        second = dataclasses.replace(obs, frame_ids=ids, state=state)
        check = dataclasses.replace(second, frame_ids=tuple(("check", *fid) for fid in ids))
        noise = pipe.policy.model.noise(1, gen, dev)
        full, ms_run = timed(pipe, first, noise, gap_s)
        again, ms_reused = timed(pipe, second, noise, gap_s)
        want = pipe.decide(check, noise)
        if full.prefix_reused or not again.prefix_reused or want.prefix_reused:
            got = (full.prefix_reused, again.prefix_reused, want.prefix_reused)
            raise RuntimeError(f"{label}: expected the prefix run, re-used, run; got {got}")
        ran.append(ms_run)
        reused.append(ms_reused)
        agreement = compare(torch.from_numpy(again.actions), torch.from_numpy(want.actions))
        worst = max(worst, agreement["max_abs"])
        cosines.append(agreement["cosine"])
    return {
        "prefix_run": Latency.from_samples(f"{label} decision, prefix run", ran),
        "prefix_reused": Latency.from_samples(f"{label} decision, prefix re-used", reused),
        "state_moved": moved,
        "max_abs_diff": worst,
        "min_cosine": min(cosines),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="pi05", choices=["pi05", "pi0"])
    ap.add_argument("--views", type=at_least(1), default=3)
    # percentiles need samples: one p99 of 2 samples is a single run
    ap.add_argument(
        "--iters", type=at_least(10), default=100, help="rounds of fused decisions (and compiled decisions timed)"
    )
    ap.add_argument(
        "--eager-iters", type=at_least(3), default=10, help="rounds of eager decisions (three of ~0.2-0.4 s each)"
    )
    ap.add_argument("--warmup", type=at_least(1), default=3)
    gap = "idle time before each decision (a 50 Hz node)"
    ap.add_argument("--gap-ms", type=number_at_least(0.0), default=20.0, help=gap)
    ap.add_argument("--out", type=out_folder, default="out")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU, reference only: a smoke test")
    args = ap.parse_args()
    if not args.tiny:
        require_cuda(ap, "the full-size run (or --tiny for a CPU smoke test)")
    dev = torch.device("cpu" if args.tiny else "cuda")
    if args.tiny:
        cfg = PolicyConfig.tiny(args.policy, num_views=args.views)
    else:
        # the tiny tokenizer's vocabulary (a policy refuses a tokenizer that is not its own): the
        # embedding table is the one part of the model it shrinks, and a decision only gathers rows of it
        cfg = PolicyConfig.preset(args.policy, num_views=args.views, dtype="bfloat16").replace(vocab_size=512)
    policy = build_policy(cfg, tiny_tokenizer_path(), seed=0, device=dev, action_dof=DOF)
    rng = np.random.default_rng(0)
    state = rng.uniform(-1, 1, DOF).astype(np.float32)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(args.views)]
    frames += [None] * (cfg.num_views - args.views)
    prompt, prompt_tokens = long_prompt(policy, frames, state)
    obs = Observation(frames, state, prompt)
    label = f"{args.policy} {args.views}v"
    results, gap = {}, args.gap_ms / 1e3
    runs = [("eager", Pipeline(policy, backend="reference"), args.eager_iters)]
    if not args.tiny:
        runs.insert(0, ("fused", Pipeline(policy, backend="fused"), args.iters))
    for mode, pipe, n in runs:
        rounds(pipe, obs, args.warmup, f"{label} {mode} warm-up", 10**6, gap)
        results[mode] = rounds(pipe, obs, n, f"{label} {mode}", 10**7 * len(results), gap)
    rows = [r[k] for r in results.values() for k in ("prefix_run", "prefix_reused")]
    compiled, compile_parity, compile_s = {}, None, 0.0
    if not args.tiny:
        case = Case.make(cfg, dev, args.views)
        # parity against an fp32 reference: the pipeline's bf16-rounded weights held in fp32, the same
        # noise (their rounding is not in the error; `flashrt bench`'s reference is built before it)
        fp32 = copy.deepcopy(policy.model).set_precision(torch.float32)
        with torch.no_grad(), true_fp32():
            ref_chunk = fp32.sample_actions(*case.args(), noise=case.noise)
        del fp32
        compiled, compile_parity, compile_s = measure_compiled(
            policy.model, case, args.iters, args.warmup, f"{label} compile", "reduce-overhead", ref_chunk
        )

    print(
        f"{label}, {cfg.dtype}, {prompt_tokens} prompt tokens, {args.views}x480x640 frames from the host; "
        f"wall ms per decide(), each {args.gap_ms:g} ms after the one before"
    )
    print(HEADER)
    for row in rows:
        print(row.row())
    if compiled:
        print("the reference under torch.compile, per stage on the same shapes (a Case: no frames from the host)")
        for row in (compiled["full"], compiled["denoise"]):
            print(row.row())
    for mode, r in results.items():
        speedup = r["prefix_run"].median_ms / r["prefix_reused"].median_ms
        print(
            f"   {mode}: re-used vs a full decision on the same inputs and noise"
            + (" (the joint state moved for the re-use)" if r["state_moved"] else "")
            + f": max abs diff {r['max_abs_diff']:.3g}, "
            f"min cosine {r['min_cosine']:.9f}; {speedup:.2f}x faster per re-using decision"
        )
    if compiled:
        print(
            f"   compile (reduce-overhead denoise step): compiled in {compile_s:.1f} s; its rows time the reference's "
            f"stages on a Case, not decide(); vs the fp32 reference chunk: {compile_parity}"
        )
    payload = {m: {k: (v.to_dict() if isinstance(v, Latency) else v) for k, v in r.items()} for m, r in results.items()}
    payload["compile"] = {k: v.to_dict() for k, v in compiled.items()} | {
        "compile_s": compile_s,
        "parity": compile_parity,
    }
    write_result(
        args.out,
        "prefix_reuse",
        dev,
        policy=args.policy,
        views=args.views,
        prompt_tokens=prompt_tokens,
        results=payload,
    )


if __name__ == "__main__":
    main()
