"""Re-using the cached prefix (engine/prefix_cache.py): a decision whose frames (by id) and
prompt tokens are the ones the cached K/V was built from skips the prefix stage, and its chunk
is byte-identical to a full decision's. Anything else runs the stage again."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from bench_script import run_bench_script
from kernel_fixtures import DEVICE

from flashrt_ros.engine.capsule import PipelineState
from flashrt_ros.engine.pipeline import NonFiniteActions, Pipeline
from flashrt_ros.engine.prefix_cache import PrefixCache, PrefixKey
from flashrt_ros.policies.policy import Observation, default_policy


def frame(fid) -> np.ndarray:
    """The pixels a frame id stands for: different ids, different pixels (a wrong re-use shows)."""
    return np.random.default_rng(zlib.crc32(repr(fid).encode())).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def obs(frame_ids=("a", "b"), state=(0.1, -0.2, 0.3, 0.0, 0.2, -0.1), prompt="pick up the cube") -> Observation:
    images = [None if fid is None else frame(fid) for fid in (frame_ids or ("a", "b"))]
    return Observation(images, np.array(state, np.float32), prompt, frame_ids=frame_ids)


def pair(kind: str = "pi05", backend: str = "reference"):
    """A re-using pipeline and one that runs every stage, same policy and seed (the fused path on
    the GPU where there is one, else in the Triton interpreter)."""
    policy = default_policy(kind, device=DEVICE if backend == "fused" else "cpu", num_views=2, action_dof=6)
    return Pipeline(policy, seed=3, backend=backend), Pipeline(
        policy, seed=3, backend=backend, prefix_trigger="every_decision"
    )


def decide_both(reusing: Pipeline, full: Pipeline, o: Observation):
    got, want = reusing.decide(o), full.decide(o)
    assert got.actions.tobytes() == want.actions.tobytes(), "a re-used prefix changed the chunk"
    assert not want.prefix_reused
    return got


def test_the_frames_reach_the_chunk() -> None:
    """What makes the byte comparisons below able to fail: other pixels, another chunk."""
    policy = default_policy(num_views=2, action_dof=6)
    noise = policy.model.noise(1, torch.Generator().manual_seed(0))
    a = Pipeline(policy).decide(obs(("a", "b")), noise).actions
    assert not np.array_equal(a, Pipeline(policy).decide(obs(("a", "c")), noise).actions)


def test_same_frames_and_prompt_reuse_the_prefix_and_change_nothing() -> None:
    reusing, full = pair()
    first, second, third = (decide_both(reusing, full, obs()) for _ in range(3))
    assert (first.prefix_reused, second.prefix_reused, third.prefix_reused) == (False, True, True)
    assert "prefix" in first.timings_ms and "prefix" not in second.timings_ms
    runs = {s.name: s.count for s in reusing.stats.summaries()}
    assert runs == {"preprocess": 3, "prefix": 1, "denoise": 3, "postprocess": 3}


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(obs(frame_ids=("a", "c")), id="new-frame"),
        pytest.param(obs(prompt="open the drawer"), id="new-prompt"),
        pytest.param(obs(frame_ids=(None, "b")), id="camera-gone"),
        pytest.param(obs(state=(0.9, -0.9, 0.9, 0.9, -0.9, 0.9)), id="pi05-state-in-prompt"),
        pytest.param(obs(frame_ids=None), id="no-ids"),
    ],
)
def test_anything_the_prefix_depends_on_runs_it_again(changed: Observation) -> None:
    reusing, full = pair()
    decide_both(reusing, full, obs())
    assert not decide_both(reusing, full, changed).prefix_reused
    if changed.frame_ids is not None:  # and the new prefix is the cached one from then on
        assert decide_both(reusing, full, changed).prefix_reused


@pytest.mark.parametrize("backend", ["reference", "fused"])
def test_pi0_takes_each_decisions_state_on_a_reused_prefix(backend: str) -> None:
    """pi0's state is a suffix token: a new joint state re-uses the prefix and still moves the chunk
    (the fused path makes the token in its denoise stage, not in the prefix)."""
    reusing, full = pair("pi0", backend)
    first = decide_both(reusing, full, obs())
    moved = decide_both(reusing, full, obs(state=(0.9, -0.9, 0.9, 0.9, -0.9, 0.9)))
    assert moved.prefix_reused
    assert not np.array_equal(first.actions, moved.actions)


def test_a_pi05_without_the_state_in_its_prompt_reuses_whatever_the_state() -> None:
    """discrete_state_input false (pi05_libero): the state reaches neither prompt nor suffix, so
    a moving arm keeps the prefix, and the chunk does not move with it."""
    from flashrt_ros.policies.config import PolicyConfig
    from flashrt_ros.policies.policy import build_policy
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    cfg = PolicyConfig.tiny("pi05", num_views=2).replace(discrete_state_input=False)
    policy = build_policy(cfg, tiny_tokenizer_path(), seed=0, action_dof=6)
    reusing, full = Pipeline(policy, seed=3), Pipeline(policy, seed=3, prefix_trigger="every_decision")
    first = decide_both(reusing, full, obs())
    moved = decide_both(reusing, full, obs(state=(0.9, -0.9, 0.9, 0.9, -0.9, 0.9)))
    assert moved.prefix_reused and not first.prefix_reused


def test_a_prefix_that_fails_leaves_no_cache_and_a_failed_denoise_keeps_it(monkeypatch) -> None:
    reusing, full = pair()
    decide_both(reusing, full, obs())
    model = reusing.policy.model
    for stage, kept in (("denoise", True), ("prefill", False)):
        real = getattr(model, stage)

        def broken(*args, stage=stage, **kwargs):
            raise RuntimeError(f"{stage} fault")

        monkeypatch.setattr(model, stage, broken)
        with pytest.raises(RuntimeError, match=f"{stage} fault"):
            reusing.decide(obs(("x", "y") if stage == "prefill" else ("a", "b")))
        monkeypatch.setattr(model, stage, real)
        assert decide_both(reusing, full, obs()).prefix_reused is kept, stage


@pytest.mark.parametrize(
    ("frame_ids", "message"),
    [
        (("a",), r"frame_ids must hold one id per camera view \(2\), got \('a',\)"),
        ("ab", r"frame_ids must hold one id per camera view \(2\), got 'ab'"),
        (("a", None), r"frame_ids has None for a present camera view: \('a', None\)"),
        ((["a"], "b"), r"unhashable type: 'list'"),
    ],
)
def test_bad_frame_ids_are_refused(frame_ids, message) -> None:
    reusing, full = pair()
    o = obs()
    o.frame_ids = frame_ids
    with pytest.raises((ValueError, TypeError), match=message):
        reusing.decide(o)
    decide_both(reusing, full, obs())  # the refusal gave its noise back


def test_a_restored_capsule_replays_the_chunks_of_a_pipeline_without_the_cache() -> None:
    """The cache is not part of a capsule: a re-use is exact, so the chunks after a restore are
    those of a pipeline that runs every prefix from the same state. The restore forgets the
    held prefix (under "period" its frames would be from the other line of decisions)."""
    policy = default_policy("pi05", num_views=2, action_dof=6)

    def state(trigger: str) -> PipelineState:
        return PipelineState(Pipeline(policy, seed=1, prefix_trigger=trigger), seed=1)

    reusing = state("new_inputs")
    saved = reusing.read()
    first = [reusing.decide(obs((i // 2, "b"))).prefix_reused for i in range(4)]
    assert first == [False, True, False, True]
    reusing.write(saved)  # the cache held the prefix of frames (1, "b") until now
    replay = [obs((1, "b")), obs((1, "b")), obs((0, "b"))]
    got = [reusing.decide(o) for o in replay]
    assert [d.prefix_reused for d in got] == [False, True, False]
    full = state("every_decision")
    assert [d.actions.tobytes() for d in got] == [full.decide(o).actions.tobytes() for o in replay]


def test_the_cache_on_its_own() -> None:
    tokens, mask = torch.arange(4), torch.tensor([True, True, False, False])
    key = PrefixKey.of(("x", "y"), [object(), object()], tokens, mask)
    assert PrefixKey.of(("x", "y"), [object(), object()], tokens.clone(), mask.clone()) == key
    assert PrefixKey.of(("x", "y"), [object(), object()], tokens.int(), mask) != key  # dtype is part of it
    same_bytes = torch.tensor([1, 1, 0, 0], dtype=torch.uint8)  # the mask's bytes, another dtype
    assert PrefixKey.of(("x", "y"), [object(), object()], tokens, same_bytes) != key
    assert PrefixKey.of(("x", "z"), [object(), None], tokens, mask) == PrefixKey.of(
        ("x", None), [object(), None], tokens, mask
    )  # an absent view's id does not count
    cache = PrefixCache()
    assert not cache.lookup(key)
    cache.store(key, 7)
    assert cache.lookup(key) and cache.lookup(key, build=7) and not cache.lookup(key, build=8)
    assert not cache.lookup(None)
    cache.forget()
    assert not cache.lookup(key) and cache.held is None
    wanted = "prefix_trigger must be one of new_inputs, period, every_decision, got 'sometimes'"
    with pytest.raises(ValueError, match=wanted):
        PrefixCache("sometimes")
    with pytest.raises(ValueError, match="prefix_trigger must be one of"):
        Pipeline(default_policy(num_views=2, action_dof=6), prefix_trigger="always")


def test_the_period_counts_from_the_decision_that_built_the_prefix_at_the_time_given() -> None:
    """A held prefix's age runs from the start of the decision that built it (`built_at`), not from
    when its stage ended, and at the `now` the decision read once, not a later read of the clock."""
    ticks = iter(range(10**6))
    clock = lambda: 5.0 + 0.06 * next(ticks)  # noqa: E731 - gains 0.06 s at every read
    cache = PrefixCache("period", period_s=0.1, clock=clock)
    tokens, mask = torch.arange(4), torch.ones(4, dtype=torch.bool)
    cache.store(PrefixKey.of(("a",), [object()], tokens, mask), "kv", built_at=0.0)
    newer = PrefixKey.of(("b",), [object()], tokens, mask)  # new frames only: the period decides
    assert cache.lookup(newer, now=0.09) and not cache.lookup(newer, now=0.10)
    assert not cache.builds_whatever_the_prompt(newer.frames, now=0.05)
    assert cache.builds_whatever_the_prompt(newer.frames, now=0.1)


def test_fused_path_reuses_its_cache_and_notices_a_prefix_run_by_others() -> None:
    """The fused path (Triton interpreter on a CPU) keeps its K/V in static buffers: a re-use
    matches a full decision byte for byte, and a prefix stage run outside the pipeline since
    (a benchmark, a test: through `run` or a direct call, on other inputs) is noticed."""
    reusing, full = pair(backend="fused")
    assert [decide_both(reusing, full, obs()).prefix_reused for _ in range(2)] == [False, True]
    fused = reusing.fused
    fused.run("prefix")
    assert not decide_both(reusing, full, obs()).prefix_reused
    other = torch.from_numpy(frame("other")).to(fused.device)
    fused.set_images([other, other])
    fused.prefix()  # the K/V of other frames, by a direct call
    assert not decide_both(reusing, full, obs()).prefix_reused
    assert decide_both(reusing, full, obs()).prefix_reused


def test_a_fused_prefix_that_fails_half_way_is_not_reused(monkeypatch) -> None:
    """The fused K/V lives in static buffers: a prefix stage that stops after writing a layer of
    other frames' K/V must leave no key behind (run eagerly here, so the fault can be injected
    between layers on a GPU too)."""
    reusing, full = pair(backend="fused")
    decide_both(reusing, full, obs())
    fused = reusing.fused
    fused.graphs.clear()
    write = fused._qkv_into_cache

    def first_layer_then_fault(*args, **kwargs):
        write(*args, **kwargs)
        raise RuntimeError("prefix fault")

    monkeypatch.setattr(fused, "_qkv_into_cache", first_layer_then_fault)
    with pytest.raises(RuntimeError, match="prefix fault"):
        reusing.decide(obs(("x", "y")))
    monkeypatch.undo()
    assert not decide_both(reusing, full, obs()).prefix_reused


def test_new_frames_refused_after_their_upload_keep_the_cache_exact(monkeypatch) -> None:
    """set_images has written other frames (and another view count) when set_inputs refuses: the
    K/V is untouched, so a re-use on the held frames is still a full decision's chunk."""
    reusing, full = pair("pi0", backend="fused")
    decide_both(reusing, full, obs())

    def refuse(*args, **kwargs):
        raise RuntimeError("inputs fault")

    monkeypatch.setattr(reusing.fused, "set_inputs", refuse)
    with pytest.raises(RuntimeError, match="inputs fault"):
        reusing.decide(obs((None, "y")))
    monkeypatch.undo()
    assert decide_both(reusing, full, obs(state=(0.5,) * 6)).prefix_reused
    assert not decide_both(reusing, full, obs((None, "y"))).prefix_reused


