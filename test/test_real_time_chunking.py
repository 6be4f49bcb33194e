"""Real-time chunking: the hold's weights and alignment, the guided denoise on both backends, and
the executing chunk read back into the model's space."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from kernel_fixtures import DEVICE
from policy_fixtures import tiny_inputs, tiny_model

from flashrt_ros.engine.pipeline import Pipeline
from flashrt_ros.engine.real_time_chunking import ExecutingChunk, LatencyWindow, RtcSettings, hold
from flashrt_ros.policies.guidance import ChunkGuide, guidance_weight, guided_velocity, prefix_weights, step_table
from flashrt_ros.policies.normalize import Normalizer, Stats
from flashrt_ros.policies.policy import Observation, default_policy

# ---- the weights ---------------------------------------------------------------------------------


def test_prefix_weights_follow_the_papers_schedule() -> None:
    """1 for the delayed actions, c * (e^c - 1) / (e - 1) with c = (overlap - i) / (overlap - delay
    + 1) over the rest of the overlap, 0 past it (Black et al. 2025, eq. 5)."""
    delay, overlap, horizon = 3, 10, 14
    w = prefix_weights(delay, overlap, horizon, "exp")
    assert w[:delay].tolist() == [1.0] * delay and w[overlap:].tolist() == [0.0] * (horizon - overlap)
    for i in range(delay, overlap):
        c = (overlap - i) / (overlap - delay + 1)
        assert math.isclose(float(w[i]), c * math.expm1(c) / (math.e - 1), rel_tol=1e-6)
    falling = w[delay - 1 : overlap].tolist()
    assert all(a > b for a, b in zip(falling, falling[1:], strict=False))
    lin = prefix_weights(delay, overlap, horizon, "linear")
    assert math.isclose(float(lin[delay]), 7 / 8, rel_tol=1e-6) and math.isclose(float(lin[overlap - 1]), 1 / 8)
    assert prefix_weights(delay, overlap, horizon, "ones")[:overlap].tolist() == [1.0] * overlap
    assert prefix_weights(delay, overlap, horizon, "zeros").tolist() == [1.0] * delay + [0.0] * (horizon - delay)
    # a delay past the overlap holds the overlap only
    assert prefix_weights(12, overlap, horizon).tolist() == [1.0] * overlap + [0.0] * 4
    with pytest.raises(ValueError, match="schedule must be one of"):
        prefix_weights(1, 2, 3, "cosine")


def test_guidance_weight_is_capped_and_pi0s_time() -> None:
    """(t^2 + (1 - t)^2) / (t (1 - t)): 2 at t = 1/2, unbounded at both ends, so beta there, and
    never above the number of steps (a step would overshoot the target)."""
    assert guidance_weight(0.5, 5.0, 10) == pytest.approx(2.0)
    assert guidance_weight(0.9, 100.0, 100) == pytest.approx((0.81 + 0.01) / 0.09)
    assert guidance_weight(1.0, 5.0, 10) == guidance_weight(0.0, 5.0, 10) == 5.0
    assert guidance_weight(0.9, 100.0, 4) == 4.0 and guidance_weight(1.0, 5.0, 1) == 1.0
    table = step_table(10, 5.0)
    assert table[:, 0].tolist() == pytest.approx([1.0 - k / 10 for k in range(10)])
    assert table[0, 1] == 5.0 and table[5, 1] == pytest.approx(2.0)


def test_exact_guidance_is_the_vector_jacobian_product() -> None:
    """ "exact" corrects by J^T e with J = d(x - t v)/dx: checked against a Jacobian built column by
    column from finite differences of a nonlinear field; "identity" by e itself."""
    g = torch.Generator().manual_seed(0)
    m = torch.randn(6, 6, generator=g, dtype=torch.float64) * 0.5

    def field(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ m) + 0.3 * x

    x = torch.randn(1, 4, 6, generator=g, dtype=torch.float64)
    target = torch.randn(4, 6, generator=g, dtype=torch.float64)
    weights = torch.rand(4, 6, generator=g, dtype=torch.float64)
    t, beta = 0.4, 5.0
    c = guidance_weight(t, beta, 10)
    v = field(x)
    e = weights * (target - (x - t * v))
    n, eps = x.numel(), 1e-6
    jac = torch.zeros(n, n, dtype=torch.float64)
    for j in range(n):
        d = torch.zeros(n, dtype=torch.float64)
        d[j] = eps
        xp, xm = x + d.view_as(x), x - d.view_as(x)
        jac[:, j] = (((xp - t * field(xp)) - (xm - t * field(xm))) / (2 * eps)).flatten()
    want = v - c * (jac.T @ e.flatten()).view_as(x)
    got = guided_velocity(field, x, t, ChunkGuide(target, weights, beta, "exact"), 10)
    torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7)
    identity = guided_velocity(field, x, t, ChunkGuide(target, weights, beta, "identity"), 10)
    torch.testing.assert_close(identity, v - c * e)


# ---- alignment on the robot's clock ---------------------------------------------------------------


def test_hold_lines_the_executing_chunk_up_with_the_new_one() -> None:
    """A chunk of 10 actions every 20 ms from t = 1 s; the next starts 60 ms later (shift 3), its
    publication 45 ms after its start: 3 actions held fully (ceil(45 / 20)), 7 overlap."""
    old = np.arange(20, dtype=np.float32).reshape(10, 2)
    executing = ExecutingChunk(old, start_ns=1_000_000_000, step_ns=20_000_000)
    start = 1_060_000_000
    held = hold(executing, start, start + 45_000_000, 10, RtcSettings())
    assert (held.shift, held.delay, held.overlap) == (3, 3, 7) and np.count_nonzero(held.weights) == 7
    np.testing.assert_array_equal(held.target[:7], old[3:])
    assert not held.target[7:].any() and not held.weights[7:].any()
    assert held.weights[:3].tolist() == [1.0] * 3 and 0 < held.weights[3] < 1
    fixed = hold(executing, start, start + 45_000_000, 10, RtcSettings(delay_steps=1))
    assert fixed.delay == 1 and fixed.weights[1] < 1
    only_delayed = hold(executing, start, start + 45_000_000, 10, RtcSettings(schedule="zeros"))
    assert (only_delayed.delay, only_delayed.overlap) == (3, 7) and np.count_nonzero(only_delayed.weights) == 3
    # nothing held at all (no delay, schedule zeros): no hold, not a hold of zero weights
    assert hold(executing, start, start, 10, RtcSettings(schedule="zeros")) is None
    # nothing left of the old chunk, or a new chunk before it (the clock went back): no hold
    assert hold(executing, 1_200_000_000, 1_250_000_000, 10, RtcSettings()) is None
    assert hold(executing, 900_000_000, 950_000_000, 10, RtcSettings()) is None


def test_hold_between_two_actions_follows_the_old_trajectory() -> None:
    """Stamps are joint states' or publications', not a whole number of steps apart: a chunk that
    starts 1.5 steps after the executing one was held to the old action 2 steps on (the nearest),
    a jump of half a step's move at the takeover. It is held to the old trajectory at its own times."""
    old = np.stack([np.arange(10.0), -2.0 * np.arange(10.0)], axis=1).astype(np.float32)  # a ramp
    executing = ExecutingChunk(old, start_ns=0, step_ns=20_000_000)
    held = hold(executing, 30_000_000, 40_000_000, 10, RtcSettings())
    assert (held.shift, held.overlap) == (2, 8)  # 1.5 steps on: old actions 1.5 .. 8.5
    np.testing.assert_allclose(held.target[:8], old[1:9] + 0.5 * (old[2:10] - old[1:9]), rtol=0, atol=1e-6)
    assert not held.target[8:].any() and not held.weights[8:].any()
    almost_whole = hold(executing, 59_999_999, 60_000_000, 10, RtcSettings())  # 3 steps less a nanosecond
    assert almost_whole.overlap == 7 and np.abs(almost_whole.target[:7] - old[3:]).max() < 1e-6


