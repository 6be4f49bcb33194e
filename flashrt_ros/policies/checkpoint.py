"""Load and save pi0 / pi0.5 weights in the two real layouts.

* openpi PyTorch: `model.safetensors` with keys `paligemma_with_expert.*`, `action_in_proj.*`,
  `time_mlp_in/out.*` (pi0.5) or `state_proj.*`, `action_time_mlp_in/out.*` (pi0); norm
  statistics in `assets/<id>/norm_stats.json`.
* LeRobot: the same keys under a `model.` prefix, plus `config.json` (`"type": "pi05"`).

Our module tree uses short roots (`vision`, `vision_proj`, `prefix_lm`, `expert`) and the
Hugging Face names below them, so mapping is a prefix rewrite. Validation is strict and
reports every problem at once. Loading streams tensor by tensor into a model built on the
meta device, so a full-size checkpoint never exists twice in memory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .config import GEMMA_2B, GEMMA_300M, MAX_INT, MAX_INTS, GemmaSpec, PolicyConfig
from .lerobot_relative import POSTPROCESSOR, PREPROCESSOR, lerobot_delta_mask, lerobot_says_relative_or_absolute
from .listing import bounded, some
from .normalize import file_present, read_json, what_is_there
from .pi0 import Pi0Model, param_dtype
from .robot_space import describe_mask

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FLASHRT_CONFIG_FILE = "flashrt_config.json"
LEROBOT_PREFIX = "model."
# LeRobot < 0.4 kept the normalisation statistics in the weights, under these modules
LEGACY_NORM_MODULES = ("normalize_inputs.", "normalize_targets.", "unnormalize_outputs.")
# ... and these config.json fields (0.4 renamed or dropped them; its loader refuses them)
LEGACY_CONFIG_FIELDS = ("adapt_to_pi_aloha", "use_delta_joint_actions_aloha", "num_steps", "resize_imgs_with_padding")
MEMORY_FIELDS = ("use_visual_memory", "use_proprioceptive_memory")
"""LeRobot's memory options (after 0.6.1): decisions on a history of observations, not supported."""
MIGRATE_HINT = (
    "convert it with LeRobot's `python -m lerobot.processor.migrate_policy_normalization --pretrained-path <folder>` "
    "(statistics into the processor files) and its config to LeRobot >= 0.4's fields"
)

