"""The decision pipeline on the CPU: named stage timings, chunk ids, and no chunk from a policy
that produces NaN actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_ros.engine.pipeline import STAGES, Decision, NonFiniteActions, Pipeline, one_line
from flashrt_ros.engine.real_time_chunking import ExecutingChunk, RtcSettings, hold
from flashrt_ros.policies.policy import Observation, default_policy


def observation() -> Observation:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (24, 32, 3), dtype=np.uint8) for _ in range(2)]
    return Observation(images, rng.normal(size=6).astype(np.float32) * 0.3, "pick up the cube")


def test_decisions_are_timed_per_stage_and_numbered() -> None:
    pipeline = Pipeline(default_policy(num_views=2, action_dof=6), seed=0)
    first, second = pipeline.decide(observation()), pipeline.decide(observation())
    assert (first.chunk_id, second.chunk_id) == (1, 2)
    assert tuple(first.timings_ms) == STAGES and all(ms >= 0 for ms in first.timings_ms.values())
    assert first.actions.shape == (pipeline.policy.cfg.horizon, 6) and np.isfinite(first.actions).all()
    assert [s.count for s in pipeline.stats.summaries()] == [2] * len(STAGES)


def test_a_refused_input_gives_its_noise_back() -> None:
    """A state with NaN is refused before any chunk: the next good decision is the one a run
    without the refusals would have made (capsules replay it byte for byte)."""
    policy = default_policy(num_views=2, action_dof=6)
    clean, refused = Pipeline(policy, seed=5), Pipeline(policy, seed=5)
    bad = observation()
    bad.state[2] = np.nan
    for _ in range(3):
        with pytest.raises(ValueError, match="state has non-finite values"):
            refused.decide(bad)
    got, want = refused.decide(observation()), clean.decide(observation())
    assert got.chunk_id == want.chunk_id == 1
    assert got.actions.tobytes() == want.actions.tobytes()


def test_a_complex_state_and_a_prompt_that_is_no_str_are_refused_by_name() -> None:
    """numpy dropped a complex state's imaginary part with a warning and the decision ran; a
    prompt of None failed inside the tokenizer with an AttributeError."""
    from dataclasses import replace

    pipeline = Pipeline(default_policy(num_views=2, action_dof=6), seed=0)
    good = observation()
    with pytest.raises(ValueError, match=r"state must be real numbers, got complex\d+; no action computed"):
        pipeline.decide(replace(good, state=good.state + 1j))
    with pytest.raises(ValueError, match="state must be real numbers, got <U1"):
        pipeline.decide(replace(good, state=np.array(["a"] * 6)))
    for prompt in (None, b"pick"):
        with pytest.raises(ValueError, match=f"prompt must be a str, got {type(prompt).__name__}; no action"):
            pipeline.decide(replace(good, prompt=prompt))
    assert pipeline.decide(good).chunk_id == 1


def test_a_chunk_refused_as_non_finite_gives_its_noise_back() -> None:
    """The refusal after the model ran (NonFiniteActions) gives the noise back too: once the
    weight is repaired, the next decision is byte-identical to a run that never refused."""
    policy = default_policy(num_views=2, action_dof=6)
    clean, refused = Pipeline(policy, seed=5), Pipeline(policy, seed=5)
    weight = next(p for n, p in policy.model.named_parameters() if "action_out" in n)
    good = weight.detach().clone()
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    for _ in range(2):
        with pytest.raises(NonFiniteActions, match="actions are NaN or inf"):
            refused.decide(observation())
    with torch.no_grad():
        weight.copy_(good)
    got, want = refused.decide(observation()), clean.decide(observation())
    assert got.chunk_id == want.chunk_id == 1
    assert got.actions.tobytes() == want.actions.tobytes()


def test_a_refused_frame_gives_its_noise_back() -> None:
    policy = default_policy(num_views=2, action_dof=6)
    clean, refused = Pipeline(policy, seed=5), Pipeline(policy, seed=5)
    nan_frames = Observation([np.full((24, 32, 3), np.nan, np.float32)] * 2, observation().state, "pick up the cube")
    with pytest.raises(ValueError, match=r"camera view 0: expected uint8 pixels \(0\.\.255\), got dtype float32"):
        refused.decide(nan_frames)
    assert refused.decide(observation()).actions.tobytes() == clean.decide(observation()).actions.tobytes()


@pytest.mark.parametrize(
    ("noise", "message"),
    [
        (torch.zeros(2, 10, 32), r"noise must be \[1, 10, 32\], got \(2, 10, 32\)"),
        (torch.zeros(1, 32), r"noise must be \[1, 10, 32\], got \(1, 32\)"),
        (torch.zeros(1, 10, 33), r"noise must be \[1, 10, 32\], got \(1, 10, 33\)"),
        (torch.zeros(1, 10, 32, dtype=torch.int64), r"float torch.Tensor \[1, 10, 32\], got torch.int64 tensor"),
        (np.zeros((1, 10, 32), np.float32), r"noise must be a float torch.Tensor \[1, 10, 32\], got ndarray"),
    ],
)
def test_reference_backend_checks_the_noise_like_the_fused_one(noise, message) -> None:
    """Both backends say the same thing for noise of another shape or type, before any work."""
    pipeline = Pipeline(default_policy(num_views=2, action_dof=6), backend="reference")
    with pytest.raises(ValueError, match=message):
        pipeline.decide(observation(), noise)
    assert pipeline.next_chunk_id == 1 and pipeline.stats.summaries() == []
    assert pipeline.decide(observation(), torch.zeros(1, 10, 32)).chunk_id == 1


def test_fused_backend_on_a_cpu_without_the_interpreter_is_refused_before_releasing_anything(monkeypatch) -> None:
    """backend "fused" means "fail if unavailable": on a CPU without TRITON_INTERPRET it must not
    build, report fused and move the reference weights to meta, then fail every decision."""
    import flashrt_ros.policies.fused  # noqa: F401  # its kernels bind to the interpreter at import: before the change

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    policy = default_policy(num_views=2, action_dof=6)
    needs_cuda = r"fused path needs a CUDA device .*TRITON_INTERPRET=1.*; the model is on cpu"
    with pytest.raises(RuntimeError, match=needs_cuda):
        Pipeline(policy, backend="fused", release_reference=True)
    assert next(policy.model.parameters()).device.type == "cpu"  # the reference weights are kept
    assert Pipeline(policy, backend="auto").decide(observation()).chunk_id == 1


def test_nan_actions_are_refused_and_use_no_chunk_id() -> None:
    policy = default_policy(num_views=2, action_dof=6)
    pipeline = Pipeline(policy, seed=0)
    assert pipeline.decide(observation()).chunk_id == 1
    with torch.no_grad():  # a broken checkpoint: one NaN in the action projection
        next(p for n, p in policy.model.named_parameters() if "action_out" in n).view(-1)[0] = float("nan")
    refused = r"60 of 60 actions are NaN or inf \(rows \[0, 1, 2, 3, 4\]\.\.\.\); expected finite actions"
    with pytest.raises(NonFiniteActions, match=refused + ": check the checkpoint"):
        pipeline.decide(observation())
    assert pipeline.next_chunk_id == 2 and pipeline.stats.summaries()[0].count == 1


def test_nan_actions_from_a_callers_nan_noise_name_the_noise() -> None:
    """Engine callers may give their own noise (the bench scripts): NaN there read as a bad
    checkpoint. Looked at only after NaN actions (on a GPU a check up front would be a sync per decision)."""
    policy = default_policy(num_views=2, action_dof=6)
    noise = torch.zeros(1, policy.cfg.horizon, policy.cfg.action_dim)
    noise[0, 3, 1] = float("nan")
    refused = r"expected finite actions: the noise given holds 1 NaN or inf value\(s\) of \d+$"
    with pytest.raises(NonFiniteActions, match=refused):
        Pipeline(policy, seed=0).decide(observation(), noise)


def test_a_build_error_is_logged_on_one_line() -> None:
    """The fall-back warning quotes the error that stopped the fused path; Triton's ptxas error
    spans several lines (stderr, repro command), and a robot's log wants it on one."""
    error = RuntimeError("`ptxas` failed with error code 1\n`ptxas` stderr:\nptxas fatal : bad\n\nRepro command: x\n")
    assert (
        one_line(error)
        == "RuntimeError: `ptxas` failed with error code 1 | `ptxas` stderr: | ptxas fatal : bad | Repro command: x"
    )
    assert one_line(ValueError()) == "ValueError"
    long = one_line(OSError("e" * 2000), limit=100)
    assert len(long) == 100 and long.endswith("...")