def test_hold_at_the_edges_of_the_executing_chunk() -> None:
    """A new chunk stamped more than half a step before the executing one gets no hold (it is not
    lined up with action 0); one that takes over at its last action is held to that action alone;
    an executing chunk longer than the horizon is held over the horizon only."""
    old = np.stack([np.arange(10.0), -2.0 * np.arange(10.0)], axis=1).astype(np.float32)
    step = 20_000_000
    executing = ExecutingChunk(old, start_ns=1_000_000_000, step_ns=step)
    early = executing.start_ns - 14_000_000  # 0.7 steps before
    assert hold(executing, early, early + step, 10, RtcSettings()) is None
    last = executing.start_ns + 9 * step
    held = hold(executing, last, last + step, 10, RtcSettings())
    assert (held.overlap, held.delay) == (1, 1)
    np.testing.assert_array_equal(held.target[0], old[9])
    capped = hold(executing, executing.start_ns, executing.start_ns + step, 4, RtcSettings())
    assert capped.overlap == 4 and capped.target.shape == (4, 2)


def test_latency_window_gives_the_slowest_and_the_median_recent_decision() -> None:
    window = LatencyWindow(size=3)
    assert window.slowest_ns() == window.typical_ns() == 0
    for ns in (10, 40, 20, 15, 12):
        window.add(ns)
    assert window.slowest_ns() == 20 and window.typical_ns() == 15  # 40 left the window of 3


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_guidance must be a positive number"):
        RtcSettings(max_guidance=0.0)
    with pytest.raises(ValueError, match="jacobian must be one of"):
        RtcSettings(jacobian="full")
    with pytest.raises(ValueError, match="schedule must be one of"):  # not at the first hold
        RtcSettings(schedule="linaer")
    with pytest.raises(ValueError, match="delay_steps must be >= 0"):
        RtcSettings(delay_steps=-2)
    # refused where they are made, not as a TypeError in every later decision's slice
    with pytest.raises(ValueError, match="delay_steps must be a whole number .* got 2.5"):
        RtcSettings(delay_steps=2.5)
    with pytest.raises(ValueError, match="delay_steps must be a whole number .* got True"):
        RtcSettings(delay_steps=True)
    with pytest.raises(ValueError, match="max_guidance must be a number, got True"):
        RtcSettings(max_guidance=True)
    assert RtcSettings(delay_steps=np.int64(2), max_guidance=np.float32(2.0)).delay_steps == 2