# (our root, openpi root) — first entry is what we write; later entries are accepted aliases.
_ROOTS: list[tuple[str, str]] = [
    ("vision.", "paligemma_with_expert.paligemma.model.vision_tower.vision_model."),
    ("vision_proj.", "paligemma_with_expert.paligemma.model.multi_modal_projector.linear."),
    ("prefix_lm.", "paligemma_with_expert.paligemma.model.language_model."),
    ("expert.", "paligemma_with_expert.gemma_expert.model."),
    # transformers < 4.52 nesting (older openpi exports)
    ("vision.", "paligemma_with_expert.paligemma.vision_tower.vision_model."),
    ("vision_proj.", "paligemma_with_expert.paligemma.multi_modal_projector.linear."),
    ("prefix_lm.", "paligemma_with_expert.paligemma.language_model.model."),
]
# The LM head, tied to the embedding: saved in its place by exports that keep one copy. The second
# name is transformers < 4.52's, where PaliGemma's language model was a GemmaForCausalLM.
_TIED_EMBEDDINGS = {
    "paligemma_with_expert.paligemma.lm_head.weight",
    "paligemma_with_expert.paligemma.language_model.lm_head.weight",
}
# Present in real exports, never used for inference (vocab heads; the expert has no embedding).
_IGNORED = {
    *_TIED_EMBEDDINGS,
    "paligemma_with_expert.gemma_expert.lm_head.weight",
    "paligemma_with_expert.gemma_expert.model.embed_tokens.weight",
}
# What LeRobot's PI05Policy drops on load (`_fix_pytorch_state_dict_keys`): pi0's state
# projection, and the expert's plain norm weights (its norms are adaRMS). Matched as LeRobot does,
# on keys without its `model.` prefix only (with it, LeRobot refuses them as unexpected).
_PI05_DROPPED = re.compile(
    r"state_proj\.|paligemma_with_expert\.gemma_expert\.model\."
    r"(layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight|norm\.weight)"
)
_ALLOWED_DTYPES = {torch.float32, torch.bfloat16, torch.float16}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with every reason listed."""


@dataclass
class CheckpointInfo:
    path: Path
    layout: str  # "openpi" | "lerobot"
    config: PolicyConfig
    num_tensors: int
    num_bytes: int
    seconds: float


# ---- key mapping -----------------------------------------------------------------------------
def to_openpi_key(ours: str) -> str:
    for root, theirs in _ROOTS:
        if ours.startswith(root):
            return theirs + ours[len(root) :]
    return ours


def from_openpi_key(theirs: str, kind: str) -> str:
    for root, prefix in _ROOTS:
        if theirs.startswith(prefix):
            return root + theirs[len(prefix) :]
    if kind == "pi05" and theirs.startswith("action_time_mlp_"):
        return theirs.replace("action_time_mlp_", "time_mlp_", 1)  # as LeRobot renames them
    return theirs


# ---- layout and config detection -------------------------------------------------------------
def _no_weights(folder: Path) -> str:
    """Why a folder has no weights file to read, for a message."""
    weights, index = folder / WEIGHTS_FILE, folder / f"{WEIGHTS_FILE}.index.json"
    if os.path.lexists(weights):  # a Hugging Face cache snapshot copied without its blobs
        return f"{weights} is {what_is_there(weights)}; expected the policy's weights file there"
    if os.path.lexists(index):
        return (
            f"{folder} holds a sharded checkpoint ({index.name} and its shards); expected one {WEIGHTS_FILE}: "
            "merge the shards into one (safetensors' load_file of each, save_file of them all)"
        )
    return f"no {WEIGHTS_FILE} in {folder}"


def detect_layout(folder: Path) -> str:
    """The weights' layout: LeRobot's where every tensor carries its prefix, or where none does but
    its processor files are there (LeRobot's loader adds the prefix: such a folder is a LeRobot
    policy, whose config.json and relative actions must be read as LeRobot's); else openpi's."""
    _check_folder(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(_no_weights(folder))
    keys = weight_names(weights)
    legacy = [k for k in keys if k.startswith(LEGACY_NORM_MODULES)]
    if legacy:  # read as a mixed layout, the advice was to delete them: the statistics
        raise CheckpointError(
            f"{weights}: a LeRobot < 0.4 checkpoint, its normalisation statistics inside the weights "
            f"({', '.join(legacy[:3])}{', ...' if len(legacy) > 3 else ''}); expected LeRobot >= 0.4's layout: "
            + MIGRATE_HINT
        )
    stray = [k for k in keys if not k.startswith(LEROBOT_PREFIX)]
    if keys and not stray:
        return "lerobot"
    if len(stray) < len(keys) / 2:  # mostly LeRobot's names: read as openpi, all of them would be "missing"
        raise CheckpointError(
            f"{weights}: {len(keys) - len(stray)} tensors carry LeRobot's {LEROBOT_PREFIX!r} prefix and {len(stray)} "
            f"do not ({', '.join(stray[:5])}{', ...' if len(stray) > 5 else ''}); expected one layout: all with "
            "the prefix (LeRobot) or none (openpi)"
        )
    if any(_present(folder / name) for name in (PREPROCESSOR, POSTPROCESSOR)):
        return "lerobot"
    if _present(folder / CONFIG_FILE) and _lerobot_type(folder / CONFIG_FILE):
        return "lerobot"  # its weights and config.json alone (processor files not downloaded)
    return "openpi"


def _check_folder(folder: Path) -> None:
    """A checkpoint is a folder: a path that is none is said as such, not read as a folder that
    lacks its files (which named a layout for a path that does not exist)."""
    if not Path(folder).is_dir():
        what = "is a file" if Path(folder).exists() else "does not exist"
        raise CheckpointError(f"checkpoint folder {folder} {what}; expected a folder with {WEIGHTS_FILE}")


def _lerobot_type(path: Path) -> bool:
    """Whether a config.json is LeRobot's: it names the policy `type`; openpi's converter writes
    none (read as openpi's, LeRobot's chunk, prompt length, steps and prompt style would be lost)."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}" if isinstance(exc, OSError) else str(exc)) from exc
    return "type" in data


