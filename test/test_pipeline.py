"""The decision pipeline on the CPU: named stage timings, chunk ids, and no chunk from a policy
that produces NaN actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_ros.engine.pipeline import STAGES, NonFiniteActions, Pipeline, one_line
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


def test_nan_actions_are_refused_and_use_no_chunk_id() -> None:
    policy = default_policy(num_views=2, action_dof=6)
    pipeline = Pipeline(policy, seed=0)
    assert pipeline.decide(observation()).chunk_id == 1
    with torch.no_grad():  # a broken checkpoint: one NaN in the action projection
        next(p for n, p in policy.model.named_parameters() if "action_out" in n).view(-1)[0] = float("nan")
    refused = r"60 of 60 actions are NaN or inf \(rows \[0, 1, 2, 3, 4\]\.\.\.\); expected finite actions"
    with pytest.raises(NonFiniteActions, match=refused):
        pipeline.decide(observation())
    assert pipeline.next_chunk_id == 2 and pipeline.stats.summaries()[0].count == 1


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
