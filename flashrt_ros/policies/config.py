"""Policy configurations: the real pi0 / pi0.5 sizes, and a `tiny` preset for CPU tests.

The sizes are openpi's (`gemma.py: get_config`, `siglip.py`) as LeRobot 0.6.1 builds them;
see ../shared/DESIGN.md §4. Everything a deployment may change (views, prompt length,
horizon, steps) is a plain field, so a YAML file can set it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .robot_space import ALOHA_DOF, counted_dims, mask_from_spec

PolicyKind = Literal["pi0", "pi05"]
Precision = Literal["float32", "bfloat16"]
PromptStyle = Literal["openpi", "lerobot"]
PROMPT_STYLES = ("openpi", "lerobot")
# what the `fp8` setting may put in FP8 (FusedPi0's prefix_mlp_fp8): nothing, or the prefix LM's MLP
FP8_PARTS = ("none", "prefix_mlp")
# real-time chunking (guidance.py): how the hold fades over the overlap; how the correction is made
RTC_SCHEDULES = ("exp", "linear", "ones", "zeros")
RTC_JACOBIANS = ("identity", "exact")


# Upper bounds of the sizes and counts, far above any pi0 / pi0.5 (chunk 50, 10 steps, prompt 200,
# 3 views, vocabulary 257152, widths up to 16384): a config.json with chunk_size 10**12 would
# otherwise load, and the first decision fail deep in torch or run for hours.
MAX_INT = 1 << 20
MAX_INTS = {
    "num_views": 16,
    "prompt_len": 4096,
    "horizon": 1000,
    "num_steps": 1000,
    "action_dim": 1024,
    "state_dim": 1024,
}


def _int_problem(name: str, value: Any) -> str | None:
    """A size or count must be a real int from 1 to its bound (a JSON "96" or 2.5 would fail
    later, elsewhere; 10**12 would load and then hang the first decision)."""
    high = MAX_INTS.get(name, MAX_INT)
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be an integer from 1 to {high}, got {value!r} ({type(value).__name__})"
    return None if 1 <= value <= high else f"{name} must be from 1 to {high}, got {value}"


def _positive_float_problem(name: str, value: Any) -> str | None:
    """An epsilon, base or period must be a finite number > 0: NaN or <= 0 passes every shape
    check and only shows up as NaN actions at the first decision."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be a finite number > 0, got {value!r} ({type(value).__name__})"
    return None if math.isfinite(value) and value > 0 else f"{name} must be a finite number > 0, got {value}"


def _spec_problems(spec: Any, cls: type, name: str) -> list[str]:
    """Every field of a SiglipSpec / GemmaSpec, named `name.field`."""
    if not isinstance(spec, cls):
        return [f"{name} must be a {cls.__name__}, got {type(spec).__name__}"]
    problems = []
    for f in dataclasses.fields(spec):
        check = _positive_float_problem if f.name.endswith("_eps") else _int_problem
        problems.append(check(f"{name}.{f.name}", getattr(spec, f.name)))
    return [p for p in problems if p]


