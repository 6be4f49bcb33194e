"""The pi0 / pi0.5 reference maths on tiny configs: masks, cache re-use, determinism, sizes."""

from __future__ import annotations

import math
import re

import pytest
import torch
from policy_fixtures import assert_parity, tiny_inputs, tiny_model

from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.pi0 import (
    Pi0Model,
    count_parameters,
    prefix_attention_mask,
    sinusoidal_time_embedding,
    suffix_attention_mask,
)

KINDS = ["pi05", "pi0"]


def test_prefix_mask_is_bidirectional_over_valid_tokens_only():
    valid = torch.tensor([[True, True, False, True]])
    m = prefix_attention_mask(valid)[0]
    assert m.shape == (4, 4)
    assert m[0, 1] and m[1, 0] and m[3, 0] and m[0, 3]  # both directions
    assert not m[:, 2].any() and not m[2].any()  # padding neither seen nor seeing


@pytest.mark.parametrize("kind", KINDS)
def test_suffix_mask_structure(kind):
    cfg = PolicyConfig.tiny(kind)
    valid = torch.tensor([[True, False, True]])
    m = suffix_attention_mask(cfg, valid)[0]  # [S, 3 + S]
    s = cfg.suffix_len
    assert m.shape == (s, 3 + s)
    assert m[:, 0].all() and not m[:, 1].any() and m[:, 2].all()  # every suffix token sees valid prefix
    own = m[:, 3:]
    if kind == "pi05":
        assert own.all()  # action tokens attend to each other bidirectionally
    else:
        assert own[0, 0] and not own[0, 1:].any()  # state token: prefix + itself only
        assert own[1:].all()  # action tokens: state + all actions