# ---- the guided denoise -----------------------------------------------------------------------------


def test_a_chunk_guide_is_checked_and_keeps_its_settings_when_moved() -> None:
    """A [action_dim] guide would hold every row of the chunk; the reference path moves the guide
    every guided decision, and the settings must go with it."""
    for shape in [(3,), (1, 4, 3)]:
        with pytest.raises(ValueError, match=r"must both be \[horizon, action_dim\]"):
            ChunkGuide(torch.zeros(shape), torch.ones(shape))
    moved = ChunkGuide(torch.zeros(4, 3), torch.ones(4, 3), 0.5, "exact").to("cpu")
    assert (moved.max_guidance, moved.jacobian) == (0.5, "exact")


def _guide(cfg, held_rows: int, seed: int = 5, jacobian: str = "identity") -> ChunkGuide:
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(cfg.horizon, cfg.action_dim, generator=g)
    weights = torch.zeros(cfg.horizon, cfg.action_dim)
    weights[:held_rows] = torch.from_numpy(prefix_weights(2, held_rows, held_rows))[:, None]
    return ChunkGuide(target, weights, 5.0, jacobian)


@pytest.mark.parametrize("jacobian", ["identity", "exact"])
def test_guided_denoise_pulls_the_held_actions_to_the_target(jacobian) -> None:
    """The held rows end near the target (far nearer than unguided); zero weights change nothing."""
    model = tiny_model("pi05", seed=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    plain = model.sample_actions(**x)[0]
    guide = _guide(model.cfg, held_rows=4, jacobian=jacobian).to(DEVICE)
    guided = model.sample_actions(**x, guide=guide)[0]
    before = (plain[:2] - guide.target[:2]).abs().max().item()
    after = (guided[:2] - guide.target[:2]).abs().max().item()
    assert after < 0.1 * before, f"held rows {before:.3f} -> {after:.3f} from the target"
    none = ChunkGuide(guide.target, torch.zeros_like(guide.weights), 5.0, jacobian)
    assert torch.equal(model.sample_actions(**x, guide=none)[0], plain)


@pytest.mark.parametrize("beta", [5.0, 100.0])
def test_one_step_lands_on_the_target_however_strong_the_guidance(beta) -> None:
    """A policy of one denoise step: the cap c <= N makes the fully held actions the target itself
    (uncapped, beta 5 would throw them four gaps past it); the rows not held are the plain ones."""
    model = tiny_model("pi05", seed=2, num_steps=1).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    guide = _guide(model.cfg, held_rows=4)
    guide = ChunkGuide(guide.target, guide.weights, beta).to(DEVICE)
    out = model.sample_actions(**x, guide=guide)[0]
    torch.testing.assert_close(out[:2], guide.target[:2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[4:], model.sample_actions(**x)[0][4:])


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_fused_guided_denoise_matches_the_reference(kind) -> None:
    """The step kernel's guided Euler tail against the reference's identity guidance; the guided
    path with no guide set runs the plain denoise."""
    from flashrt_ros.policies.fused import FusedPi0

    model = tiny_model(kind, seed=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    guide = _guide(model.cfg, held_rows=5).to(DEVICE)
    ref = model.sample_actions(**x, guide=guide)[0]
    plain = model.sample_actions(**x)[0]
    fused = FusedPi0(model, torch.float32, guided=True)
    fused.set_pixels(x["pixels"][0], x["image_masks"][0].tolist())
    fused.set_inputs(x["tokens"][0], x["token_masks"][0], x["state"][0], x["noise"][0])
    fused.capture()
    fused.set_guide(guide)
    torch.testing.assert_close(fused.sample_actions().clone(), ref, rtol=1e-4, atol=1e-4)
    fused.set_guide(None)
    torch.testing.assert_close(fused.sample_actions().clone(), plain, rtol=1e-4, atol=1e-4)
    # another beta (a runtime rtc_max_guidance change), the guide from the host and from the device
    weaker = dataclasses.replace(_guide(model.cfg, held_rows=5), max_guidance=2.0)
    ref_weaker = model.sample_actions(**x, guide=weaker.to(DEVICE))[0]
    assert (ref_weaker - ref).abs().max() > 1e-3  # the beta changes the chunk
    for given in (weaker, weaker.to(DEVICE)):
        fused.set_guide(given)
        torch.testing.assert_close(fused.sample_actions().clone(), ref_weaker, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="identity Jacobian; jacobian 'exact' needs the reference"):
        fused.set_guide(_guide(model.cfg, 5, jacobian="exact"))


# ---- the executing chunk in the model's space ------------------------------------------------------


def _aloha_policy(mode: str, convention: str, deltas: bool = True, aloha: bool = True):
    from flashrt_ros.policies.config import PolicyConfig
    from flashrt_ros.policies.policy import build_policy
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    mask = (6, -1, 6, -1) if deltas else ()
    cfg = PolicyConfig.tiny("pi05", num_views=2).replace(delta_action_mask=mask, aloha_adapt_to_pi=aloha)
    policy = build_policy(cfg, tiny_tokenizer_path(), seed=0, action_dof=14)
    rng = np.random.default_rng(4)
    lo = rng.uniform(-2, 0, cfg.action_dim).astype(np.float32)
    width = rng.uniform(0.5, 3, cfg.action_dim).astype(np.float32)
    width[3] = 0.0  # a dim the statistics pin to one value: a robot value maps to inf or ~1e8 in the model's space
    if mode == "quantile":
        stats = Stats(q01=lo, q99=lo + width)
    else:
        stats = Stats(mean=lo, std=width)
    policy.normalizer = Normalizer(mode, state=stats, actions=stats, convention=convention)
    return policy


@pytest.mark.parametrize("space", ["deltas+aloha", "deltas", "aloha"])
@pytest.mark.parametrize("convention", ["lerobot", "openpi"])
@pytest.mark.parametrize("mode", ["quantile", "mean_std"])
def test_chunk_guide_reads_the_robots_actions_back_into_the_models_space(mode, convention, space) -> None:
    """Deltas against the new state, ALOHA's joint and gripper conversion (each alone, as pi0_libero
    or DROID's deltas, and both) and both statistics in both conventions: the guide's target,
    post-processed as a chunk would be, gives back the robot's actions on every held dim; the dim
    whose statistics have no width gets no weight, and the padded dims are held to 0 with the
    rows' weights (LeRobot zero-pads the executing chunk)."""
    deltas = space.startswith("deltas")
    policy = _aloha_policy(mode, convention, deltas=deltas, aloha=space.endswith("aloha"))
    cfg = policy.cfg
    rng = np.random.default_rng(5)
    state = rng.uniform(-1, 1, 14)
    state[[6, 13]] = [0.3, 0.7]
    target = rng.uniform(-1, 1, (cfg.horizon, 14)).astype(np.float32)
    rows = prefix_weights(2, 6, cfg.horizon)
    guide = policy.chunk_guide(target, rows, state)
    assert guide.target.shape == guide.weights.shape == (cfg.horizon, cfg.action_dim)
    back = policy.postprocess(guide.target[None], state)
    held = [d for d in range(14) if d != 3]
    np.testing.assert_allclose(back[:6, held], target[:6, held], atol=1e-4)
    assert not guide.weights[:, 3].any() and not guide.target[:, 14:].any()
    np.testing.assert_array_equal(guide.weights[:, 14:].numpy(), np.repeat(rows[:, None], cfg.action_dim - 14, 1))
    np.testing.assert_array_equal(guide.weights[:, 0].numpy(), rows)
    # another state: the delta dims move with it, the absolute ones (grippers) do not
    other = policy.chunk_guide(target, rows, state + 0.25)
    assert torch.allclose(other.target[:6, 0], guide.target[:6, 0]) is not deltas
    torch.testing.assert_close(other.target[:6, 6], guide.target[:6, 6])


# ---- the pipeline --------------------------------------------------------------------------------


def test_pipeline_backends_take_the_same_hold() -> None:
    """A hold through Pipeline.decide: the fused path's chunk is the reference's, both pulled
    towards the executing chunk on the held actions."""
    policy = default_policy("pi05", device=DEVICE, num_views=2, action_dof=6)
    rng = np.random.default_rng(0)
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)] * 2, rng.uniform(-1, 1, 6), "pick up")
    noise = policy.model.noise(1, torch.Generator(device=DEVICE).manual_seed(3), DEVICE)
    h = policy.cfg.horizon
    executing = ExecutingChunk(rng.uniform(-1, 1, (h, 6)).astype(np.float32), 0, 20_000_000)
    held = hold(executing, 40_000_000, 70_000_000, h, RtcSettings())
    assert (held.shift, held.delay) == (2, 2)
    ref_pipe = Pipeline(policy, backend="reference", rtc=RtcSettings())
    plain = ref_pipe.decide(obs, noise).actions
    ref = ref_pipe.decide(obs, noise, hold=held).actions
    fused = Pipeline(policy, backend="fused", rtc=RtcSettings()).decide(obs, noise, hold=held).actions
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-4)
    want = executing.actions[2:4]
    assert np.abs(ref[:2] - want).max() < 0.1 * np.abs(plain[:2] - want).max()