@dataclass(frozen=True)
class GemmaSpec:
    """One Gemma decoder stack (the prefix language model or the action expert)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SiglipSpec:
    """SigLIP vision tower (pre-LN ViT, no pooling head) plus the linear projector."""

    image_size: int = 224
    patch_size: int = 14
    width: int = 1152
    depth: int = 27
    num_heads: int = 16
    mlp_dim: int = 4304
    layer_norm_eps: float = 1e-6

    @property
    def num_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


GEMMA_2B = GemmaSpec(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_300M = GemmaSpec(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)
SIGLIP_SO400M = SiglipSpec()
PALIGEMMA_VOCAB = 257152


@dataclass(frozen=True)
class PolicyConfig:
    """Everything needed to build a pi0 / pi0.5 model and run one decision.

    `action_dim` / `state_dim` are the padded model dimensions (32 in openpi); the robot's
    own DOF is smaller and is handled by un-padding at the output.
    """

    kind: PolicyKind = "pi05"
    vision: SiglipSpec = SIGLIP_SO400M
    prefix: GemmaSpec = GEMMA_2B
    expert: GemmaSpec = GEMMA_300M
    vocab_size: int = PALIGEMMA_VOCAB
    num_views: int = 3
    prompt_len: int = 200
    horizon: int = 50
    action_dim: int = 32
    state_dim: int = 32
    num_steps: int = 10
    rms_norm_eps: float = 1e-6
    rope_base: float = 10000.0
    min_period: float = 4e-3
    max_period: float = 4.0
    dtype: Precision = "float32"
    # pi0.5 writes the discretised state into its prompt unless its openpi config set
    # discrete_state_input=False (pi05_libero does; the state is then unused). None: the kind's way.
    discrete_state_input: bool | None = None
    # views that no camera feeds (LeRobot's `empty_cameras`): run as absent, masked views after
    # the cameras, as LeRobot runs them; `num_views` counts them
    empty_cameras: int = 0
    # dims whose actions the model predicts as offsets from the state (openpi's DeltaActions mask,
    # LeRobot's relative actions): the state is added back on them (robot_space.py). A JSON file may
    # also write openpi's make_bool_mask counts, [6, -1, 6, -1]. (): the actions are absolute.
    delta_action_mask: tuple[bool, ...] = ()
    # openpi's ALOHA adapt_to_pi: the state into, the actions out of the pi runtime's joint signs
    # and gripper units (14 joints: per arm 6 joints and a gripper)
    aloha_adapt_to_pi: bool = False
    # whose pre-processing wrote the prompts the model was trained on. pi0: openpi cleans the task
    # (strip, "_" and newlines to spaces) and appends "\n" as its own piece; LeRobot tokenises the
    # task as it is, with "\n" appended where it is missing (its Pi0NewLineProcessor). pi0.5's
    # prompt is the same in both. LeRobot's config.json sets "lerobot".
    prompt_style: PromptStyle = "openpi"
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.delta_action_mask, list | tuple):  # JSON gives a list; counts become booleans
            mask = mask_from_spec(self.delta_action_mask)
            object.__setattr__(self, "delta_action_mask", self.delta_action_mask if mask is None else mask)
        self.validate()

    @property
    def state_in_prompt(self) -> bool:
        return self.kind == "pi05" if self.discrete_state_input is None else self.discrete_state_input

    @property
    def prompt_format(self) -> str:
        """The prompt layout the tokenizer writes: pi0.5's (task and state), or pi0's (task only)
        as openpi ("pi0") or LeRobot ("pi0_lerobot") writes it."""
        if self.state_in_prompt:
            return "pi05"
        return "pi0_lerobot" if self.prompt_style == "lerobot" else "pi0"

    @property
    def camera_views(self) -> int:
        """Views fed by a camera: the deployment's camera count."""
        return self.num_views - self.empty_cameras

    @property
    def uses_adarms(self) -> bool:
        """pi0.5 conditions the expert's norms on time (adaRMS); pi0 feeds time through an MLP."""
        return self.kind == "pi05"

    @property
    def suffix_len(self) -> int:
        """pi0's suffix carries one state token before the action tokens."""
        return self.horizon + (1 if self.kind == "pi0" else 0)

    @property
    def prefix_len(self) -> int:
        return self.num_views * self.vision.num_tokens + self.prompt_len

    def validate(self) -> None:
        """Every field's type and range, then how the fields fit together; all problems at once.
        Runs for presets, YAML settings and a checkpoint's flashrt_config.json alike."""
        problems = self._field_problems()
        if not problems:  # the relations divide by and compare the fields checked above
            problems = self._relation_problems()
        if problems:
            raise ValueError("invalid PolicyConfig: " + "; ".join(problems))

    def _field_problems(self) -> list[str]:
        problems = []
        if self.kind not in ("pi0", "pi05"):
            problems.append(f"kind must be 'pi0' or 'pi05', got {self.kind!r}")
        if self.dtype not in ("float32", "bfloat16"):
            problems.append(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        problems += _spec_problems(self.vision, SiglipSpec, "vision")
        problems += _spec_problems(self.prefix, GemmaSpec, "prefix")
        problems += _spec_problems(self.expert, GemmaSpec, "expert")
        for name in ("num_views", "prompt_len", "horizon", "action_dim", "state_dim", "num_steps", "vocab_size"):
            problems.append(_int_problem(name, getattr(self, name)))
        for name in ("rms_norm_eps", "rope_base", "min_period", "max_period"):
            problems.append(_positive_float_problem(name, getattr(self, name)))
        if not (self.discrete_state_input is None or isinstance(self.discrete_state_input, bool)):
            problems.append(f"discrete_state_input must be true, false or null, got {self.discrete_state_input!r}")
        if isinstance(self.empty_cameras, bool) or not isinstance(self.empty_cameras, int) or self.empty_cameras < 0:
            problems.append(f"empty_cameras must be an integer >= 0, got {self.empty_cameras!r}")
        mask = self.delta_action_mask
        dims = counted_dims(mask) if isinstance(mask, list | tuple) else None  # counts left: too many
        if dims is not None:
            problems.append(
                f"delta_action_mask counts add up to {dims} dims; expected a mask no longer than the model's "
                "action dims"
            )
        elif not isinstance(mask, tuple) or not all(isinstance(x, bool) for x in mask):
            problems.append(
                f"delta_action_mask must be a list of booleans or of openpi's make_bool_mask counts "
                f"(non-zero integers, e.g. [6, -1, 6, -1]), got {mask!r}"[:300]
            )
        if self.prompt_style not in PROMPT_STYLES:
            problems.append(f"prompt_style must be one of {', '.join(PROMPT_STYLES)}, got {self.prompt_style!r}")
        if not isinstance(self.aloha_adapt_to_pi, bool):
            problems.append(f"aloha_adapt_to_pi must be true or false, got {self.aloha_adapt_to_pi!r}")
        if not isinstance(self.extra, dict):
            problems.append(f"extra must be a dict, got {type(self.extra).__name__}")
        else:
            problems += self._extra_problems()
        return [p for p in problems if p]

    def _extra_problems(self) -> list[str]:
        """The keys of `extra` that code reads (a LeRobot checkpoint's, kept in flashrt_config.json):
        a wrong type there failed later, in the node, naming neither the file nor the field."""
        problems = []
        steps = self.extra.get("n_action_steps")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            problems.append(f"extra.n_action_steps must be an integer >= 1 (or absent), got {steps!r}")
        elif steps is not None and isinstance(self.horizon, int) and steps > self.horizon:
            problems.append(f"extra.n_action_steps is {steps}, more than horizon {self.horizon}")
        names = self.extra.get("camera_names")
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            problems.append(f"extra.camera_names must be a list of strings (or absent), got {names!r}"[:300])
        return problems

    def _relation_problems(self) -> list[str]:
        problems = []
        p, e = self.prefix, self.expert
        if p.depth != e.depth:
            problems.append(f"prefix depth {p.depth} != expert depth {e.depth} (they attend jointly per layer)")
        if (p.head_dim, p.num_kv_heads) != (e.head_dim, e.num_kv_heads):
            problems.append("prefix and expert must share head_dim and num_kv_heads (shared KV cache)")
        if p.head_dim % 2 or e.head_dim % 2:
            problems.append(f"head_dim must be even (RoPE rotates the two halves of each head), got {p.head_dim}")
        if p.num_heads % p.num_kv_heads or e.num_heads % e.num_kv_heads:
            problems.append("num_heads must be a multiple of num_kv_heads")
        if self.vision.image_size % self.vision.patch_size:
            problems.append("image_size must be a multiple of patch_size")
        if self.vision.width % self.vision.num_heads:
            problems.append("vision width must be a multiple of vision num_heads")
        if e.width % 2:
            problems.append("expert width must be even (sin/cos time embedding)")
        if self.kind == "pi0" and self.discrete_state_input:
            problems.append("discrete_state_input must be false for pi0 (its state goes through the state token)")
        if self.empty_cameras >= self.num_views:
            problems.append(
                f"empty_cameras {self.empty_cameras} must leave at least one of the {self.num_views} views to a camera"
            )
        mask = self.delta_action_mask
        if len(mask) > min(self.action_dim, self.state_dim):
            problems.append(
                f"delta_action_mask covers {len(mask)} dims, more than the model's action_dim {self.action_dim} "
                f"or state_dim {self.state_dim}"
            )
        if self.aloha_adapt_to_pi and min(self.action_dim, self.state_dim) < ALOHA_DOF:
            problems.append(f"aloha_adapt_to_pi needs action_dim and state_dim >= {ALOHA_DOF} (ALOHA's joints)")
        if self.min_period > self.max_period:
            problems.append(f"min_period {self.min_period} must be <= max_period {self.max_period}")
        return problems

    def replace(self, **changes) -> PolicyConfig:
        return dataclasses.replace(self, **changes)

    # ---- presets ---------------------------------------------------------------------------
    @classmethod
    def pi05(cls, **overrides) -> PolicyConfig:
        return cls(kind="pi05", prompt_len=200, **overrides)

    @classmethod
    def pi0(cls, **overrides) -> PolicyConfig:
        return cls(kind="pi0", prompt_len=48, **overrides)

    @classmethod
    def tiny(cls, kind: PolicyKind = "pi05", **overrides) -> PolicyConfig:
        """A few layers and small widths: same code paths, runs in milliseconds on a CPU."""
        base = dict(
            kind=kind,
            vision=SiglipSpec(image_size=56, patch_size=14, width=32, depth=2, num_heads=2, mlp_dim=64),
            prefix=GemmaSpec(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
            expert=GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
            vocab_size=512,
            num_views=2,
            prompt_len=96 if kind == "pi05" else 16,
            horizon=10,
            num_steps=4,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def preset(cls, name: str, **overrides) -> PolicyConfig:
        """Presets by name, as YAML files and the CLI spell them."""
        presets = {
            "pi05": lambda: cls.pi05(**overrides),
            "pi0": lambda: cls.pi0(**overrides),
            "pi05_tiny": lambda: cls.tiny("pi05", **overrides),
            "pi0_tiny": lambda: cls.tiny("pi0", **overrides),
        }
        if name not in presets:
            raise ValueError(f"unknown policy preset {name!r}; expected one of {sorted(presets)}")
        return presets[name]()

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PolicyConfig:
        """A config from `to_dict`'s layout (a flashrt_config.json); unknown or missing keys, at
        the top or inside `vision` / `prefix` / `expert`, are refused by name."""
        if not isinstance(data, dict):
            raise ValueError(f"a PolicyConfig must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        _check_keys(data, cls, "PolicyConfig")
        specs = {"vision": SiglipSpec, "prefix": GemmaSpec, "expert": GemmaSpec}
        for key, spec in specs.items():
            if isinstance(data.get(key), dict):
                _check_keys(data[key], spec, key)
                data[key] = spec(**data[key])
        return cls(**data)


def _check_keys(data: dict, cls: type, name: str) -> None:
    """The keys a dataclass takes: unknown ones would be a TypeError naming neither file nor field."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    no_default = dataclasses.MISSING
    required = {n for n, f in fields.items() if f.default is no_default and f.default_factory is no_default}
    missing = sorted(required - set(data))
    wrong = ([f"unknown fields {unknown}"] if unknown else []) + ([f"missing fields {missing}"] if missing else [])
    if wrong:
        raise ValueError(f"{name}: {', '.join(wrong)}; expected the fields {sorted(fields)}")
