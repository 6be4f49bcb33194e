"""Building the node's policy and pipeline from its parameters, and checking they fit.

Everything here runs before the node serves: the checkpoint's files are read and matched to the
parameters (camera views, frame size, joints, delta actions, prompt) before its weights are
loaded, so a mismatch stops the start in seconds with every problem named, not after a minute's
load. A failure is a StartupError with the reason (the node exits 1; a lifecycle configure
fails). No rclpy here: the node logs what this returns.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from flashrt_ros.engine.real_time_chunking import RtcSettings
from flashrt_ros.ros.params import NodeConfig


class StartupError(RuntimeError):
    """The policy could not be built (checkpoint, tokenizer, device): exit with the reason."""


def build_pipeline_state(cfg: NodeConfig) -> tuple[Any, dict[str, str]]:
    """The policy, its pipeline and the capsule-able state, from the parameters; and strings
    describing them for logs and status. Raises StartupError with the reason."""
    try:
        import torch
    except ImportError as exc:  # the platform brings it (a Jetson: NVIDIA's build); say so, no traceback
        raise StartupError(f"PyTorch is not installed ({exc}): install the build that fits this machine") from exc

    from flashrt_ros.engine.capsule import PipelineState
    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies import robot_space
    from flashrt_ros.policies.config import PolicyConfig
    from flashrt_ros.policies.policy import read_policy
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    try:  # said with the files' problems below: a CPU machine showed only this one, then the next
        device, first = resolve_device(cfg.device, torch.cuda.is_available()), []
    except StartupError as exc:
        device, first = None, [str(exc)]
    model_cfg = PolicyConfig.preset(cfg.policy, num_views=len(cfg.camera_topics), dtype=cfg.precision)
    try:
        tokenizer = cfg.tokenizer or str(tiny_tokenizer_path())
    except OSError as exc:  # trained and cached on first use
        raise StartupError(f"the embedded policy's tokenizer: {exc}") from exc
    failed = f"could not build policy {cfg.policy!r}"
    try:  # the files only: every mismatch below is found before the weights' load (a minute at full size)
        source = read_policy(model_cfg, tokenizer, checkpoint=cfg.checkpoint_folder, seed=cfg.seed)
    except Exception as exc:  # a bad checkpoint, statistics or tokenizer: the node says why and exits
        raise StartupError("; ".join([*first, f"{failed}: {type(exc).__name__}: {exc}"])) from exc
    problems = first + policy_problems(source, model_cfg.kind, cfg)
    if problems:
        raise StartupError("; ".join(problems))
    try:
        policy = source.build(device, action_dof=len(cfg.output_joint_names))
    except Exception as exc:  # bad weights, or a device that cannot hold them
        raise StartupError(f"{failed}: {type(exc).__name__}: {exc}") from exc
    try:
        pipeline = Pipeline(
            policy,
            seed=cfg.seed,
            backend=cfg.backend,
            fp8=cfg.fp8,
            release_reference=True,
            prefix_trigger=cfg.prefix_trigger,
            prefix_period_s=cfg.prefix_period_s,
            rtc=rtc_settings(cfg) if cfg.rtc else None,
        )
    except Exception as exc:  # backend "fused" that cannot be built: say why
        raise StartupError(f"could not build the {cfg.backend} pipeline: {type(exc).__name__}: {exc}") from exc
    description = {
        "warm_up": warm_up(pipeline, cfg),
        "policy": cfg.policy,
        "weights": f"checkpoint {cfg.checkpoint_folder}"
        if cfg.checkpoint_folder
        else f"RANDOM weights (seed {cfg.seed}, no checkpoint): the actions mean nothing",
        "tokenizer": cfg.tokenizer or "built-in tiny tokenizer",
        "device": str(device),
        "precision": policy.cfg.dtype + fp8_suffix(pipeline),
        "backend": pipeline.backend,
        "horizon": str(policy.cfg.horizon),
        "actions": robot_space.describe(policy.cfg, cfg.output_joint_names, cfg.joint_names),
    }
    return PipelineState(pipeline, cfg.seed), description


def warm_up(pipeline: Any, cfg: NodeConfig) -> str:
    """Run the pipeline's warm-up decision (`Pipeline.warm_up`: the first decision's one-time
    costs paid at start) on frames of the configured size, or 224x224; say how it went. A failure
    is said, not raised: the live decisions check their own inputs and are refused by name. One
    that left the GPU broken (a kernel fault) is a StartupError: every decision would fail."""
    from flashrt_ros.engine.pipeline import DeviceUnusable, NonFiniteActions

    h, w = cfg.expected_hw or (224, 224)
    views = pipeline.policy.cfg.camera_views
    try:
        ms = pipeline.warm_up(len(cfg.joint_names), cfg.prompt, (h, w))
    except DeviceUnusable as exc:
        raise StartupError(str(exc)) from exc
    except NonFiniteActions as exc:  # on black frames and a zero state: likely on any input
        return f"failed ({type(exc).__name__}: {exc}): the live decisions will likely be refused the same way"
    except Exception as exc:
        return f"failed ({type(exc).__name__}: {exc}): the first decision pays the one-time costs"
    return f"{ms:.1f} ms on {views} black {h}x{w} frames"


DECODERS = {
    "simplejpeg": ("simplejpeg", "JPEG frames need the simplejpeg package (strict decoding)"),
    "PIL": ("pillow", "PNG frames need the pillow package"),
}
"""module -> (pip package, what needs it): the decoders of compressed cameras (image_convert)."""


def check_decoders(cfg: NodeConfig) -> None:
    """Compressed cameras need simplejpeg (JPEG strictly decoded, see image_convert) and pillow
    (PNG): say so at start (exit 1, like a missing PyTorch) rather than refusing every frame later."""
    if "compressed" not in cfg.transports:
        return
    missing = [DECODERS[m] for m in DECODERS if importlib.util.find_spec(m) is None]
    if missing:
        needs = "; ".join(why for _, why in missing)
        raise StartupError(
            f"camera_transports has compressed cameras, whose {needs}: pip install {' '.join(p for p, _ in missing)}"
        )


def policy_problems(policy: Any, kind: str, cfg: NodeConfig) -> list[str]:
    """Where the policy (a PolicySource: its files, before its weights are loaded) does not fit the
    parameters: the checkpoint's kind against the `policy` preset, camera views, the configured
    frame size, joints against the checkpoint's statistics and its delta / ALOHA action space, the
    prompt."""
    problems = []
    where = f"checkpoint {cfg.checkpoint_folder}" if cfg.checkpoint_folder else "the policy"
    if policy.cfg.kind != kind:
        problems.append(
            f"policy {cfg.policy!r} is a {kind} policy but {where} holds a {policy.cfg.kind} one; "
            f"expected a matching `policy` parameter"
        )
    views, empty = policy.cfg.camera_views, policy.cfg.empty_cameras
    if views != len(cfg.camera_topics):
        more = f" (and {empty} empty camera view(s) of its own, which no topic feeds)" if empty else ""
        problems.append(f"the policy takes {views} camera views{more}; camera_topics has {len(cfg.camera_topics)}")
    frame = policy.frame_problem(*cfg.expected_hw) if cfg.expected_hw else None
    if frame:
        problems.append(f"image_height x image_width {cfg.image_height}x{cfg.image_width}: {frame}")
    for name, joints, dims, padded in joint_coverage(policy, cfg):
        if joints > padded:  # statistics of identity cover any count: the model's padding does not
            problems.append(
                f"{name} has {joints} joints but the model takes at most {padded}; expected at most {padded}"
            )
        elif dims is not None and joints > dims:
            problems.append(
                f"{name} has {joints} joints but the normalisation statistics of {where} cover "
                f"{dims}; expected at most {dims} (the checkpoint was trained on another robot?)"
            )
    space = policy.space_problem(len(cfg.joint_names), len(cfg.output_joint_names))
    if space:
        problems.append(f"{where}: {space}")
    moved = delta_joints_moved(policy.cfg.delta_action_mask, cfg.joint_names, cfg.output_joint_names)
    if moved:
        problems.append(f"{where}: {moved}")
    prompt = policy.prompt_problem(cfg.prompt, len(cfg.joint_names))
    return problems + ([prompt] if prompt else [])


def delta_joints_moved(mask: tuple[bool, ...], state_names: list[str], action_names: list[str]) -> str | None:
    """A delta is added to the state of its own index: an action joint that the state lists at
    another index (action_joint_names a reordering of joint_names) would be offset by another
    joint's position. Names the state does not list at all may be the controller's own names."""
    moved = [
        f"{name} (action dim {i}, state dim {j})"
        for i, name, j in moved_joints(action_names[: len(mask)], state_names)
        if mask[i]
    ]
    if not moved:
        return None
    return (
        f"the actions are deltas added to the state of the same index (delta_action_mask), but action_joint_names "
        f"puts {', '.join(moved)} elsewhere than joint_names; expected those joints in the same order in both"
    )


def moved_joints(action_names: list[str], state_names: list[str]) -> list[tuple[int, str, int]]:
    """(action index, name, state index) of each action joint the state lists at another index."""
    at = {name: j for j, name in reversed(list(enumerate(state_names)))}  # a name's first index, as list.index
    return [(i, n, at[n]) for i, n in enumerate(action_names) if n in at and at[n] != i]


def joint_coverage(policy: Any, cfg: NodeConfig) -> list[tuple[str, int, int | None, int]]:
    """(parameter, its joint count, the dims the policy's statistics cover (None = any), the
    model's padded dims) for the state and the actions: too many joints stop the start, fewer
    than the statistics cover get a warning."""
    state_dims, action_dims = policy.normalizer.dims()
    return [
        ("joint_names", len(cfg.joint_names), state_dims, policy.cfg.state_dim),
        ("action_joint_names (or joint_names)", len(cfg.output_joint_names), action_dims, policy.cfg.action_dim),
    ]


def fp8_suffix(pipeline) -> str:
    """ "+fp8:prefix_mlp" where the fused path runs the prefix MLP in FP8 (the status and the
    startup log say which precision actually runs)."""
    fused = pipeline.fused
    return "+fp8:prefix_mlp" if fused is not None and fused.prefix_mlp_fp8 else ""


def resolve_device(device: str, cuda_available: bool) -> str:
    if device == "auto":
        return "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise StartupError(f"device {device!r} requested but torch sees no CUDA device; use device: cpu or auto")
    return device


def rtc_settings(cfg: NodeConfig) -> RtcSettings:
    """Real-time chunking's settings from the parameters (validated before)."""
    delay = None if cfg.rtc_delay_steps < 0 else cfg.rtc_delay_steps
    return RtcSettings(cfg.rtc_max_guidance, cfg.rtc_schedule, cfg.rtc_jacobian, delay)


def describe_rtc(cfg: NodeConfig, num_steps: int) -> str:
    """One line for the start-up log; the guidance weight as it is: capped at the policy's number of
    denoise steps as well (policies/guidance.py)."""
    if not cfg.rtc:
        return "real-time chunking off (rtc false): each chunk computed on its own"
    delay = (
        "the actions executed before it takes over (from the slowest of the last 10 decisions)"
        if cfg.rtc_delay_steps < 0
        else f"its first {cfg.rtc_delay_steps} actions"
    )
    return (
        f"real-time chunking on: each chunk guided towards the executing one, {delay} held fully, the rest of "
        f"the overlap fading ({cfg.rtc_schedule}); guidance weight at most {guidance_cap(cfg, num_steps)}, "
        f"{cfg.rtc_jacobian} Jacobian"
    )


def guidance_cap(cfg: NodeConfig, num_steps: int) -> str:
    """rtc_max_guidance as it acts: above the number of denoise steps it changes nothing."""
    if cfg.rtc_max_guidance <= num_steps:
        return f"{cfg.rtc_max_guidance:g}"
    return (
        f"{num_steps} (rtc_max_guidance {cfg.rtc_max_guidance:g} is capped at the policy's {num_steps} denoise steps)"
    )


def prefix_schedule(cfg: NodeConfig) -> str:
    """When the prefix stage runs, in words, for the start-up log."""
    if cfg.prefix_trigger == "every_decision":
        return "runs at every decision"
    exact = "when the prompt tokens (pi0.5: with the state) or the cameras present change"
    if cfg.prefix_trigger == "period":
        return f"runs {exact}, and on new frames at most every {cfg.prefix_period_s:g} s (frames held <= max_age_s)"
    return f"runs {exact} or any camera sends a new frame; otherwise the decision re-uses it (the same chunk)"