def test_pipeline_refuses_what_it_cannot_guide() -> None:
    policy = default_policy("pi05", num_views=2, action_dof=6)
    rng = np.random.default_rng(0)
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)] * 2, rng.uniform(-1, 1, 6), "pick up")
    h = policy.cfg.horizon
    held = hold(ExecutingChunk(np.zeros((h, 6), np.float32), 0, 1), 0, 0, h, RtcSettings())
    with pytest.raises(ValueError, match="needs a pipeline built with rtc settings"):
        Pipeline(policy, backend="reference").decide(obs, hold=held)
    with pytest.raises(ValueError, match="'exact' differentiates through the expert.*backend 'fused'"):
        Pipeline(policy, backend="fused", rtc=RtcSettings(jacobian="exact"))


def test_the_executing_chunks_trajectory_runs_from_its_origin_to_its_actions():
    """As joint_trajectory_controller plays it: from where the joints were at the start to action 0
    one step later, then action i at (i + 1) steps; before the start its origin, after the end its
    last action; a joint of no known origin is at action 0 for the first step."""
    actions = np.array([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]], np.float32)
    chunk = ExecutingChunk(actions, start_ns=1000, step_ns=100, origin=np.array([0.0, np.nan]))
    np.testing.assert_allclose(chunk.trajectory_at(1000), [0.0, 10.0])
    np.testing.assert_allclose(chunk.trajectory_at(1050), [0.5, 10.0])
    np.testing.assert_allclose(chunk.trajectory_at(1150), [1.5, 15.0])
    np.testing.assert_allclose(chunk.trajectory_at(1300), [4.0, 40.0])
    np.testing.assert_allclose(chunk.trajectory_at(5000), [4.0, 40.0])
    np.testing.assert_allclose(chunk.trajectory_at(0), [0.0, 10.0])
    np.testing.assert_allclose(ExecutingChunk(actions, 1000, 100).trajectory_at(1050), [1.0, 10.0])


