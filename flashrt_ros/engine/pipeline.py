"""One decision as named stages, timed: the interface the ROS node drives.

preprocess (tokenise + images -> pixels) -> prefix (vision + prefix LM -> prefix_kv)
-> denoise (Euler loop over the cached prefix) -> postprocess (un-pad, un-normalise, the state
added back to delta dims). On the fused path a decision on new frames tokenises while its
vision runs on the GPU, so there that host work is inside the prefix stage's time.
Timing uses CUDA events on a GPU (no host sync inside the decision; one at the end to read
the chunk) and the monotonic clock on a CPU.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import torch

from ..policies.config import FP8_PARTS
from ..policies.guidance import ChunkGuide
from ..policies.policy import ModelInputs, Observation, Policy
from .frame_pool import FramePool
from .prefix_cache import PrefixCache, PrefixKey, check_period, check_trigger
from .real_time_chunking import Hold, RtcSettings
from .stats import PipelineStats

log = logging.getLogger(__name__)

STAGES = ("preprocess", "prefix", "denoise", "postprocess")


class DeviceUnusable(RuntimeError):
    """A CUDA error left the device's context broken: nothing more runs on it in this process."""


class NonFiniteActions(ValueError):
    """The policy produced NaN or inf actions (a bad checkpoint or statistics, an overflow):
    the chunk must not reach the robot."""


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Make `device` the current CUDA device, so events, graphs and default streams are on the
    GPU that does the work (``cuda:1`` included); nothing to do on a CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@dataclass
class Decision:
    chunk_id: int
    actions: np.ndarray  # [horizon, dof] float32, robot units
    timings_ms: dict[str, float]  # per stage that ran: no "prefix" where the cached one was re-used
    prefix_reused: bool = False
    # the frame ids the chunk's prefix was built from: the observation's own, except where the
    # "period" trigger re-used a prefix of older frames (None: the observation gave no ids)
    prefix_frames: tuple[Hashable, ...] | None = None

    @property
    def total_ms(self) -> float:
        return sum(self.timings_ms.values())


class _Timer:
    """Marks stage boundaries; resolves to milliseconds after the decision's final sync. On a
    GPU it records `events`, made once by the pipeline: creating five timing events per decision
    cost ~0.2 ms of host time on an H100 host (bench/decide_host.py)."""

    def __init__(self, device: torch.device, events: list | None = None):
        self.cuda = device.type == "cuda"
        self.events = events if events is not None else []
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            i = len(self.marks)
            if i == len(self.events):
                self.events.append(torch.cuda.Event(enable_timing=True))
            ev = self.events[i]
            ev.record()
            self.marks.append((name, ev))
        else:
            self.marks.append((name, time.perf_counter()))

    def resolve(self) -> dict[str, float]:
        if self.cuda:  # the host sync read the chunk, but the last event may not be complete yet
            self.marks[-1][1].synchronize()
        out = {}
        for (_, a), (name, b) in itertools.pairwise(self.marks):
            out[name] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