def test_delta_actions_are_published_with_the_state_added_back() -> None:
    """A checkpoint trained on delta actions (here over the first 4 of 6 joints, the third kept
    absolute): the decision's actions are the plain model's plus the observation's raw state (not
    the normalised one the model saw) on exactly those dims, for every step of the chunk."""
    from flashrt_ros.policies.config import PolicyConfig
    from flashrt_ros.policies.normalize import Normalizer, Stats
    from flashrt_ros.policies.policy import build_policy
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    cfg, mask = PolicyConfig.tiny("pi05", num_views=2), (True, True, False, True)
    stats = Stats(mean=np.full(6, 0.5, np.float32), std=np.full(6, 2.0, np.float32))
    norm = Normalizer("mean_std", state=stats, actions=stats)
    plain = build_policy(cfg, tiny_tokenizer_path(), seed=0, action_dof=6, normalizer=norm)
    delta = build_policy(cfg.replace(delta_action_mask=mask), tiny_tokenizer_path(), 0, action_dof=6, normalizer=norm)
    obs = observation()
    got, base = Pipeline(delta, seed=3).decide(obs), Pipeline(plain, seed=3).decide(obs)
    added = np.where([*mask, False, False], obs.state, 0.0)
    assert np.abs(added).min(initial=1.0, where=added != 0) > 0.01  # the state is not ~0 on those dims
    np.testing.assert_allclose(got.actions - base.actions, np.broadcast_to(added, got.actions.shape), atol=1e-6)