_STEP = 20_000_000


def _executing() -> ExecutingChunk:
    old = np.stack([np.arange(10.0), -2.0 * np.arange(10.0)], axis=1).astype(np.float32)
    return ExecutingChunk(old, start_ns=1_000_000_000, step_ns=_STEP)


def test_a_chunk_starting_less_than_half_a_step_early_is_held_from_the_first_action() -> None:
    """Without `at = max(at, 0.0)`, a new chunk 0.3 steps before the executing one (shift 0)
    was held to index -0.3 + i: action 0's target blended the chunk's *last* action (index -1)."""
    executing = _executing()
    start = executing.start_ns - 6_000_000  # 0.3 steps early: shift round(-0.3) = 0
    held = hold(executing, start, start + 30_000_000, 10, RtcSettings())
    assert held is not None and (held.shift, held.overlap) == (0, 10)
    np.testing.assert_array_equal(held.target, executing.actions)


def test_a_takeover_before_the_new_chunks_start_holds_nothing_fully() -> None:
    """Without `max(0, ...)`, a joint-state stamp ahead of now (clock skew within max_age_s, the
    node's "observation" trajectory stamp) gave a negative delay, and prefix_weights raised: the
    node logged rtc_failed and decided unguided."""
    executing = _executing()
    start = executing.start_ns + 2 * _STEP
    held = hold(executing, start, start - 30_000_000, 10, RtcSettings())
    assert held is not None and held.delay == 0 and held.overlap == 8
    assert 0 < held.weights[0] < 1