def test_builds_whatever_the_prompt_agrees_with_lookup() -> None:
    """What lets the fused path start vision before the tokens exist: where the cache says the
    stage runs whatever the prompt, `lookup` refuses every key on those frames; where it says it
    depends, the held tokens are re-used."""
    held_tokens = (torch.arange(4), torch.tensor([True, True, True, False]))
    prompts = [held_tokens, (torch.arange(1, 5), held_tokens[1])]
    images = [object(), object()]
    frame_sets = [("x", "y"), ("x", "z"), (None, "y"), None]
    for trigger in ("new_inputs", "period", "every_decision"):
        for age in (0.5, 2.0, -1.0):
            cache = PrefixCache(trigger, period_s=1.0, clock=lambda: 0.0)
            cache.store(PrefixKey.of(("x", "y"), images, *held_tokens), "build 1", built_at=-age)
            for frame_ids in frame_sets:
                shown = [None if f is None else img for f, img in zip(frame_ids or ("x", "y"), images, strict=True)]
                frames = PrefixKey.frames_of(frame_ids, shown)
                keys = [PrefixKey.of(frame_ids, shown, *t) for t in prompts]
                for build in ("build 1", "build 2"):
                    found = [cache.lookup(k, build=build, now=0.0) for k in keys]
                    sure = cache.builds_whatever_the_prompt(frames, build=build, now=0.0)
                    case = (trigger, age, frame_ids, build, found)
                    assert not (sure and any(found)), case
                    if not sure:
                        assert found[0], case
    assert PrefixCache().builds_whatever_the_prompt(("x", "y"))  # nothing held


