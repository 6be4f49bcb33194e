"""State / action normalisation with statistics shipped beside the checkpoint.

Modes: `mean_std`: (x - mean) / (std + eps); `quantile`: map [q01, q99] to [-1, 1];
`identity`. openpi's norm_stats.json does not say which: openpi uses mean/std for pi0 and
quantiles for pi0.5 (`use_quantile_norm = model_type != PI0`), and so does `default_mode`.
Two conventions exist and both are kept exact:
openpi adds eps = 1e-6 to the divisor both ways (`assets/<id>/norm_stats.json`);
LeRobot uses eps = 1e-8 only where a quantile range is zero and none when un-normalising
mean/std (`policy_preprocessor_step_*_normalizer_processor.safetensors`).
Each also in its own precision: openpi reads its JSON statistics as float64 and normalises the
robot's float64 state in float64, LeRobot works in float32. pi0.5 writes the normalised state into
its prompt as bins; a state within float32 rounding of a bin's edge (about 1 in 20000 states) lands
in another bin in the other precision, and the prompt differs.
Statistics may cover fewer dims than the padded model vector: extra dims pass through.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

EPS = 1e-6
LEROBOT_EPS = 1e-8
MODES = ("mean_std", "quantile", "identity")
CONVENTIONS = ("openpi", "lerobot")  # whose eps rules (see the module docstring)


def default_mode(kind: str | None) -> str:
    """openpi's choice for a norm_stats.json without a mode: mean/std for pi0, else quantiles."""
    return "mean_std" if kind == "pi0" else "quantile"


@dataclass
class Stats:
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "statistics") -> Stats:
        """`where` names the statistics in errors (``norm_stats.state``)."""
        get = lambda k: None if d.get(k) is None else _numbers(f"{where}.{k}", d[k])  # noqa: E731
        return cls(get("mean"), get("std"), get("q01"), get("q99"))

    def to_dict(self) -> dict:
        return {k: v.tolist() for k, v in vars(self).items() if v is not None}


