#!/usr/bin/env python3
"""Golden values for `flashrt_ros.policies.robot_space` from openpi's and LeRobot's own code.

Runs openpi's `DeltaActions` / `AbsoluteActions` / `make_bool_mask` (transforms.py) and its ALOHA
`_decode_state` / `AlohaOutputs` (policies/aloha_policy.py), and LeRobot 0.6.1's
`RelativeActionsProcessorStep` / `AbsoluteActionsProcessorStep`, on fixed random states and
un-normalised action chunks, and writes what they return to test/data/robot_space_golden.json
(`test/test_robot_space.py` compares ours with it).

Neither project is imported whole: openpi's transforms.py pulls in JAX and flax, LeRobot's
processor package its whole pipeline. The functions and classes used are taken from their source
files as they are (openpi's by name, out of the module's syntax tree; LeRobot's module with its
package imports stubbed) and called unchanged. Needs numpy, torch and einops:

    git -C <openpi checkout> archive HEAD src/openpi | tar -x -C /tmp/openpi
    pip download --no-deps lerobot==0.6.1 einops && unzip lerobot-0.6.1-*.whl -d /tmp/lerobot
    PYTHONPATH=<einops> python scripts/robot_space_reference.py --openpi /tmp/openpi/src \
        --lerobot /tmp/lerobot --out test/data/robot_space_golden.json

Nothing here is imported by the package or the tests.
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np

SEED = 0
HORIZON = 4  # every row is transformed alike
PADDED = 32  # openpi's model action / state width: its output transforms see padded arrays


def openpi_transforms(src: Path) -> types.ModuleType:
    """openpi.transforms with only what the ALOHA and delta transforms use, taken verbatim."""
    path = src / "openpi" / "transforms.py"
    tree = ast.parse(path.read_text())
    wanted = {"DataTransformFn", "DeltaActions", "AbsoluteActions", "make_bool_mask"}
    nodes = [n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in nodes} == wanted, f"{path}: missing {wanted - {n.name for n in nodes}}"
    module = types.ModuleType("openpi.transforms")
    sys.modules[module.__name__] = module  # dataclasses look their class's module up
    prelude = (
        "import dataclasses\nfrom collections.abc import Sequence\nfrom typing import Protocol, runtime_checkable\n"
        "import numpy as np\nDataDict = dict\n"
    )
    exec(prelude, module.__dict__)
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module


def openpi_aloha(src: Path) -> types.ModuleType:
    package = types.ModuleType("openpi")
    package.__path__ = []
    package.transforms = openpi_transforms(src)
    sys.modules["openpi"] = package
    return _load("openpi.policies.aloha_policy", src / "openpi" / "policies" / "aloha_policy.py")


def lerobot_relative(root: Path) -> types.ModuleType:
    """LeRobot's relative_action_processor.py with its package imports stubbed (the classes it
    derives from are plain bases; the transition is a dict keyed as LeRobot keys it)."""

    class TransitionKey(enum.StrEnum):
        OBSERVATION = "observation"
        ACTION = "action"

    class ProcessorStepRegistry:
        @staticmethod
        def register(_name):
            return lambda cls: cls

    stubs = {
        "lerobot": {},
        "lerobot.configs": {"PipelineFeatureType": object, "PolicyFeature": object},
        "lerobot.lerobot_types": {"EnvTransition": dict, "TransitionKey": TransitionKey},
        "lerobot.utils": {},
        "lerobot.utils.constants": {"OBS_STATE": "observation.state"},
        "lerobot.processor": {},
        "lerobot.processor.delta_action_processor": {
            "MapDeltaActionToRobotActionStep": object,
            "MapTensorToDeltaActionDictStep": object,
        },
        "lerobot.processor.pipeline": {"ProcessorStep": object, "ProcessorStepRegistry": ProcessorStepRegistry},
    }
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__path__ = []
        module.__dict__.update(attrs)
        sys.modules[name] = module
    return _load("lerobot.processor.relative_action_processor", root / "lerobot/processor/relative_action_processor.py")


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def aloha_state(rng: np.random.Generator) -> np.ndarray:
    """Joints in radians, grippers as ALOHA's normalised linear position (0 open .. 1 closed)."""
    state = rng.uniform(-1.5, 1.5, 14)
    state[[6, 13]] = rng.uniform(0.05, 0.95, 2)
    return state