def weight_names(path: Path) -> tuple[str, ...]:
    """The tensor names in a safetensors file's header. Start-up asks for them several times (the
    layout, the kind, the parameter checks) before the weights are streamed: the header is read
    once per version of the file (its inode, size and modification times)."""
    try:
        st = Path(path).stat()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    return _weight_names(str(path), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


@functools.lru_cache(maxsize=8)
def _weight_names(path: str, version: tuple[int, ...]) -> tuple[str, ...]:
    with _open(Path(path)) as f:
        return tuple(f.keys())


def kind_from_keys(keys: Iterable[str]) -> tuple[str, str] | None:
    """(pi0 or pi05, the tensor that says so) from the weights' names, for a folder with no config
    file that names the kind: pi0.5's expert norms are adaptive, pi0 has a state projection (which
    some pi0.5 exports carry too, unused: LeRobot drops it, so the adaptive norms decide)."""
    keys = list(keys)
    pi05 = next((key for key in keys if ".input_layernorm.dense." in key and "gemma_expert" in key), None)
    if pi05 is not None:
        return "pi05", pi05
    pi0 = next((key for key in keys if key.removeprefix(LEROBOT_PREFIX).startswith("state_proj.")), None)
    return None if pi0 is None else ("pi0", pi0)


def read_config(folder: Path, layout: str, fallback: PolicyConfig | None = None) -> PolicyConfig:
    """What model the folder's weights are: our own flashrt_config.json, on top of what the other
    files say (LeRobot's config.json, or the one openpi's converter writes: chunk length, action
    dims, variants), else the caller's fallback.

    A flashrt_config.json with every field (as `save_model` writes) is the config alone; one with
    some fields (written by hand: what no other file records, e.g. openpi's discrete_state_input)
    changes those. LeRobot's config.json names only the full-size variants (gemma_2b / gemma_300m),
    so a non-standard model needs a whole flashrt_config.json or an explicit config. Where no file
    names the kind (openpi), the weights' names do, and a fallback of the other kind is refused
    here, before anything is loaded."""
    folder = Path(folder)
    _check_folder(folder)
    ours = folder / FLASHRT_CONFIG_FILE
    if not _present(ours):
        return _with_relative_actions(_base_config(folder, layout, fallback), folder, layout)
    every = {f.name for f in dataclasses.fields(PolicyConfig)} - {"extra"}

    def parse(data: dict) -> PolicyConfig:
        if not isinstance(data, dict) or every <= set(data):
            cfg = PolicyConfig.from_dict(data)
            _check_kind_stated(cfg.kind, ours, folder)  # a partial file's kind is checked with its base
            return cfg
        base = _base_config(folder, layout, fallback, kind=data.get("kind"))
        return PolicyConfig.from_dict({**base.to_dict(), **data})

    cfg = _config_from_file(ours, parse)
    if layout == "lerobot":
        cfg = _beside_lerobots(cfg, folder)
    else:
        _warn_where_openpi_differs(cfg, folder)
    return _with_relative_actions(cfg, folder, layout)


def _check_kind_stated(kind: str, stated_in: Path, folder: Path) -> None:
    """Refuse a config file whose kind the weights' names contradict, before anything is loaded:
    loading would fail later on tensor names with no word about the kind, and the `policy`
    parameter's mismatch message would point at the wrong one."""
    found = kind_from_keys(weight_names(folder / WEIGHTS_FILE))
    if found and found[0] != kind:
        raise CheckpointError(
            f"{stated_in} says kind {kind!r}, but the weights are a {found[0]} policy "
            f"(they have {found[1]}); expected the weights' kind there"
        )


def _warn_where_openpi_differs(cfg: PolicyConfig, folder: Path) -> None:
    """A flashrt_config.json that sets what the converter's config.json states otherwise (the chunk
    length, the action dims, the variants, the prompt length): ours runs, said field by field as
    for LeRobot's (a stale file changed the chunk's length without a word)."""
    theirs = folder / CONFIG_FILE
    if not _present(theirs):
        return
    try:  # a config.json that ours overrides need not be well formed
        data = read_json(theirs)
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    keys = {**_OPENPI_INTS, "max_token_len": "prompt_len", "discrete_state_input": "discrete_state_input"}
    said = {ours: data[key] for key, ours in keys.items() if key in data}
    for key, ours in (("paligemma_variant", "prefix"), ("action_expert_variant", "expert")):
        if isinstance(data.get(key), str):
            said[ours] = data[key].removesuffix("_lora")
    for key, value in said.items():
        mine, other = _shown_field(getattr(cfg, key)), value if key in ("prefix", "expert") else repr(value)
        if mine != other:
            _ours_runs(folder, f"{key} is {mine}", f"says {other}", mine)


def _shown_field(value: object) -> str:
    """A config field for a warning: a Gemma stack by its variant's name."""
    names = {GEMMA_2B: "gemma_2b", GEMMA_300M: "gemma_300m"}
    if isinstance(value, GemmaSpec):
        return names.get(value, f"a Gemma of width {value.width} and depth {value.depth}")
    return repr(value)


def _beside_lerobots(cfg: PolicyConfig, folder: Path) -> PolicyConfig:
    """`cfg` (from a flashrt_config.json) with the camera names of LeRobot's config.json beside it,
    for the start-up log, where they are as many as its camera views.

    A flashrt_config.json that sets what LeRobot's config.json states otherwise (chunk, steps,
    prompt length, cameras, resolution, periods): ours runs, LeRobot would run theirs. A choice
    (fewer steps) or a stale file: said, field by field, not refused."""
    theirs = folder / CONFIG_FILE
    if not _present(theirs):
        return cfg
    data = _config_from_file(theirs, lambda d: d if isinstance(d, dict) else {})
    try:
        _refuse_memory(data)  # what the model was trained on, whatever our file says
    except CheckpointError as exc:
        raise CheckpointError(f"{theirs}: {exc}") from None
    _warn_where_lerobot_differs(cfg, folder, data)
    try:  # only named in the log: a config.json that ours overrides need not be well formed
        names = _lerobot_cameras(data.get("input_features", {}), _lerobot_int(data, "empty_cameras", 0, minimum=0))
    except CheckpointError:
        return cfg
    if len(names) != cfg.camera_views:  # config.json's, over ours: a re-saved policy keeps the names it had
        views, listed = str(cfg.camera_views), f"lists {len(names)} ({', '.join(names)})"
        _ours_runs(folder, f"{views} camera views", listed, views, str(len(names)))
        return cfg
    return cfg.replace(extra={**cfg.extra, "camera_names": names})


def _warn_where_lerobot_differs(cfg: PolicyConfig, folder: Path, data: dict) -> None:
    """Each field where `cfg` differs from what LeRobot's config.json (`data`) says, as a warning."""
    said = {ours: data[key] for key, ours in _LEROBOT_INTS.items() if key in data}
    said |= {key: data[key] for key in ("empty_cameras", "min_period", "max_period") if key in data}
    ours = {key: getattr(cfg, key) for key in said}
    if "image_resolution" in data:
        said["image_size"], ours["image_size"] = data["image_resolution"], [cfg.vision.image_size] * 2
    for key in sorted(k for k in said if said[k] != ours[k]):
        _ours_runs(folder, f"{key} is {ours[key]!r}", f"says {said[key]!r}", repr(ours[key]), repr(said[key]))


def _ours_runs(folder: Path, ours_say: str, theirs_say: str, runs: str, lerobot_runs: str | None = None) -> None:
    """The warning where flashrt_config.json says otherwise than config.json beside it: ours runs
    (and, for LeRobot's, what LeRobot would run)."""
    other = f" (LeRobot would run {lerobot_runs})" if lerobot_runs is not None else ""
    log.warning(
        "%s: %s, where %s %s: this runs %s%s",
        folder / FLASHRT_CONFIG_FILE,
        ours_say,
        folder / CONFIG_FILE,
        theirs_say,
        runs,
        other,
    )


def _with_relative_actions(cfg: PolicyConfig, folder: Path, layout: str) -> PolicyConfig:
    """A LeRobot checkpoint's relative actions, from the processor files LeRobot runs, whatever
    else the folder holds; a flashrt_config.json mask that says otherwise is refused (also one
    where the files say the actions are absolute: LeRobot 0.6.1 writes the steps disabled). A
    mask stands only where the folder says nothing about relative actions (older exports)."""
    if layout != "lerobot":
        return cfg
    try:
        mask = lerobot_delta_mask(folder)
        # the files read again only where a mask of ours meets theirs switched off
        contradicted = not mask and any(cfg.delta_action_mask) and lerobot_says_relative_or_absolute(folder)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    if not mask:  # off: a flashrt_config.json's own mask stands where LeRobot's files say nothing
        if contradicted:
            raise CheckpointError(
                f"{folder / FLASHRT_CONFIG_FILE}: delta_action_mask ({describe_mask(cfg.delta_action_mask)}), but the "
                "LeRobot processor files (or config.json's use_relative_actions) say the actions are absolute: "
                "relative actions disabled; expected no mask (the state would be added to absolute actions), or, "
                "for weights trained on relative actions, those processors enabled (LeRobot needs them too)"
            )
        return cfg
    if cfg.delta_action_mask and cfg.delta_action_mask != mask:
        raise CheckpointError(
            f"{folder / FLASHRT_CONFIG_FILE}: delta_action_mask ({describe_mask(cfg.delta_action_mask)}) differs from "
            f"the relative actions of the LeRobot processor files ({describe_mask(mask)}); expected the same or none"
        )
    if len(mask) > min(cfg.action_dim, cfg.state_dim):
        raise CheckpointError(
            f"{folder}: the LeRobot processors' relative actions cover {len(mask)} action dims (config.json "
            f"output_features.action.shape), more than the model's action_dim {cfg.action_dim} / state_dim "
            f"{cfg.state_dim}"
        )
    return cfg.replace(delta_action_mask=mask)


def _base_config(folder: Path, layout: str, fallback: PolicyConfig | None, kind: str | None = None) -> PolicyConfig:
    """The config from LeRobot's or openpi's config.json, else the fallback; `kind` (stated by a
    flashrt_config.json) overrides what the weights' names say."""
    theirs = folder / CONFIG_FILE
    if kind is not None:  # else: errors about the wrong size or tokenizer
        _check_kind_stated(kind, folder / FLASHRT_CONFIG_FILE, folder)
    if layout == "lerobot":
        if _present(theirs):
            cfg = _config_from_file(theirs, config_from_lerobot)
            if kind is None:  # the kind config.json states
                _check_kind_stated(cfg.kind, theirs, folder)
            return cfg
        # the caller's preset would stand in for chunk, steps, prompt length and style, cameras
        raise CheckpointError(
            f"{folder} holds a LeRobot policy without its {CONFIG_FILE}; expected the {CONFIG_FILE} saved with "
            f"its weights (LeRobot cannot load the folder without it either), or a {FLASHRT_CONFIG_FILE} of every field"
        )
    found = kind_from_keys(weight_names(folder / WEIGHTS_FILE))
    if kind is None and found and fallback is not None and found[0] != fallback.kind:
        raise CheckpointError(
            f"{folder} holds a {found[0]} policy (it has {found[1]}), not the {fallback.kind} one asked for; "
            "expected a matching `policy` parameter"
        )
    kind = kind or (found[0] if found else None)
    if fallback is None and not (_present(theirs) or _present(folder / FLASHRT_CONFIG_FILE)):
        raise CheckpointError(
            f"{folder} has no {FLASHRT_CONFIG_FILE} or {CONFIG_FILE}: pass a config "
            "(e.g. PolicyConfig.pi05()) to say what model the weights belong to"
        )
    if fallback is None or (kind is not None and kind != fallback.kind):
        fallback = PolicyConfig.pi0() if kind == "pi0" else PolicyConfig.pi05()  # openpi exports: full size
    if _present(theirs):
        return _config_from_file(theirs, lambda data: config_from_openpi(data, fallback))
    return fallback


# openpi's converter (examples/convert_jax_model_to_pytorch.py) writes these into config.json
_OPENPI_INTS = {"action_horizon": "horizon", "action_dim": "action_dim"}


def config_from_openpi(data: dict, base: PolicyConfig) -> PolicyConfig:
    """`base` with what the config.json of openpi's PyTorch converter says: the chunk length, the
    padded action dims (openpi pads the state to them too) and the Gemma variants (a LoRA variant
    has its base's shapes). Its precision is not taken: that is the deployment's choice."""
    variants = {"gemma_2b": GEMMA_2B, "gemma_300m": GEMMA_300M}
    specs = {}
    for key, ours in (("paligemma_variant", "prefix"), ("action_expert_variant", "expert")):
        if key not in data:
            continue
        name = data[key]
        spec = variants.get(name.removesuffix("_lora")) if isinstance(name, str) else None
        if spec is None:
            raise CheckpointError(f"field {key!r} is {name!r}; expected one of {sorted(variants)} (or their _lora)")
        specs[ours] = spec
    ints = {ours: _lerobot_int(data, key, getattr(base, ours), ours=ours) for key, ours in _OPENPI_INTS.items()}
    # what openpi's Pi0Config holds and some converters copy too (openpi's own writes none of them)
    if "pi05" in data and not isinstance(data["pi05"], bool):
        raise CheckpointError(f"field 'pi05' must be true or false, got {data['pi05']!r}")
    if "pi05" in data and data["pi05"] is not (base.kind == "pi05"):
        raise CheckpointError(
            f"field 'pi05' is {data['pi05']!r}, but the weights are a {base.kind} policy; expected "
            f"{str(base.kind == 'pi05').lower()}"
        )
    extra = {}
    if "max_token_len" in data:
        extra["prompt_len"] = _lerobot_int(data, "max_token_len", base.prompt_len, ours="prompt_len")
    if "discrete_state_input" in data:
        value = data["discrete_state_input"]
        if not isinstance(value, bool):
            raise CheckpointError(f"field 'discrete_state_input' must be true or false, got {value!r}")
        extra["discrete_state_input"] = value
    return base.replace(state_dim=ints["action_dim"], **ints, **specs, **extra)


def _present(path: Path) -> bool:
    """normalize.file_present, its refusal as a CheckpointError."""
    try:
        return file_present(path)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc


def _config_from_file(path: Path, parse: Callable[[dict], PolicyConfig]) -> PolicyConfig:
    """`parse` of the JSON object in `path`; any problem (not UTF-8 / JSON, a field of the wrong
    type or range) is a CheckpointError naming the file and what it says about the field."""
    try:
        return parse(read_json(path))
    except (CheckpointError, ValueError, TypeError) as exc:
        message = str(exc)  # already naming a file of the folder (config.json read for a partial
        # flashrt_config.json): that file is the one at fault, not this one
        raise CheckpointError(message if message.startswith(str(path.parent)) else f"{path}: {message}") from exc


EMPTY_CAMERA_PREFIX = "observation.images.empty_camera_"  # LeRobot's name for its empty_cameras
VARIANT_KEYS = {"paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m"}
# config.json field -> PolicyConfig field, for the integer fields LeRobot's config may set
_LEROBOT_INTS = {
    "tokenizer_max_length": "prompt_len",
    "chunk_size": "horizon",
    "max_action_dim": "action_dim",
    "max_state_dim": "state_dim",
    "num_inference_steps": "num_steps",
}


def _refuse_memory(data: dict) -> None:
    """LeRobot's memory (MEM) on: visual memory adds no tensor, so such a checkpoint would run,
    single-frame, on image features it was not trained on, without a word."""
    memory = [key for key in MEMORY_FIELDS if data.get(key) not in (None, False)]
    if memory:
        raise CheckpointError(
            f"LeRobot config turns on {', '.join(f'{k}: {data[k]!r}' for k in memory)} (MEM: a history of frames "
            "or states per decision); this package runs pi0.5 on the current frame and state only"
        )


def config_from_lerobot(data: dict) -> PolicyConfig:
    """PolicyConfig of a LeRobot config.json; a field of the wrong type is named with what it
    should be (an int() or a [0] on it would fail naming neither)."""
    kind = data.get("type")
    if kind not in ("pi0", "pi05"):
        raise CheckpointError(f"LeRobot config type {kind!r} is not a pi0/pi05 policy")
    variants = {"gemma_2b": GEMMA_2B, "gemma_300m": GEMMA_300M}
    base = PolicyConfig.pi05() if kind == "pi05" else PolicyConfig.pi0()
    legacy = [key for key in LEGACY_CONFIG_FIELDS if key in data]
    if legacy:  # adapt_to_pi_aloha dropped without a word flips the ALOHA joints' signs
        raise CheckpointError(f"LeRobot < 0.4 config fields {legacy}, which LeRobot >= 0.4 refuses; " + MIGRATE_HINT)
    _refuse_memory(data)
    chosen = {key: data.get(key, default) for key, default in VARIANT_KEYS.items()}
    unknown = {key: v for key, v in chosen.items() if not isinstance(v, str) or v not in variants}
    if unknown:
        raise CheckpointError(
            f"LeRobot config has unknown model variants {unknown}; expected one of {sorted(variants)}"
        )
    ints = {ours: _lerobot_int(data, key, getattr(base, ours), ours=ours) for key, ours in _LEROBOT_INTS.items()}
    # the sin / cos time embedding's periods (LeRobot's create_sinusoidal_pos_embedding reads them
    # from the config); PolicyConfig checks them (finite, > 0, min <= max)
    periods = {key: data.get(key, getattr(base, key)) for key in ("min_period", "max_period")}
    empty = _lerobot_int(data, "empty_cameras", 0, minimum=0)
    cameras = _lerobot_cameras(data.get("input_features", {}), empty)  # in the order LeRobot feeds them
    # how many of a chunk's actions LeRobot executes before it decides again: the node says so
    executed = _lerobot_int(data, "n_action_steps", ints["horizon"])
    if executed > ints["horizon"]:
        raise CheckpointError(f"field 'n_action_steps' is {executed}, more than chunk_size {ints['horizon']}")
    return base.replace(
        prefix=variants[chosen["paligemma_variant"]],
        expert=variants[chosen["action_expert_variant"]],
        vision=base.vision.__class__(image_size=_lerobot_resolution(data)),
        num_views=max(1, len(cameras)) + empty,
        empty_cameras=empty,
        prompt_style="lerobot",
        dtype=data.get("dtype", "float32"),
        extra={"n_action_steps": executed, "camera_names": cameras},
        **ints,
        **periods,
    )


def _lerobot_int(data: dict, key: str, default: int, minimum: int = 1, ours: str | None = None) -> int:
    """An integer field of a LeRobot / openpi config.json, checked under the file's own name
    (`ours`: the PolicyConfig field it sets, whose upper bound applies)."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"field {key!r} must be an integer >= {minimum}, got {value!r}")
    high = MAX_INTS.get(ours or "", MAX_INT)
    if value > high:
        raise CheckpointError(f"field {key!r} must be from {minimum} to {high}, got {value}")
    return value


def _lerobot_cameras(features: object, empty: int) -> list[str]:
    """The cameras the config's VISUAL input features name, in their order (the order LeRobot
    stacks the views in, so the order camera_topics must feed them in). LeRobot saves its empty
    cameras among them too (`observation.images.empty_camera_<i>`, added by validate_features): not
    cameras."""
    if not isinstance(features, dict) or not all(isinstance(v, dict) for v in features.values()):
        raise CheckpointError(
            f"field 'input_features' must be an object of feature name -> {{\"type\": ...}}, got {features!r}"[:300]
        )
    placeholders = {f"{EMPTY_CAMERA_PREFIX}{i}" for i in range(empty)}
    return [name for name, v in features.items() if v.get("type") == "VISUAL" and name not in placeholders]


def _lerobot_resolution(data: dict) -> int:
    """The square input side from image_resolution [height, width]."""
    res = data.get("image_resolution", [224, 224])
    ok = isinstance(res, list) and len(res) == 2 and all(type(v) is int and v >= 1 for v in res)
    if not ok or res[0] != res[1]:
        raise CheckpointError(f"field 'image_resolution' must be [size, size] with an integer size >= 1, got {res!r}")
    return res[0]


def lerobot_config_dict(cfg: PolicyConfig, camera_names: list[str] | None = None, robot_dof: int | None = None) -> dict:
    """A LeRobot-readable config.json for full-size models (ours is written beside it). LeRobot's
    pi0.5 always writes the state into its prompt: a model trained otherwise has no LeRobot config.
    A policy loaded from LeRobot's files keeps its camera names and n_action_steps (in cfg.extra)."""
    if cfg.state_in_prompt != (cfg.kind == "pi05"):
        raise ValueError(
            f"a {cfg.kind} model with discrete_state_input={cfg.discrete_state_input} has no LeRobot config "
            "(LeRobot's pi0.5 puts the state in its prompt, its pi0 never); save it in the openpi layout"
        )
    names = {GEMMA_2B: "gemma_2b", GEMMA_300M: "gemma_300m"}
    had = [str(name) for name in cfg.extra.get("camera_names") or []]  # LeRobot's keys, as read
    cams = camera_names or (had if len(had) == cfg.camera_views else [f"cam{i}" for i in range(cfg.camera_views)])
    size = cfg.vision.image_size
    keys = [c if c.startswith("observation.") else f"observation.images.{c}" for c in cams]
    visual = keys + [f"{EMPTY_CAMERA_PREFIX}{i}" for i in range(cfg.empty_cameras)]
    features = {name: {"type": "VISUAL", "shape": [3, size, size]} for name in visual}
    features["observation.state"] = {"type": "STATE", "shape": [robot_dof or cfg.state_dim]}
    return {
        "type": cfg.kind,
        "paligemma_variant": names.get(cfg.prefix, "custom"),
        "action_expert_variant": names.get(cfg.expert, "custom"),
        "dtype": cfg.dtype,
        "chunk_size": cfg.horizon,
        "n_action_steps": cfg.extra.get("n_action_steps") or cfg.horizon,
        "max_state_dim": cfg.state_dim,
        "max_action_dim": cfg.action_dim,
        "num_inference_steps": cfg.num_steps,
        "tokenizer_max_length": cfg.prompt_len,
        "min_period": cfg.min_period,
        "max_period": cfg.max_period,
        "image_resolution": [size, size],
        "empty_cameras": cfg.empty_cameras,
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [robot_dof or cfg.action_dim]}},
    }