def test_the_reported_delay_is_at_most_the_overlap() -> None:
    """`Hold(..., delay, ...)` reported a delay beyond the overlap (the ActionChunk's
    held-fully count) when the takeover is past the old chunk's end."""
    executing = _executing()
    start = executing.start_ns + 7 * _STEP
    held = hold(executing, start, start + 100 * _STEP, 10, RtcSettings())
    assert (held.delay, held.overlap) == (3, 3)


def test_zero_step_is_a_value_error_naming_it() -> None:
    """`step < 0` let step_ns = 0 through to a ZeroDivisionError."""
    executing = ExecutingChunk(np.zeros((4, 2), np.float32), start_ns=0, step_ns=0)
    with pytest.raises(ValueError, match="step_ns must be > 0, got 0"):
        hold(executing, 0, 0, 4, RtcSettings())


def test_latency_window_typical_is_the_median_and_negatives_count_as_zero() -> None:
    """The mean for the median (the project's one test had mean == median); a negative
    latency (a clock that went back) kept negative made the likely start earlier than now."""
    window = LatencyWindow(size=3)
    for ns in (10, 10, 100):
        window.add(ns)
    assert window.typical_ns() == 10 and window.slowest_ns() == 100
    back = LatencyWindow(size=3)
    back.add(-50)
    assert back.typical_ns() == 0 and back.slowest_ns() == 0


def test_delay_steps_of_minus_one_is_refused_where_it_is_made() -> None:
    """`delay_steps < -1` let -1 through (the project's test used -2); prefix_weights then
    raised at every decision (rtc_failed, unguided)."""
    with pytest.raises(ValueError, match="delay_steps must be >= 0"):
        RtcSettings(delay_steps=-1)


def test_infinite_max_guidance_is_refused() -> None:
    """Without `math.isfinite`, max_guidance = inf passed the settings check."""
    with pytest.raises(ValueError, match="max_guidance must be a positive number, got inf"):
        RtcSettings(max_guidance=math.inf)


def test_ones_holds_only_the_overlap():
    assert prefix_weights(2, 5, 10, "ones").tolist() == [1.0] * 5 + [0.0] * 5


@pytest.mark.parametrize("args", [(-1, 5, 10), (0, 11, 10)])
def test_prefix_weights_refuse_a_negative_delay_or_an_overlap_past_the_horizon(args):
    for schedule in ("exp", "ones", "zeros"):
        with pytest.raises(ValueError, match="need 0 <= overlap <= horizon and delay >= 0"):
            prefix_weights(*args, schedule)


def _bad_guide(**kw):
    base = dict(target=torch.zeros(4, 3), weights=torch.ones(4, 3))
    base.update(kw)
    return ChunkGuide(**base)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(jacobian="exakt"), "jacobian must be one of"),
        (dict(max_guidance=0.0), "max_guidance must be a positive number"),
        (dict(max_guidance=float("inf")), "max_guidance must be a positive number"),
        (dict(weights=torch.ones(4, 2)), r"must both be \[horizon, action_dim\]"),
        (dict(weights=torch.tensor([[float("nan")] * 3] * 4)), "must be finite"),
        (dict(target=torch.tensor([[0.0, 0.0, float("nan")]] * 4)), "must be finite"),
        (
            dict(
                target=torch.full((4, 3), float("nan"), dtype=torch.bfloat16),
                weights=torch.ones(4, 3, dtype=torch.bfloat16),
            ),
            "must be finite",
        ),
    ],
)
def test_chunk_guide_refuses_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        _bad_guide(**kw)