def recorded(pipe: Pipeline) -> list[str]:
    """The order in which `pipe`'s decisions queue their stages and make their tokens."""
    calls: list[str] = []
    run, host = pipe.fused.run, pipe._host_inputs

    def run_stage(stage: str) -> None:
        calls.append(stage)
        run(stage)

    def host_inputs(o: Observation):
        calls.append("tokens")
        return host(o)

    pipe.fused.run, pipe._host_inputs = run_stage, host_inputs
    return calls


def test_new_frames_start_vision_before_the_tokens_and_change_nothing() -> None:
    """On new frames the fused path queues vision first and makes the tokens while it runs; a
    decision that may re-use the prefix makes its tokens first. The chunks are those of a
    pipeline that does all host work first (`vision_first` off)."""
    policy = default_policy("pi05", device=DEVICE, num_views=2, action_dof=6)
    first, serial = (Pipeline(policy, seed=3, backend="fused") for _ in range(2))
    serial.vision_first = False
    early, late = recorded(first), recorded(serial)
    for o in (obs(), obs(), obs(prompt="open the drawer"), obs(("a", "c"))):
        assert first.decide(o).actions.tobytes() == serial.decide(o).actions.tobytes()
    new_frames, same, new_prompt = ["vision", "tokens", "language", "denoise"], ["tokens", "denoise"], ["tokens"]
    assert early == new_frames + same + new_prompt + ["prefix", "vision", "language", "denoise"] + new_frames
    serial_full = ["tokens", "prefix", "vision", "language", "denoise"]  # "prefix" runs the two
    assert late == serial_full + same + serial_full + serial_full