# ---- loading ---------------------------------------------------------------------------------
def load_model(
    folder: str | Path,
    config: PolicyConfig | None = None,
    device: str | torch.device = "cpu",
    progress: bool | None = None,
) -> tuple[Pi0Model, CheckpointInfo]:
    """Build the model and stream the checkpoint's weights in.

    `config` (if given) says what model the weights are for; otherwise the folder's config
    files do (`read_config`). Raises CheckpointError listing every missing, unexpected,
    mis-shaped or wrongly typed tensor; the model is returned only if all of them are right.
    """
    folder = Path(folder)
    start = time.perf_counter()
    layout = detect_layout(folder)
    cfg = config or read_config(folder, layout)
    weights = folder / WEIGHTS_FILE
    with torch.device("meta"):
        model = Pi0Model(cfg)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    with _open(weights) as f:
        plan = _plan(f, layout, cfg, expected, weights)
        total = sum(_nbytes(f, key) for key in plan.values())
        dtype = getattr(torch, cfg.dtype)
        not_finite = []
        for ours, theirs in _progress(plan.items(), total, progress, weights.name):
            # copy=True: on the CPU at the stored dtype `to` would return the file's memory map itself,
            # and rewriting or truncating the file on disk would change or crash the running policy
            tensor = f.get_tensor(theirs).to(device=device, dtype=param_dtype(ours, dtype), copy=True)
            bad = int((~torch.isfinite(tensor)).sum())  # a NaN weight would make every action NaN
            if bad:
                not_finite.append(f"{theirs} ({bad} of {tensor.numel()} values)")
            _assign(model, ours, tensor)
    if not_finite:
        raise CheckpointError(
            f"{weights}: {len(not_finite)} tensors hold NaN or inf values: "
            + "; ".join(bounded(not_finite, 5))
            + "; expected finite weights (a corrupted or diverged checkpoint?)"
        )
    model.eval()
    info = CheckpointInfo(folder, layout, cfg, len(plan), total, time.perf_counter() - start)
    log.info(
        "loaded %s %s checkpoint %s: %d tensors, %.2f GB in %.1f s (%s, %s)",
        cfg.kind,
        layout,
        folder,
        info.num_tensors,
        total / 1e9,
        info.seconds,
        cfg.dtype,
        device,
    )
    return model, info