def test_giving_gpu_memory_back_after_a_cuda_error_logs_instead_of_raising(monkeypatch, caplog):
    """After a sticky CUDA error (an illegal address in a kernel) every CUDA call raises: the
    tear-down's memory release must not, or a lifecycle shutdown fails and the node never ends."""
    from flashrt_ros.engine import pipeline as pipeline_module

    def sticky() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", sticky)
    with caplog.at_level("ERROR", logger=pipeline_module.__name__):
        pipeline_module.release_device_memory()
    assert "could not give the GPU memory back: CUDA error: an illegal memory access" in caplog.text


@pytest.mark.parametrize("backend", ["reference", pytest.param("fused", marks=pytest.mark.slow)])
def test_a_warm_up_leaves_the_live_state_as_it_was(backend: str) -> None:
    """The warm-up decision (the node's, at start) runs the whole path but leaves nothing a live
    decision sees: the next chunk is the one a pipeline without it makes, byte for byte, with id
    1, the statistics count no decision, the live generator is where it was, and no prefix is
    held."""
    from kernel_fixtures import DEVICE

    policy = default_policy("pi0", device=DEVICE if backend == "fused" else "cpu", num_views=2, action_dof=6)
    settings = dict(seed=3, backend=backend, prefix_trigger="period", prefix_period_s=60.0)
    warmed, cold = Pipeline(policy, **settings), Pipeline(policy, **settings)
    rng = warmed.generator.get_state()
    assert warmed.warm_up(6, "pick up the cube", (24, 32)) > 0
    assert torch.equal(warmed.generator.get_state(), rng)
    assert warmed.stats.summaries() == []
    assert warmed.prefix_cache.held_frames is None
    o = observation()
    o.frame_ids = ("a", "b")
    got, want = warmed.decide(o), cold.decide(o)
    assert (got.chunk_id, got.prefix_reused) == (1, False)
    assert got.actions.tobytes() == want.actions.tobytes()


def test_a_warm_up_that_fails_says_why_and_holds_no_prefix() -> None:
    """A warm-up refused after its prefix was built (here NaN actions) raises what the decision
    raises, and leaves no prefix held and no chunk id used."""
    policy = default_policy(num_views=2, action_dof=6)
    pipeline = Pipeline(policy, prefix_trigger="period", prefix_period_s=60.0)
    weight = next(p for n, p in policy.model.named_parameters() if "action_out" in n)
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteActions):
        pipeline.warm_up(6, "pick up the cube")
    assert pipeline.prefix_cache.held_frames is None and pipeline.next_chunk_id == 1
    with pytest.raises(ValueError, match="state must be a vector of at most"):
        pipeline.warm_up(99, "pick up the cube")


def test_a_warm_up_refused_for_non_finite_actions_says_the_live_decisions_will_be_too() -> None:
    """On black frames and a zero state a diverged checkpoint's NaN is no one-time cost: the start-up
    line said "the first decision pays the one-time costs" and the node then never published."""
    from flashrt_ros.ros.params import NodeConfig
    from flashrt_ros.ros.startup import warm_up

    policy = default_policy(num_views=2, action_dof=6)
    pipeline = Pipeline(policy, seed=0)
    cfg = NodeConfig(joint_names=[f"j{i}" for i in range(6)])
    assert "black" in warm_up(pipeline, cfg) and "failed" not in warm_up(pipeline, cfg)
    with torch.no_grad():  # a broken checkpoint: one NaN in the action projection
        next(p for n, p in policy.model.named_parameters() if "action_out" in n).view(-1)[0] = float("nan")
    said = warm_up(pipeline, cfg)
    assert said.startswith("failed (NonFiniteActions: ") and said.endswith(
        "the live decisions will likely be refused the same way"
    ), said


# ---- the pipeline's own choices and checks --------------------------------------------------------


