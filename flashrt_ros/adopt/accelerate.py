"""`accelerate(model, example)`: our kernels in an unmodified PyTorch model, each kept only where
it passes the parity and speed gates on the user's own example call.

Replacements are tried one kind at a time, in order, each on top of those already kept, and
always measured against the outputs of the model as `accelerate` found it: what is kept in the
end passed the parity gate as a whole. A replacement swaps the `forward` of the module instances it fits (the
class is not touched, so other models in the process are not affected); `AdoptReport.revert`
puts every forward back.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from .gate import (
    Gates,
    OutputsChanged,
    Parity,
    alternating_rounds,
    floating_outputs,
    median_ms,
    parity,
    rounds_short_of,
    seeded,
)
from .replacements import KERNEL_DTYPES, REPLACEMENTS, AdoptedForward, Replacement, kernels_refusal

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    """What became of one kind of replacement. `extra_bytes`: what it holds while kept (0 when
    not kept, or once reverted: then it holds nothing)."""

    name: str
    modules: int
    kept: bool
    reason: str
    parity: Parity | None = None
    unpatched_ms: float | None = None
    patched_ms: float | None = None
    extra_bytes: int = 0

    @property
    def speedup(self) -> float | None:
        if self.unpatched_ms and self.patched_ms:
            return self.unpatched_ms / self.patched_ms
        return None

    def row(self) -> str:
        cos = f"{self.parity.cos:.6f}" if self.parity else "-"
        err = f"{self.parity.max_abs:.2e}" if self.parity else "-"
        ms = (
            f"{self.unpatched_ms:9.3f} {self.patched_ms:9.3f} {self.speedup:6.3f}x"
            if self.speedup
            else f"{'-':>9} {'-':>9} {'-':>7}"
        )
        mb = f"{self.extra_bytes / 2**20:8.1f}"
        verdict = f"{'kept' if self.kept else 'not kept'}: {self.reason}"
        return f"{self.name:<11} {self.modules:>7} {cos:>9} {err:>9} {ms} {mb}  {verdict}"

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "modules", "kept", "reason", "unpatched_ms", "patched_ms")}
        parity_d = self.parity.to_dict() if self.parity else None
        return d | {"speedup": self.speedup, "extra_bytes": self.extra_bytes, "parity": parity_d}


HEADER = (
    f"{'replacement':<11} {'modules':>7} {'cosine':>9} {'max abs':>9} "
    f"{'before ms':>9} {'after ms':>9} {'speedup':>7} {'extra MB':>8}  verdict"
)


@dataclass
class AdoptReport:
    """The verdicts, in the order tried, and the way back to the unpatched model."""

    verdicts: list[Verdict]
    device: str
    gates: Gates
    _patches: list[_Patch] = field(default_factory=list, repr=False)
    _unpatched_depth: int = field(default=0, repr=False)

    @property
    def kept(self) -> list[str]:
        return [v.name for v in self.verdicts if v.kept]

    def table(self) -> str:
        return "\n".join([HEADER, *(v.row() for v in self.verdicts)])

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "gates": self.gates.__dict__,
            "kept": self.kept,
            "verdicts": [v.to_dict() for v in self.verdicts],
        }

    def revert(self) -> None:
        """Every kept replacement undone, newest first: the model runs its own code again, and
        the verdicts say so (`kept` and the table would otherwise describe a model that is gone)."""
        while self._patches:
            self._patches.pop().drop()
        for v in self.verdicts:
            if v.kept:
                v.kept, v.reason, v.extra_bytes = False, f"reverted (was: {v.reason})", 0

    def refresh(self) -> None:
        """Make the kept replacements' weight copies again (geglu_mlp's gate|up), after a change
        they cannot see: a write through `.data` (`p.data.copy_(ema)`) bumps no tensor version."""
        for patch in self._patches:
            for forward in patch.forwards:
                forward.refresh()

    @contextlib.contextmanager
    def unpatched(self) -> Iterator[None]:
        """The model's own forwards inside the block, the kept replacements again after it
        (an A/B in the user's own code, or a baseline beside the adopted model). Nested blocks
        turn them back on when the outermost one ends."""
        self._unpatched_depth += 1
        if self._unpatched_depth == 1:
            for patch in reversed(self._patches):
                patch.off()
        try:
            yield
        finally:
            self._unpatched_depth -= 1
            if self._unpatched_depth == 0:
                for patch in self._patches:
                    patch.on()


class _Patch:
    """One kind of replacement installed on its modules; `on()` / `off()` swap the forwards."""

    def __init__(self, replacement: Replacement, modules: list[nn.Module]):
        self.modules = modules
        self.forwards: list[AdoptedForward] = []
        try:
            for m in modules:
                self.forwards.append(replacement.build(m))
        except BaseException:  # nothing is swapped yet; undo what the built ones added
            self.drop()
            raise
        self.extra_bytes = sum(f.extra_bytes() for f in self.forwards)

    def on(self) -> None:
        for module, forward in zip(self.modules, self.forwards, strict=True):
            forward.enabled = True  # also under a forward another tool wrapped around ours since
            if module.__dict__.get("forward") is forward.before:  # not a forward set since by someone else
                forward.unpark()
                module.forward = forward  # the instance's attribute shadows the class's forward
            elif module.__dict__.get("forward") is not forward:
                log.warning(
                    "adopt: %s has a forward set by another tool since; ours runs only where it calls ours",
                    type(module).__name__,
                )

    def off(self) -> None:
        for module, forward in zip(self.modules, self.forwards, strict=False):
            forward.enabled = False  # also where another tool's forward wraps ours and calls it
            if module.__dict__.get("forward") is not forward:
                continue  # ours is not on (or another tool's replaced it): leave theirs
            if forward.before is None:
                del module.__dict__["forward"]
            else:
                module.forward = forward.before  # another tool's forward, set before ours
            forward.park()

    def drop(self) -> None:
        self.off()
        for forward in self.forwards:
            forward.release()  # e.g. the concatenated weight's buffer
        self.forwards.clear()

    def reset(self) -> None:
        for forward in self.forwards:
            forward.reset()

    @property
    def runs(self) -> int:
        """Calls the kernels took since the last `reset`."""
        return sum(forward.runs for forward in self.forwards)

    def never_ran(self) -> str:
        """Why the kernels took no call since the last `reset`, as far as the forwards saw."""
        seen = {(dtype, device) for forward in self.forwards for dtype, device in forward.declined}
        if not seen:
            return "the modules it fits were not called"
        inputs = ", ".join(sorted({f"{_dtype_name(d)} on {device}" for d, device in seen}))
        weights = {p.dtype for m in self.modules for p in m.parameters()} - {d for d, _ in seen}
        held = f" (weights {', '.join(sorted(map(_dtype_name, weights)))})" if weights else ""
        takes = "/".join(map(_dtype_name, KERNEL_DTYPES))
        return f"inputs {inputs}{held}; they take {takes} on a CUDA GPU or the interpreter, without gradients"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _fitting(replacement: Replacement, model: nn.Module) -> tuple[list[nn.Module], Counter[str]]:
    """The modules of `model` that `replacement` fits (not those adopted already), and how many
    of its other candidates were refused for each reason."""
    modules: list[nn.Module] = []
    refused: Counter[str] = Counter()
    for module in model.modules():
        if _adopted(module) or not _candidate(replacement, module):
            continue
        why = _refusal(replacement, module)
        if why is None:
            modules.append(module)
        else:
            refused[why] += 1
    return modules, refused


def _candidate(replacement: Replacement, module: nn.Module) -> bool:
    try:
        return bool(replacement.candidate(module))
    except NotImplementedError:  # a replacement without its checks: said, not read as "no module fits"
        raise
    except Exception:  # a module whose attributes cannot be read is not one of ours
        return False


def _refusal(replacement: Replacement, module: nn.Module) -> str | None:
    """`replacement.refusal(module)`, where a module that makes the check fail (a probe it cannot
    take) does not fit, with that as its reason."""
    try:
        return replacement.refusal(module)
    except Exception as exc:
        return f"its check raised {type(exc).__name__}"


def _refused(refused: Counter[str]) -> str:
    """E.g. "3 candidates refused: eps is None (2), has parameters other than weight: bias (1)"."""
    n = sum(refused.values())
    reasons = ", ".join(f"{why} ({count})" for why, count in refused.most_common())
    return f"{n} candidate{'' if n == 1 else 's'} refused: {reasons}"


def _adopted(module: nn.Module) -> bool:
    """Whether one of our forwards is on the module already (an earlier `accelerate`)."""
    return isinstance(module.__dict__.get("forward"), AdoptedForward)


def _device_of(model: nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def accelerate(
    model: nn.Module,
    example: Callable[[], object],
    gates: Gates | None = None,
    replacements: tuple[Replacement, ...] = REPLACEMENTS,
) -> AdoptReport:
    """Try each replacement on `model`; keep those that pass the gates on `example()`.

    `example` makes one call of the model on representative inputs and returns what to compare
    (a tensor or a structure of them; e.g. ``lambda: model(**inputs)``). It runs under
    ``torch.no_grad`` with torch's RNG seeded before every call. Adopt after loading weights: a
    replacement that copies weights (see the report's extra MB) makes the copy again on its next
    call after an in-place change (a one-off cost); a write through `.data` bumps no version and
    needs `report.refresh()`, and a CUDA graph captured before a change keeps the old copy.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"accelerate takes a torch.nn.Module, got {type(model).__name__}")
    gates = gates or Gates()
    device = _device_of(model)
    report = AdoptReport([], str(device), gates)
    reference = floating_outputs(seeded(example, gates.seed, device))
    if not reference:
        raise ValueError("example() returned no floating-point tensor to compare (return the model's outputs)")
    try:
        for replacement in replacements:
            verdict, patch = _try(replacement, model, example, reference, gates, device)
            if patch is not None:
                report._patches.append(patch)
            report.verdicts.append(verdict)
            log.info("adopt %s", verdict.row())
    except BaseException:  # an error or Ctrl-C mid-way: the model goes back to its own code
        report.revert()
        raise
    return report


def _try(
    replacement: Replacement,
    model: nn.Module,
    example: Callable[[], object],
    reference: list,
    gates: Gates,
    device: torch.device,
) -> tuple[Verdict, _Patch | None]:
    """One replacement through the gates: its verdict, and its patch if kept (left on). The
    verdict names the reasons its refused candidates did not fit. On an exception nothing of it
    stays installed."""
    modules, refused = _fitting(replacement, model)
    verdict, patch = _gated(replacement, modules, example, reference, gates, device)
    if refused:
        verdict.reason += f"; {_refused(refused)}"
    if patch is not None:
        verdict.extra_bytes = patch.extra_bytes
    return verdict, patch


def _gated(
    replacement: Replacement,
    modules: list[nn.Module],
    example: Callable[[], object],
    reference: list,
    gates: Gates,
    device: torch.device,
) -> tuple[Verdict, _Patch | None]:
    """`replacement` on `modules` through the gates (see `_try`)."""
    verdict = Verdict(replacement.name, len(modules), False, "")
    if not modules:
        verdict.reason = "no module fits"
        return verdict, None
    cannot_run = kernels_refusal(device)
    if cannot_run:
        verdict.reason = cannot_run
        return verdict, None
    try:
        patch = _Patch(replacement, modules)
    except Exception as exc:  # e.g. a weight layout the kernel does not take
        verdict.reason = f"cannot build: {type(exc).__name__}: {exc}"
        return verdict, None
    patch.on()
    patch.reset()
    try:
        verdict.parity = parity(reference, floating_outputs(seeded(example, gates.seed, device)))
    except OutputsChanged as exc:  # other shapes or dtypes: the replacement computes something else
        patch.drop()
        verdict.reason = f"parity: {exc}"
        return verdict, None
    except Exception as exc:  # any failure of the patched call is a verdict, not a crash of the gate
        patch.drop()
        verdict.reason = f"the patched call failed: {type(exc).__name__}: {exc}"
        return verdict, None
    except BaseException:  # Ctrl-C: nothing of it stays
        patch.drop()
        raise
    if not patch.runs:  # the model's own code ran: parity proves nothing, and a weight copy would be waste
        verdict.parity, verdict.reason = None, f"the kernels never ran in example() ({patch.never_ran()})"
        patch.drop()
        return verdict, None
    failure = verdict.parity.failure(gates)
    if failure:
        patch.drop()
        verdict.reason = f"parity: {failure}"
        return verdict, None
    if not gates.latency:
        verdict.kept, verdict.reason = True, "parity passed (speed not gated)"
        return verdict, patch
    try:
        patched, unpatched = alternating_rounds([(patch.on, example), (patch.off, example)], gates, device)
        verdict.patched_ms, verdict.unpatched_ms = median_ms(patched), median_ms(unpatched)
    except BaseException:
        patch.drop()
        raise
    patch.on()
    if verdict.patched_ms > verdict.unpatched_ms * (1.0 - gates.min_gain):
        patch.drop()
        verdict.reason = f"not faster by {gates.min_gain:.0%}"
        return verdict, None
    short = rounds_short_of(patched, unpatched, gates.min_gain)
    if short:  # a gain the rounds' spread covers: noise, as likely as not
        patch.drop()
        verdict.reason = f"faster by {gates.min_gain:.0%} overall, not in {short} of {gates.rounds} rounds"
        return verdict, None
    verdict.kept, verdict.reason = True, "passed parity and speed"
    return verdict, patch
