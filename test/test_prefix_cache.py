"""Re-using the cached prefix (engine/prefix_cache.py): a decision whose frames (by id) and
prompt tokens are the ones the cached K/V was built from skips the prefix stage, and its chunk
is byte-identical to a full decision's. Anything else runs the stage again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.engine.capsule import PipelineState
from flashrt_ros.engine.pipeline import Pipeline
from flashrt_ros.engine.prefix_cache import PrefixCache, PrefixKey
from flashrt_ros.policies.policy import Observation, default_policy

FRAMES = [np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8) for _ in range(2)]


def obs(frame_ids=("a", "b"), state=(0.1, -0.2, 0.3, 0.0, 0.2, -0.1), prompt="pick up the cube", images=None):
    images = list(FRAMES) if images is None else images
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
        pytest.param(obs(frame_ids=(None, "b"), images=[None, FRAMES[1]]), id="camera-gone"),
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


def test_pi0_takes_each_decisions_state_on_a_reused_prefix() -> None:
    """pi0's state is a suffix token: a new joint state re-uses the prefix and still moves the chunk."""
    reusing, full = pair("pi0")
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


def test_a_failed_decision_forgets_the_prefix(monkeypatch) -> None:
    reusing, full = pair()
    decide_both(reusing, full, obs())
    denoise = reusing.policy.model.denoise

    def broken(*args, **kwargs):
        raise RuntimeError("denoise fault")

    monkeypatch.setattr(reusing.policy.model, "denoise", broken)
    with pytest.raises(RuntimeError, match="denoise fault"):
        reusing.decide(obs())
    monkeypatch.setattr(reusing.policy.model, "denoise", denoise)
    assert not decide_both(reusing, full, obs()).prefix_reused


@pytest.mark.parametrize(
    ("frame_ids", "message"),
    [
        (("a",), r"frame_ids must hold one id per camera view \(2\), got \('a',\)"),
        ("ab", r"frame_ids must hold one id per camera view \(2\), got 'ab'"),
        (("a", None), r"frame_ids has None for a present camera view: \('a', None\)"),
        ((["a"], "b"), r"unhashable type: 'list'"),
    ],
)
def test_bad_frame_ids_are_refused_before_any_work(frame_ids, message) -> None:
    reusing, full = pair()
    with pytest.raises((ValueError, TypeError), match=message):
        reusing.decide(obs(frame_ids=frame_ids))
    assert reusing.stats.summaries() == []
    decide_both(reusing, full, obs())  # the refusal drew no noise


def test_a_restored_capsule_replays_the_same_chunks_with_or_without_the_cache() -> None:
    """The cache is not part of a capsule: a re-use is exact, so a replay after a restore gives
    the chunks of the first pass whether the prefix runs again or not."""
    policy = default_policy("pi05", num_views=2, action_dof=6)
    state = PipelineState(Pipeline(policy, seed=1), seed=1)
    saved = state.read()
    first = [state.decide(obs(frame_ids=(i // 2, "b"))).actions for i in range(4)]
    state.write(saved)
    again = [state.decide(obs(frame_ids=(i // 2, "b"))).actions for i in range(4)]
    assert [a.tobytes() for a in first] == [a.tobytes() for a in again]


def test_the_cache_on_its_own() -> None:
    tokens, mask = torch.arange(4), torch.tensor([True, True, False, False])
    key = PrefixKey.of(("x", "y"), [object(), object()], tokens, mask)
    assert PrefixKey.of(("x", "y"), [object(), object()], tokens.clone(), mask.clone()) == key
    assert PrefixKey.of(("x", "y"), [object(), object()], tokens.int(), mask) != key  # dtype is part of it
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
    with pytest.raises(ValueError, match="prefix_trigger must be one of new_inputs, every_decision, got 'sometimes'"):
        PrefixCache("sometimes")
    with pytest.raises(ValueError, match="prefix_trigger must be one of"):
        Pipeline(default_policy(num_views=2, action_dof=6), prefix_trigger="always")


def test_fused_path_reuses_its_cache_and_notices_a_prefix_run_by_others() -> None:
    """The fused path (Triton interpreter on a CPU) keeps its K/V in static buffers: a re-use
    matches a full decision byte for byte, and a prefix stage run outside the pipeline since
    (a benchmark, a test) is noticed, not re-used."""
    reusing, full = pair(backend="fused")
    assert [decide_both(reusing, full, obs()).prefix_reused for _ in range(2)] == [False, True]
    reusing.fused.run("prefix")
    assert not decide_both(reusing, full, obs()).prefix_reused
    assert decide_both(reusing, full, obs()).prefix_reused


def test_the_benchmark_runs_and_finds_the_chunks_identical(tmp_path) -> None:
    """bench/prefix_reuse.py's smoke mode (tiny, CPU, reference only): its parity line and JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "prefix_reuse.py"
    run = subprocess.run(
        [sys.executable, str(script), "--tiny", "--eager-iters", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "eager: re-used vs run, same inputs and noise: max abs diff 0, min cosine 1.000000000" in run.stdout
    (path,) = tmp_path.glob("prefix_reuse_*.json")
    result = json.loads(path.read_text())["results"]["eager"]
    assert result["max_abs_diff"] == 0 and result["prefix_run"]["n"] == result["prefix_reused"]["n"] == 2