def test_one_non_finite_action_refuses_the_whole_chunk() -> None:
    """Non-finite values spread through the denoise, but an overflow in one joint's un-normalising
    touches that action alone: still no chunk, and no chunk id used."""
    pipe = Pipeline(default_policy(num_views=2, action_dof=6), backend="reference")
    real = pipe.policy.postprocess

    def one_overflow(chunk, state):
        actions = real(chunk, state)
        actions[3, 2] = np.inf
        return actions

    pipe.policy.postprocess = one_overflow
    with pytest.raises(NonFiniteActions, match=r"1 of \d+ actions are NaN or inf \(rows \[3\]\)"):
        pipe.decide(observation())
    assert pipe.next_chunk_id == 1


def test_backends_are_checked_and_chosen() -> None:
    """A misspelt backend is refused (not a fused build that falls back with a warning); auto runs
    the reference on a CPU; the exact Jacobian, which the fused path cannot do, is refused for
    auto too (a GPU would build the fused path); release_reference frees nothing without one."""
    policy = default_policy(num_views=2, action_dof=6)
    with pytest.raises(ValueError, match="backend must be auto, fused or reference, got 'refernce'"):
        Pipeline(policy, backend="refernce")
    assert Pipeline(policy, backend="auto").backend == "reference"
    with pytest.raises(ValueError, match="'exact' differentiates through the expert.*backend 'auto'"):
        Pipeline(policy, backend="auto", rtc=RtcSettings(jacobian="exact"))
    kept = Pipeline(policy, backend="reference", release_reference=True)
    assert kept.released_gib is None and np.isfinite(kept.decide(observation()).actions).all()


def test_a_misspelt_trigger_is_refused_at_runtime_and_changes_nothing() -> None:
    pipe = Pipeline(default_policy(num_views=2, action_dof=6), backend="reference", prefix_trigger="period")
    with pytest.raises(ValueError, match="prefix_trigger must be one of"):
        pipe.set_prefix_trigger("every_decisions", 0.5)
    assert (pipe.prefix_cache.trigger, pipe.prefix_cache.period_s) == ("period", 0.1)


def test_the_period_ages_from_the_time_the_decision_read_before_its_prefix() -> None:
    """The clock is read once per decision, at its start: a prefix stage that ends later does not
    make its prefix younger."""
    readings = iter([0.0, 0.09, 0.15] + [0.15] * 10)
    policy = default_policy("pi0", num_views=2, action_dof=6)
    pipe = Pipeline(policy, prefix_trigger="period", prefix_period_s=0.1, clock=lambda: next(readings))
    o = observation()

    def at(ids: tuple[str, str]) -> Observation:
        return Observation(o.images, o.state, o.prompt, frame_ids=ids)

    assert not pipe.decide(at(("a", "b"))).prefix_reused  # built at 0.0
    assert pipe.decide(at(("a2", "b2"))).prefix_reused  # 0.09 after it
    assert not pipe.decide(at(("a3", "b3"))).prefix_reused  # 0.15 after it


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (RtcSettings(max_guidance=0.5), RtcSettings(max_guidance=5.0)),
        (RtcSettings(jacobian="identity"), RtcSettings(jacobian="exact")),
    ],
)
def test_the_pipelines_rtc_settings_reach_the_guided_denoise(a: RtcSettings, b: RtcSettings) -> None:
    policy = default_policy("pi05", num_views=2, action_dof=6)
    rng = np.random.default_rng(0)
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)] * 2, rng.uniform(-1, 1, 6), "pick up")
    horizon = policy.cfg.horizon
    executing = ExecutingChunk(rng.uniform(-1, 1, (horizon, 6)).astype(np.float32), 0, 20_000_000)
    held = hold(executing, 40_000_000, 70_000_000, horizon, a)
    noise = policy.model.noise(1, torch.Generator().manual_seed(3), "cpu")
    one = Pipeline(policy, backend="reference", rtc=a).decide(obs, noise, hold=held).actions
    two = Pipeline(policy, backend="reference", rtc=b).decide(obs, noise, hold=held).actions
    assert np.abs(one - two).max() > 1e-4


def test_the_warm_up_is_kept_as_the_yardstick_and_total_ms_sums_the_stages() -> None:
    """The node reads warm_up_ms as a slow policy's first yardstick, and takes total_ms off the
    wall time for its own overhead."""
    pipe = Pipeline(default_policy(num_views=2, action_dof=6), backend="reference")
    assert pipe.warm_up_ms is None
    ms = pipe.warm_up(6, "pick up the cube", (24, 32))
    assert pipe.warm_up_ms == ms > 0
    assert Decision(1, np.zeros((1, 1), np.float32), {"preprocess": 1.0, "prefix": 2.0, "denoise": 4.0}).total_ms == 7