def _numbers(where: str, value: object) -> np.ndarray:
    """A statistic as float64, refusing what only looks numeric: JSON's true / false and numbers
    written as strings would otherwise convert without a word (true as a std of 1)."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu" or (isinstance(value, list) and _holds_bool(value)):
        raise ValueError(f"{where} must be numbers, got {repr(value)[:80]}")
    return arr.astype(np.float64)


def _holds_bool(values: list) -> bool:
    return any(_holds_bool(v) if isinstance(v, list) else isinstance(v, bool) for v in values)


@dataclass
class Normalizer:
    """Normalises the robot state and un-normalises actions, one mode for both."""

    mode: str = "identity"
    state: Stats = field(default_factory=Stats)
    actions: Stats = field(default_factory=Stats)
    convention: str = "openpi"  # or "lerobot"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"normalisation mode must be one of {MODES}, got {self.mode!r}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"normalisation convention must be one of {CONVENTIONS}, got {self.convention!r}")
        for name in ("state", "actions"):
            self._check(name, getattr(self, name))

    def _check(self, name: str, s: Stats) -> None:
        """The statistics the mode uses: present, 1-D, of one length, finite (a NaN bound would
        turn every normalised state into NaN, which pi0.5's state tokens silently bin)."""
        need = {"mean_std": ("mean", "std"), "quantile": ("q01", "q99")}.get(self.mode, ())
        missing = [k for k in need if getattr(s, k) is None]
        if missing:
            raise ValueError(f"{self.mode} normalisation needs {name} statistics {missing}")
        arrays = {k: getattr(s, k) for k in need}
        shapes = {k: a.shape for k, a in arrays.items()}
        if any(len(shape) != 1 for shape in shapes.values()) or len(set(shapes.values())) > 1:
            raise ValueError(f"{name} statistics must be vectors of one length, got shapes {shapes}")
        for k, a in arrays.items():
            # finite in float32 too: the actions reach the model, and LeRobot's statistics the
            # normaliser, in float32 (1e39 read as float64 is finite and un-normalises to 3e38)
            with np.errstate(over="ignore"):
                bad = np.flatnonzero(~np.isfinite(a.astype(np.float32)))
            if bad.size:
                raise ValueError(
                    f"{name} statistic {k!r} is not finite at index {int(bad[0])} ({a[bad[0]]}; "
                    f"{bad.size} of {a.size} values); expected finite numbers (within float32's range)"
                )
        self._check_order(name, s)

    def _check_order(self, name: str, s: Stats) -> None:
        """A negative std or q99 < q01 mirrors the values: finite actions of the wrong sign."""
        if self.mode == "mean_std":
            bad, want, show = s.std < 0, "std >= 0", lambda i: f"std {s.std[i]}"
        elif self.mode == "quantile":
            bad, want, show = s.q99 < s.q01, "q99 >= q01", lambda i: f"q01 {s.q01[i]}, q99 {s.q99[i]}"
        else:
            return
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name} statistics at index {i}: {show(i)}; expected {want} ({bad.sum()} such indices)")

    def dims(self) -> tuple[int | None, int | None]:
        """How many state and action dims the statistics cover (None: identity, any number)."""
        if self.mode == "identity":
            return None, None
        key = "mean" if self.mode == "mean_std" else "q01"
        return tuple(int(getattr(s, key).shape[-1]) for s in (self.state, self.actions))  # type: ignore[return-value]

    def normalize_state(self, x: np.ndarray) -> np.ndarray:
        """In the convention's precision (float64 for openpi, float32 for LeRobot): pi0.5's prompt
        bins are cut from it."""
        return self._apply(x, self.state, forward=True)

    def normalize_actions(self, x: np.ndarray) -> np.ndarray:
        """The exact inverse of `unnormalize_actions`, with its own scale (LeRobot un-normalises
        mean / std with std, without the 1e-8 its normalisation adds): real-time chunking reads the
        executing chunk back into the model's space with it. A dim of zero scale gives inf or NaN,
        which the caller masks."""
        return self._apply(x, self.actions, forward=True, divide_by_inverse=True).astype(np.float32)

    def unnormalize_actions(self, x: np.ndarray) -> np.ndarray:
        return self._apply(x, self.actions, forward=False).astype(np.float32)

    def _apply(self, x: np.ndarray, s: Stats, forward: bool, divide_by_inverse: bool = False) -> np.ndarray:
        lerobot = self.convention == "lerobot"
        dtype = np.float32 if lerobot else np.float64  # the convention's own precision (module docstring)
        x = np.asarray(x, dtype=dtype)
        if self.mode == "identity":
            return x.copy()
        cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
        if self.mode == "mean_std":
            shift, std = cast(s.mean), cast(s.std)
            fwd = std + (LEROBOT_EPS if lerobot else EPS)
            inv = std if lerobot else fwd
        else:
            shift = cast(s.q01)
            span = cast(s.q99) - shift
            fwd = np.where(span == 0, LEROBOT_EPS, span) if lerobot else span + EPS
            inv = fwd
        d = min(shift.shape[-1], x.shape[-1])
        out = x.copy()
        a, f, i = shift[:d], fwd[:d], inv[:d]
        if divide_by_inverse:
            f = i
        if self.mode == "mean_std":
            out[..., :d] = (x[..., :d] - a) / f if forward else x[..., :d] * i + a
        else:
            out[..., :d] = 2 * (x[..., :d] - a) / f - 1 if forward else (x[..., :d] + 1) * i / 2 + a
        return out

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """openpi's norm_stats.json layout, plus the mode and the convention (LeRobot's statistics
        saved this way keep LeRobot's eps rules when loaded)."""
        data = {
            "norm_stats": {"state": self.state.to_dict(), "actions": self.actions.to_dict()},
            "mode": self.mode,
            "convention": self.convention,
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, path: str | Path, mode: str | None = None, kind: str | None = None) -> Normalizer:
        """openpi's norm_stats.json; the mode: `mode`, else the file's, else `default_mode(kind)`;
        the convention: the file's ("lerobot" for LeRobot's statistics), else openpi's."""
        data = read_json(path)  # a dict
        stats = data.get("norm_stats", data)
        if not isinstance(stats, dict) or "state" not in stats or "actions" not in stats:
            got = sorted(stats) if isinstance(stats, dict) else type(stats).__name__
            raise ValueError(f"{path}: expected norm_stats with 'state' and 'actions', got {got}")
        for name in ("state", "actions"):
            if not isinstance(stats[name], dict):
                raise ValueError(
                    f"{path}: norm_stats.{name} must be an object of statistics (mean, std, q01, q99), "
                    f"got {type(stats[name]).__name__}"
                )
        if "mode" in data and not (isinstance(data["mode"], str) and data["mode"]):
            raise ValueError(f"{path}: mode must be one of {MODES}, got {data['mode']!r}")
        mode = mode or data.get("mode") or default_mode(kind)
        convention = data.get("convention", "openpi")
        try:
            state, actions = (Stats.from_dict(stats[name], f"norm_stats.{name}") for name in ("state", "actions"))
            return cls(mode, state, actions, convention)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc

    @classmethod
    def from_lerobot(cls, folder: str | Path) -> Normalizer | None:
        """LeRobot 0.6 keeps statistics in its processor pipeline files, not beside the weights."""
        folder = Path(folder)
        pipeline = folder / "policy_preprocessor.json"
        if not file_present(pipeline):
            return None
        found = _lerobot_stats(folder, pipeline, "normalizer_processor")
        if found is None:
            return None
        mode, stats, stats_file = found
        try:
            out = cls(mode, stats("observation.state."), stats("action."), convention="lerobot")
        except ValueError as exc:
            raise ValueError(f"{stats_file}: {exc}") from exc
        _check_unnormalizer(folder, out)
        return out

    @classmethod
    def find(cls, folder: str | Path, mode: str | None = None, kind: str | None = None) -> Normalizer | None:
        """openpi's norm_stats.json (in the folder, else under its one assets/<asset id>/, whose id
        may hold a `/`: openpi's repo ids) or LeRobot's processor files; None when there are none.
        A norm_stats.json in the folder is the user's choice and wins; statistics under assets/
        beside LeRobot's processor files (an openpi export converted) are refused as a guess."""
        folder = Path(folder)
        if file_present(folder / "norm_stats.json"):
            return _said(cls.load(folder / "norm_stats.json", mode, kind), folder / "norm_stats.json")
        assets = sorted(  # under an asset id: not assets/norm_stats.json itself
            p for p in folder.glob("assets/**/norm_stats.json") if p.parent != folder / "assets" and file_present(p)
        )
        ids = ", ".join(str(p.parent.relative_to(folder / "assets")) for p in assets)
        if len(assets) > 1:  # statistics of several robots: picking one would be a guess
            raise ValueError(
                f"{folder}: normalisation statistics for {len(assets)} asset ids ({ids}); copy the one "
                f"of your robot to {folder / 'norm_stats.json'} (it takes precedence)"
            )
        processor, lerobot = folder / "policy_preprocessor.json", cls.from_lerobot(folder)
        if assets and lerobot is not None:  # which of the two the policy was trained with is a guess
            raise ValueError(
                f"{folder}: normalisation statistics both in {assets[0]} (openpi's, asset id {ids}) and in "
                f"LeRobot's {processor.name}; copy the ones the policy was trained with to "
                f'{folder / "norm_stats.json"} (it takes precedence; with "convention": "lerobot" for '
                "LeRobot's) or remove the other"
            )
        if assets:
            return _said(cls.load(assets[0], mode, kind), assets[0])
        return None if lerobot is None else _said(lerobot, processor)


