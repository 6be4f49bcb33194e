"""One decision as named stages, timed: the interface the ROS node drives.

preprocess (tokenise + images -> pixels) -> prefix (vision + prefix LM -> prefix_kv)
-> denoise (Euler loop over the cached prefix) -> postprocess (un-pad, un-normalise).
Timing uses CUDA events on a GPU (no host sync inside the decision; one at the end to read
the chunk) and the monotonic clock on a CPU.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..policies.policy import ModelInputs, Observation, Policy
from .stats import PipelineStats

STAGES = ("preprocess", "prefix", "denoise", "postprocess")


@dataclass
class Decision:
    chunk_id: int
    actions: np.ndarray  # [horizon, dof] float32, robot units
    timings_ms: dict[str, float]

    @property
    def total_ms(self) -> float:
        return sum(self.timings_ms.values())


class _Timer:
    """Marks stage boundaries; resolves to milliseconds after the decision's final sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((name, ev))
        else:
            self.marks.append((name, time.perf_counter()))

    def resolve(self) -> dict[str, float]:
        out = {}
        for (_, a), (name, b) in itertools.pairwise(self.marks):
            out[name] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


class Pipeline:
    """Runs decisions of a Policy and keeps per-stage statistics."""

    def __init__(self, policy: Policy, seed: int = 0, stats_window: int = 200):
        self.policy = policy
        self.stats = PipelineStats(stats_window)
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self._ids = itertools.count(1)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return STAGES

    def decide(self, obs: Observation, noise: torch.Tensor | None = None) -> Decision:
        policy, model = self.policy, self.policy.model
        timer = _Timer(policy.device)
        timer.mark("start")
        x: ModelInputs = policy.prepare(obs)
        timer.mark("preprocess")
        with torch.no_grad():
            emb, valid = model.embed_prefix(x.pixels, x.image_masks, x.tokens, x.token_masks)
            prefix = model.prefill(emb, valid)
            timer.mark("prefix")
            if noise is None:
                noise = model.noise(1, self.generator, policy.device)
            chunk = model.denoise(prefix, noise, x.state)
            timer.mark("denoise")
        actions = policy.postprocess(chunk)  # the one host sync of the decision
        timer.mark("postprocess")
        timings = timer.resolve()
        self.stats.add(timings)
        return Decision(next(self._ids), actions, timings)
