"""PolicyConfig's own checks: fields of the wrong type or range, and specs that do not fit
together, refused with the field named (else they fail deep in torch at build time, or load as
something else: "false" as true, true as 1)."""

from __future__ import annotations

import dataclasses

import pytest

from flashrt_ros.policies.config import PolicyConfig


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(horizon=True), "horizon must be an integer"),
        (dict(rope_base=float("inf")), "rope_base must be a finite number"),
        (dict(empty_cameras=-1), "empty_cameras must be an integer >= 0"),
        (dict(aloha_adapt_to_pi="false"), "aloha_adapt_to_pi must be true or false"),
        (dict(delta_action_mask=("yes", "no")), "delta_action_mask must be a list of booleans"),
        (dict(extra={"camera_names": ["top", 3]}), "extra.camera_names must be a list of strings"),
        (dict(state_dim=4, delta_action_mask=(True,) * 6), "delta_action_mask covers 6 dims"),
        (dict(state_dim=8, aloha_adapt_to_pi=True), "aloha_adapt_to_pi needs action_dim and state_dim"),
    ],
)
def test_bad_fields_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        PolicyConfig.tiny("pi05", **overrides)


def _tiny_specs():
    cfg = PolicyConfig.tiny("pi05")
    return cfg.prefix, cfg.expert, cfg.vision


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda p, e, v: dict(expert=dataclasses.replace(e, depth=3)), "prefix depth 2 != expert depth 3"),
        (lambda p, e, v: dict(expert=dataclasses.replace(e, num_kv_heads=2)), "share head_dim and num_kv_heads"),
        (
            lambda p, e, v: dict(
                prefix=dataclasses.replace(p, num_kv_heads=2),
                expert=dataclasses.replace(e, num_heads=3, num_kv_heads=2),
            ),
            "num_heads must be a multiple",
        ),
        (lambda p, e, v: dict(vision=dataclasses.replace(v, image_size=50)), "image_size must be a multiple"),
        (lambda p, e, v: dict(vision=dataclasses.replace(v, width=33)), "vision width must be a multiple"),
        (lambda p, e, v: dict(expert=dataclasses.replace(e, width=33)), "expert width must be even"),
    ],
)
def test_specs_that_do_not_fit_together_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        PolicyConfig.tiny("pi05", **change(*_tiny_specs()))


def test_from_dict_takes_a_file_without_extra():
    data = PolicyConfig.tiny("pi05").to_dict()
    del data["extra"]
    assert PolicyConfig.from_dict(data) == PolicyConfig.tiny("pi05")


def test_prefix_len_counts_the_empty_cameras():
    cfg = PolicyConfig.tiny("pi05", empty_cameras=1)
    assert cfg.prefix_len == 2 * cfg.vision.num_tokens + cfg.prompt_len
