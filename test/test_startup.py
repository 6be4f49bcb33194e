"""What the node builds at start (ros/startup.py) from its parameters, without ROS: each setting
reaches the pipeline (rtc off, precision, seed, tokenizer, prefix trigger, action joints), the
policy checks count state and action joints against their own dims and views against topics,
the device error comes with the checkpoint's, and the start-up descriptions say what runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.normalize import Normalizer, Stats
from flashrt_ros.policies.policy import read_policy
from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path
from flashrt_ros.ros import startup
from flashrt_ros.ros.params import NodeConfig
from flashrt_ros.ros.startup import StartupError

CAMS = ["cam0/image_raw", "cam1/image_raw"]
NO_GPU_CASE = "tests device 'cuda' refused on a machine without a CUDA GPU; this machine has one, where it is valid"


def source(state_stats=None, action_stats=None, **tiny):
    cfg = PolicyConfig.tiny("pi05", **{"num_views": len(CAMS), **tiny})
    norm = Normalizer("identity")
    if state_stats is not None:
        stats = lambda n: Stats(q01=-np.ones(n), q99=np.ones(n))  # noqa: E731
        norm = Normalizer("quantile", state=stats(state_stats), actions=stats(action_stats))
    return read_policy(cfg, tiny_tokenizer_path(), normalizer=norm)


def node_cfg(**values) -> NodeConfig:
    return NodeConfig.from_values({"camera_topics": CAMS, "joint_names": ["j0", "j1", "j2", "j3", "j4"], **values})


def test_state_and_action_joints_are_each_checked_against_their_own_dims():
    """5 state joints, 4 action joints: a model of state_dim 5 / action_dim 4 with statistics of 5
    state and 4 action dims fits exactly (each bound is inclusive, state and actions not mixed up)."""
    cfg = node_cfg(action_joint_names=["j0", "j1", "j2", "j3"])
    assert startup.policy_problems(source(state_dim=5, action_dim=4), "pi05", cfg) == []
    assert startup.policy_problems(source(5, 4), "pi05", cfg) == []
    # and one too many on the action side is named for the actions, not the state
    five = node_cfg()
    said = startup.policy_problems(source(5, 4), "pi05", five)
    assert said == [
        "action_joint_names (or joint_names) has 5 joints but the normalisation statistics of the policy "
        "cover 4; expected at most 4 (the checkpoint was trained on another robot?)"
    ], said
    said = startup.policy_problems(source(state_dim=5, action_dim=4), "pi05", five)
    assert said == [
        "action_joint_names (or joint_names) has 5 joints but the model takes at most 4; expected at most 4"
    ], said


def test_a_policy_with_more_camera_views_than_topics_is_refused():
    """3 views, 2 camera topics: one view would never be fed."""
    said = startup.policy_problems(source(num_views=3), "pi05", node_cfg())
    assert "the policy takes 3 camera views; camera_topics has 2" in said, said


@pytest.mark.skipif(torch.cuda.is_available(), reason=NO_GPU_CASE)
def test_an_indexed_cuda_device_without_a_gpu_is_refused_by_name():
    with pytest.raises(StartupError, match=r"device 'cuda:1' requested but torch sees no CUDA device"):
        startup.resolve_device("cuda:1", False)


@pytest.mark.skipif(torch.cuda.is_available(), reason=NO_GPU_CASE)
def test_device_cuda_without_a_gpu_is_said_with_an_unreadable_checkpoint(tmp_path):
    """The device's problem comes with the checkpoint's, not one start after the other."""
    with pytest.raises(StartupError) as err:
        startup.build_pipeline_state(NodeConfig(device="cuda", checkpoint=str(tmp_path)))
    text = str(err.value)
    assert text.startswith("device 'cuda' requested but torch sees no CUDA device"), text
    assert "could not build policy 'pi05_tiny'" in text, text


def test_a_zero_rtc_delay_holds_no_action_fully_it_is_not_the_latency_estimate():
    cfg = dataclasses.replace(NodeConfig(), rtc=True, rtc_delay_steps=0)
    assert startup.rtc_settings(cfg).delay_steps == 0
    assert "its first 0 actions held fully" in startup.describe_rtc(cfg, 4)
    auto = dataclasses.replace(cfg, rtc_delay_steps=-1)
    assert startup.rtc_settings(auto).delay_steps is None
    assert "(from the slowest of the last 10 decisions) held fully" in startup.describe_rtc(auto, 4)


def test_a_guidance_weight_equal_to_the_steps_is_not_said_capped():
    cfg = dataclasses.replace(NodeConfig(), rtc=True, rtc_max_guidance=4.0)
    assert startup.guidance_cap(cfg, 4) == "4"


def test_the_prefix_schedule_says_each_trigger():
    said = {
        t: startup.prefix_schedule(dataclasses.replace(NodeConfig(), prefix_trigger=t, prefix_period_s=0.5))
        for t in ("every_decision", "period", "new_inputs")
    }
    assert said["every_decision"] == "runs at every decision"
    assert "at most every 0.5 s" in said["period"]
    assert "any camera sends a new frame" in said["new_inputs"]


@pytest.fixture(scope="module")
def built():
    """Two pipelines from TEST_PARAMS-like parameters: seed 7 and seed 0."""
    params = {"camera_topics": CAMS, "joint_names": ["j0", "j1", "j2", "j3"], "image_height": 24, "image_width": 32}
    return {seed: startup.build_pipeline_state(NodeConfig.from_values({**params, "seed": seed})) for seed in (7, 0)}


def test_the_seed_reaches_the_weights_the_noise_and_the_reset(built):
    (state7, _), (state0, _) = built[7], built[0]
    assert state7.seed == 7  # ~/reset returns to it
    assert torch.equal(state7.pipeline.generator.get_state(), torch.Generator().manual_seed(7).get_state())
    w7 = next(state7.pipeline.policy.model.parameters())
    w0 = next(state0.pipeline.policy.model.parameters())
    assert not torch.equal(w7, w0), "seed 7 built the same random weights as seed 0"


def test_the_description_says_random_weights_device_and_tokenizer(built):
    _, desc = built[7]
    assert desc["weights"] == "RANDOM weights (seed 7, no checkpoint): the actions mean nothing", desc
    assert desc["device"] == ("cuda" if torch.cuda.is_available() else "cpu"), desc
    assert desc["tokenizer"] == "built-in tiny tokenizer"
    assert desc["precision"] == "float32" and desc["policy"] == "pi05_tiny"
    assert desc["warm_up"].endswith("ms on 2 black 24x32 frames"), desc


def _build(**values):
    params = {"camera_topics": CAMS, "joint_names": ["j0", "j1", "j2", "j3"], "image_height": 24, "image_width": 32}
    return startup.build_pipeline_state(NodeConfig.from_values({**params, **values}))


def test_the_pipeline_is_built_with_the_nodes_settings():
    """rtc off is no guidance; the prefix trigger and period, the action joints (not the state's)
    and the precision reach the pipeline the node runs."""
    state, desc = _build(
        joint_names=["j0", "j1", "j2", "j3", "j4"],
        action_joint_names=["j0", "j1", "j2"],
        prefix_trigger="period",
        prefix_period_s=0.3,
    )
    pipe = state.pipeline
    assert pipe.rtc is None  # rtc false: each chunk computed on its own
    assert (pipe.prefix_cache.trigger, pipe.prefix_cache.period_s) == ("period", 0.3)
    assert pipe.policy.action_dof == 3  # the chunk's columns are action_joint_names'
    guided, _ = _build(rtc=True, rtc_max_guidance=2.0, rtc_delay_steps=1)
    assert (guided.pipeline.rtc.max_guidance, guided.pipeline.rtc.delay_steps) == (2.0, 1)


def test_the_configured_precision_is_the_one_built():
    state, desc = _build(precision="bfloat16", backend="reference")
    assert desc["precision"] == "bfloat16" and state.pipeline.policy.cfg.dtype == "bfloat16"
    assert state.pipeline.policy.model.lm_dtype == torch.bfloat16


def test_a_configured_tokenizer_is_the_one_read(tmp_path):
    """tokenizer: a file that is no SentencePiece model stops the start (not the tiny one silently)."""
    bad = tmp_path / "tok.model"
    bad.write_bytes(b"not a sentencepiece model")
    with pytest.raises(StartupError, match="could not build policy 'pi05_tiny'"):
        _build(tokenizer=str(bad))


def test_a_checkpoint_of_the_other_kind_is_refused():
    said = startup.policy_problems(source(), "pi0", node_cfg())
    assert any("is a pi0 policy but the policy holds a pi05 one" in p for p in said), said


def test_a_warm_up_with_non_finite_actions_says_the_live_decisions_will_be_refused(monkeypatch):
    from types import SimpleNamespace

    from flashrt_ros.engine.pipeline import NonFiniteActions

    def nan(*_):
        raise NonFiniteActions("the chunk has NaN actions")

    pipeline = SimpleNamespace(policy=SimpleNamespace(cfg=SimpleNamespace(camera_views=2)), warm_up=nan)
    said = startup.warm_up(pipeline, node_cfg(image_height=24, image_width=32))
    assert said == (
        "failed (NonFiniteActions: the chunk has NaN actions): the live decisions will likely be refused the same way"
    ), said