def test_a_decision_refused_after_its_vision_ran_loses_nothing() -> None:
    """New frames with a NaN joint: vision has run into the prefix's image rows when the state
    check refuses. The K/V is untouched, so the held prefix is re-used exactly, and the new
    frames then give a full decision's chunk."""
    reusing, full = pair(backend="fused")
    decide_both(reusing, full, obs())
    calls = recorded(reusing)
    nan = (0.1, float("nan"), 0.3, 0.0, 0.2, -0.1)
    for frame_ids in (("x", "y"), (None, "z")):  # the second with another view count
        with pytest.raises(ValueError, match="state has non-finite values"):
            reusing.decide(obs(frame_ids, state=nan))
        assert calls == ["vision", "tokens"]
        calls.clear()
        assert decide_both(reusing, full, obs()).prefix_reused
        calls.clear()
    assert not decide_both(reusing, full, obs(("x", "y"))).prefix_reused


def test_the_benchmark_runs_and_finds_the_chunks_identical(tmp_path) -> None:
    """bench/prefix_reuse.py's smoke mode (tiny, CPU, reference only): its parity line and JSON."""
    stdout, written = run_bench_script("prefix_reuse", tmp_path, "--tiny", "--eager-iters", "3", timeout=300)
    assert "on the same inputs and noise: max abs diff 0, min cosine 1.0000" in stdout
    result = written["results"]["eager"]
    assert result["max_abs_diff"] == 0 and result["prefix_run"]["n"] == result["prefix_reused"]["n"] == 3