def padded(x: np.ndarray, width: int = PADDED) -> np.ndarray:
    out = np.zeros((*x.shape[:-1], width))
    out[..., : x.shape[-1]] = x
    return out


def openpi_cases(src: Path, rng: np.random.Generator) -> list[dict]:
    aloha = openpi_aloha(src)
    t = sys.modules["openpi.transforms"]
    cases = []
    for name, mask_counts, adapt in (
        ("openpi_aloha_delta", [6, -1, 6, -1], True),  # pi0_aloha, pi05_aloha, towel, tupperware
        ("openpi_aloha_absolute", None, True),  # pi0_aloha_sim (use_delta_joint_actions=False)
        ("openpi_aloha_delta_not_adapted", [6, -1, 6, -1], False),
    ):
        state = aloha_state(rng)
        actions = rng.normal(0.0, 0.5, (HORIZON, 14))
        decoded = aloha._decode_state(state.copy(), adapt_to_pi=adapt)  # AlohaInputs' state
        data = {"state": padded(decoded), "actions": padded(actions)}  # what Unnormalize hands on
        if mask_counts:
            data = t.AbsoluteActions(t.make_bool_mask(*mask_counts))(data)
        out = aloha.AlohaOutputs(adapt_to_pi=adapt)(data)["actions"]
        cases.append(
            dict(name=name, mask=mask_counts, aloha=adapt, state=state, actions=actions, model_state=decoded, out=out)
        )
    for name, mask_counts, dof, state_dims in (
        ("openpi_libero_delta", [6, -1], 7, 8),  # pi0_libero: LiberoOutputs keeps 7 dims
        ("openpi_droid_joint_delta", [7, -1], 8, 8),  # DROID joint positions: DroidOutputs keeps 8
    ):
        state = rng.uniform(-2.0, 2.0, state_dims)
        actions = rng.normal(0.0, 0.5, (HORIZON, dof))
        data = t.AbsoluteActions(t.make_bool_mask(*mask_counts))({"state": padded(state), "actions": padded(actions)})
        out = np.asarray(data["actions"][:, :dof])
        cases.append(
            dict(name=name, mask=mask_counts, aloha=False, state=state, actions=actions, model_state=state, out=out)
        )
    return cases


def lerobot_cases(root: Path, rng: np.random.Generator) -> list[dict]:
    import torch

    lr = lerobot_relative(root)
    key = sys.modules["lerobot.lerobot_types"].TransitionKey
    so100 = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
    so100 = [f"{joint}.pos" for joint in so100]  # LeRobot's SO-100 action names
    cases = []
    for name, exclude, names, dof in (
        ("lerobot_exclude_gripper", ["gripper"], so100, 6),  # LeRobot's default exclude list
        ("lerobot_no_names", ["gripper"], None, 6),  # no action names: every dim relative
        ("lerobot_exclude_substring", ["WRIST"], so100, 6),  # matched lower case, inside names
        ("lerobot_names_shorter_than_actions", ["gripper"], so100[:4] + ["gripper"], 7),
    ):
        state = rng.uniform(-90.0, 90.0, dof)
        actions = rng.normal(0.0, 5.0, (HORIZON, dof))
        relative = lr.RelativeActionsProcessorStep(enabled=True, exclude_joints=exclude, action_names=names)
        relative({key.OBSERVATION: {"observation.state": torch.tensor(state)[None]}})  # caches the raw state
        absolute = lr.AbsoluteActionsProcessorStep(enabled=True, relative_step=relative)
        out = absolute({key.ACTION: torch.tensor(actions)[None]})[key.ACTION][0].numpy()
        processor = {"enabled": True, "exclude_joints": exclude, "action_names": names}
        cases.append(dict(name=name, processor=processor, dof=dof, state=state, actions=actions, out=out))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--openpi", type=Path, required=True, help="openpi's src/ folder")
    parser.add_argument("--lerobot", type=Path, required=True, help="the folder holding LeRobot's lerobot/ package")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    cases = openpi_cases(args.openpi, rng) + lerobot_cases(args.lerobot, rng)
    data = {
        "source": "scripts/robot_space_reference.py (openpi transforms + aloha_policy; LeRobot 0.6.1 processors)",
        "cases": [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in c.items()} for c in cases],
    }
    args.out.write_text(json.dumps(data) + "\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