def _plan(f, layout: str, cfg: PolicyConfig, expected: dict[str, tuple], path: Path) -> dict[str, str]:
    """Map every expected parameter to a checkpoint key, or raise with all problems (names as the
    file spells them: a missing tensor with the layout's prefix, as the others in it)."""
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    sources: dict[str, list[str]] = {}
    unexpected, ignored = [], []
    tied = []  # the keys the LM head was saved under, with or without LeRobot's prefix
    for key in f.keys():
        theirs = key[len(prefix) :] if prefix and key.startswith(prefix) else key
        if theirs in _IGNORED or (cfg.kind == "pi05" and key == theirs and _PI05_DROPPED.match(key)):
            ignored.append(key)
            if theirs in _TIED_EMBEDDINGS:
                tied.append(key)
            continue
        ours = from_openpi_key(theirs, cfg.kind)
        (sources.setdefault(ours, []).append(key) if ours in expected else unexpected.append(key))
    available = {ours: keys[0] for ours, keys in sources.items()}
    embed = "prefix_lm.embed_tokens.weight"
    if embed not in available and tied:
        available[embed] = tied[0]  # tied weights saved under the LM head's name
        if len(tied) > 1:  # which head stood in for the embedding would depend on key order
            sources[embed] = tied
    missing = sorted(set(expected) - set(available))
    problems = bounded(_collisions(sources), SHOWN, " such")
    if missing:
        names = [prefix + to_openpi_key(m) for m in missing]
        problems.append(f"missing {len(missing)} tensor(s): " + some(names, SHOWN))
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): " + some(sorted(unexpected), SHOWN))
    shapes, dtypes = [], []
    for ours, key in sorted(available.items()):
        sl = f.get_slice(key)
        shape, dtype = tuple(sl.get_shape()), _torch_dtype(sl.get_dtype())
        if shape != expected[ours]:
            shapes.append(f"{key}: shape {list(shape)}, expected {list(expected[ours])}")
        if dtype not in _ALLOWED_DTYPES:
            dtypes.append(f"{key}: dtype {sl.get_dtype()}, expected F32, BF16 or F16 (cast it to one)")
    problems += bounded(shapes, SHOWN, " tensors of other shapes") + bounded(dtypes, SHOWN, " tensors of other dtypes")
    if problems:
        header = f"{path}: does not match a {cfg.kind} model of this config:"
        if any(k.startswith("state_proj.") for k in ignored):  # dropped as LeRobot does, and a pi0's
            problems.append("it holds pi0's state_proj (a pi05 has none; ignored as LeRobot does): pi0 weights?")
        raise CheckpointError("\n  ".join([header, *problems]))
    if ignored:  # LeRobot warns of the pi05 keys it drops; they are as unused here
        log.debug("ignored %d unused tensor(s): %s", len(ignored), ", ".join(ignored))
    return {ours: available[ours] for ours in expected}