class Clock:
    """The prefix's age is read from the pipeline's clock: set by hand here."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def period_pair(kind: str = "pi0", backend: str = "reference", period_s: float = 1.0):
    """A pipeline on the "period" trigger with a hand-set clock, and one that runs every stage."""
    clock = Clock()
    policy = default_policy(kind, device=DEVICE if backend == "fused" else "cpu", num_views=2, action_dof=6)
    periodic = Pipeline(policy, seed=3, backend=backend, prefix_trigger="period", prefix_period_s=period_s, clock=clock)
    return periodic, Pipeline(policy, seed=3, backend=backend, prefix_trigger="every_decision"), clock


MOVED = (0.5, 0.4, -0.3, 0.2, -0.6, 0.1)


@pytest.mark.parametrize("backend", ["reference", pytest.param("fused", marks=pytest.mark.slow)])
def test_period_acts_on_the_held_frames_until_the_period_ends(backend: str) -> None:
    """New frames alone do not run the stage within the period: the chunk is the one a full
    decision on the held frames and the *current* state gives (pi0: the state is in the denoise),
    and `prefix_frames` names those frames. At the end of the period the new frames are used."""
    periodic, full, clock = period_pair(backend=backend)
    first = periodic.decide(obs(("a", "b")))
    assert not first.prefix_reused and first.prefix_frames == ("a", "b")
    full.decide(obs(("a", "b")))
    clock.now += 0.999
    held = periodic.decide(obs(("a2", "b2"), state=MOVED))
    assert held.prefix_reused and held.prefix_frames == ("a", "b")
    assert "prefix" not in held.timings_ms
    assert held.actions.tobytes() == full.decide(obs(("a", "b"), state=MOVED)).actions.tobytes()
    clock.now += 0.001  # the period is over: the newest frames run the stage
    fresh = periodic.decide(obs(("a3", "b3"), state=MOVED))
    assert not fresh.prefix_reused and fresh.prefix_frames == ("a3", "b3")
    assert fresh.actions.tobytes() == full.decide(obs(("a3", "b3"), state=MOVED)).actions.tobytes()


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(obs(("a2", "b2"), prompt="open the drawer"), id="new-prompt"),
        pytest.param(obs(("a2", None)), id="camera-gone"),
        pytest.param(obs(None), id="no-ids"),
    ],
)
def test_period_holds_back_frames_only(changed: Observation) -> None:
    """The prompt tokens and which views are present are never held back, however young the
    prefix; nor is a prefix used for an observation that names no frames."""
    periodic, _, _ = period_pair()
    periodic.decide(obs(("a", "b")))
    assert not periodic.decide(changed).prefix_reused


def test_period_runs_pi05_again_when_its_state_tokens_change() -> None:
    """pi0.5 carries the discretised state in its prompt: a moved arm runs the stage, a still
    one re-uses the prefix of older frames."""
    periodic, _, _ = period_pair("pi05")
    periodic.decide(obs(("a", "b")))
    assert periodic.decide(obs(("a2", "b2"))).prefix_reused
    assert not periodic.decide(obs(("a3", "b3"), state=MOVED)).prefix_reused


def test_period_ages_from_the_decision_that_built_the_prefix() -> None:
    """Re-uses do not extend the period; a clock that went back (sim time reset) gives no age."""
    periodic, _, clock = period_pair(period_s=0.1)
    periodic.decide(obs(("a", "b")))
    reused = []
    for i in range(1, 6):
        clock.now += 0.04
        reused.append(periodic.decide(obs((f"a{i}", "b"))).prefix_reused)
    assert reused == [True, True, False, True, True]  # built at 0 and 0.12; 0.16 and 0.2 are within 0.1
    clock.now -= 50.0
    assert not periodic.decide(obs(("a9", "b"))).prefix_reused


def test_a_refused_decision_leaves_no_prefix_for_the_period() -> None:
    """A decision refused after it built the prefix (non-finite actions) publishes nothing: its
    prefix must not hold the next decisions to its frames for the period (if the prefix made the
    NaN, all of them would be refused too). The next one builds its own, on its own frames."""
    periodic, full, clock = period_pair(period_s=0.1)
    weight = next(p for n, p in periodic.policy.model.named_parameters() if "action_out" in n)
    good = weight.detach().clone()
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteActions):
        periodic.decide(obs(("x", "x")))
    with torch.no_grad():
        weight.copy_(good)
    clock.now += 0.03
    after = periodic.decide(obs(("y", "y")))
    assert not after.prefix_reused and after.prefix_frames == ("y", "y")
    assert after.actions.tobytes() == full.decide(obs(("y", "y"))).actions.tobytes()


def test_a_reset_forgets_the_held_prefix() -> None:
    periodic, _, _ = period_pair()
    state = PipelineState(periodic, seed=3)
    state.decide(obs(("a", "b")))
    state.reset()
    after = state.decide(obs(("a2", "b2")))
    assert not after.prefix_reused and after.prefix_frames == ("a2", "b2")


def test_period_is_checked_and_changes_at_runtime() -> None:
    policy = default_policy(num_views=2, action_dof=6)
    for bad in (0, -1.0, float("nan"), float("inf"), True, np.True_, "0.1", np.float32("nan")):
        with pytest.raises(ValueError, match="prefix_period_s must be a finite number of seconds > 0"):
            Pipeline(policy, prefix_period_s=bad)
    assert Pipeline(policy, prefix_period_s=np.float32(0.25)).prefix_cache.period_s == pytest.approx(0.25)
    clock = Clock()
    pipeline = Pipeline(policy, clock=clock)
    pipeline.decide(obs(("a", "b")))
    assert not pipeline.decide(obs(("a2", "b"))).prefix_reused  # new_inputs: a new frame runs the stage
    with pytest.raises(ValueError, match="prefix_period_s"):
        pipeline.set_prefix_trigger("period", 0.0)
    assert pipeline.prefix_cache.trigger == "new_inputs"  # a refused change changes nothing
    pipeline.set_prefix_trigger("period", 5.0)
    assert pipeline.decide(obs(("a3", "b"))).prefix_reused


def test_period_runs_the_stage_when_only_the_token_mask_changed() -> None:
    """`self.tokens == other.tokens` ignored the mask: under "period" a key whose mask alone
    changed (same token ids, another prompt length) re-used the held prefix."""
    tokens, images = torch.zeros(4, dtype=torch.int64), [object(), object()]
    held = PrefixKey.of(("a", "b"), images, tokens, torch.tensor([True, True, False, False]))
    newer = PrefixKey.of(("a2", "b2"), images, tokens, torch.tensor([True, True, True, False]))
    cache = PrefixCache("period", period_s=1.0, clock=lambda: 0.0)
    cache.store(held, "k/v", built_at=0.0)
    assert cache.lookup(PrefixKey.of(("a2", "b2"), images, tokens, torch.tensor([True, True, False, False])), now=0.5)
    assert not cache.lookup(newer, now=0.5)