def _said(normalizer: Normalizer, path: Path) -> Normalizer:
    """Log where the statistics came from: the start-up log names the file that scales the robot."""
    log.info("normalisation statistics: %s (%s, %s convention)", path, normalizer.mode, normalizer.convention)
    return normalizer


def _lerobot_stats(folder: Path, pipeline: Path, step_name: str) -> tuple[str, Callable[[str], Stats], Path] | None:
    """The mode, a `prefix -> Stats` reader and the file of the statistics that a processor step
    (`normalizer_processor`, `unnormalizer_processor`) names; None without such a step."""
    steps = pipeline_steps(pipeline)
    step = next((s for s in steps if s.get("registry_name") == step_name), None)
    if step is None or "state_file" not in step:
        return None
    import torch
    from safetensors.torch import load_file

    if not (isinstance(step["state_file"], str) and step["state_file"].strip()):
        raise ValueError(
            f"{pipeline}: the {step_name} step's state_file is {step['state_file']!r}; expected the name of the "
            "statistics file beside it"
        )
    name = Path(step["state_file"])
    if name.is_absolute() or ".." in name.parts:  # LeRobot writes a bare name beside the JSON file
        raise ValueError(
            f"{pipeline}: the {step_name} step's state_file {str(name)!r} is outside the checkpoint folder; "
            "expected a file name in it (statistics of another checkpoint would be used silently)"
        )
    stats_file = folder / name
    try:  # through torch: numpy has no bfloat16 (a statistics file converted by hand may hold it)
        tensors = {
            k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in load_file(str(stats_file)).items()
        }
    except Exception as exc:  # safetensors' errors are not OSErrors: say which file and what
        raise ValueError(f"cannot read normalisation statistics {stats_file}: {exc} (truncated or missing?)") from exc

    def stats(prefix: str) -> Stats:
        return Stats.from_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}, prefix[:-1])

    return _lerobot_mode(pipeline, step), stats, stats_file


def _check_unnormalizer(folder: Path, normalizer: Normalizer) -> None:
    """LeRobot un-normalises the actions with its postprocessor's own copy of the statistics; we
    use the preprocessor's. LeRobot saves the same in both: where they differ (a hand-edited or
    mixed-up folder), which ones the actions were trained against is unknown."""
    pipeline = folder / "policy_postprocessor.json"
    found = _lerobot_stats(folder, pipeline, "unnormalizer_processor") if file_present(pipeline) else None
    if found is None:
        return
    mode, stats, stats_file = found
    try:
        theirs = stats("action.")
    except ValueError as exc:
        raise ValueError(f"{stats_file}: {exc}") from exc
    used = {"mean_std": ("mean", "std"), "quantile": ("q01", "q99")}.get(mode, ())
    same = mode == normalizer.mode and all(
        getattr(theirs, k) is not None and np.array_equal(getattr(normalizer.actions, k), getattr(theirs, k))
        for k in used
    )
    if not same:
        raise ValueError(
            f"{stats_file}: the action statistics (or mode {mode}) the postprocessor un-normalises with differ "
            f"from the preprocessor's ({normalizer.mode}); expected the same, as LeRobot saves them"
        )


