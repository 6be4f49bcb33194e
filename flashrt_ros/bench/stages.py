"""Latency of the compiled-reference and fused paths, stage by stage, with parity.

Each function times one way of running the same weights on the same `Case` and returns
Latency rows; parity is always against the fp32 reference chunk of the same inputs and noise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..engine.frame_pool import FramePool
from ..policies.config import PolicyConfig
from ..policies.fused import FusedPi0
from ..policies.pi0 import Pi0Model
from .parity import chunk_parity
from .reference import Case, build_random, time_decision
from .timing import Latency, time_call

log = logging.getLogger(__name__)


def load_case(fused: FusedPi0, case: Case) -> None:
    fused.set_pixels(case.pixels[0].to(fused.dtype), case.image_masks[0].tolist())
    fused.set_inputs(case.tokens[0], case.token_masks[0], case.state[0], case.noise[0])


def random_fused(
    policy: str, views: int, device: torch.device, model_dtype: str = "float32"
) -> tuple[Pi0Model, Case, FusedPi0]:
    """A random-weight `policy` preset at `views` cameras, its Case, and its fused bf16 path with
    the case loaded and its graphs captured (the benchmarks' common start)."""
    cfg = PolicyConfig.preset(policy, num_views=views, dtype=model_dtype)
    model = build_random(cfg, device)
    case = Case.make(cfg, device, views)
    fused = FusedPi0(model, torch.bfloat16)
    load_case(fused, case)
    fused.capture()
    return model, case, fused


@dataclass(frozen=True)
class FusedBuild:
    """What the fused path built, for the result file: a kernel that fell back shows here."""

    describe: str
    precision: str

    @classmethod
    def of(cls, fused: FusedPi0) -> FusedBuild:
        precision = "bfloat16"
        if fused.prefix_mlp_fp8:
            down = any(w.down_scale is not None for w in fused.prefix_layers)
            precision += ", prefix LM MLP in FP8" if down else ", prefix LM gate|up in FP8 (down in bf16)"
        return cls(fused.describe(), precision)


def measure_fused(
    model: Pi0Model,
    case: Case,
    iters: int,
    warmup: int,
    label: str,
    ref_chunk: torch.Tensor,
    prefix_mlp_fp8: bool = False,
):
    """Build + capture the fused path (bf16; the prefix LM's MLP GEMMs in FP8 with
    `prefix_mlp_fp8`), time full decision / stages, and check parity. The pre-processing row
    starts from host frames, as the node's decisions do (the upload is part of it)."""
    dev = case.noise.device
    t0 = time.perf_counter()
    fused = FusedPi0(model, torch.bfloat16, prefix_mlp_fp8=prefix_mlp_fp8)
    if prefix_mlp_fp8 and not fused.prefix_mlp_fp8:  # a bf16 row must not be labelled fp8
        raise RuntimeError(f"FP8 prefix MLP asked for but not active here: {fused.describe()}")
    load_case(fused, case)
    fused.capture()
    capture_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(case.views)]
    absent = [None] * (fused.cfg.num_views - case.views)

    pool = FramePool(pinned=dev.type == "cuda")
    pooled = [pool.copy(f) for f in frames]  # where the node puts them as they arrive

    def preprocess() -> None:  # as engine.pipeline's fused decision does it
        fused.set_frames(pooled + absent)

    lat = time_decision(lambda: fused.run("prefix"), lambda _: fused.run("denoise"), iters, warmup, dev, label)
    alone = {
        "prefix_alone": ("prefix alone", lambda: fused.run("prefix")),
        "vision": ("vision alone", lambda: fused.run("vision")),  # the node's vision graph
        "preprocess": (f"preprocess {case.views}x480x640 from host", preprocess),
    }
    for key, (name, fn) in alone.items():
        lat[key] = Latency.from_samples(f"{label} {name}", time_call(fn, iters, warmup, dev, f"{label} {name}"))
    load_case(fused, case)  # preprocess wrote camera frames into pixels: restore the case's
    chunk = fused.sample_actions().clone()
    parity = chunk_parity(chunk, ref_chunk[0], case.noise[0])
    return lat, parity, capture_s, FusedBuild.of(fused)


def measure_compiled(
    model: Pi0Model, case: Case, iters: int, warmup: int, label: str, mode: str, ref_chunk: torch.Tensor
):
    """torch.compile of the reference, per stage: (embed_prefix + prefill) in inductor's default
    mode (compute-bound: large GEMMs), one denoise step in `mode` (launch-bound: CUDA graphs)."""
    dev = case.noise.device
    # each (policy, views) compiles from scratch: dynamo keys its cache by code object, so the
    # earlier runs' graphs would count against its recompile limit (then it runs eager, silently)
    torch._dynamo.reset()
    prefix_fn = torch.compile(lambda *a: model.prefill(*model.embed_prefix(*a)), dynamic=False)
    step_fn = torch.compile(model.velocity, mode=mode, dynamic=False)
    cfg = model.cfg

    def denoise(prefix):
        x = case.noise.float()
        dt = -1.0 / cfg.num_steps
        for step in range(cfg.num_steps):
            t = torch.full((1,), 1.0 + step * dt, device=dev)
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are consumed
            x = x + dt * step_fn(prefix, x, t, case.state)
        return x

    def decide():
        return denoise(prefix_fn(*case.args()[:4]))

    t0 = time.perf_counter()
    with torch.no_grad():
        chunk = decide()
        torch.cuda.synchronize(dev)
        compile_s = time.perf_counter() - t0
        lat = time_decision(lambda: prefix_fn(*case.args()[:4]), denoise, iters, warmup, dev, label)
        chunk = decide().clone()
    return lat, chunk_parity(chunk[0], ref_chunk[0], case.noise[0]), compile_s
