"""The two gates a replacement must pass to stay: parity with the model's own outputs, and speed.

Parity is measured on the user's example call, against the unpatched model's outputs on the same
inputs and the same random state, for each floating output on its own (a small output, actions
beside hidden states, is not drowned by a large one): its cosine and its largest absolute error
relative to its largest reference value; the worst of each decides. Speed is the median over
alternating rounds, in ABBA order (patched then unpatched, then unpatched then patched, ...), so
that clocks and caches drifting during the measurement fall on both sides alike; and the gain
must show in every round's medians too, so that on a noisy host a difference smaller than the
rounds' spread keeps the model's own code.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Gates:
    """What a replacement must show to be kept.

    min_cos: cosine of each output with the unpatched model's, at least this.
    max_rel_err: largest |patched - unpatched| over the largest |unpatched|, per output, at most this.
    min_gain: the patched median must be at least this fraction faster (0.01: 1 %), over all
        rounds and in each round; a tie within the noise keeps the model's own code.
    latency: False skips the speed gate (parity alone decides), e.g. to check a model on a
        CPU, where the interpreted kernels are slow by design.
    rounds, iters, warmup: alternating rounds of `iters` timed calls each, after `warmup` calls.
    seed: torch's RNG is seeded with it before every call, so that a model that draws noise
        (a flow-matching policy) draws the same noise on both sides.
    """

    min_cos: float = 0.999
    max_rel_err: float = 0.05
    min_gain: float = 0.01
    latency: bool = True
    rounds: int = 5
    iters: int = 10
    warmup: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 < self.min_cos <= 1.0:
            problems.append(f"min_cos must be in (0, 1], got {self.min_cos}")
        if not (math.isfinite(self.max_rel_err) and self.max_rel_err >= 0.0):
            problems.append(f"max_rel_err must be finite and >= 0, got {self.max_rel_err}")
        if not (math.isfinite(self.min_gain) and -1.0 < self.min_gain < 1.0):
            problems.append(f"min_gain must be in (-1, 1), got {self.min_gain}")
        for name in ("rounds", "iters", "warmup"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        if problems:
            raise ValueError("adopt gates: " + "; ".join(problems))


@dataclass(frozen=True)
class Parity:
    """The patched outputs against the unpatched ones, the worst output's figures: `cos` the lowest
    cosine (output `cos_at`), `max_abs` / `max_ref` those of the output whose error is the largest
    share of its own largest value (output `err_at`), of `outputs` floating outputs."""

    cos: float
    max_abs: float
    max_ref: float
    finite: bool
    cos_at: int = 0
    err_at: int = 0
    outputs: int = 1

    @property
    def rel_err(self) -> float:
        return _rel_err(self.max_abs, self.max_ref)

    def failure(self, gates: Gates) -> str | None:
        """Why this parity fails the gates (None: it passes)."""
        if not self.finite:
            return "non-finite outputs"
        if not self.cos >= gates.min_cos:
            return f"cosine {self.cos:.6f} < {gates.min_cos}{self._which(self.cos_at)}"
        if not self.rel_err <= gates.max_rel_err:
            share = f"{self.rel_err:.3g} of its largest value"
            return f"max abs error {self.max_abs:.3g} is {share}, > {gates.max_rel_err}{self._which(self.err_at)}"
        return None

    def _which(self, i: int) -> str:
        return f" (output {i} of {self.outputs})" if self.outputs > 1 else ""

    def to_dict(self) -> dict:
        return asdict(self) | {"rel_err": self.rel_err}


def floating_outputs(result: object) -> list[Tensor]:
    """The floating-point tensors in what a call returned (a tensor, or tuples, lists and dicts of
    them, as Hugging Face's ModelOutput is), in a stable order; detached copies."""
    found: list[Tensor] = []

    def walk(value: object) -> None:
        if isinstance(value, Tensor):
            if value.is_floating_point():
                found.append(value.detach().clone())
        elif isinstance(value, dict):
            for key in value:
                walk(value[key])
        elif isinstance(value, (tuple, list)):
            for item in value:
                walk(item)

    walk(result)
    return found


class OutputsChanged(ValueError):
    """The patched call returned outputs of other shapes or dtypes than the unpatched one: what
    the model returns changed, whatever the values (a bf16 model must not start returning fp32)."""


def _rel_err(max_abs: float, max_ref: float) -> float:
    return max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else math.inf)


