"""Parity with LeRobot 0.6.1 on golden files it produced (tiny pi0 / pi0.5, CPU).

test/data/lerobot_tiny/<policy>/ holds a checkpoint written by LeRobot's own
`save_pretrained` (random weights, seed 0) and, per dtype, the inputs, noise and LeRobot's
chunk (`scripts/lerobot_reference.py --size tiny --cam0-hw 120x160`). Full-size parity runs
on the GPU (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from flashrt_ros.bench.parity import run_parity
from flashrt_ros.policies.normalize import Normalizer

DATA = Path(__file__).parent / "data" / "lerobot_tiny"


@pytest.mark.parametrize("policy", ["pi05", "pi0"])
def test_float32_chunk_matches_lerobot(policy):
    r = run_parity(DATA / policy / "io_float32.safetensors", DATA / policy / "checkpoint", "float32")
    assert r["chunk"]["cosine"] >= 0.99999 and r["chunk_minus_noise"]["cosine"] >= 0.99999
    assert r["chunk"]["max_abs"] < 1e-5
    assert r["pre_image0"]["max_abs"] < 1e-6  # resize-with-pad of a 120x160 camera
    # the intermediates that localise a mismatch (measured: <= 1.5e-7): a drift in the vision
    # tower or the prefix shows here before the chunk's tolerance lets it through
    inner = [k for k in r if k.startswith(("prefix_embs", "prefix_k_layer", "velocity_step0"))]
    assert len(inner) >= 4 and all(r[k]["max_abs"] < 1e-6 for k in inner), {k: r[k]["max_abs"] for k in inner}


@pytest.mark.parametrize("policy", ["pi05", "pi0"])
def test_bfloat16_chunk_matches_lerobot_bfloat16(policy):
    r = run_parity(DATA / policy / "io_bfloat16.safetensors", DATA / policy / "checkpoint", "bfloat16")
    # measured: max abs 5.3e-5 (pi0.5) / 2.0e-4 (pi0), cosine 0.99999999
    assert r["chunk"]["cosine"] >= 0.99999 and r["chunk_minus_noise"]["cosine"] >= 0.99999
    assert r["chunk"]["max_abs"] < 1e-3
    # measured: prefix embeddings 1.5e-8 (fp32 vision), keys 3.9-5.9e-3 (bf16 rounding), velocity <= 5.7e-4
    assert r["prefix_embs"]["max_abs"] < 1e-6 and r["velocity_step0"]["max_abs"] < 2e-3
    keys = [k for k in r if k.startswith("prefix_k_layer")]
    assert keys and all(r[k]["max_abs"] < 2e-2 and r[k]["cosine"] > 0.99999 for k in keys)


@pytest.mark.parametrize("policy", ["pi05", "pi0"])
def test_an_empty_camera_runs_as_a_masked_view(policy, tmp_path, monkeypatch):
    """LeRobot's `empty_cameras` add a blank view after the cameras, with its mask off. Masked,
    its tokens change nothing, so LeRobot's chunk (taken without it) must still match; unmasked,
    the blank image would be attended to and the chunk would move."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(DATA / policy / "checkpoint", checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "empty_cameras": 1}))
    r = run_parity(DATA / policy / "io_float32.safetensors", checkpoint, "float32")
    assert r["views"] == {"cameras": 2, "empty": 1}
    assert r["chunk"]["cosine"] >= 0.99999 and r["chunk"]["max_abs"] < 1e-5, r["chunk"]
    assert r["prefix_embs"]["max_abs"] < 1e-6 and r["velocity_step0"]["max_abs"] < 1e-5
    # the control: the same blank view left unmasked is attended to, and the chunk moves (measured 7.9e-4)
    from flashrt_ros.bench import parity

    masked = parity.images_to_pixels
    monkeypatch.setattr(parity, "images_to_pixels", lambda *a: (masked(*a)[0], torch.ones_like(masked(*a)[1])))
    unmasked = run_parity(DATA / policy / "io_float32.safetensors", checkpoint, "float32")
    assert unmasked["chunk"]["max_abs"] > 1e-4, unmasked["chunk"]


@pytest.mark.parametrize("policy", ["pi05", "pi0"])
def test_lerobot_normaliser_statistics(policy):
    io = load_file(str(DATA / policy / "io_float32.safetensors"))
    norm = Normalizer.find(DATA / policy / "checkpoint")
    assert norm is not None and norm.convention == "lerobot"
    assert norm.mode == ("quantile" if policy == "pi05" else "mean_std")
    raw = io["norm.raw_state"].numpy()
    np.testing.assert_allclose(norm.normalize_state(raw), io["in.observation.state"].numpy(), rtol=1e-5, atol=1e-5)
    chunk = io["out.chunk"].numpy()[0]
    np.testing.assert_allclose(
        norm.unnormalize_actions(chunk), io["norm.chunk_unnormalised"].numpy()[0], rtol=1e-5, atol=1e-5
    )