def one_line(exc: BaseException, limit: int = 600) -> str:
    """`Type: message` on one line of at most `limit` characters: a compiler's error (Triton's
    PTXASError carries ptxas's stderr and the repro command over several lines) stays one
    readable log line on the robot."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def release_device_memory() -> None:
    """After a pipeline was dropped (a lifecycle node's cleanup): collect what only a garbage
    collection frees (reference cycles of modules and captured graphs), and give the CUDA caching
    allocator's free blocks back, so that other processes on the robot's GPU can use them."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except RuntimeError as exc:  # raised, it would fail the tear-down too (a lifecycle shutdown)
            log.error(
                "could not give the GPU memory back: %s (after a CUDA error the device is unusable in this "
                "process: restart it)",
                exc,
            )


def release_weights(policy: Policy) -> float:
    """Move the reference model's weights to the meta device and return the GiB of device memory
    that freed. Once the fused path is built the reference is not run again, and most of its
    weights are duplicates of the fused path's re-laid-out copies; the ones the fused path uses
    as they are stay alive through its own references. Irreversible for this process: the
    reference path needs a new policy afterwards."""
    dev = policy.device
    on_gpu = dev.type == "cuda"
    before = torch.cuda.memory_allocated(dev) if on_gpu else 0
    policy.model.to("meta")
    gc.collect()
    freed = (before - torch.cuda.memory_allocated(dev)) / 2**30 if on_gpu else 0.0
    log.info(
        "released the reference model's weights (%.2f GiB of %s memory): the fused path runs on its own copies",
        freed,
        dev,
    )
    return freed


class Pipeline:
    """Runs decisions of a Policy and keeps per-stage statistics.

    backend "reference" runs the plain-torch model; "fused" the fused path (`FusedPi0`:
    Triton kernels, static buffers, CUDA graphs); "auto" picks fused on a CUDA device and
    falls back to the reference, with a warning saying why, if it cannot be built.
    With `release_reference` (the node), a built fused path frees the reference model's weights:
    they would otherwise stay on the GPU as duplicates of the fused path's own copies.
    `prefix_trigger` "new_inputs" re-uses the cached prefix for observations whose frames (by
    their `frame_ids`) and prompt tokens it was built from; "period" also for newer frames, up to
    `prefix_period_s` after the decision that built it (on `clock`, seconds); "every_decision"
    always runs it.
    `rtc` (real-time chunking, engine/real_time_chunking.py) lets a decision be held to the chunk
    the robot executes (`decide(..., hold=)`); on the fused path its denoise graphs are built
    with the guided Euler step.
    """

    def __init__(
        self,
        policy: Policy,
        seed: int = 0,
        stats_window: int = 200,
        backend: str = "auto",
        fp8: str = "none",
        release_reference: bool = False,
        prefix_trigger: str = "new_inputs",
        prefix_period_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        rtc: RtcSettings | None = None,
    ):
        self.policy = policy
        self.rtc = rtc
        self.prefix_cache = PrefixCache(prefix_trigger, prefix_period_s, clock)
        self.stats = PipelineStats(stats_window)
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self.next_chunk_id = 1  # part of the execution state (capsules save and restore it)
        self.warm_up_ms: float | None = None  # the warm-up decision's, once it ran (a slow policy's first yardstick)
        self._events: list = []  # the timer's, re-used by every decision (each ends with a sync)
        if fp8 not in FP8_PARTS:
            raise ValueError(f"fp8 must be {' or '.join(FP8_PARTS)}, got {fp8!r}")
        if fp8 != "none" and policy.cfg.dtype != "bfloat16":  # not a silent fall back to the reference
            raise ValueError(f"fp8 {fp8!r} needs a bfloat16 policy, got {policy.cfg.dtype}")
        with on_device(policy.device):
            if rtc is not None and rtc.jacobian == "exact" and backend != "reference":
                raise ValueError(
                    "rtc jacobian 'exact' differentiates through the expert, which only the reference backend "
                    f"can (backend {backend!r}); use jacobian 'identity', or backend 'reference'"
                )
            self.fused = self._build_fused(backend, prefix_mlp_fp8=fp8 == "prefix_mlp")
        if fp8 != "none" and self.fused is None:
            log.warning("fp8 %r applies to the fused path only: the reference runs in %s", fp8, policy.cfg.dtype)
        self.backend = "fused" if self.fused is not None else "reference"
        # the fused path starts a decision's vision before the host makes its prompt tokens
        # (`_run_fused`); off, all host work comes first (bench/decide_host.py compares the two)
        self.vision_first = True
        self.released_gib: float | None = None  # device memory freed by `release_reference`
        # page-locked memory for the frames the caller converts (the node: as they arrive), which
        # the fused path then uploads with a queued copy; None where nothing would gain from it
        on_gpu = self.fused is not None and policy.device.type == "cuda"
        self.frame_pool: FramePool | None = FramePool() if on_gpu else None
        if release_reference and self.fused is not None:
            self.released_gib = release_weights(policy)

    def _build_fused(self, backend: str, prefix_mlp_fp8: bool = False):
        if backend not in ("auto", "fused", "reference"):
            raise ValueError(f"backend must be auto, fused or reference, got {backend!r}")
        if backend == "reference" or (backend == "auto" and self.policy.device.type != "cuda"):
            return None
        try:
            from ..policies.fused import FusedPi0

            dtype = getattr(torch, self.policy.cfg.dtype)
            fused = FusedPi0(self.policy.model, dtype, prefix_mlp_fp8=prefix_mlp_fp8, guided=self.rtc is not None)
            fused.capture()
        except Exception as exc:
            if backend == "fused":
                raise
            self._check_device_after(exc, "the fused path", "not falling back to the reference")
            log.warning("fused path unavailable (%s): running the reference path", one_line(exc))
            return None
        log.info("fused path active: %s", fused.describe())
        return fused

    def _check_device_after(self, exc: Exception, what: str, then: str) -> None:
        """After `what` raised `exc`: DeviceUnusable where it left the CUDA context broken (a kernel
        fault), since every later decision would fail. The reference may take over from a fused
        path that could not be built only on a working device."""
        if self.policy.device.type != "cuda":
            return
        try:
            torch.cuda.synchronize(self.policy.device)
        except Exception as broken:
            raise DeviceUnusable(
                f"{what} failed ({one_line(exc)}) and left the GPU unusable ({one_line(broken)}): {then}"
            ) from exc

    @property
    def stage_names(self) -> tuple[str, ...]:
        return STAGES

    def decide(self, obs: Observation, noise: torch.Tensor | None = None, hold: Hold | None = None) -> Decision:
        """One chunk; raises (and uses no chunk id) for bad inputs or non-finite actions. With
        `hold` (real-time chunking), the chunk is guided towards the executing one.

        A refusal of any kind gives the drawn noise back (the generator is restored), so the next
        good decision is the one a run without the refusal makes: capsules replay it exactly. A
        prefix the refused decision built is not held (the K/V it replaced cannot come back): the
        next decision builds its own, as it would have on frames the refused one did not see
        (under "period" it would otherwise act on the refused decision's frames, or, when the
        prefix made the NaN, be refused too)."""
        policy = self.policy
        rng = self.generator.get_state() if noise is None else None
        stores = self.prefix_cache.stores
        try:
            with on_device(policy.device):
                timer = _Timer(policy.device, self._events)
                timer.mark("start")  # drawing the noise is part of the preprocess stage
                if noise is None:
                    noise = policy.model.noise(1, self.generator, policy.device)
                self._check_noise(noise)
                if hold is not None and self.rtc is None:
                    raise ValueError("a hold (real-time chunking) needs a pipeline built with rtc settings")
                actions, timings, reused = self._decide(obs, noise.to(policy.device), timer, hold)
        except Exception:
            if rng is not None:  # no chunk: the next decision draws what this one would have
                self.generator.set_state(rng)
            if self.prefix_cache.stores != stores:
                self.prefix_cache.forget()
            raise
        self.stats.add(timings)
        chunk_id, self.next_chunk_id = self.next_chunk_id, self.next_chunk_id + 1
        frames = self.prefix_cache.held_frames  # the ones this decision stored or re-used
        return Decision(chunk_id, actions, timings, prefix_reused=reused, prefix_frames=frames)

    def warm_up(self, state_dim: int, prompt: str, frame_size: tuple[int, int] = (224, 224)) -> float:
        """One decision on black frames, a zero state and `prompt`, whose chunk goes nowhere; its
        wall milliseconds. A process's first decision also loads the CUDA kernels that run outside
        the graphs (the noise draw, the frames' copies and pre-processing, the chunk's read-back)
        and touches the host buffers for the first time: with Triton's cache empty it took 26.0 ms
        on an H100, and the first live decision after the warm-up 18.7 (docs/results/README.md).
        The frames go through the frame pool, as the node's do. Nothing of the live state changes:
        no chunk id is used, the noise comes from a generator of its own (the live one draws what
        it would have, so capsules replay alike), the statistics do not count it, and it holds no
        prefix (its frames have no ids). Made for the start: a prefix held from earlier decisions
        is dropped (the next decision builds its own). Raises what the decision raises;
        DeviceUnusable where that left the GPU broken."""
        policy, pool = self.policy, self.frame_pool
        h, w = frame_size
        black = np.zeros((h, w, 3), dtype=np.uint8)
        frames = [pool.copy(black) if pool is not None else black for _ in range(policy.cfg.camera_views)]
        obs = Observation([*frames, *[None] * policy.cfg.empty_cameras], np.zeros(state_dim, np.float32), prompt)
        t0 = time.perf_counter()
        try:
            with on_device(policy.device):
                noise = policy.model.noise(1, torch.Generator(device=policy.device).manual_seed(0), policy.device)
                self._decide(obs, noise, _Timer(policy.device, self._events))
        except Exception as exc:
            self._check_device_after(exc, "the warm-up decision", "restart the process")
            raise
        self.warm_up_ms = (time.perf_counter() - t0) * 1e3
        return self.warm_up_ms

    def set_prefix_trigger(self, trigger: str, period_s: float | None = None) -> None:
        """When the prefix stage runs from the next decision on (engine/prefix_cache.py)."""
        cache = self.prefix_cache
        period_s = cache.period_s if period_s is None else check_period(period_s)  # both checked first
        cache.trigger, cache.period_s = check_trigger(trigger), period_s

    def forget_prefix(self) -> None:
        """The next decision runs the prefix stage whatever its inputs: after a reset or a restored
        capsule (under the "period" trigger the held prefix would carry frames from before), or
        where the caller finds the held frames too old to act on."""
        self.prefix_cache.forget()

    def _decide(
        self, obs: Observation, noise: torch.Tensor, timer: _Timer, hold: Hold | None = None
    ) -> tuple[np.ndarray, dict[str, float], bool]:
        """Run one decision: the finite actions, the stage timings and whether the cached prefix
        was re-used, or raise."""
        self.policy.check_frames(obs)  # before any work, on both backends
        with torch.no_grad():
            run = self._run_fused if self.fused is not None else self._run_reference
            chunk, reused = run(obs, noise, timer, hold)
        actions = self.policy.postprocess(chunk, obs.state)  # the host sync (fused: the chunk came back already)
        timer.mark("postprocess")
        timings = timer.resolve()
        bad = ~np.isfinite(actions)
        if bad.any():
            rows = sorted(set(np.nonzero(bad)[0].tolist()))
            bad_noise = int((~torch.isfinite(noise)).sum())  # looked at only now: no sync on a good decision
            cause = (
                f"the noise given holds {bad_noise} NaN or inf value(s) of {noise.numel()}"
                if bad_noise
                else "check the checkpoint, its normalisation statistics and the precision"
            )
            raise NonFiniteActions(
                f"{int(bad.sum())} of {actions.size} actions are NaN or inf (rows {rows[:5]}"
                f"{'...' if len(rows) > 5 else ''}); expected finite actions: {cause}"
            )
        return actions, timings, reused

    def _check_noise(self, noise: object) -> None:
        """Both backends take the same noise, a float tensor [1, horizon, action_dim]: the reference
        would otherwise broadcast a row over the chunk or fail inside torch."""
        cfg = self.policy.cfg
        if not isinstance(noise, torch.Tensor) or not noise.is_floating_point():
            got = f"{noise.dtype} tensor" if isinstance(noise, torch.Tensor) else type(noise).__name__
            raise ValueError(f"noise must be a float torch.Tensor [1, {cfg.horizon}, {cfg.action_dim}], got {got}")
        if tuple(noise.shape) != (1, cfg.horizon, cfg.action_dim):
            raise ValueError(f"noise must be [1, {cfg.horizon}, {cfg.action_dim}], got {tuple(noise.shape)}")

    def _guide(self, obs: Observation, hold: Hold | None) -> ChunkGuide | None:
        """The hold in the model's space (after `_host_inputs` checked the state it uses)."""
        if hold is None or self.rtc is None:
            return None
        rtc = self.rtc
        return self.policy.chunk_guide(hold.target, hold.weights, obs.state, rtc.max_guidance, rtc.jacobian)

    def _host_inputs(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, PrefixKey | None]:
        """The checked prompt tokens, their mask and the state (host tensors), and the key of the
        prefix they and the frames make (None without frame ids); the frames were checked in `_decide`."""
        tokens, token_mask, state = self.policy.prompt_state(obs)
        return tokens, token_mask, state, PrefixKey.of(obs.frame_ids, obs.images, tokens, token_mask)

    # Both backends forget the cached key before the prefix stage writes its K/V and store the new
    # one after it: a stage that fails half-way leaves no key. (The fused path's vision may run
    # before the key is forgotten: it writes only the image rows of the prefix's input, which no
    # re-used prefix reads.) A failed denoise leaves the prefix as it was (the reference's K/V is
    # not written by it; the fused denoise writes only the rows after it).
    def _run_reference(
        self, obs: Observation, noise: torch.Tensor, timer: _Timer, hold: Hold | None = None
    ) -> tuple[torch.Tensor, bool]:
        model, policy, cache = self.policy.model, self.policy, self.prefix_cache
        tokens, token_mask, state, key = self._host_inputs(obs)
        guide = self._guide(obs, hold)
        now = cache.clock()
        reuse = cache.lookup(key, now=now)
        if reuse:
            timer.mark("preprocess")
            prefix = cache.held
        else:
            x: ModelInputs = policy.to_model_inputs(obs, tokens, token_mask, state)
            timer.mark("preprocess")
            cache.forget()
            prefix = model.prefill(*model.embed_prefix(x.pixels, x.image_masks, x.tokens, x.token_masks))
            cache.store(key, prefix, built_at=now)
            timer.mark("prefix")
        guide = guide.to(policy.device) if guide is not None else None
        chunk = model.denoise(prefix, noise, state[None].to(policy.device), guide=guide)
        timer.mark("denoise")
        return chunk, reuse

    def _run_fused(
        self, obs: Observation, noise: torch.Tensor, timer: _Timer, hold: Hold | None = None
    ) -> tuple[torch.Tensor, bool]:
        """Where the prefix stage will run whatever the prompt (new frames), its vision half is
        queued first and the host makes the tokens, checks the state and builds the guide while
        the GPU runs it: that host work then counts in the "prefix" stage's time, not in
        "preprocess". Otherwise (`vision_first` off, or a decision that may re-use the prefix)
        all host work comes first."""
        fused, cache = self.fused, self.prefix_cache
        now = cache.clock()
        frames = PrefixKey.frames_of(obs.frame_ids, obs.images)
        early = self.vision_first and cache.builds_whatever_the_prompt(frames, build=fused.prefix_serial, now=now)
        if early:  # vision reads no token; what it writes is read only by the language stage
            fused.set_frames(list(obs.images))
            timer.mark("preprocess")
            fused.run("vision")
        tokens, token_mask, state, key = self._host_inputs(obs)
        guide = self._guide(obs, hold)
        reuse = not early and cache.lookup(key, build=fused.prefix_serial, now=now)
        if not reuse and not early:
            fused.set_frames(list(obs.images))  # queued copies where they are page-locked (frame_pool.py)
        fused.set_inputs(tokens, token_mask, state, noise[0])  # host tensors: the bucket choice needs no sync
        fused.set_guide(guide)  # None: weights of zero (the plain step), where the path is guided
        if not early:
            timer.mark("preprocess")
        if not reuse:
            cache.forget()
            fused.run("language" if early else "prefix")
            cache.store(key, fused.prefix_serial, built_at=now)
            timer.mark("prefix")
        fused.run("denoise")
        timer.mark("denoise")
        return fused.actions_to_host()[None], reuse