SHOWN = 12  # names listed per kind of problem: a model of another size mismatches all ~800 tensors


def _collisions(sources: dict[str, list[str]]) -> list[str]:
    """Parameters that several checkpoint keys map to (the old and new transformers nesting of one
    tensor, or pi0.5's time_mlp_in and its action_time_mlp_in alias): picking one would depend on
    key order and silently drop the other, so each is a problem naming every key."""
    return [
        f"{len(keys)} tensors map to the one parameter {to_openpi_key(ours)}: {', '.join(sorted(keys))}; "
        "expected exactly one (remove the duplicates)"
        for ours, keys in sorted(sources.items())
        if len(keys) > 1
    ]


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises its own error type for corrupt headers
        raise CheckpointError(f"cannot read {path}: {exc} (truncated or not a safetensors file?)") from exc


_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _torch_dtype(name: str) -> torch.dtype | None:
    return _DTYPES.get(name)


def _nbytes(f, key: str) -> int:
    sl = f.get_slice(key)
    n = 1
    for d in sl.get_shape():
        n *= d
    dtype = _torch_dtype(sl.get_dtype())
    return n * (dtype.itemsize if dtype is not None else 1)


def _progress(items, total_bytes: int, enabled: bool | None, name: str):
    """A progress bar for large checkpoints (> 200 MB) unless told otherwise."""
    if enabled is None:
        enabled = total_bytes > 200e6
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(list(items), desc=f"loading {name}", unit="tensor")


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)


# ---- saving ----------------------------------------------------------------------------------
def save_model(
    model: Pi0Model,
    folder: str | Path,
    layout: str = "lerobot",
    camera_names: list[str] | None = None,
    robot_dof: int | None = None,
) -> Path:
    """Write `model.safetensors` (+ configs) in the given layout; returns the folder."""
    if layout not in ("openpi", "lerobot"):
        raise ValueError(f"layout must be 'openpi' or 'lerobot', got {layout!r}")
    cfg = model.cfg
    # first: a config LeRobot has no form for is refused before anything is written (the weights
    # and our config alone made a folder that loads as a LeRobot one, or sat beside an older config.json)
    lerobot_cfg = lerobot_config_dict(cfg, camera_names, robot_dof) if layout == "lerobot" else None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    tensors = {prefix + to_openpi_key(n): p.detach().contiguous().cpu() for n, p in model.named_parameters()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt", "flashrt_layout": layout})
    (folder / FLASHRT_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
    if lerobot_cfg is not None:
        (folder / CONFIG_FILE).write_text(json.dumps(lerobot_cfg, indent=2))
    return folder
