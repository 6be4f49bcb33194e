"""A ready-to-run policy: raw robot observation in, un-normalised action chunk out.

This is what the engine and the ROS node call. It owns the model, the tokenizer and the
normaliser, and does the openpi observation pipeline: state into the model's space
(robot_space) -> normalise -> (pi0.5) discretise it into the prompt / (pi0) pad it for the
state token -> pre-process views -> sample -> drop padded action dims -> un-normalise -> add the
state back to delta dims and out of the model's space (robot_space).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checkpoint import detect_layout, load_model, read_config
from .config import PolicyConfig
from .guidance import ChunkGuide
from .listing import shown
from .normalize import Normalizer
from .pi0 import Pi0Model, count_parameters
from .preprocess import frame_error, images_to_pixels, require_a_view, thin_frame_error
from .prompt import PromptTokenizer, PromptTooLong, Tokens, clean_task, worst_case_state
from .robot_space import actions_from_robot, actions_to_robot, space_problem, state_to_model

log = logging.getLogger(__name__)

# the largest normalised action real-time chunking guides towards: quantile statistics put the
# training data in [-1, 1], mean / std within a few units
GUIDE_LIMIT = 10.0


@dataclass
class Observation:
    """One robot observation. `images` are numpy HxWx3 RGB uint8 (anything else is refused),
    ordered as the model's views; None marks an absent camera. `frame_ids` (optional) names each
    view's frame, e.g. its message's stamp: equal ids promise equal pixels, which lets a pipeline
    re-use the prefix it built from them (engine/prefix_cache.py)."""

    images: list[np.ndarray | None]
    state: np.ndarray
    prompt: str
    frame_ids: tuple[Hashable, ...] | None = None


@dataclass
class ModelInputs:
    """Tensors of one decision, ready for `Pi0Model.sample_actions` (batch of 1)."""

    pixels: torch.Tensor
    image_masks: torch.Tensor
    tokens: torch.Tensor
    token_masks: torch.Tensor
    state: torch.Tensor


class Policy:
    def __init__(
        self,
        model: Pi0Model,
        tokenizer: PromptTokenizer,
        normalizer: Normalizer | None = None,
        action_dof: int | None = None,
        device: str | torch.device = "cpu",
    ):
        self.model = model
        self.cfg: PolicyConfig = model.cfg
        self.tokenizer = tokenizer
        self.normalizer = normalizer or Normalizer("identity")
        self.action_dof = self.cfg.action_dim if action_dof is None else _check_dof(action_dof, self.cfg.action_dim)
        _, action_stats = self.normalizer.dims()
        if action_stats is not None and self.action_dof > action_stats:
            raise ValueError(
                f"{self.action_dof} action dims asked for, but the normalisation statistics cover {action_stats}: "
                f"the others would come out still normalised; expected at most {action_stats}"
            )
        self.device = torch.device(device)
        problem = vocabulary_problem(tokenizer, self.cfg)
        if problem:
            raise ValueError(problem)
        log.info(
            "%s model: %.1fM parameters, %d views, prompt %d, horizon %d, %d steps, %s on %s",
            self.cfg.kind,
            count_parameters(model) / 1e6,
            self.cfg.num_views,
            self.cfg.prompt_len,
            self.cfg.horizon,
            self.cfg.num_steps,
            self.cfg.dtype,
            self.device,
        )

    def prepare_prompt_state(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Host side of an observation: (token ids [L], token mask [L], padded normalised state),
        after checking its frames (`check_frames`) and its state and prompt."""
        self.check_frames(obs)
        return self.prompt_state(obs)

    def prompt_state(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`prepare_prompt_state` for an observation whose frames were checked already."""
        cfg = self.cfg
        if not isinstance(obs.prompt, str):
            raise ValueError(f"prompt must be a str, got {type(obs.prompt).__name__}; no action computed")
        raw = np.asarray(obs.state)
        if raw.dtype.kind not in "biuf":  # complex (the imaginary part dropped), text, objects
            raise ValueError(f"state must be real numbers, got {raw.dtype}; no action computed")
        state = raw.astype(np.float64)  # as the robot gave it: openpi bins pi0.5's prompt state in float64
        if state.ndim != 1 or state.shape[0] > cfg.state_dim:
            raise ValueError(f"state must be a vector of at most {cfg.state_dim} values, got shape {state.shape}")
        if not np.isfinite(state).all():
            raise ValueError("state has non-finite values")
        state_stats, _ = self.normalizer.dims()  # read here: `normalizer` may be swapped after init
        if state_stats is not None and state.shape[0] > state_stats:
            raise ValueError(
                f"state has {state.shape[0]} values but the normalisation statistics cover {state_stats}: the "
                "others would reach the model in raw robot units; no action computed"
            )
        problem = space_problem(self.cfg, state.shape[0], self.action_dof)
        if problem:
            raise ValueError(f"{problem}; no action computed")
        with np.errstate(all="ignore"):  # checked just below
            norm_state = self.normalizer.normalize_state(state_to_model(state, self.cfg))
        finite = np.isfinite(norm_state.astype(np.float32))  # as the model gets it
        if not finite.all():  # finite statistics, but e.g. a state at 1e38
            i = int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"normalised state is not finite at index {i} (raw value {state[i]:.6g}); no action computed"
            )
        in_prompt = norm_state if cfg.state_in_prompt else None
        tokens: Tokens = self.tokenizer.tokenize(cfg.prompt_format, obs.prompt, in_prompt)
        if tokens.truncated:
            raise PromptTooLong(
                f"the prompt{' with the state' if cfg.state_in_prompt else ''} takes {tokens.length} tokens, more "
                f"than the policy's {cfg.prompt_len}; expected a shorter prompt (got {obs.prompt!r}); no action "
                "computed"
            )
        padded = np.zeros(cfg.state_dim, dtype=np.float32)
        padded[: norm_state.shape[0]] = norm_state
        return torch.from_numpy(tokens.ids), torch.from_numpy(tokens.mask), torch.from_numpy(padded)

    def check_frames(self, obs: Observation) -> None:
        """An observation's camera views, checked before any work (the same for both backends):
        one entry per configured view, at least one present, each a frame the pre-processing takes."""
        cfg = self.cfg
        if len(obs.images) != cfg.num_views:
            raise ValueError(f"expected {cfg.num_views} camera views, got {len(obs.images)}")
        require_a_view(obs.images)  # both backends: the fused one would run prompt-only
        for i, img in enumerate(obs.images):
            problem = None if img is None else frame_error(img, cfg.vision.image_size)
            if problem:
                raise ValueError(f"camera view {i}: {problem}; no action computed")

    def prompt_problem(self, prompt: str, state_dims: int) -> str | None:
        return prompt_problem(self.cfg, self.tokenizer, prompt, state_dims)

    def same_prompt(self, a: str, b: str) -> bool:
        """Whether two instructions make the same prompt tokens (the same state written in):
        a planner's trailing newline is no new instruction, a double space or a non-breaking one is
        (the tokenizer reads them otherwise)."""
        if a == b:
            return True
        state = worst_case_state(1) if self.cfg.state_in_prompt else None
        try:
            ids = [self.tokenizer.token_ids(self.cfg.prompt_format, text, state) for text in (a, b)]
        except ValueError:  # not UTF-8: prompt_problem says why
            return False
        return ids[0] == ids[1]

    def frame_problem(self, height: int, width: int) -> str | None:
        return frame_problem(self.cfg, height, width)

    def space_problem(self, state_dims: int, action_dof: int) -> str | None:
        return space_problem(self.cfg, state_dims, action_dof)

    def prepare(self, obs: Observation) -> ModelInputs:
        tokens, mask, state = self.prepare_prompt_state(obs)
        return self.to_model_inputs(obs, tokens, mask, state)

    def to_model_inputs(
        self, obs: Observation, tokens: torch.Tensor, mask: torch.Tensor, state: torch.Tensor
    ) -> ModelInputs:
        """The checked host inputs (`prepare_prompt_state`) and the pre-processed frames, on the device."""
        pixels, masks = images_to_pixels(obs.images, self.cfg.vision.image_size, self.device)
        dev = self.device
        return ModelInputs(
            pixels=pixels,
            image_masks=masks,
            tokens=tokens[None].to(dev),
            token_masks=mask[None].to(dev),
            state=state[None].to(dev),
        )

    def postprocess(self, chunk: torch.Tensor, state: np.ndarray) -> np.ndarray:
        """Model chunk [1, horizon, action_dim] -> robot actions [horizon, dof] (the host sync);
        `state` is the observation's raw robot state, which delta actions are relative to."""
        actions = chunk[0, :, : self.action_dof].float().cpu().numpy()
        return actions_to_robot(self.normalizer.unnormalize_actions(actions), state, self.cfg)

    def chunk_guide(
        self,
        target: np.ndarray,
        row_weights: np.ndarray,
        state: np.ndarray,
        max_guidance: float = 5.0,
        jacobian: str = "identity",
    ) -> ChunkGuide:
        """Real-time chunking's guide in the model's space from a chunk in robot units: `target`
        [horizon, dof] (the executing chunk on the new chunk's time), `row_weights` [horizon],
        `state` the new decision's raw robot state (delta dims are taken against it). Every step
        back (ALOHA's conversion, the deltas, the statistics) is the inverse of an affine step of
        `postprocess`, so the target post-processes to the robot's actions again. The padded
        dims (past the robot's) are held to 0 with the rows' weights, as LeRobot zero-pads the
        executing chunk (they feed action_in_proj, and so the robot's dims' velocities). A dim
        whose held values are not finite or lie beyond GUIDE_LIMIT in the model's space (a
        statistic of almost no width maps a robot value to ~1e8) gets weight 0: the guide never
        pulls the model far outside what it was trained to output."""
        cfg, dof = self.cfg, self.action_dof
        target = np.asarray(target, dtype=np.float32)
        row_weights = np.asarray(row_weights, dtype=np.float32)
        if target.shape != (cfg.horizon, dof) or row_weights.shape != (cfg.horizon,):
            raise ValueError(
                f"guide target {target.shape} / weights {row_weights.shape}; expected ({cfg.horizon}, {dof}) / "
                f"({cfg.horizon},)"
            )
        with np.errstate(all="ignore"):  # what is out of range is masked just below
            model = self.normalizer.normalize_actions(actions_from_robot(target, state, cfg))
        ok = (np.abs(model[row_weights > 0]) <= GUIDE_LIMIT).all(axis=0)  # per dim over the rows held (NaN: False)
        full = np.zeros((cfg.horizon, cfg.action_dim), dtype=np.float32)
        weights = np.zeros_like(full)
        full[:, :dof] = np.where(ok, model, 0.0)
        weights[:, :dof] = row_weights[:, None] * ok[None, :]
        weights[:, dof:] = row_weights[:, None]  # towards 0, the padding's value
        return ChunkGuide(torch.from_numpy(full), torch.from_numpy(weights), max_guidance, jacobian)

    def infer(
        self, obs: Observation, noise: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> np.ndarray:
        """-> actions [horizon, action_dof] float32 in robot units."""
        x = self.prepare(obs)
        chunk = self.model.sample_actions(
            x.pixels, x.image_masks, x.tokens, x.token_masks, x.state, noise=noise, generator=generator
        )
        return self.postprocess(chunk, obs.state)


def _check_dof(dof: object, action_dim: int) -> int:
    """The robot's action dims: an int in 1..action_dim. 0 or a negative number would slice the
    padded chunk silently (all 32 dims, or 32 - n), and a float fails only at the first decision."""
    if isinstance(dof, bool) or not isinstance(dof, int | np.integer):
        raise ValueError(f"action_dof must be an integer in 1..{action_dim}, got {dof!r} ({type(dof).__name__})")
    if not 1 <= dof <= action_dim:
        raise ValueError(f"action_dof must be in 1..{action_dim} (the model's action dims), got {dof}")
    return int(dof)


def random_init(model: Pi0Model, seed: int) -> Pi0Model:
    """Deterministic random weights: N(0, 0.02) matrices, small random norms and biases.

    Norm scales and adaRMS projections get non-zero values on purpose, so every code path
    (scale, shift, gate) is exercised; the result is a valid but untrained policy.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda item: item[0]):
            p.normal_(0.0, 0.02 if p.ndim >= 2 else 0.1, generator=gen)
    return model


def prompt_problem(cfg: PolicyConfig, tokenizer: PromptTokenizer, prompt: str, state_dims: int) -> str | None:
    """Why `prompt` cannot be used with a state of `state_dims` joints, or None: it must fit the
    policy's prompt length, with the state in it (pi0.5) as its longest text (every bin 3 digits)."""
    state = worst_case_state(state_dims) if cfg.state_in_prompt else None
    if cfg.prompt_format != "pi0_lerobot" and not clean_task(prompt).strip():
        return f"prompt {shown(prompt, 300)} is empty once written into the prompt (underscores read as spaces)"
    try:
        n = len(tokenizer.token_ids(cfg.prompt_format, prompt, state))
    except ValueError as err:  # not UTF-8 text: a reason, as for a prompt too long
        return f"prompt {shown(prompt, 300)}: {err}"
    if n <= cfg.prompt_len:
        return None
    with_state = f" with a {state_dims}-joint state" if state is not None else ""
    return (
        f"prompt {shown(prompt, 300)} takes up to {n} tokens{with_state}, more than the policy's prompt "
        f"length {cfg.prompt_len}; expected a shorter instruction"
    )


def frame_problem(cfg: PolicyConfig, height: int, width: int) -> str | None:
    """Why a height x width camera frame cannot be used, or None: resized into the model's square
    input (aspect kept), it must have pixels and keep at least one row and one column."""
    return thin_frame_error(height, width, cfg.vision.image_size)


def vocabulary_problem(tokenizer: PromptTokenizer, cfg: PolicyConfig) -> str | None:
    """A tokenizer that is not the model's: ids past its embedding would fail or wrap, and a much
    smaller vocabulary (the built-in tiny one with a real checkpoint) gives ids that mean other words
    to the model, so every action is garbage. Half the model's vocabulary is the line: Gemma's 256000
    pieces against PaliGemma's 257152 rows is the same text vocabulary; the tiny tokenizer's 400
    against the tiny model's 512 is by design."""
    have, rows = tokenizer.vocab_size, cfg.vocab_size
    if have > rows:
        return f"tokenizer {tokenizer.path} has {have} pieces, more than the model's {rows} embedding rows"
    if 2 * have < rows:
        return (
            f"tokenizer {tokenizer.path} has {have} pieces but the model embeds {rows}: it is not this model's "
            f"tokenizer; expected PaliGemma's tokenizer.model (257152 pieces) for a pi0 / pi0.5 checkpoint"
        )
    return None


@dataclass
class PolicySource:
    """A policy as its files describe it, before any weight is read: its config, tokenizer and
    statistics. A deployment is checked against this (views, joints, prompt) in a second, so a
    mistake does not cost a full checkpoint load; `build` then loads the weights."""

    cfg: PolicyConfig
    tokenizer: PromptTokenizer
    normalizer: Normalizer
    checkpoint: Path | None = None
    seed: int = 0

    def prompt_problem(self, prompt: str, state_dims: int) -> str | None:
        return prompt_problem(self.cfg, self.tokenizer, prompt, state_dims)

    def frame_problem(self, height: int, width: int) -> str | None:
        return frame_problem(self.cfg, height, width)

    def space_problem(self, state_dims: int, action_dof: int) -> str | None:
        return space_problem(self.cfg, state_dims, action_dof)

    def build(self, device: str | torch.device = "cpu", action_dof: int | None = None) -> Policy:
        if self.checkpoint is None:
            log.warning("no checkpoint given: using RANDOM weights (seed %d) - the actions mean nothing", self.seed)
            model = random_init(Pi0Model(self.cfg), self.seed)
            model = model.set_precision(getattr(torch, self.cfg.dtype)).to(device)
        else:
            model, _ = load_model(self.checkpoint, self.cfg, device=device)
        return Policy(model.eval(), self.tokenizer, self.normalizer, action_dof, device)


def read_policy(
    config: PolicyConfig | None,
    tokenizer_file: str | Path,
    checkpoint: str | Path | None = None,
    seed: int = 0,
    normalizer: Normalizer | None = None,
) -> PolicySource:
    """What `build_policy` would build, from the checkpoint's config and statistics files and the
    tokenizer; raises on any of them (or a tokenizer that is not the model's) before a weight is read."""
    folder = Path(checkpoint) if checkpoint else None
    cfg = config
    if folder is not None:
        cfg = read_config(folder, detect_layout(folder), config)
        if config is not None:
            cfg = cfg.replace(dtype=config.dtype)  # precision is the deployment's choice, not the file's
        normalizer = normalizer or Normalizer.find(folder, kind=cfg.kind)
        if normalizer is None:
            raise ValueError(
                f"{folder}: no normalisation statistics (norm_stats.json, assets/<id>/norm_stats.json, or "
                "LeRobot's policy_preprocessor.json with a normalizer_processor step): without them the "
                'actions are not in robot units. To run without, add a norm_stats.json of {"mode": "identity", '
                '"norm_stats": {"state": {}, "actions": {}}}'
            )
    if cfg is None:
        raise ValueError("no config and no checkpoint: nothing says what model to build")
    tokenizer = PromptTokenizer(tokenizer_file, cfg.prompt_len)
    problem = vocabulary_problem(tokenizer, cfg)
    if problem:
        raise ValueError(problem)
    return PolicySource(cfg, tokenizer, normalizer or Normalizer("identity"), folder, seed)


def build_policy(
    config: PolicyConfig | None,
    tokenizer_file: str | Path,
    checkpoint: str | Path | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    action_dof: int | None = None,
    normalizer: Normalizer | None = None,
) -> Policy:
    """From a checkpoint folder, or seeded random weights when none is given."""
    return read_policy(config, tokenizer_file, checkpoint, seed, normalizer).build(device, action_dof)


def default_policy(
    kind: str = "pi05", device: str | torch.device = "cpu", seed: int = 0, action_dof: int = 14, num_views: int = 3
) -> Policy:
    """The embedded default: a tiny random-weight policy with a fixed seed and the tiny
    tokenizer, so the node runs anywhere with nothing downloaded."""
    from .tiny_tokenizer import tiny_tokenizer_path

    cfg = PolicyConfig.tiny(kind, num_views=num_views)
    return build_policy(cfg, tiny_tokenizer_path(), seed=seed, device=device, action_dof=action_dof)