@pytest.mark.parametrize("kind", KINDS)
def test_prefix_never_depends_on_suffix(kind):
    model = tiny_model(kind)
    x = tiny_inputs(model.cfg, batch=1)
    emb, valid = model.embed_prefix(x["pixels"], x["image_masks"], x["tokens"], x["token_masks"])
    kv = model.prefill(emb, valid)
    v1 = model.velocity(kv, x["noise"], torch.tensor([0.7]), x["state"])
    v2 = model.velocity(kv, torch.randn_like(x["noise"]), torch.tensor([0.3]), x["state"])
    kv_after = model.prefill(emb, valid)
    assert not torch.allclose(v1, v2)
    for a, b in zip(kv.keys + kv.values, kv_after.keys + kv_after.values, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_padding_and_absent_views_are_ignored(kind):
    model = tiny_model(kind)
    x = tiny_inputs(model.cfg, batch=1, valid_tokens=10)
    x["image_masks"][0, 1] = False
    base = model.sample_actions(**x)
    y = {k: v.clone() for k, v in x.items()}
    y["tokens"][0, 10:] = 7  # change padded tokens
    y["pixels"][0, 1] = torch.rand_like(y["pixels"][0, 1])  # change the absent view
    torch.testing.assert_close(model.sample_actions(**y), base, rtol=0, atol=1e-6)
    y["tokens"][0, 3] = (y["tokens"][0, 3] + 1) % model.cfg.vocab_size  # a real token does matter
    assert (model.sample_actions(**y) - base).abs().max() > 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_cached_prefix_equals_recomputed_prefix(kind):
    model = tiny_model(kind)
    x = tiny_inputs(model.cfg)
    cached = model.sample_actions(**x)
    recomputed = model.sample_actions(**x, reuse_prefix=False)
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_with_noise_and_generator(kind):
    model = tiny_model(kind)
    x = tiny_inputs(model.cfg)
    assert torch.equal(model.sample_actions(**x), model.sample_actions(**x))
    x.pop("noise")
    a = model.sample_actions(**x, generator=torch.Generator().manual_seed(5))
    b = model.sample_actions(**x, generator=torch.Generator().manual_seed(5))
    c = model.sample_actions(**x, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, model.cfg.horizon, model.cfg.action_dim) and a.dtype == torch.float32


def test_pi0_state_token_matters_and_pi05_reads_state_from_prompt_only():
    pi0, pi05 = tiny_model("pi0"), tiny_model("pi05")
    for model, should_change in ((pi0, True), (pi05, False)):
        x = tiny_inputs(model.cfg, batch=1)
        a = model.sample_actions(**x)
        x["state"] = x["state"] + 1.0
        changed = (model.sample_actions(**x) - a).abs().max() > 1e-6
        assert changed == should_change


def test_euler_integration_matches_hand_loop():
    model = tiny_model("pi05")
    x = tiny_inputs(model.cfg, batch=1)
    emb, valid = model.embed_prefix(x["pixels"], x["image_masks"], x["tokens"], x["token_masks"])
    kv = model.prefill(emb, valid)
    steps = model.cfg.num_steps
    xt = x["noise"].clone()
    for i in range(steps):  # t = 1, 1 - 1/N, ..., 1/N; dt = -1/N
        xt = xt - model.velocity(kv, xt, torch.tensor([1.0 - i / steps]), None) / steps
    torch.testing.assert_close(model.sample_actions(**x), xt, rtol=1e-6, atol=1e-6)


def test_time_embedding_is_sin_cos_of_log_spaced_periods():
    emb = sinusoidal_time_embedding(torch.tensor([0.0, 0.5]), 8, 4e-3, 4.0)
    assert emb.shape == (2, 8)
    torch.testing.assert_close(emb[0], torch.tensor([0, 0, 0, 0, 1, 1, 1, 1.0]))
    # the last of the 4 periods is max_period: angle 2*pi*0.5/4 = pi/4
    assert emb[1, 3].item() == pytest.approx(math.sin(math.pi / 4), abs=1e-6)
    assert emb[1, 7].item() == pytest.approx(math.cos(math.pi / 4), abs=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_mixed_precision_tracks_fp32(kind):
    model = tiny_model(kind)
    x = tiny_inputs(model.cfg)
    ref = model.sample_actions(**x)
    model.set_precision(torch.bfloat16)
    assert model.prefix_lm.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert model.prefix_lm.layers[0].input_layernorm.weight.dtype == torch.float32
    assert model.vision.encoder.layers[0].mlp.fc1.weight.dtype == torch.float32
    out = model.sample_actions(**x)
    assert_parity(out, ref, max_abs=5e-3, cos=0.9999, noise=x["noise"])  # ~1e-3 measured


def test_full_size_parameter_counts_on_meta_device():
    """SigLIP ~0.41B, Gemma-2B ~2.5B with embeddings, expert ~0.31B (openpi's sizes)."""
    with torch.device("meta"):
        pi05, pi0 = Pi0Model(PolicyConfig.pi05()), Pi0Model(PolicyConfig.pi0())
    vision = count_parameters(pi05.vision) + count_parameters(pi05.vision_proj)
    assert 0.40e9 < vision < 0.42e9
    assert 2.50e9 < count_parameters(pi05.prefix_lm) < 2.52e9
    assert 0.30e9 < count_parameters(pi0.expert) < 0.32e9
    # pi0.5 swaps each of the expert's 2*18+1 norm weights for a Dense(1024 -> 3*1024) adaRMS projection
    adarms = 37 * (1024 * 3 * 1024 + 3 * 1024) - 37 * 1024
    assert count_parameters(pi05.expert) - count_parameters(pi0.expert) == adarms
    assert 3.2e9 < count_parameters(pi0) < 3.3e9


def test_invalid_config_lists_every_problem():
    with pytest.raises(ValueError) as err:
        PolicyConfig.tiny("pi05", horizon=0, dtype="float8", num_views=0)
    msg = str(err.value)
    assert (
        "horizon must be from 1 to 1000, got 0" in msg and "dtype must be" in msg and "num_views must be from 1" in msg
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rms_norm_eps", float("nan"), "rms_norm_eps must be a finite number > 0, got nan"),
        ("rms_norm_eps", -1.0, "rms_norm_eps must be a finite number > 0, got -1.0"),
        ("min_period", -1.0, "min_period must be a finite number > 0, got -1.0"),
        ("max_period", 0.0, "max_period must be a finite number > 0, got 0.0"),
        ("rope_base", float("nan"), "rope_base must be a finite number > 0, got nan"),
        ("rope_base", "1e4", "rope_base must be a finite number > 0, got '1e4' (str)"),
        ("min_period", 5.0, "min_period 5.0 must be <= max_period 4.0"),
        ("prompt_len", "96", "prompt_len must be an integer from 1 to 4096, got '96' (str)"),
        ("horizon", 2.5, "horizon must be an integer from 1 to 1000, got 2.5 (float)"),
        ("horizon", 10**30, f"horizon must be from 1 to 1000, got {10**30}"),  # loaded, then randn overflowed
        ("num_steps", 10**12, "num_steps must be from 1 to 1000, got 1000000000000"),  # a decision for hours
        ("prompt_len", 10**7, "prompt_len must be from 1 to 4096, got 10000000"),
        ("vocab_size", 1 << 40, f"vocab_size must be from 1 to {1 << 20}, got {1 << 40}"),
    ],
)
def test_float_and_int_fields_are_checked_when_the_config_is_made(field, value, message):
    """Not at the first decision (every action NaN) nor as a TypeError inside a comparison."""
    with pytest.raises(ValueError, match=r"^invalid PolicyConfig: .*" + re.escape(message)):
        PolicyConfig.tiny("pi05", **{field: value})


def test_spec_fields_are_checked_by_name():
    from flashrt_ros.policies.config import GemmaSpec, SiglipSpec

    tiny = PolicyConfig.tiny("pi05")
    vision = SiglipSpec(image_size=56, patch_size=0, width=32, depth=2, num_heads=2, mlp_dim=64, layer_norm_eps=-1.0)
    with pytest.raises(ValueError) as err:
        tiny.replace(vision=vision, expert=GemmaSpec(32, 2, 64, 4, 1, head_dim="16"))
    msg = str(err.value)  # a zero patch size is named, not a ZeroDivisionError in the divisibility check
    assert "vision.patch_size must be from 1 to 1048576, got 0" in msg
    assert "vision.layer_norm_eps must be a finite number > 0" in msg
    assert "expert.head_dim must be an integer from 1 to 1048576, got '16' (str)" in msg
    assert PolicyConfig.tiny("pi05", rope_base=10000) == tiny  # an int where a float goes is fine (JSON writes 10000)
    odd = dict(mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=15)  # the weights' shapes would match: refused here
    with pytest.raises(ValueError, match=r"head_dim must be even \(RoPE rotates the two halves of each head\), got 15"):
        tiny.replace(prefix=GemmaSpec(width=64, depth=2, **odd), expert=GemmaSpec(width=32, depth=2, **odd))