def parity(reference: list[Tensor], outputs: list[Tensor]) -> Parity:
    """Cosine and max abs error of each of `outputs` against `reference` (float64 sums over fp32
    values); the worst of each (`Parity`).

    Outputs of other shapes or dtypes than the reference's raise `OutputsChanged`. Values the
    reference holds as inf or NaN (a masked score, say) count as matched where the output holds
    the same there, and stay out of the sums; any other non-finite value fails."""
    ref_shapes, out_shapes = [tuple(t.shape) for t in reference], [tuple(t.shape) for t in outputs]
    if ref_shapes != out_shapes:
        raise OutputsChanged(f"the outputs' shapes changed: {out_shapes} instead of {ref_shapes}")
    changed = [i for i, (r, o) in enumerate(zip(reference, outputs, strict=True)) if r.dtype != o.dtype]
    if changed:
        i = changed[0]
        first = f"output {i} is {outputs[i].dtype} instead of {reference[i].dtype}"
        raise OutputsChanged(f"the outputs' dtypes changed: {first} ({len(changed)} of {len(outputs)} changed)")
    finite = True
    cosines, errors = [], []  # per output: cosine, (max abs, max ref)
    for r, o in zip(reference, outputs, strict=True):
        r, o = r.float(), o.to(r.device).float()
        held = torch.isfinite(r)
        if not bool(held.all()):
            rb, ob = r[~held], o[~held]
            same = (rb == ob) | (rb.isnan() & ob.isnan())  # the same inf, or NaN for NaN
            finite = finite and bool(same.all())
            r, o = r[held], o[held]
        finite = finite and bool(torch.isfinite(o).all())
        dot = float((r.double() * o.double()).sum())
        ref_sq, out_sq = float(r.double().square().sum()), float(o.double().square().sum())
        norm = math.sqrt(ref_sq * out_sq)
        cosines.append(dot / norm if norm > 0 else (1.0 if ref_sq == out_sq else 0.0))
        errors.append((float((o - r).abs().max()), float(r.abs().max())) if r.numel() else (0.0, 0.0))
    if not cosines:  # nothing to compare: the same (empty) outputs
        return Parity(cos=1.0, max_abs=0.0, max_ref=0.0, finite=finite, outputs=0)
    cos_at = min(range(len(cosines)), key=cosines.__getitem__)
    err_at = max(range(len(errors)), key=lambda i: _rel_err(*errors[i]))
    max_abs, max_ref = errors[err_at]
    return Parity(cosines[cos_at], max_abs, max_ref, finite, cos_at, err_at, len(cosines))


def seeded(call: Callable[[], object], seed: int, device: torch.device) -> object:
    """`call()` under no_grad with torch's RNG seeded (the CPU's and `device`'s), the caller's
    RNG state restored afterwards. Only those two: torch.manual_seed reseeds every GPU's, which
    fork_rng does not give back."""
    with _own_rng(device), torch.no_grad():
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        return call()


def _own_rng(device: torch.device) -> contextlib.AbstractContextManager:
    """The caller's RNG state (the CPU's and `device`'s) put back when the block ends."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def time_ms(call: Callable[[], object], iters: int, device: torch.device) -> list[float]:
    """Milliseconds per call: CUDA events on a GPU (one sync per call), else perf_counter."""
    samples = []
    cuda = device.type == "cuda"
    for _ in range(iters):
        if cuda:
            with torch.cuda.device(device):  # the events on the model's GPU, not the current one
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def alternating_rounds(
    sides: Iterable[tuple[Callable[[], None], Callable[[], object]]], gates: Gates, device: torch.device
) -> list[list[list[float]]]:
    """Each side's ms per call, round by round ([side][round][call]), over `gates.rounds`
    alternating rounds. A side is (switch to it, one call); every round switches to each side in
    turn and times it, the odd rounds in reverse order (ABBA: a steady drift, clocks ramping or a
    cache growing, falls on both sides alike instead of always on the first). The caller's RNG
    state is restored afterwards."""
    sides = list(sides)
    samples: list[list[list[float]]] = [[] for _ in sides]
    with _own_rng(device), torch.no_grad():
        for n in range(gates.rounds):
            order = range(len(sides)) if n % 2 == 0 else reversed(range(len(sides)))
            for i in order:
                switch, call = sides[i]
                switch()
                for _ in range(gates.warmup):
                    call()
                if device.type == "cuda":  # else the first call's launches hide behind the warm-up's queue
                    torch.cuda.synchronize(device)
                samples[i].append(time_ms(call, gates.iters, device))
    return samples


def median_ms(rounds: list[list[float]]) -> float:
    """The median over every round's calls."""
    return float(np.median(np.concatenate(rounds)))


def rounds_short_of(patched: list[list[float]], unpatched: list[list[float]], min_gain: float) -> int:
    """In how many rounds the patched median is not `min_gain` faster than that round's unpatched one."""
    pairs = zip(patched, unpatched, strict=True)
    return sum(float(np.median(p)) > float(np.median(u)) * (1.0 - min_gain) for p, u in pairs)
