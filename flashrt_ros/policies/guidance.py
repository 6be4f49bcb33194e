"""Real-time chunking: the next chunk guided to agree with the one the robot is executing.

While a decision runs, the robot goes on executing the previous chunk, so the new chunk's first
actions are in the past by the time it arrives, and the rest overlaps what was planned before.
Chunks computed independently disagree there, and the switch jumps. Real-time chunking (Black,
Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies") treats the new
chunk as an inpainting problem: at every denoise step the velocity is corrected so that the
predicted clean chunk moves towards the previous one, with full weight on the actions that will
be executed before the new chunk arrives and a weight that decays over the rest of the overlap.

In pi0's convention (t = 1 noise -> t = 0 actions, x += dt * v with dt = -1/N) one step is

    x1  = x - t * v(x, t)                       the clean chunk the step predicts
    e   = W * (Y - x1)                          weighted disagreement with the previous chunk Y
    g   = J^T e,  J = d x1 / d x                ("exact") or g = e (J taken as identity)
    c   = min(beta, (t^2 + (1 - t)^2) / (t (1 - t)), N)
    x  += dt * (v - c * g)

The paper's pseudo-inverse guidance weight c is written here in pi0's time (its tau = 1 - t). The
cap N = 1 / |dt| is ours: a step moves x (and with the identity Jacobian x1) by c / N of the gap,
so a larger c would throw the held actions past the target (with one step and beta 5, four times
the gap beyond it).
"exact" needs the gradient of the action expert (autograd, the reference path only, several
times slower); "identity" drops the expert's Jacobian, which keeps the update elementwise, so
the fused path does it inside the step kernel's Euler tail at no measurable cost. For an ideal
denoiser J is close to the identity late in the schedule (small t), where the guidance sets the
final values; early on the identity over-states how far x1 follows x, and c's cap bounds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .config import RTC_JACOBIANS as JACOBIANS
from .config import RTC_SCHEDULES as SCHEDULES


def prefix_weights(delay: int, overlap: int, horizon: int, schedule: str = "exp") -> np.ndarray:
    """Per action of the new chunk [horizon] fp32: how strongly it is held to the previous chunk.

    1 for the first `delay` actions (executed before the new chunk takes over), 0 from `overlap`
    on (the previous chunk has no action there), and between them by `schedule`: the paper's
    "exp" c * (e^c - 1) / (e - 1) or "linear" c, with c going from 1 towards 0 over the overlap;
    "ones" holds the whole overlap, "zeros" only the delayed actions. (numpy: it is made on the
    host for every decision.)"""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not 0 <= overlap <= horizon or delay < 0:
        raise ValueError(f"need 0 <= overlap <= horizon and delay >= 0, got {delay}, {overlap}, {horizon}")
    delay = min(delay, overlap)
    w = np.zeros(horizon, dtype=np.float32)
    w[:delay] = 1.0
    span = overlap - delay
    if span == 0 or schedule == "zeros":
        return w
    if schedule == "ones":
        w[delay:overlap] = 1.0
        return w
    c = (overlap - np.arange(delay, overlap, dtype=np.float64)) / (span + 1)
    w[delay:overlap] = c * np.expm1(c) / (math.e - 1) if schedule == "exp" else c
    return w


def guidance_weight(t: float, max_guidance: float, num_steps: int) -> float:
    """c(t) = min(beta, (t^2 + (1 - t)^2) / (t (1 - t)), num_steps): the paper's weight is infinite
    at both ends, so beta there; at most num_steps, so that a step never overshoots."""
    cap = min(float(max_guidance), float(num_steps))
    if t <= 0.0 or t >= 1.0:
        return cap
    return float(min(cap, (t * t + (1 - t) ** 2) / (t * (1 - t))))


def step_table(num_steps: int, max_guidance: float) -> Tensor:
    """[num_steps, 2] fp32: (t, c) of each Euler step, as the fused path's kernels read them."""
    dt = -1.0 / num_steps
    ts = [1.0 + k * dt for k in range(num_steps)]
    return torch.tensor([[t, guidance_weight(t, max_guidance, num_steps)] for t in ts], dtype=torch.float32)


@dataclass(frozen=True)
class ChunkGuide:
    """What a decision is guided towards, in the model's action space.

    target:  [horizon, action_dim] fp32, the previous chunk's actions aligned to the new chunk's
             time and normalised as the model's output is (robot units converted back).
    weights: [horizon, action_dim] fp32 in [0, 1]: `prefix_weights` per row, 0 on padded dims
             and dims the conversion could not invert.
    max_guidance: beta, the cap of c(t).
    jacobian: "identity" or "exact" (see the module docstring).
    """

    target: Tensor
    weights: Tensor
    max_guidance: float = 5.0
    jacobian: str = "identity"

    def __post_init__(self) -> None:
        if self.jacobian not in JACOBIANS:
            raise ValueError(f"jacobian must be one of {JACOBIANS}, got {self.jacobian!r}")
        if not (math.isfinite(self.max_guidance) and self.max_guidance > 0):
            raise ValueError(f"max_guidance must be a positive number, got {self.max_guidance}")
        if self.target.shape != self.weights.shape or self.target.dim() != 2:
            raise ValueError(
                f"target and weights must both be [horizon, action_dim], got {tuple(self.target.shape)} "
                f"and {tuple(self.weights.shape)}"
            )
        if not all(_finite(t) for t in (self.target, self.weights)):
            raise ValueError("target and weights must be finite")

    def to(self, device: torch.device | str) -> ChunkGuide:
        return ChunkGuide(self.target.to(device), self.weights.to(device), self.max_guidance, self.jacobian)


def _finite(t: Tensor) -> bool:
    """Whether every value is finite; through numpy on the host (a tenth of torch's call time,
    and a guide is built for every decision)."""
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(t.numpy()).all())
    return bool(torch.isfinite(t).all())


def guided_velocity(
    velocity: Callable[[Tensor], Tensor], x: Tensor, t: float, guide: ChunkGuide, num_steps: int
) -> Tensor:
    """v(x) corrected towards `guide` (the reference path): v - c(t) * g, g as the module says.
    `velocity` maps x [B, H, A] to v [B, H, A]; with "exact" it must be differentiable."""
    c = guidance_weight(t, guide.max_guidance, num_steps)
    if guide.jacobian == "identity":
        v = velocity(x)
        return v - c * guide.weights * (guide.target - (x - t * v))
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        v = velocity(xg)
        x1 = xg - t * v
        error = guide.weights * (guide.target - x1.detach())
        (g,) = torch.autograd.grad(x1, xg, grad_outputs=error)
    return v.detach() - c * g
