"""The robot's joint space against the checkpoint's: delta actions and openpi's ALOHA conversion,
against what openpi's and LeRobot's own transforms return (test/data/robot_space_golden.json,
written by scripts/robot_space_reference.py from their source files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.lerobot_relative import lerobot_delta_mask, lerobot_says_relative_or_absolute
from flashrt_ros.policies.robot_space import actions_to_robot, describe, space_problem, state_to_model

GOLDEN = json.loads((Path(__file__).parent / "data" / "robot_space_golden.json").read_text())["cases"]
OPENPI = [c for c in GOLDEN if c["name"].startswith("openpi")]
LEROBOT = [c for c in GOLDEN if c["name"].startswith("lerobot")]


def close(ours: np.ndarray, theirs: list) -> None:
    """Ours in float32 (the node's dtype) against their float64: float32 rounding of the values."""
    want = np.asarray(theirs)
    np.testing.assert_allclose(ours, want, rtol=2e-6, atol=2e-6 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("case", OPENPI, ids=[c["name"] for c in OPENPI])
def test_openpi_transforms_as_openpi_runs_them(case):
    """State in (AlohaInputs' decode) and actions out (AbsoluteActions, then AlohaOutputs) match
    openpi's own functions, the mask given as openpi's make_bool_mask counts."""
    cfg = PolicyConfig.pi0(delta_action_mask=case["mask"] or (), aloha_adapt_to_pi=case["aloha"])
    state = np.asarray(case["state"], dtype=np.float32)
    close(state_to_model(state, cfg), case["model_state"])
    ours = actions_to_robot(np.asarray(case["actions"], dtype=np.float32), state, cfg)
    assert ours.dtype == np.float32 and ours.shape == np.asarray(case["out"]).shape
    close(ours, case["out"])
    assert not np.allclose(ours, np.asarray(case["actions"]), atol=1e-3)  # the transforms changed something


def lerobot_folder(tmp_path: Path, processor: dict, dof: int, absolute: bool = True, **config) -> Path:
    """LeRobot's processor files and config.json's action feature (plus `config`), laid out as
    LeRobot writes them, with the relative-action steps set."""
    action = {"type": "ACTION", "shape": [dof]}
    (tmp_path / "config.json").write_text(json.dumps({"output_features": {"action": action}, **config}))
    pre = [{"registry_name": "to_batch_processor", "config": {}}]
    pre.append({"registry_name": "relative_actions_processor", "config": processor})
    post = [{"registry_name": "absolute_actions_processor", "config": {"enabled": absolute}}]
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": pre}))
    (tmp_path / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": post}))
    return tmp_path


@pytest.mark.parametrize("case", LEROBOT, ids=[c["name"] for c in LEROBOT])
def test_lerobot_relative_actions_as_lerobot_runs_them(case, tmp_path):
    """The mask read from the processor files (names matched as LeRobot matches them) and the raw
    state added back give LeRobot's AbsoluteActionsProcessorStep output."""
    mask = lerobot_delta_mask(lerobot_folder(tmp_path, case["processor"], case["dof"]))
    assert len(mask) == case["dof"] and any(mask)
    cfg = PolicyConfig.pi05(delta_action_mask=mask)
    state = np.asarray(case["state"], dtype=np.float32)
    close(actions_to_robot(np.asarray(case["actions"], dtype=np.float32), state, cfg), case["out"])


def test_lerobot_relative_actions_off_or_half_on(tmp_path):
    processor = {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}
    assert lerobot_delta_mask(lerobot_folder(tmp_path, processor, 6, absolute=False)) == ()
    folder = lerobot_folder(tmp_path, processor, 6, absolute=True)  # converted back, never made relative
    with pytest.raises(ValueError, match="'absolute_actions_processor' is enabled but 'relative_actions_processor' is"):
        lerobot_delta_mask(folder)
    folder = lerobot_folder(tmp_path, {**processor, "enabled": True}, 6, absolute=False)  # offsets published
    with pytest.raises(ValueError, match="'relative_actions_processor' is enabled but 'absolute_actions_processor' is"):
        lerobot_delta_mask(folder)
    for names in ({"action_names": "gripper"}, {"exclude_joints": "gripper", "action_names": ["a", "gripper"]}):
        folder = lerobot_folder(tmp_path, {**processor, "enabled": True, **names}, 6)  # a string's letters: no names
        with pytest.raises(ValueError, match="exclude_joints and action_names must be lists of names"):
            lerobot_delta_mask(folder)
    folder = lerobot_folder(tmp_path, {**processor, "enabled": True}, 6)
    for features in ({}, {"action": "x"}, {"action": {"shape": [0]}}):
        (folder / "config.json").write_text(json.dumps({"output_features": features}))
        with pytest.raises(ValueError, match=r"relative actions need the action width from output_features.action"):
            lerobot_delta_mask(folder)
    steps = json.loads((folder / "policy_preprocessor.json").read_text())
    steps["steps"].append(steps["steps"][-1])  # two relative steps: which one LeRobot pairs is unknown
    (folder / "policy_preprocessor.json").write_text(json.dumps(steps))
    with pytest.raises(ValueError, match="2 relative_actions_processor and 1 absolute_actions_processor steps"):
        lerobot_delta_mask(folder)
    folder = lerobot_folder(tmp_path, {**processor, "enabled": True}, 6)
    steps = json.loads((folder / "policy_postprocessor.json").read_text())
    steps["steps"].append(steps["steps"][-1])  # two absolute steps: the same
    (folder / "policy_postprocessor.json").write_text(json.dumps(steps))
    with pytest.raises(ValueError, match="1 relative_actions_processor and 2 absolute_actions_processor steps"):
        lerobot_delta_mask(folder)


def test_lerobot_config_json_must_agree_with_the_processors(tmp_path):
    """config.json's use_relative_actions, where given, says what the processor files do; the
    files decide the mask (LeRobot runs them), a disagreement is refused naming both."""
    processor = {"enabled": True, "exclude_joints": ["gripper"], "action_names": None}
    assert lerobot_delta_mask(lerobot_folder(tmp_path, processor, 6, use_relative_actions=True)) == (True,) * 6
    off = {**processor, "enabled": False}
    assert lerobot_delta_mask(lerobot_folder(tmp_path, off, 6, absolute=False, use_relative_actions=False)) == ()
    folder = lerobot_folder(tmp_path, processor, 6, use_relative_actions=False)
    with pytest.raises(
        ValueError,
        match=r"use_relative_actions is false, but policy_preprocessor.json / policy_post"
        r"processor.json have relative_actions_processor and absolute_actions_processor enabled",
    ):
        lerobot_delta_mask(folder)
    folder = lerobot_folder(tmp_path, off, 6, absolute=False, use_relative_actions=True)
    with pytest.raises(ValueError, match=r"use_relative_actions is true, but .* have no enabled relative_actions"):
        lerobot_delta_mask(folder)
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):  # the files gone: nothing says which
        (folder / name).unlink()
    with pytest.raises(ValueError, match=r"use_relative_actions is true, but .* have no enabled relative_actions"):
        lerobot_delta_mask(folder)


def test_mask_counts_and_bad_masks():
    aloha = PolicyConfig.pi0(delta_action_mask=[6, -1, 6, -1])
    assert aloha.delta_action_mask == (True,) * 6 + (False,) + (True,) * 6 + (False,)
    assert PolicyConfig.from_dict(aloha.to_dict()) == aloha  # saved as booleans, read back the same
    for bad in ([1, 0], [True, 1], "110", [1.5]):
        with pytest.raises(ValueError, match="delta_action_mask must be a list of booleans or of openpi's"):
            PolicyConfig.pi0(delta_action_mask=bad)
    with pytest.raises(ValueError, match="delta_action_mask covers 33 dims, more than the model's action_dim 32"):
        PolicyConfig.pi0(delta_action_mask=[33])
    with pytest.raises(ValueError, match=r"delta_action_mask counts add up to 1000000000 dims"):
        PolicyConfig.pi0(delta_action_mask=[10**9])  # refused before 10**9 booleans are made
    with pytest.raises(ValueError, match=r"delta_action_mask counts add up to 2000 dims"):
        PolicyConfig.pi0(delta_action_mask=[-2000])  # an absolute run counts as much as a delta run
    assert PolicyConfig.pi0(delta_action_mask=list(np.array([True, False]))).delta_action_mask == (True, False)
    with pytest.raises(ValueError, match=r"aloha_adapt_to_pi needs action_dim and state_dim >= 14"):
        PolicyConfig.tiny(aloha_adapt_to_pi=True, action_dim=8)


def test_robots_that_do_not_fit_the_transforms_are_named():
    aloha = PolicyConfig.pi0(delta_action_mask=[6, -1, 6, -1], aloha_adapt_to_pi=True)
    assert space_problem(aloha, 14, 14) is None
    problem = space_problem(aloha, 7, 14)
    assert "ALOHA's joint conversion (aloha_adapt_to_pi) needs 14 state and 14 action joints" in problem
    assert "the robot has 7 and 14" in problem
    assert "deltas over the first 14 dims (delta_action_mask)" in problem and "it has 7 and 14" in problem
    libero = PolicyConfig.pi0(delta_action_mask=[6, -1])
    assert space_problem(libero, 8, 7) is None and space_problem(libero, 8, 6) is not None
    half = space_problem(PolicyConfig.pi0(aloha_adapt_to_pi=True), 14, 7)  # 14 state joints, 7 action joints
    assert half is not None and "the robot has 14 and 7" in half
    assert space_problem(PolicyConfig.pi0(), 3, 2) is None  # absolute actions fit any robot


def test_described_for_logs():
    assert describe(PolicyConfig.pi0()) == "absolute (as the model outputs them, un-normalised)"
    libero = PolicyConfig.pi0(delta_action_mask=[6, -1])
    assert describe(libero) == "deltas on dims 0-5 added to the joint state"
    assert describe(PolicyConfig.pi0(delta_action_mask=[-3, 2])) == "deltas on dims 3-4 added to the joint state"
    assert describe(PolicyConfig.pi0(delta_action_mask=[2]), ["x", "y"]) == "deltas on x, y added to the joint state"
    named = describe(PolicyConfig.pi0(delta_action_mask=[2, -1, 1]), ["a", "b", "c", "d"], ["a", "b", "c", "d", "e"])
    assert named == "deltas on a, b, d added to the joint state"
    other = describe(PolicyConfig.pi0(delta_action_mask=[2]), ["x_cmd", "y_cmd"], ["x", "y"])
    assert other == "deltas on x_cmd, y_cmd added to the state of x, y"  # paired by index: both said
    aloha = describe(PolicyConfig.pi0(delta_action_mask=[6, -1, 6, -1], aloha_adapt_to_pi=True))
    assert aloha == (
        "deltas on dims 0-5, 7-12 added to the joint state; "
        "ALOHA joints and grippers converted from the pi runtime's space"
    )


def _save_lerobot(tmp_path: Path, relative: bool, **space) -> Path:
    """A tiny checkpoint in LeRobot's layout (config.json, processors) with relative actions as given."""
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model

    folder = save_model(tiny_model("pi05", **space), tmp_path / "lerobot", layout="lerobot")
    processor = {"enabled": relative, "exclude_joints": ["gripper"], "action_names": None}
    lerobot_folder(folder, processor, 6, absolute=relative)
    return folder


def test_lerobot_processors_count_whatever_flashrt_config_json_says(tmp_path):
    """A LeRobot folder with a flashrt_config.json of every field (as save_model writes it) still
    gets the processors' relative actions; a flashrt_config.json mask that differs is refused, and
    so is one where the processors say the actions are absolute."""
    from flashrt_ros.policies.checkpoint import FLASHRT_CONFIG_FILE, CheckpointError, read_config

    folder = _save_lerobot(tmp_path, relative=True)
    full = json.loads((folder / FLASHRT_CONFIG_FILE).read_text())
    assert "delta_action_mask" in full and not full["delta_action_mask"]  # every field, the mask empty
    assert read_config(folder, "lerobot").delta_action_mask == (True,) * 6
    (folder / FLASHRT_CONFIG_FILE).write_text(json.dumps({**full, "delta_action_mask": [5, -1]}))
    with pytest.raises(CheckpointError, match=r"delta_action_mask \(dims 0-4\) differs from the relative actions"):
        read_config(folder, "lerobot")
    processor = {"enabled": False, "exclude_joints": [], "action_names": None}
    lerobot_folder(folder, processor, 6, absolute=False)  # processors off: the actions are absolute
    with pytest.raises(CheckpointError, match=r"delta_action_mask \(dims 0-4\), but the LeRobot processor files"):
        read_config(folder, "lerobot")


def test_openpi_export_states_its_mask_in_flashrt_config_json(tmp_path):
    """openpi exports record no delta mask: a partial flashrt_config.json written by hand, with
    openpi's make_bool_mask counts, gives it, on top of what the other files say."""
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import FLASHRT_CONFIG_FILE, CheckpointError, read_config, save_model

    folder = save_model(tiny_model("pi0", seed=1), tmp_path / "openpi", layout="openpi")
    full = json.loads((folder / FLASHRT_CONFIG_FILE).read_text())
    (folder / FLASHRT_CONFIG_FILE).write_text(json.dumps({"kind": "pi0", "delta_action_mask": [6, -1]}))
    cfg = read_config(folder, "openpi", PolicyConfig.from_dict(full))
    assert cfg.delta_action_mask == (True,) * 6 + (False,) and cfg.aloha_adapt_to_pi is False
    (folder / FLASHRT_CONFIG_FILE).write_text(json.dumps({"kind": "pi0", "delta_action_mask": [6, 0]}))
    with pytest.raises(CheckpointError, match=r"flashrt_config.json: .*delta_action_mask must be a list of booleans"):
        read_config(folder, "openpi", PolicyConfig.from_dict(full))


def test_an_aloha_gripper_past_fully_open_is_read_as_open_not_nan():
    """Real grippers overshoot their calibration: past 1.0 the linkage's arcsin argument leaves
    [-1, 1] and the whole state turned NaN."""
    cfg = PolicyConfig.pi0(aloha_adapt_to_pi=True)
    state = np.full(14, 0.1)
    state[[6, 13]] = 1.0
    at_open = state_to_model(state, cfg)
    state[[6, 13]] = 1.02
    np.testing.assert_array_equal(state_to_model(state, cfg), at_open)


def _lerobot_folder(path, processor: dict, config: dict | None = None):
    pre = [{"registry_name": "relative_actions_processor", "config": processor}]
    post = [{"registry_name": "absolute_actions_processor", "config": {"enabled": processor.get("enabled")}}]
    (path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": pre}))
    (path / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": post}))
    cfg = {"output_features": {"action": {"type": "ACTION", "shape": [3]}}}
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_an_empty_exclude_name_excludes_nothing(tmp_path):
    folder = _lerobot_folder(
        tmp_path, {"enabled": True, "exclude_joints": ["", "grip"], "action_names": ["a", "b", "gripper"]}
    )
    assert lerobot_delta_mask(folder) == (True, True, False)


@pytest.mark.parametrize(
    ("names", "exclude", "mask"),
    [
        (["shoulder", "wrist", "gripper"], ["wrist", "gripper"], (True, False, False)),  # any token excludes
        (["A", "B", "Gripper.pos"], ["gripper"], (True, True, False)),  # matched whatever the case
        (["a", "b", "c", "gripper"], ["gripper"], (True, True, True)),  # names past the width: none
    ],
)
def test_exclude_names_as_lerobot_matches_them(tmp_path, names, exclude, mask):
    folder = _lerobot_folder(tmp_path, {"enabled": True, "exclude_joints": exclude, "action_names": names})
    assert lerobot_delta_mask(folder) == mask


@pytest.mark.parametrize("shape", [[3, 2], ["3"], [True]])
def test_action_shape_must_be_one_whole_number(tmp_path, shape):
    folder = _lerobot_folder(tmp_path, {"enabled": True}, {"output_features": {"action": {"shape": shape}}})
    with pytest.raises(ValueError, match="output_features.action.shape"):
        lerobot_delta_mask(folder)


def test_config_json_saying_absolute_actions_is_saying_something(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"use_relative_actions": False}))
    assert lerobot_says_relative_or_absolute(tmp_path)


def test_a_disabled_absolute_step_alone_is_saying_something(tmp_path):
    post = [{"registry_name": "absolute_actions_processor", "config": {"enabled": False}}]
    (tmp_path / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": post}))
    assert lerobot_says_relative_or_absolute(tmp_path)
