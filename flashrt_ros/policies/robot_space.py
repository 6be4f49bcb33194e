"""The robot's joints against the space a checkpoint's state and actions were trained in.

Two training conventions change what a chunk means, and neither is in the weights:

- **Delta actions.** The model predicts some dims as offsets from the current state: openpi's
  `DeltaActions(mask)` (its ALOHA configs, `pi0_libero`, DROID joint positions) and LeRobot's
  relative actions. The state is added back after un-normalising, on the mask's dims only, as
  openpi's `AbsoluteActions` and LeRobot's `AbsoluteActionsProcessorStep` do. Published without
  it, a chunk of offsets would be read by the controller as positions near zero.
- **openpi's ALOHA `adapt_to_pi`.** The pi runtime that trained the base models flips four joint
  signs and measures the grippers as angles; standard ALOHA reports linear gripper positions. The
  state goes into the pi space before it is normalised, the actions come out of it last. The
  grippers stay in ALOHA's normalised units (0 closed, 1 open) on both sides, as openpi's
  `aloha_real` environment gives and takes them: the robot side converts with its constants.

openpi's order, kept here: state -> ALOHA decode -> normalise -> model -> un-normalise -> add the
decoded state on the mask -> ALOHA encode. Both transforms are configured per checkpoint
(`PolicyConfig.delta_action_mask`, `aloha_adapt_to_pi`): a flashrt_config.json for openpi exports,
LeRobot's processor files for LeRobot checkpoints (lerobot_relative.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# ALOHA's 14 joints: per arm 6 joints then the gripper (left arm first)
ALOHA_DOF = 14
ALOHA_GRIPPERS = (6, 13)
# the pi runtime's joint signs against standard ALOHA's (shoulder and elbow of each arm)
ALOHA_FLIP = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1], dtype=np.float64)
# Interbotix / ALOHA constants (metres and radians), as openpi's aloha_policy uses them
_GRIPPER_LINEAR = (0.01844, 0.05800)  # puppet gripper position (finger, m) closed, open
_GRIPPER_ARM, _GRIPPER_HORN = 0.036, 0.022  # the gripper linkage: arm length, horn radius
_PI_GRIPPER_RAD = (0.5476, 1.6296)  # pi0's gripper encoder range (2405..3110 counts) in radians
_ALOHA_GRIPPER_JOINT = (-0.6213, 1.4910)  # puppet gripper joint (rad) closed, open
# the most dims a mask may give (a JSON count of 10**9 would otherwise be expanded before any check)
MAX_MASK_DIMS = 1024


def counted_dims(spec: Sequence[Any]) -> int | None:
    """How many dims openpi's `make_bool_mask` counts give (6 + 1 + 6 + 1 for [6, -1, 6, -1]),
    or None when `spec` is not a list of non-zero integers."""
    items = list(spec)
    if items and all(isinstance(x, int | np.integer) and not isinstance(x, bool) and x != 0 for x in items):
        return sum(abs(int(x)) for x in items)
    return None


def mask_from_spec(spec: Sequence[Any]) -> tuple[bool, ...] | None:
    """A delta mask from booleans, or from openpi's `make_bool_mask` counts ([6, -1, 6, -1]: six
    delta dims, one absolute, six delta, one absolute). None when `spec` is neither, or counts
    more than MAX_MASK_DIMS."""
    items = list(spec)
    if all(isinstance(x, bool | np.bool_) for x in items):
        return tuple(bool(x) for x in items)
    dims = counted_dims(items)
    if dims is not None and dims <= MAX_MASK_DIMS:
        return tuple(x > 0 for x in items for _ in range(abs(int(x))))
    return None


def has_deltas(cfg: Any) -> bool:
    return any(cfg.delta_action_mask)


def describe_mask(mask: Sequence[bool], names: Sequence[str] = ()) -> str:
    """'dims 0-5, 7-12' (or the joints' names): which dims are deltas, for logs and messages."""
    dims = [i for i, on in enumerate(mask) if on]
    if names:
        return ", ".join(names[i] if i < len(names) else f"dim {i}" for i in dims)
    runs: list[list[int]] = []
    for i in dims:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return "dims " + ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def describe(cfg: Any, action_names: Sequence[str] = (), state_names: Sequence[str] = ()) -> str:
    """What the policy does to its actions beyond un-normalising, in one phrase. Each delta is
    added to the state joint of its index: where those are named differently, both are said."""
    parts = []
    if has_deltas(cfg):
        mask = cfg.delta_action_mask
        onto = "the joint state"
        if state_names and list(state_names[: len(mask)]) != list(action_names[: len(mask)]):
            onto = f"the state of {describe_mask(mask, state_names)}"
        parts.append(f"deltas on {describe_mask(mask, action_names)} added to {onto}")
    if cfg.aloha_adapt_to_pi:
        parts.append("ALOHA joints and grippers converted from the pi runtime's space")
    return "; ".join(parts) or "absolute (as the model outputs them, un-normalised)"


def space_problem(cfg: Any, state_dims: int, action_dof: int) -> str | None:
    """Why a robot with `state_dims` joints in and `action_dof` out cannot run this checkpoint's
    transforms, or None: a delta dim needs its joint in the state and the actions; ALOHA's
    conversion addresses fixed joints of its 14."""
    problems = []
    if cfg.aloha_adapt_to_pi and (state_dims, action_dof) != (ALOHA_DOF, ALOHA_DOF):
        problems.append(
            f"ALOHA's joint conversion (aloha_adapt_to_pi) needs {ALOHA_DOF} state and {ALOHA_DOF} action "
            f"joints (per arm 6 joints and a gripper); the robot has {state_dims} and {action_dof}"
        )
    mask = cfg.delta_action_mask
    if has_deltas(cfg) and len(mask) > min(state_dims, action_dof):
        problems.append(
            f"the actions are deltas over the first {len(mask)} dims (delta_action_mask), so the robot needs at "
            f"least {len(mask)} state and {len(mask)} action joints (each delta is added to its own joint's "
            f"state); it has {state_dims} and {action_dof}"
        )
    return "; ".join(problems) or None


def state_to_model(state: np.ndarray, cfg: Any) -> np.ndarray:
    """The robot's state in the space the model was trained on (before normalising), in float64
    as the robot gave it: openpi normalises it in float64 (normalize.py)."""
    state = np.asarray(state, dtype=np.float64)
    if not cfg.aloha_adapt_to_pi:
        return state
    return _aloha(state, _gripper_to_angular)


def actions_to_robot(actions: np.ndarray, state: np.ndarray, cfg: Any) -> np.ndarray:
    """Un-normalised model actions [horizon, dof] -> robot commands: the state added back on the
    delta dims, then (ALOHA) out of the pi space. `state` is the robot's, as the decision saw it."""
    actions = np.asarray(actions, dtype=np.float32)
    if not (has_deltas(cfg) or cfg.aloha_adapt_to_pi):
        return actions
    out = actions.astype(np.float64)
    if has_deltas(cfg):
        mask = np.asarray(cfg.delta_action_mask)
        model_state = state_to_model(state, cfg).astype(np.float64)
        out[:, : mask.size] += np.where(mask, model_state[: mask.size], 0.0)
    if cfg.aloha_adapt_to_pi:
        out = _aloha(out, _gripper_from_angular)
    return out.astype(np.float32)


def actions_from_robot(actions: np.ndarray, state: np.ndarray, cfg: Any) -> np.ndarray:
    """The inverse of `actions_to_robot`: robot commands [horizon, dof] -> un-normalised model
    actions, with the deltas taken against `state` (the robot's, as a new decision sees it).
    Real-time chunking reads the chunk the robot executes back into the model's space with it."""
    actions = np.asarray(actions, dtype=np.float32)
    if not (has_deltas(cfg) or cfg.aloha_adapt_to_pi):
        return actions
    out = actions.astype(np.float64)
    if cfg.aloha_adapt_to_pi:
        grippers = list(ALOHA_GRIPPERS)
        out[..., grippers] = _gripper_to_pi_output(out[..., grippers])
        out = ALOHA_FLIP * out
    if has_deltas(cfg):
        mask = np.asarray(cfg.delta_action_mask)
        model_state = state_to_model(state, cfg).astype(np.float64)
        out[:, : mask.size] -= np.where(mask, model_state[: mask.size], 0.0)
    return out.astype(np.float32)


def _aloha(x: np.ndarray, gripper: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """ALOHA's 14 values (the last axis) with the pi runtime's joint flips and `gripper` applied
    to the two grippers: the same on the way in and out, only the gripper map differs."""
    out = ALOHA_FLIP * x
    grippers = list(ALOHA_GRIPPERS)
    out[..., grippers] = gripper(out[..., grippers])
    return out


def _gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """ALOHA's normalised linear gripper position -> pi0's normalised gripper angle: undo ALOHA's
    normalisation, then the linkage's angle-to-linear map (law of cosines), then pi0's range."""
    lo, hi = _GRIPPER_LINEAR
    linear = value * (hi - lo) + lo
    arm, horn = _GRIPPER_ARM, _GRIPPER_HORN
    angle = np.arcsin(np.clip((horn**2 + linear**2 - arm**2) / (2 * horn * linear), -1.0, 1.0))
    lo, hi = _PI_GRIPPER_RAD
    return (angle - lo) / (hi - lo)


def _gripper_from_angular(value: np.ndarray) -> np.ndarray:
    """pi0's gripper output -> ALOHA's normalised gripper joint: shifted by pi0's zero, in the
    puppet joint's open..close range (the output stays an angle, as openpi sends it)."""
    lo, hi = _ALOHA_GRIPPER_JOINT
    return (value + _PI_GRIPPER_RAD[0] - lo) / (hi - lo)


def _gripper_to_pi_output(value: np.ndarray) -> np.ndarray:
    """The inverse of `_gripper_from_angular`."""
    lo, hi = _ALOHA_GRIPPER_JOINT
    return value * (hi - lo) + lo - _PI_GRIPPER_RAD[0]