def pipeline_steps(path: Path) -> list[dict]:
    """A LeRobot processor file's `steps`: a list of objects, else an error naming the file."""
    steps = read_json(path).get("steps", [])
    if not isinstance(steps, list):
        raise ValueError(f"{path}: 'steps' must be a list of step objects, got {type(steps).__name__}")
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("config", {}), dict):
            got = f"config {step['config']!r}" if isinstance(step, dict) else repr(step)
            raise ValueError(f"{path}: steps[{i}] must be an object with a 'config' object, got {got}"[:400])
    return steps


def _lerobot_mode(pipeline: Path, step: dict) -> str:
    """A (un)normalizer step's mode from its config.norm_map. Without a norm_map the statistics'
    mode is unknown: reading it as identity would publish normalised actions as robot units."""
    norm_map = step.get("config", {}).get("norm_map")
    if not isinstance(norm_map, dict):
        raise ValueError(
            f"{pipeline}: the {step.get('registry_name')} step has statistics ({step['state_file']}) but its "
            f"config.norm_map is {'missing' if norm_map is None else type(norm_map).__name__}; expected an "
            'object such as {"STATE": "QUANTILES", "ACTION": "QUANTILES"} saying how they are applied'
        )
    modes = {"QUANTILES": "quantile", "MEAN_STD": "mean_std", "IDENTITY": "identity"}
    state_mode, action_mode = norm_map.get("STATE", "IDENTITY"), norm_map.get("ACTION", "IDENTITY")
    if not (isinstance(state_mode, str) and state_mode in modes and state_mode == action_mode):
        raise ValueError(
            f"{pipeline}: the {step.get('registry_name')} step's config.norm_map has STATE={state_mode!r} "
            f"ACTION={action_mode!r}; expected both the same, one of {', '.join(modes)} (LeRobot's MIN_MAX and "
            "per-feature mixes are not supported)"
        )
    _check_lerobot_step(pipeline, step, applied=modes[state_mode] != "identity")
    return modes[state_mode]


def _check_lerobot_step(pipeline: Path, step: dict, applied: bool) -> None:
    """What else LeRobot's (un)normalizer step would do that is not done here: images normalised,
    another eps, the state (or the actions) left out of what it normalises (the last two matter
    only where statistics are `applied`). Refused, named: the chunk would otherwise differ from
    LeRobot's without a word."""
    config, name = step.get("config", {}), step.get("registry_name")
    where = f"{pipeline}: the {name} step"
    visual = config["norm_map"].get("VISUAL", "IDENTITY")
    if visual != "IDENTITY":
        raise ValueError(
            f"{where} normalises the images ({visual}); expected VISUAL IDENTITY (pi0 / pi0.5 scale the pixels "
            "to [-1, 1] themselves)"
        )
    if not applied:
        return
    eps = config.get("eps", LEROBOT_EPS)
    if not (isinstance(eps, int | float) and math.isclose(eps, LEROBOT_EPS, rel_tol=1e-6)):
        raise ValueError(f"{where}'s eps is {eps!r}; expected LeRobot's default {LEROBOT_EPS:g}, the one applied here")
    key = "observation.state" if name == "normalizer_processor" else "action"
    features, keys = config.get("features"), config.get("normalize_observation_keys")
    left_out = (isinstance(features, dict) and key not in features) or (
        name == "normalizer_processor" and isinstance(keys, list) and key not in keys
    )
    if left_out:
        raise ValueError(
            f"{where} leaves {key} out of its features / normalize_observation_keys, so LeRobot does not normalise "
            f"it; expected it in (it is normalised here with the statistics)"
        )


def file_present(path: Path) -> bool:
    """Whether an optional checkpoint file is there. Something at the path that is not a regular
    file (a directory, a broken or looping link) is an error naming it: read as absent, the
    folder would silently run without what that file says (another view count, no deltas, other
    statistics)."""
    if path.is_file():
        return True
    if not os.path.lexists(path):
        return False
    raise ValueError(f"{path} is {what_is_there(path)}; expected a readable file there, or nothing")


def what_is_there(path: Path) -> str:
    """What occupies a path that is no readable regular file, for a message."""
    return "a directory" if path.is_dir() else "a broken or looping link" if path.is_symlink() else "not a regular file"


def read_json(path: str | Path) -> dict:
    """A JSON object from a checkpoint folder; a malformed file's error names it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc}); expected a UTF-8 JSON file") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
