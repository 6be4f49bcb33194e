"""LeRobot's relative actions, as its processor files configure them.

A LeRobot checkpoint trained with `use_relative_actions` has a `relative_actions_processor` step
in policy_preprocessor.json (it remembers the raw state) and an `absolute_actions_processor` step
in policy_postprocessor.json (it adds that state back to the un-normalised actions). LeRobot
runs these files, not config.json, so the mask is read from them and built as LeRobot 0.6.1
builds it (`RelativeActionsProcessorStep._build_mask`); robot_space.py applies it.
"""

from __future__ import annotations

from pathlib import Path

from .normalize import file_present, pipeline_steps, read_json

PREPROCESSOR, POSTPROCESSOR = "policy_preprocessor.json", "policy_postprocessor.json"
RELATIVE_STEP, ABSOLUTE_STEP = "relative_actions_processor", "absolute_actions_processor"


def lerobot_delta_mask(folder: str | Path) -> tuple[bool, ...]:
    """The checkpoint's delta mask, () when its relative actions are off. Every action dim is
    relative except those whose name (its `action_names`, lower case) equals or contains one of
    `exclude_joints`; dims past the names, or all dims when there are no names, are relative."""
    folder = Path(folder)
    relative = _steps_named(folder / PREPROCESSOR, RELATIVE_STEP)
    absolute = _steps_named(folder / POSTPROCESSOR, ABSOLUTE_STEP)
    if len(relative) > 1 or len(absolute) > 1:
        raise ValueError(
            f"{folder}: {len(relative)} {RELATIVE_STEP} and {len(absolute)} {ABSOLUTE_STEP} steps; expected at "
            "most one of each (which one LeRobot pairs would be a guess)"
        )
    config = relative[0].get("config", {}) if relative else {}
    relative_on = bool(config.get("enabled"))
    absolute_on = bool(absolute) and bool(absolute[0].get("config", {}).get("enabled"))
    _check_config_agrees(folder, relative_on and absolute_on, relative_on or absolute_on)
    if not (relative_on or absolute_on):
        return ()
    if relative_on != absolute_on:
        on, off = (RELATIVE_STEP, ABSOLUTE_STEP) if relative_on else (ABSOLUTE_STEP, RELATIVE_STEP)
        state = "disabled" if (absolute if relative_on else relative) else "missing"
        raise ValueError(
            f"{folder}: the processor {on!r} is enabled but {off!r} is {state}; expected both enabled "
            "(actions trained relative to the state and converted back) or both disabled"
        )
    exclude, names = config.get("exclude_joints") or [], config.get("action_names")
    if not _names(exclude) or not (names is None or _names(names)):
        raise ValueError(
            f"{folder / PREPROCESSOR}: {RELATIVE_STEP}'s exclude_joints and action_names must be lists of "
            f"names, got {exclude!r} and {names!r}"[:400]
        )
    dof = _action_width(folder)
    tokens = [name.lower() for name in exclude if name]
    if not tokens or names is None:
        return (True,) * dof
    mask = [not any(t == n.lower() or t in n.lower() for t in tokens) for n in names[:dof]]
    return tuple(mask + [True] * (dof - len(mask)))


def lerobot_says_relative_or_absolute(folder: str | Path) -> bool:
    """Whether the folder says anything about relative actions: a relative or absolute step in the
    processor files, or config.json's `use_relative_actions`. Said and off (lerobot_delta_mask
    empty), the actions are absolute: a mask from elsewhere contradicts it."""
    folder = Path(folder)
    if _steps_named(folder / PREPROCESSOR, RELATIVE_STEP) or _steps_named(folder / POSTPROCESSOR, ABSOLUTE_STEP):
        return True
    path = folder / "config.json"
    return file_present(path) and isinstance(read_json(path).get("use_relative_actions"), bool)


def _steps_named(path: Path, name: str) -> list[dict]:
    return [s for s in pipeline_steps(path) if s.get("registry_name") == name] if file_present(path) else []


def _check_config_agrees(folder: Path, on: bool, any_on: bool) -> None:
    """config.json's `use_relative_actions`, where it is given, must say what the processor files
    do. LeRobot runs the files, so they decide; a disagreement means a hand-edited folder, or
    processor files from another training run, and which one the weights were trained with
    would be a guess."""
    path = folder / "config.json"
    said = read_json(path).get("use_relative_actions") if file_present(path) else None
    if not isinstance(said, bool) or said == on or (said and any_on):
        return  # absent, agreeing, or half-enabled processors (refused by the caller, more precisely)
    files = f"{PREPROCESSOR} / {POSTPROCESSOR}"
    steps = (
        f"no enabled {RELATIVE_STEP} and {ABSOLUTE_STEP}" if said else f"{RELATIVE_STEP} and {ABSOLUTE_STEP} enabled"
    )
    raise ValueError(
        f"{path}: use_relative_actions is {str(said).lower()}, but {files} have {steps}; expected them "
        "to agree (LeRobot runs the processor files: restore the ones saved with these weights)"
    )


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _action_width(folder: Path) -> int:
    """The robot's action dims from config.json's `output_features.action.shape`: the width
    LeRobot builds its mask for."""
    path = folder / "config.json"
    shape = read_json(path) if file_present(path) else {}
    for key in ("output_features", "action", "shape"):
        shape = shape.get(key) if isinstance(shape, dict) else None
    # type(...) is int: JSON's true is a Python int too, and no width
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and shape[0] >= 1):
        raise ValueError(
            f"{path}: relative actions need the action width from output_features.action.shape, got {shape!r}; "
            'expected e.g. {"action": {"type": "ACTION", "shape": [14]}}'
        )
    return shape[0]
