"""Observation processing: prompt format + tokenizer, normalisation, image pre-processing, Policy."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.normalize import Normalizer, Stats
from flashrt_ros.policies.preprocess import frame_error, images_to_pixels, resize_with_pad, resized_hw, to_unit_float
from flashrt_ros.policies.prompt import PromptTokenizer, clean_task, discretize_state, pi05_prompt
from flashrt_ros.policies.tiny_tokenizer import train_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    return train_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tiny.model")


def test_state_discretisation_uses_256_bins_over_minus_one_one():
    bins = discretize_state(np.array([-1.0, -0.9999, 0.0, 0.5, 0.99999, 1.0, -3.0, 3.0]))
    assert bins.tolist() == [0, 0, 128, 192, 255, 255, -1 + 0, 255]


def test_openpi_statistics_bin_the_state_in_float64_as_openpi_does():
    """openpi reads norm_stats.json as float64 and normalises the robot's float64 state in float64
    before binning it into pi0.5's prompt; in float32 about 1 state in 20000 lands one bin off (a
    state within float32 rounding of a bin's edge). LeRobot's statistics stay in float32, as LeRobot."""
    import json

    rng = np.random.default_rng(0)
    q01 = rng.uniform(-2, 0, 14)
    q99 = q01 + rng.uniform(0.1, 3, 14)
    stats = Stats.from_dict(json.loads(json.dumps({"q01": q01.tolist(), "q99": q99.tolist()})))
    states = rng.uniform(q01, q99, (200_000, 14))
    edges = np.linspace(-1, 1, 257)[:-1]
    openpi = np.digitize((states - q01) / (q99 - q01 + 1e-6) * 2.0 - 1.0, edges) - 1  # transforms.py, tokenizer.py
    s32, lo32, span32 = states.astype(np.float32), q01.astype(np.float32), (q99 - q01).astype(np.float32)
    in_float32 = np.digitize(2 * (s32 - lo32) / (span32 + np.float32(1e-6)) - 1, edges) - 1
    assert (in_float32 != openpi).any(axis=1).sum() >= 3  # the data holds states at a bin's edge
    ours = Normalizer("quantile", stats, stats).normalize_state(states)
    np.testing.assert_array_equal(discretize_state(ours), openpi)
    lerobot = Normalizer("quantile", stats, stats, convention="lerobot").normalize_state(states)
    assert lerobot.dtype == np.float32


def test_pi05_prompt_format():
    text = pi05_prompt(" pick_up the\ncube ", np.array([-1.0, 0.0, 0.999]))
    assert text == "Task: pick up the cube, State: 0 128 255;\nAction: "
    assert clean_task("a_b\nc ") == "a b c"


def test_tokenize_pi05_pads_right_and_masks(tokenizer_file):
    tok = PromptTokenizer(tokenizer_file, prompt_len=64)
    out = tok.tokenize("pi05", "pick up the cup", np.zeros(3))
    ids = tok.encode(pi05_prompt("pick up the cup", np.zeros(3)), add_bos=True)
    n = len(ids)
    assert out.ids.shape == (64,) and out.ids.dtype == np.int64
    assert out.ids[:n].tolist() == ids and out.ids[0] == 2  # BOS
    assert out.mask[:n].all() and not out.mask[n:].any() and (out.ids[n:] == 0).all()
    assert tok.sp.decode(out.ids[:n].tolist()) == "Task: pick up the cup, State: 128 128 128;\nAction: "
    with pytest.raises(ValueError, match="state is required"):
        tok.tokenize("pi05", "x", None)


def test_tokenize_pi0_ends_with_newline_token(tokenizer_file):
    tok = PromptTokenizer(tokenizer_file, prompt_len=16)
    out = tok.tokenize("pi0", "push the button")
    n = int(out.mask.sum())
    assert out.ids[n - 1] == tok.encode("\n")[0]
    assert out.ids[:n].tolist() == tok.encode("push the button", add_bos=True) + tok.encode("\n")


def test_tokenize_pi0_as_lerobot_writes_the_task_as_it_is(tokenizer_file):
    """LeRobot's pi0 pre-processing appends "\\n" where it is missing and tokenises the task
    uncleaned in one piece, where openpi strips it and turns "_" and newlines into spaces: a
    LeRobot pi0 checkpoint gets its own way, pi0.5 (the same prompt in both) keeps openpi's."""
    from pathlib import Path

    from flashrt_ros.policies.checkpoint import read_config

    tok = PromptTokenizer(tokenizer_file, prompt_len=24)
    task = " pick_up the cube "
    assert tok.token_ids("pi0_lerobot", task) == tok.encode(task + "\n", add_bos=True)
    assert tok.token_ids("pi0_lerobot", "push it\n") == tok.encode("push it\n", add_bos=True)
    assert tok.token_ids("pi0_lerobot", task) != tok.token_ids("pi0", task)
    data = Path(__file__).parent / "data" / "lerobot_tiny"
    assert read_config(data / "pi0" / "checkpoint", "lerobot").prompt_format == "pi0_lerobot"
    assert read_config(data / "pi05" / "checkpoint", "lerobot").prompt_format == "pi05"
    assert PolicyConfig.pi0().prompt_format == "pi0"
    with pytest.raises(ValueError, match="prompt_style must be one of openpi, lerobot, got 'hf'"):
        PolicyConfig.pi0().replace(prompt_style="hf")


def test_long_prompt_is_truncated_and_flagged_every_time(tokenizer_file):
    tok = PromptTokenizer(tokenizer_file, prompt_len=8)
    full = tok.token_ids("pi05", "pick up the cup and then place it", np.zeros(14))
    for _ in range(2):  # once only the first (warned) call was cut, and the second raised
        out = tok.tokenize("pi05", "pick up the cup and then place it", np.zeros(14))
        assert out.truncated and out.mask.all() and out.ids.tolist() == full[:8]


def test_a_prompt_that_is_not_utf8_is_refused_by_name(tokenizer_file):
    """A lone surrogate (Python API only: rclpy decodes strictly) reached SentencePiece, whose
    binding raised "Unable to cast Python instance", counted as a policy error, not bad input."""
    from flashrt_ros.policies.policy import Observation, build_policy

    policy = build_policy(PolicyConfig.tiny("pi05"), tokenizer_file, seed=0, action_dof=6)
    obs = Observation([np.zeros((48, 64, 3), np.uint8), None], np.zeros(6), "pick\ud800")
    refused = r"prompt is not valid UTF-8 text \(surrogates not allowed at character 4\); no action computed"
    with pytest.raises(ValueError, match=refused):
        policy.prepare(obs)
    # the node's check of a new prompt (parameter or topic) gets a reason, not the error
    assert "prompt is not valid UTF-8 text (surrogates not allowed at character 4)" in policy.prompt_problem(
        "pick\ud800", 6
    )


def test_policy_refuses_a_prompt_it_would_cut(tokenizer_file):
    from flashrt_ros.policies.policy import Observation, build_policy
    from flashrt_ros.policies.prompt import PromptTooLong

    cfg = PolicyConfig.tiny("pi05", prompt_len=48)
    policy = build_policy(cfg, tokenizer_file, seed=0, action_dof=6)
    short, long = "pick up the cup", "pick up the cup and then place it on the shelf next to the red box"
    assert policy.prompt_problem(short, 6) is None
    n = len(policy.tokenizer.token_ids("pi05", long, np.ones(6)))
    assert n > 48
    assert policy.prompt_problem(long, 6) == (
        f"prompt {long!r} takes up to {n} tokens with a 6-joint state, more than the policy's prompt "
        "length 48; expected a shorter instruction"
    )
    obs = Observation([np.zeros((48, 64, 3), np.uint8), None], np.zeros(6), long)
    for _ in range(2):
        with pytest.raises(PromptTooLong, match=r"prompt with the state takes \d+ tokens, more than the policy's 48;"):
            policy.prepare(obs)
    assert policy.infer(Observation(obs.images, obs.state, short)).shape == (cfg.horizon, 6)


def test_pi05_trained_without_the_state_in_its_prompt(tokenizer_file):
    """openpi's discrete_state_input=False (pi05_libero): pi0's prompt layout, the state unused;
    with it (the default) the state is in the prompt and moves its tokens."""
    from flashrt_ros.policies.policy import Observation, build_policy

    images = [np.zeros((48, 64, 3), np.uint8), None]
    plain = build_policy(PolicyConfig.tiny("pi05", discrete_state_input=False), tokenizer_file, action_dof=6)
    with_state = build_policy(PolicyConfig.tiny("pi05"), tokenizer_file, action_dof=6)
    tokens = {}
    for name, policy in (("plain", plain), ("with_state", with_state)):
        for state in (np.zeros(6), np.full(6, 0.5)):
            ids, mask, _ = policy.prepare_prompt_state(Observation(images, state, "pick up the cup"))
            tokens.setdefault(name, []).append(ids[mask].tolist())
    assert tokens["plain"][0] == tokens["plain"][1] == plain.tokenizer.token_ids("pi0", "pick up the cup")
    assert tokens["with_state"][0] != tokens["with_state"][1]
    long = plain.prompt_problem("word " * 200, 6)
    assert long and "tokens, more than the policy's prompt length 96" in long  # no state in it
    with pytest.raises(ValueError, match="discrete_state_input must be false for pi0"):
        PolicyConfig.tiny("pi0", discrete_state_input=True)
    with pytest.raises(ValueError, match="discrete_state_input must be true, false or null, got 0"):
        PolicyConfig.tiny("pi05", discrete_state_input=0)


def test_a_tokenizer_that_is_not_the_models_is_refused_before_loading(tokenizer_file):
    """The built-in tiny tokenizer (400 pieces) with a real checkpoint's 257152-row embedding would
    run, with every prompt turned into other words; refused from the files alone."""
    from flashrt_ros.policies.policy import read_policy

    with pytest.raises(ValueError) as err:
        read_policy(PolicyConfig.pi05(), tokenizer_file)  # no model is built: full size costs nothing
    assert str(err.value) == (
        f"tokenizer {tokenizer_file} has 400 pieces but the model embeds 257152: it is not this model's "
        "tokenizer; expected PaliGemma's tokenizer.model (257152 pieces) for a pi0 / pi0.5 checkpoint"
    )
    with pytest.raises(ValueError, match="has 400 pieces, more than the model's 300 embedding rows"):
        read_policy(PolicyConfig.tiny("pi05", vocab_size=300), tokenizer_file)
    assert read_policy(PolicyConfig.tiny("pi05"), tokenizer_file).cfg.vocab_size == 512


def test_policy_files_are_checked_before_the_weights_are_read(tmp_path, tokenizer_file):
    """read_policy reads the config, statistics and tokenizer only, so a deployment's mistakes are
    found in a second; the weights (here of the wrong size for the config) fail only at build."""
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import CheckpointError, save_model
    from flashrt_ros.policies.policy import read_policy

    folder = save_model(tiny_model("pi05"), tmp_path / "ckpt", layout="openpi")
    Normalizer("identity").save(folder / "norm_stats.json")
    wider = PolicyConfig.tiny("pi05", vocab_size=640)
    (folder / "flashrt_config.json").write_text(json.dumps(wider.to_dict()))
    source = read_policy(None, tokenizer_file, checkpoint=folder)
    assert source.cfg == wider and source.normalizer.mode == "identity" and source.checkpoint == folder
    assert source.prompt_problem("pick up the cup", 6) is None and source.frame_problem(1, 500) is not None
    with pytest.raises(CheckpointError, match=r"embed_tokens.weight: shape \[512, 64\], expected \[640, 64\]"):
        source.build(action_dof=6)


def test_policy_names_frames_too_thin_for_its_input(tokenizer_file):
    from flashrt_ros.policies.policy import build_policy

    cfg = PolicyConfig.tiny("pi05")
    policy = build_policy(cfg, tokenizer_file, seed=0, action_dof=6)
    size = cfg.vision.image_size
    assert policy.frame_problem(480, 640) is None and policy.frame_problem(1, size) is None
    assert policy.frame_problem(1, 120) == f"resized into the model's {size}x{size} input it keeps no row"
    assert policy.frame_problem(120, 1) == f"resized into the model's {size}x{size} input it keeps no column"
    assert policy.frame_problem(0, 0) == "a 0x0 frame has no pixels; expected at least one row and one column"
    assert policy.frame_problem(0, 640) == "a 0x640 frame has no pixels; expected at least one row and one column"


def test_an_empty_frame_is_named_not_divided_by(tokenizer_file):
    from flashrt_ros.policies.policy import Observation, build_policy

    policy = build_policy(PolicyConfig.tiny("pi05"), tokenizer_file, seed=0, action_dof=6)
    good = np.zeros((24, 32, 3), np.uint8)
    obs = Observation([good, np.zeros((0, 0, 3), np.uint8)], np.zeros(6), "pick")
    with pytest.raises(ValueError, match=r"^camera view 1: a 0x0 frame has no pixels; expected at least one row"):
        policy.prepare(obs)
    with pytest.raises(ValueError, match=r"a 0x5 frame has no pixels; expected at least 1x1"):
        resized_hw(0, 5, 56)


_U8 = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
BAD_FRAMES = {  # frame -> what the refusal must quote (dtype and the values found)
    "int64": (_U8.astype(np.int64), r"got dtype int64 \(values 0\.\.255\)"),
    "uint16": (_U8.astype(np.uint16) * 257, r"got dtype uint16 \(values 0\.\.65535\)"),
    "float 0..255": (_U8.astype(np.float32), r"got dtype float32 \(values 0\.\.255\)"),
    "float at model size": (np.full((56, 56, 3), 2e6, np.float32), r"got dtype float32 \(values 2e\+06\.\.2e\+06\)"),
    "NaN": (np.full((24, 32, 3), np.nan, np.float32), r"got dtype float32 \(values all 2304 NaN/inf\)"),
}


@pytest.mark.parametrize("name", BAD_FRAMES)
def test_policy_frames_must_be_uint8_for_both_backends(tokenizer_file, name):
    """The host check both backends run: a frame of another dtype is refused naming the view, the
    dtype and the values found, before any token or pixel is made (never read as [0, 1])."""
    from flashrt_ros.policies.policy import Observation, build_policy

    policy = build_policy(PolicyConfig.tiny("pi05"), tokenizer_file, seed=0, action_dof=6)
    frame, found = BAD_FRAMES[name]
    obs = Observation([_U8, frame], np.zeros(6), "pick")
    expected = rf"^camera view 1: expected uint8 pixels \(0\.\.255\), {found}; no action computed$"
    with pytest.raises(ValueError, match=expected):
        policy.prepare_prompt_state(obs)
    with pytest.raises(ValueError, match=expected):
        policy.prepare(obs)
    assert policy.infer(Observation([_U8, _U8], np.zeros(6), "pick")).shape == (policy.cfg.horizon, 6)


@pytest.mark.parametrize(
    ("frame", "found"),
    [
        (_U8.astype(np.int64), r"expected uint8 \(0\.\.255\) or float in \[0, 1\], got dtype int64"),
        (_U8.astype(np.float32), r"expected float values in \[0, 1\], got 0\.\.255 \(float32\)"),
        (np.full((16, 16, 3), -11.0, np.float32), r"expected float values in \[0, 1\], got -11\.\.-11"),
        (np.full((16, 16, 3), np.nan, np.float32), r"expected float values in \[0, 1\], got all 768 NaN/inf"),
    ],
)
def test_images_to_pixels_refuses_values_it_would_clamp(frame, found):
    """The low-level path keeps floats in [0, 1] (the parity bench's inputs) and refuses the rest."""
    with pytest.raises(ValueError, match=rf"^camera view 1: {found}"):
        images_to_pixels([_U8, frame], size=16)
    unit = images_to_pixels([_U8.astype(np.float32) / 255], size=16)[0]
    torch.testing.assert_close(unit, images_to_pixels([_U8], size=16)[0])


@pytest.mark.parametrize(
    ("dof", "message"),
    [
        (0, r"action_dof must be in 1\.\.32 \(the model's action dims\), got 0"),
        (-3, r"action_dof must be in 1\.\.32 \(the model's action dims\), got -3"),
        (33, r"action_dof must be in 1\.\.32 \(the model's action dims\), got 33"),
        (2.5, r"action_dof must be an integer in 1\.\.32, got 2\.5 \(float\)"),
        (True, r"action_dof must be an integer in 1\.\.32, got True \(bool\)"),
    ],
)
def test_action_dof_is_checked_when_the_policy_is_built(tokenizer_file, dof, message):
    """Not at the first decision, and never a silent slice of the padded chunk (0 -> all 32, -3 -> 29)."""
    from flashrt_ros.policies.policy import build_policy

    cfg = PolicyConfig.tiny("pi05")
    with pytest.raises(ValueError, match=message):
        build_policy(cfg, tokenizer_file, seed=0, action_dof=dof)
    assert build_policy(cfg, tokenizer_file, seed=0, action_dof=np.int64(32)).action_dof == 32
    assert build_policy(cfg, tokenizer_file, seed=0).action_dof == 32


def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer model not found"):
        PromptTokenizer(tmp_path / "nope.model", 8)
    with pytest.raises(FileNotFoundError, match=r"tokenizer model a directory: .*; expected PaliGemma's tokenizer"):
        PromptTokenizer(tmp_path, 8)


def test_a_tokenizer_file_the_user_cannot_read_is_said_so(tmp_path, monkeypatch):
    """Not "is not a SentencePiece model": the file may be fine, its permissions are not (this
    suite runs as root here, so the refusal is the one open() gives a user without read access)."""
    import flashrt_ros.policies.prompt as prompt

    path = tmp_path / "tokenizer.model"
    path.write_bytes(b"x")

    def refused(file, mode="r", *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(prompt, "open", refused, raising=False)
    with pytest.raises(PermissionError, match=rf"tokenizer model cannot be read: {re.escape(str(path))} \(Permission"):
        PromptTokenizer(path, 8)


@pytest.mark.parametrize("content", [b"", b"not a model", b'{"version": "1.0", "model": {}}'])
def test_a_file_that_is_no_sentencepiece_model_is_named(tmp_path, content):
    """sentencepiece's own error ('INTERNAL: could not parse ModelProto', 'unk is not defined')
    names neither the file nor that it is the tokenizer."""
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"tokenizer {re.escape(str(path))} is not a SentencePiece model \("):
        PromptTokenizer(path, 8)


@pytest.mark.parametrize("mode", ["mean_std", "quantile"])
def test_normalisation_round_trip_and_files(tmp_path, mode):
    rng = np.random.default_rng(0)
    stats = Stats(
        mean=rng.normal(size=6), std=rng.uniform(0.5, 2, 6), q01=-rng.uniform(1, 2, 6), q99=rng.uniform(1, 2, 6)
    )
    norm = Normalizer(mode, state=stats, actions=stats)
    x = rng.normal(size=(5, 8)).astype(np.float32)  # 8 > 6 stats dims: the padding passes through
    y = norm.normalize_state(x)
    np.testing.assert_allclose(norm.unnormalize_actions(y), x, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y[:, 6:], x[:, 6:])
    if mode == "quantile":
        ends = norm.normalize_state(np.stack([stats.q01, stats.q99]).astype(np.float32))
        np.testing.assert_allclose(ends, [[-1] * 6, [1] * 6], atol=1e-5)
    path = tmp_path / "assets" / "robot" / "norm_stats.json"
    norm.save(path)
    again = Normalizer.find(tmp_path)
    assert again is not None and again.mode == mode
    np.testing.assert_allclose(again.normalize_state(x), y, rtol=1e-5, atol=1e-6)


def test_lerobot_statistics_saved_to_norm_stats_keep_lerobots_rules(tmp_path):
    """The way out of a LeRobot / openpi statistics conflict is a norm_stats.json; LeRobot's saved
    there came back with openpi's eps rules (std + 1e-6 where LeRobot divides by std + 1e-8): 100x
    on a zero-std dim. The file keeps the convention."""
    s = Stats(mean=np.array([0.0, 1.0], np.float32), std=np.array([0.0, 0.5], np.float32))
    lerobot = Normalizer("mean_std", s, s, convention="lerobot")
    lerobot.save(tmp_path / "norm_stats.json")
    again = Normalizer.find(tmp_path)
    assert again.convention == "lerobot"
    x = np.array([[1.0, 1.0]], np.float32)
    np.testing.assert_array_equal(again.normalize_state(x), lerobot.normalize_state(x))
    np.testing.assert_array_equal(again.unnormalize_actions(x), lerobot.unnormalize_actions(x))
    Normalizer("mean_std", s, s).save(tmp_path / "norm_stats.json")  # openpi's: no convention needed
    assert Normalizer.find(tmp_path).convention == "openpi"
    with pytest.raises(ValueError, match="normalisation convention must be one of"):
        Normalizer("mean_std", s, s, convention="jax")


def test_normaliser_needs_its_statistics():
    with pytest.raises(ValueError, match=r"quantile normalisation needs state statistics \['q01', 'q99'\]"):
        Normalizer("quantile", state=Stats(mean=np.zeros(2), std=np.ones(2)), actions=Stats())
    with pytest.raises(ValueError, match="mode must be one of"):
        Normalizer("minmax")


def test_normaliser_refuses_statistics_it_cannot_use(tmp_path):
    """A NaN bound would make every normalised state NaN (pi0.5 then bins it silently into its
    prompt): refused at load, naming the statistic, the index and the file."""
    q = dict(q01=np.full(3, -1.0), q99=np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match=r"state statistic 'q99' is not finite at index 1 \(nan; 1 of 3 values\)"):
        Normalizer("quantile", state=Stats(**q), actions=Stats(q01=np.zeros(3), q99=np.ones(3)))
    with pytest.raises(ValueError, match=r"actions statistics must be vectors of one length, got shapes"):
        Normalizer("mean_std", state=Stats(mean=np.zeros(3), std=np.ones(3)), actions=Stats(np.zeros(3), np.ones(4)))
    path = tmp_path / "norm_stats.json"
    path.write_text(json.dumps({"norm_stats": {"state": {"mean": [0, 1], "std": [1, float("inf")]}, "actions": {}}}))
    with pytest.raises(ValueError, match=rf"{path}: state statistic 'std' is not finite at index 1"):
        Normalizer.load(path, "mean_std")
    # beyond float32 (read as a float64, 1e39 is finite): the actions would un-normalise to 3e38
    for convention in ("openpi", "lerobot"):
        stats = Stats(mean=np.zeros(2), std=np.array([1e39, 1.0]))
        with pytest.raises(ValueError, match=r"'std' is not finite at index 0 \(1e\+39; .*\(within float32's range\)"):
            Normalizer("mean_std", state=stats, actions=stats, convention=convention)
    path.write_text('{"norm_stats": {"state": ')
    with pytest.raises(ValueError, match=rf"{path} is not valid JSON: Expecting value"):
        Normalizer.find(tmp_path)


@pytest.mark.parametrize(("kind", "mode"), [("pi0", "mean_std"), ("pi05", "quantile"), (None, "quantile")])
def test_openpi_stats_without_a_mode_follow_openpi_per_policy(tmp_path, kind, mode):
    """openpi's norm_stats.json carries mean, std, q01 and q99 and no mode: openpi normalises pi0
    with mean / std and pi0.5 with quantiles (`use_quantile_norm = model_type != PI0`)."""
    stats = {"mean": [0.0], "std": [2.0], "q01": [-1.0], "q99": [5.0]}
    (tmp_path / "norm_stats.json").write_text(json.dumps({"norm_stats": {"state": stats, "actions": stats}}))
    norm = Normalizer.find(tmp_path, kind=kind)
    assert norm.mode == mode
    want = 0.5 if mode == "mean_std" else -1 / 3  # state 1.0: (1 - 0) / 2, or 2 (1 + 1) / 6 - 1
    np.testing.assert_allclose(norm.normalize_state(np.ones(1, np.float32)), [want], atol=1e-5)
    (tmp_path / "norm_stats.json").write_text(
        json.dumps({"norm_stats": {"state": stats, "actions": stats}, "mode": "quantile"})
    )
    assert Normalizer.find(tmp_path, kind="pi0").mode == "quantile"  # a file that says wins


def test_malformed_norm_stats_json_names_the_file_and_field(tmp_path):
    path = tmp_path / "norm_stats.json"
    actions = {"q01": [0], "q99": [1]}
    for raw, expected in [
        ({"norm_stats": {"state": None, "actions": actions}}, "norm_stats.state must be an object of statistics"),
        ({"norm_stats": {"state": [1, 2], "actions": actions}}, "(mean, std, q01, q99), got list"),
        ({"norm_stats": {"state": actions, "actions": {"q01": ["a"], "q99": [1]}}}, "norm_stats.actions.q01 must be"),
        # what numpy would convert without a word: true as 1, a number written as a string
        ({"norm_stats": {"state": {"q01": [True], "q99": [1]}, "actions": actions}}, "norm_stats.state.q01 must be"),
        ({"norm_stats": {"state": actions, "actions": {"q01": [0], "q99": ["1.5"]}}}, "norm_stats.actions.q99 must be"),
        ({"norm_stats": {"state": {"mean": [10**400], "std": [1]}, "actions": actions}}, "norm_stats.state.mean must"),
        ({"norm_stats": {"state": actions, "actions": actions}, "mode": ""}, "mode must be one of"),
    ]:
        path.write_text(json.dumps(raw))
        with pytest.raises(ValueError, match=rf"^{path}: .*{re.escape(expected)}"):
            Normalizer.find(tmp_path)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=rf"^{path} is not UTF-8 text .*; expected a UTF-8 JSON file"):
        Normalizer.find(tmp_path)


def _lerobot_normalizer(folder, step_config: dict):
    """A LeRobot processor pipeline whose normalizer step has quantile statistics for 6 dims."""
    from safetensors.numpy import save_file as save_numpy

    stats_file = "policy_preprocessor_step_2_normalizer_processor.safetensors"
    bounds = {"q01": -2.0, "q99": 2.0}
    q = {f"{k}.{s}": np.full(6, v, np.float32) for k in ("observation.state", "action") for s, v in bounds.items()}
    save_numpy(q, str(folder / stats_file))
    step = {"registry_name": "normalizer_processor", "state_file": stats_file, "config": step_config}
    (folder / "policy_preprocessor.json").write_text(json.dumps({"steps": [step]}))
    return folder / "policy_preprocessor.json"


@pytest.mark.parametrize("config", [{}, {"norm_map": None}, {"norm_map": ["QUANTILES"]}])
def test_lerobot_statistics_without_a_norm_map_are_refused(tmp_path, config):
    """Statistics whose mode the file does not say: not read as identity (normalised actions
    published as robot units)."""
    pipeline = _lerobot_normalizer(tmp_path, config)
    with pytest.raises(
        ValueError,
        match=rf"^{pipeline}: the normalizer_processor step has statistics \(policy_preprocessor_step_2_normalizer"
        r"_processor\.safetensors\) but its config\.norm_map is (missing|list); expected an object",
    ):
        Normalizer.find(tmp_path)
    _lerobot_normalizer(tmp_path, {"norm_map": {"STATE": "QUANTILES", "ACTION": "QUANTILES"}})
    assert Normalizer.find(tmp_path).unnormalize_actions(np.full((1, 6), 0.5)).tolist() == [[1.0] * 6]


QUANTILES = {"STATE": "QUANTILES", "ACTION": "QUANTILES"}


def test_lerobot_statistics_in_bfloat16_are_read(tmp_path):
    """numpy has no bfloat16: such a file was refused as "truncated or missing?"."""
    from safetensors.torch import save_file

    pipeline = _lerobot_normalizer(tmp_path, {"norm_map": QUANTILES})
    stats_file = pipeline.parent / json.loads(pipeline.read_text())["steps"][0]["state_file"]
    bounds = {"q01": -2.0, "q99": 2.0}
    save_file(
        {
            f"{k}.{s}": torch.full((6,), v, dtype=torch.bfloat16)
            for k in ("observation.state", "action")
            for s, v in bounds.items()
        },
        str(stats_file),
    )
    assert Normalizer.find(tmp_path).unnormalize_actions(np.full((1, 6), 0.5)).tolist() == [[1.0] * 6]


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({"norm_map": {**QUANTILES, "VISUAL": "MEAN_STD"}}, r" normalises the images \(MEAN_STD\); expected VISUAL"),
        ({"norm_map": QUANTILES, "eps": 0.5}, r"'s eps is 0\.5; expected LeRobot's default 1e-08"),
        ({"norm_map": QUANTILES, "normalize_observation_keys": []}, r" leaves observation\.state out of its features"),
        ({"norm_map": QUANTILES, "features": {"action": {}}}, r" leaves observation\.state out of its features"),
        (
            {"norm_map": {"STATE": ["QUANTILES"], "ACTION": ["QUANTILES"]}},
            r"'s config\.norm_map has STATE=\['QUANTILES'\] ACTION=\['QUANTILES'\]; expected both the same, one of "
            r"QUANTILES, MEAN_STD, IDENTITY",
        ),
        ({"norm_map": {"STATE": "MIN_MAX", "ACTION": "MIN_MAX"}}, r"'s config\.norm_map has STATE='MIN_MAX' ACTION"),
        ({"norm_map": {"STATE": "MEAN_STD", "ACTION": "QUANTILES"}}, r"'s config\.norm_map has STATE='MEAN_STD' ACT"),
    ],
    ids=[
        "images-normalised",
        "another-eps",
        "state-not-in-keys",
        "state-not-a-feature",
        "mode-a-list",
        "min-max",
        "mixed",
    ],
)
def test_lerobot_normaliser_settings_not_applied_here_are_refused(tmp_path, config, refused):
    """What LeRobot's normaliser step would do otherwise (images normalised, another eps, the state
    left as it is) was accepted and the state normalised as usual: the chunk differed from LeRobot's."""
    pipeline = _lerobot_normalizer(tmp_path, config)
    with pytest.raises(ValueError, match=rf"^{pipeline}: the normalizer_processor step" + refused):
        Normalizer.find(tmp_path)
    _lerobot_normalizer(tmp_path, {"norm_map": {**QUANTILES, "VISUAL": "IDENTITY"}, "eps": 1e-8})
    assert Normalizer.find(tmp_path).mode == "quantile"


def test_malformed_policy_preprocessor_json_names_the_file_and_step(tmp_path):
    pipeline = tmp_path / "policy_preprocessor.json"
    not_a_step = "steps[0] must be an object with a 'config' object, got "
    for steps, expected in [
        (["normalizer_processor"], not_a_step + "'normalizer_processor'"),
        ([{"registry_name": "normalizer_processor", "config": "x"}], not_a_step + "config 'x'"),
        ({"normalizer_processor": {}}, "'steps' must be a list of step objects, got dict"),
    ]:
        pipeline.write_text(json.dumps({"steps": steps}))
        with pytest.raises(ValueError, match=rf"^{pipeline}: {re.escape(expected)}"):
            Normalizer.find(tmp_path)


def test_statistics_of_several_robots_are_not_guessed_between(tmp_path):
    norm = Normalizer("quantile", Stats(q01=np.zeros(2), q99=np.ones(2)), Stats(q01=np.zeros(2), q99=np.ones(2)))
    for robot in ("trossen", "aloha"):
        norm.save(tmp_path / "assets" / robot / "norm_stats.json")
    with pytest.raises(ValueError, match=r"statistics for 2 asset ids \(aloha, trossen\); copy the one of your robot"):
        Normalizer.find(tmp_path)
    norm.save(tmp_path / "norm_stats.json")  # the top-level file decides
    assert Normalizer.find(tmp_path).mode == "quantile"


def test_statistics_that_would_mirror_values_are_refused():
    with pytest.raises(ValueError, match=r"state statistics at index 1: std -0.5; expected std >= 0"):
        Normalizer("mean_std", Stats(mean=np.zeros(2), std=np.array([1, -0.5])), Stats(np.zeros(2), np.ones(2)))
    with pytest.raises(ValueError, match=r"actions statistics at index 0: q01 2.0, q99 1.0; expected q99 >= q01"):
        Normalizer("quantile", Stats(q01=np.zeros(2), q99=np.ones(2)), Stats(q01=np.array([2.0, 0]), q99=np.ones(2)))
    flat = Stats(q01=np.zeros(2), q99=np.zeros(2))  # a constant joint: a zero range is fine
    Normalizer("quantile", flat, Stats(q01=np.zeros(2), q99=np.ones(2)))


def test_resize_with_pad_keeps_aspect_and_centres():
    img = torch.rand(1, 3, 48, 64)
    out = resize_with_pad(img, 32)
    assert out.shape == (1, 3, 32, 32)
    # 64x48 -> 32x24, padded 4 rows above and below
    assert (out[..., :4, :] == 0).all() and (out[..., 28:, :] == 0).all()
    expected = F.interpolate(img, size=(24, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out[..., 4:28, :], expected.clamp(0, 1))


def test_images_to_pixels_scales_and_masks_absent_views():
    img = np.full((20, 30, 3), 255, dtype=np.uint8)
    pixels, masks = images_to_pixels([img, None], size=16)
    assert pixels.shape == (1, 2, 3, 16, 16) and masks.tolist() == [[True, False]]
    assert (pixels[0, 1] == -1).all()  # absent view
    assert pixels[0, 0, :, 8, 8].tolist() == [1.0, 1.0, 1.0]  # white -> +1
    assert (pixels[0, 0, :, 0, :] == -1).all()  # padding -> -1
    with pytest.raises(ValueError, match="all camera views are absent"):
        images_to_pixels([None], 16)
    with pytest.raises(ValueError, match="HxWx3"):
        images_to_pixels([np.zeros((4, 4), np.uint8)], 16)


def test_policy_end_to_end_with_normaliser(tokenizer_file):
    from flashrt_ros.policies.policy import Observation, build_policy

    cfg = PolicyConfig.tiny("pi05")
    dof = 6
    stats = Stats(q01=np.full(dof, -2.0), q99=np.full(dof, 2.0))
    norm = Normalizer("quantile", state=stats, actions=stats)
    policy = build_policy(cfg, tokenizer_file, seed=0, action_dof=dof, normalizer=norm)
    obs = Observation([np.zeros((48, 64, 3), np.uint8), None], np.linspace(-1, 1, dof), "pick up the cup")
    noise = torch.randn(1, cfg.horizon, cfg.action_dim, generator=torch.Generator().manual_seed(0))
    actions = policy.infer(obs, noise=noise)
    assert actions.shape == (cfg.horizon, dof) and actions.dtype == np.float32
    x = policy.prepare(obs)
    raw = policy.model.sample_actions(x.pixels, x.image_masks, x.tokens, x.token_masks, x.state, noise=noise)
    np.testing.assert_allclose(actions, (raw[0, :, :dof].numpy() + 1) / 2 * (4 + 1e-6) - 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(policy.infer(obs, noise=noise), actions)
    with pytest.raises(ValueError, match="non-finite"):
        policy.infer(Observation(obs.images, np.array([np.nan] * dof), "x"))
    narrow = Normalizer("quantile", state=Stats(q01=np.zeros(dof), q99=np.full(dof, 1e-3)), actions=stats)
    policy.normalizer = narrow  # a finite state far outside a narrow range overflows float32
    huge = np.array([0.0, 3e38, 0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"normalised state is not finite at index 1 \(raw value 3e\+38\)"):
        policy.infer(Observation(obs.images, huge, "x"))
    with pytest.raises(ValueError, match="expected 2 camera views, got 1"):
        policy.infer(Observation(obs.images[:1], obs.state, "x"))


def test_a_checkpoint_without_statistics_is_refused_unless_it_asks_for_none(tmp_path, tokenizer_file):
    """Without statistics the actions would be published in normalised units as if they were
    radians: refused, naming where statistics are looked for; an explicit identity file opts out."""
    from policy_fixtures import tiny_model

    from flashrt_ros.policies.checkpoint import save_model
    from flashrt_ros.policies.policy import build_policy

    folder = save_model(tiny_model("pi0", seed=1), tmp_path / "ckpt", layout="openpi")
    with pytest.raises(ValueError, match=rf"{folder}: no normalisation statistics \(norm_stats.json, assets/"):
        build_policy(None, tokenizer_file, checkpoint=folder, action_dof=6)
    (folder / "norm_stats.json").write_text(
        json.dumps({"mode": "identity", "norm_stats": {"state": {}, "actions": {}}})
    )
    assert build_policy(None, tokenizer_file, checkpoint=folder, action_dof=6).normalizer.mode == "identity"


def _lerobot_relative(tmp_path, relative: bool, absolute: bool, names: list[str] | None = None):
    """The tiny LeRobot pi0.5 checkpoint with its relative-action processors switched as given."""
    import shutil
    from pathlib import Path

    data = Path(__file__).parent / "data" / "lerobot_tiny" / "pi05"
    folder = Path(shutil.copytree(data / "checkpoint", tmp_path / "ckpt"))
    for pipeline, step, config in (
        ("policy_preprocessor.json", "relative_actions_processor", {"enabled": relative, "action_names": names}),
        ("policy_postprocessor.json", "absolute_actions_processor", {"enabled": absolute}),
    ):
        content = json.loads((folder / pipeline).read_text())
        next(s for s in content["steps"] if s["registry_name"] == step)["config"].update(config)
        (folder / pipeline).write_text(json.dumps(content))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "use_relative_actions": relative}))
    return data, folder


def test_lerobot_relative_actions_are_added_back_to_the_raw_state(tmp_path, tokenizer_file):
    """A LeRobot checkpoint trained on actions relative to the state: the mask comes from its
    processor files (LeRobot's default exclude_joints ["gripper"] against its action names), and
    the state added back after un-normalising is the raw one, as LeRobot caches it before its
    normaliser. Checked against LeRobot's own un-normalised chunk of the tiny pi0.5."""
    from safetensors.torch import load_file

    from flashrt_ros.bench.parity import reference_config
    from flashrt_ros.policies.checkpoint import load_model
    from flashrt_ros.policies.policy import Policy

    arm = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper"]
    names = [f"{side}_{joint}" for side in ("left", "right") for joint in arm]
    data, folder = _lerobot_relative(tmp_path, relative=True, absolute=True, names=names)
    cfg = reference_config(json.loads((data / "io_float32.json").read_text()), folder, "float32")
    mask = tuple(i not in (6, 13) for i in range(14))
    assert cfg.delta_action_mask == mask
    model, _ = load_model(folder, cfg)
    policy = Policy(model, PromptTokenizer(tokenizer_file, cfg.prompt_len), Normalizer.find(folder), action_dof=14)
    io = load_file(str(data / "io_float32.safetensors"))
    raw = io["norm.raw_state"].numpy()[0]
    actions = policy.postprocess(io["out.chunk"], raw)
    unnormalised = io["norm.chunk_unnormalised"].numpy()[0]
    np.testing.assert_allclose(actions, unnormalised + np.where(mask, raw, 0.0), rtol=1e-5, atol=1e-5)
    assert np.abs(actions - unnormalised)[:, [6, 13]].max() == 0  # the grippers stay absolute


def test_a_mask_against_lerobots_absolute_actions_is_refused(tmp_path):
    """LeRobot's processor files (and config.json) say the actions are absolute: a
    flashrt_config.json delta_action_mask would add the state to them (every position offset).
    It was kept because "off" read as "nothing said"; a mask in a folder that says nothing stands."""
    from flashrt_ros.policies.checkpoint import CheckpointError, read_config

    _, folder = _lerobot_relative(tmp_path, relative=False, absolute=False)
    (folder / "flashrt_config.json").write_text(json.dumps({"delta_action_mask": [True] * 6}))
    refused = r"flashrt_config\.json: delta_action_mask .* say the actions are absolute"
    with pytest.raises(CheckpointError, match=refused):
        read_config(folder, "lerobot")
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        content = json.loads((folder / name).read_text())
        content["steps"] = [s for s in content["steps"] if "actions_processor" not in s["registry_name"]]
        (folder / name).write_text(json.dumps(content))
    config = json.loads((folder / "config.json").read_text())
    del config["use_relative_actions"]
    (folder / "config.json").write_text(json.dumps(config))
    assert read_config(folder, "lerobot").delta_action_mask == (True,) * 6  # nothing said: the mask stands


def test_a_lerobot_folder_without_its_config_json_is_refused(tmp_path):
    """Without config.json a LeRobot folder ran on the node's preset: chunk, steps, prompt length,
    cameras and the prompt's style (LeRobot's pi0 adds "\n") guessed, without a word."""
    from flashrt_ros.policies.checkpoint import CheckpointError, read_config

    folder = _lerobot_copy(tmp_path)
    (folder / "config.json").unlink()
    (folder / "flashrt_config.json").unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match=r"holds a LeRobot policy without its config\.json; expected the"):
        read_config(folder, "lerobot", PolicyConfig.tiny("pi05"))


def test_lerobot_folder_with_openpi_tensor_names_is_read_as_lerobot(tmp_path):
    """LeRobot's loader adds its "model." prefix to tensors saved without it, so a folder of such
    weights beside LeRobot's config.json and processor files is a LeRobot policy: it was read as
    openpi, which dropped its relative actions (absolute joint targets published as offsets) and
    the config.json's chunk and prompt lengths, without a word."""
    from safetensors.torch import load_file, save_file

    from flashrt_ros.bench.parity import reference_config
    from flashrt_ros.policies.checkpoint import LEROBOT_PREFIX, detect_layout, load_model, read_config

    data, folder = _lerobot_relative(tmp_path / "prefixed", relative=True, absolute=True)
    _, stripped = _lerobot_relative(tmp_path / "stripped", relative=True, absolute=True)
    tensors = load_file(str(stripped / "model.safetensors"))
    save_file({k.removeprefix(LEROBOT_PREFIX): v for k, v in tensors.items()}, str(stripped / "model.safetensors"))
    assert detect_layout(stripped) == detect_layout(folder) == "lerobot"
    assert read_config(stripped, "lerobot") == read_config(folder, "lerobot")
    cfg = reference_config(json.loads((data / "io_float32.json").read_text()), stripped, "float32")  # tiny dims
    assert any(cfg.delta_action_mask)
    ours, _ = load_model(stripped, cfg)
    theirs, _ = load_model(folder, cfg)
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def _lerobot_copy(tmp_path):
    import shutil
    from pathlib import Path

    data = Path(__file__).parent / "data" / "lerobot_tiny" / "pi05"
    return Path(shutil.copytree(data / "checkpoint", tmp_path / "ckpt"))


@pytest.mark.parametrize("name", ["flashrt_config.json", "config.json", "norm_stats.json", "policy_preprocessor.json"])
@pytest.mark.parametrize("kind", ["directory", "broken link"])
def test_an_unreadable_config_or_statistics_file_is_refused_by_name(tmp_path, tokenizer_file, name, kind):
    """A file that is there but cannot be read (a directory, a broken link) was taken as absent:
    the folder then ran without what it says (views, deltas, statistics), with no error."""
    from flashrt_ros.policies.checkpoint import CheckpointError
    from flashrt_ros.policies.policy import read_policy

    folder = _lerobot_copy(tmp_path)
    target = folder / name
    target.unlink(missing_ok=True)
    if kind == "directory":
        target.mkdir()
    else:
        target.symlink_to(folder / "gone.json")
    what = "a directory" if kind == "directory" else "a broken or looping link"
    with pytest.raises((CheckpointError, ValueError), match=re.escape(f"{target} is {what}; expected a readable file")):
        policy = read_policy(None, tokenizer_file, checkpoint=folder)
        policy.build("cpu", action_dof=14)


def test_lerobot_statistics_outside_the_folder_are_refused(tmp_path):
    """A processor step's state_file must be a file in the checkpoint: '../' or an absolute path
    loaded another checkpoint's statistics without a word."""
    folder = _lerobot_copy(tmp_path)
    pipeline = folder / "policy_preprocessor.json"
    content = json.loads(pipeline.read_text())
    step = next(s for s in content["steps"] if s["registry_name"] == "normalizer_processor")
    for elsewhere in (f"../{step['state_file']}", str(folder / step["state_file"])):
        pipeline.write_text(json.dumps({**content, "steps": [{**step, "state_file": elsewhere}]}))
        with pytest.raises(ValueError, match=r"state_file .* is outside the checkpoint folder; expected a file name"):
            Normalizer.find(folder)
    for nameless in (None, "", 5):  # "" read the folder itself, None a file called "None"
        pipeline.write_text(json.dumps({**content, "steps": [{**step, "state_file": nameless}]}))
        with pytest.raises(ValueError, match=rf"state_file is {re.escape(repr(nameless))}; expected the name of"):
            Normalizer.find(folder)


def test_lerobot_postprocessor_statistics_must_be_the_preprocessors(tmp_path):
    """LeRobot un-normalises the actions with the postprocessor's copy of the statistics: where
    it differs from the preprocessor's (which we use), the folder is refused."""
    from safetensors.numpy import load_file, save_file

    folder = _lerobot_copy(tmp_path)
    assert Normalizer.find(folder).mode == "quantile"  # the copies agree, as LeRobot saves them
    path = folder / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    tensors = load_file(str(path))
    save_file({**tensors, "action.q99": tensors["action.q99"] * 100}, str(path))
    with pytest.raises(ValueError, match=r"unnormalizer_processor.safetensors: the action statistics \(or mode"):
        Normalizer.find(folder)


@pytest.mark.parametrize("relative", [True, False])
def test_lerobot_relative_actions_half_enabled_are_refused(tmp_path, tokenizer_file, relative):
    """Trained relative but published without the state (or the state added to absolute actions):
    the processors must agree, or the checkpoint is refused before its weights load."""
    from flashrt_ros.policies.checkpoint import CheckpointError
    from flashrt_ros.policies.policy import read_policy

    _, folder = _lerobot_relative(tmp_path, relative=relative, absolute=not relative)
    on, off = ("relative", "absolute") if relative else ("absolute", "relative")
    with pytest.raises(CheckpointError, match=f"'{on}_actions_processor' is enabled but '{off}_actions_processor'"):
        read_policy(None, tokenizer_file, checkpoint=folder)


def test_aloha_state_enters_the_model_in_the_pi_space(tokenizer_file):
    """openpi's ALOHA adapt_to_pi converts the state before normalising (the model's state is the
    pi runtime's); a state of another robot's width is refused by name."""
    from flashrt_ros.policies.policy import Observation, build_policy
    from flashrt_ros.policies.robot_space import state_to_model

    cfg = PolicyConfig.tiny("pi0", aloha_adapt_to_pi=True)
    policy = build_policy(cfg, tokenizer_file, seed=0, action_dof=14)
    images = [np.zeros((56, 56, 3), np.uint8)] * cfg.num_views
    state = np.linspace(-1.0, 1.0, 14).astype(np.float32)
    state[[6, 13]] = [0.2, 0.8]
    _, _, model_state = policy.prepare_prompt_state(Observation(images, state, "pick"))
    np.testing.assert_array_equal(model_state[:14].numpy(), state_to_model(state, cfg).astype(np.float32))
    assert (np.sign(model_state[[1, 2, 8, 9]].numpy()) == -np.sign(state[[1, 2, 8, 9]])).all()  # flipped
    with pytest.raises(ValueError, match="needs 14 state and 14 action joints .* the robot has 6 and 14"):
        policy.prepare_prompt_state(Observation(images, state[:6], "pick"))


def test_more_joints_than_the_statistics_cover_are_refused(tokenizer_file):
    """Dims past the statistics passed through un-normalised: a state in raw robot units reached
    the model, and actions came out still normalised as robot units. The node refused this at
    start; the Policy itself now does, for every caller (bench, parity, scripts)."""
    from flashrt_ros.policies.policy import Observation, build_policy

    cfg = PolicyConfig.tiny("pi0")
    seven = Stats(mean=np.zeros(7, np.float32), std=np.ones(7, np.float32))
    stats = Normalizer("mean_std", seven, seven)
    with pytest.raises(ValueError, match="10 action dims asked for, but the normalisation statistics cover 7"):
        build_policy(cfg, tokenizer_file, seed=0, action_dof=10, normalizer=stats)
    policy = build_policy(cfg, tokenizer_file, seed=0, action_dof=7, normalizer=stats)
    images = [np.zeros((56, 56, 3), np.uint8)] * cfg.num_views
    assert policy.infer(Observation(images, np.zeros(7, np.float32), "go")).shape == (cfg.horizon, 7)
    with pytest.raises(ValueError, match="state has 10 values but the normalisation statistics cover 7: "):
        policy.infer(Observation(images, np.zeros(10, np.float32), "go"))


def test_a_flipped_view_is_the_same_image(tokenizer_file):
    """`bgr[..., ::-1]` (negative strides) failed in torch on the reference path while the fused
    path copied it: both now take it as the image it shows."""
    from flashrt_ros.policies.policy import Observation, build_policy

    cfg = PolicyConfig.tiny("pi05")
    policy = build_policy(cfg, tokenizer_file, seed=0, action_dof=14)
    bgr = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    noise = torch.randn(1, cfg.horizon, cfg.action_dim, generator=torch.Generator().manual_seed(1))

    def act(image: np.ndarray) -> np.ndarray:
        obs = Observation([image] * cfg.num_views, np.zeros(14, np.float32), "go")
        return policy.infer(obs, noise=noise)

    np.testing.assert_array_equal(act(bgr[..., ::-1]), act(np.ascontiguousarray(bgr[..., ::-1])))


def test_statistics_under_an_asset_id_with_a_slash_are_found(tmp_path):
    """openpi saves statistics under assets/<asset_id>/, and its asset ids are repo ids
    (pi05_libero: physical-intelligence/libero); only one directory level was searched."""
    norm = Normalizer("quantile", Stats(q01=np.zeros(2), q99=np.ones(2)), Stats(q01=np.zeros(2), q99=np.ones(2)))
    norm.save(tmp_path / "assets" / "physical-intelligence" / "libero" / "norm_stats.json")
    found = Normalizer.find(tmp_path)
    assert found is not None and found.mode == "quantile"
    norm.save(tmp_path / "assets" / "norm_stats.json")  # under no asset id: not openpi's, not counted
    assert Normalizer.find(tmp_path) is not None
    norm.save(tmp_path / "assets" / "trossen" / "norm_stats.json")
    with pytest.raises(ValueError, match=r"2 asset ids \(physical-intelligence/libero, trossen\)"):
        Normalizer.find(tmp_path)


def test_openpi_statistics_beside_lerobots_processor_files_are_not_guessed_between(tmp_path):
    """A LeRobot folder converted from an openpi export may keep openpi's assets/: which of the
    two sets the policy was trained with is not for the loader to guess (openpi's won silently)."""
    from safetensors.numpy import save_file as save_numpy

    stats_file = "policy_preprocessor_step_2_normalizer_processor.safetensors"
    norm_map = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    step = {"registry_name": "normalizer_processor", "state_file": stats_file, "config": {"norm_map": norm_map}}
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"steps": [step]}))
    q = {
        f"{k}.{s}": np.full(2, v, np.float32)
        for k in ("observation.state", "action")
        for s, v in [("q01", -2.0), ("q99", 2.0)]
    }
    save_numpy(q, str(tmp_path / stats_file))
    assert Normalizer.find(tmp_path).convention == "lerobot"
    openpi = Normalizer("quantile", Stats(q01=np.zeros(2), q99=np.ones(2)), Stats(q01=np.zeros(2), q99=np.ones(2)))
    openpi.save(tmp_path / "assets" / "libero" / "norm_stats.json")
    with pytest.raises(
        ValueError,
        match=r"statistics both in .*assets/libero/norm_stats.json .* and in LeRobot's policy_preprocessor.json",
    ):
        Normalizer.find(tmp_path)
    openpi.save(tmp_path / "norm_stats.json")  # the user's choice decides
    assert Normalizer.find(tmp_path).convention == "openpi"


def test_text_that_makes_the_same_prompt_tokens_is_the_same_prompt_and_underscores_alone_are_empty():
    """The node took "the same words in other spacing" as no change by str.split(), which also
    equates what the tokenizer reads otherwise (a non-breaking space); and "___", which the prompt
    writes as spaces, passed the empty check."""
    from flashrt_ros.policies.policy import default_policy

    for kind in ("pi05", "pi0"):
        policy = default_policy(num_views=1, action_dof=4, kind=kind)
        assert policy.same_prompt("fold the towel", " fold the towel\n")  # a planner's newline
        assert not policy.same_prompt("fold the towel", "fold the\xa0towel")
        assert not policy.same_prompt("fold the towel", "fold the shirt")
        reason = policy.prompt_problem("___", 4)
        assert reason == "prompt '___' is empty once written into the prompt (underscores read as spaces)", reason


def test_a_json_list_mixing_true_with_numbers_is_refused() -> None:
    """Without `_holds_bool`, [1.0, true] became the float array [1.0, 1.0] (true as a std of 1)."""
    with pytest.raises(ValueError, match=r"norm_stats.state.std must be numbers"):
        Stats.from_dict({"mean": [0.0, 0.0], "std": [1.0, True]}, "norm_stats.state")
    with pytest.raises(ValueError, match=r"must be numbers"):
        Stats.from_dict({"q01": [[0.0], [False]]})


def _one(mode: str, convention: str, **stats) -> Normalizer:
    s = Stats(**{k: np.array(v, np.float64) for k, v in stats.items()})
    return Normalizer(mode, s, s, convention=convention)


def test_lerobot_mean_std_normalises_with_its_own_eps_and_unnormalises_without() -> None:
    """openpi's 1e-6 for LeRobot's 1e-8 in the divisor; LeRobot's un-normalisation with
    std + eps (it uses std alone: a zero-std joint comes back as its mean, exactly)."""
    n = _one("mean_std", "lerobot", mean=[0.0], std=[1e-4])
    assert n.normalize_state(np.array([1.0]))[0] == np.float32(1.0) / (np.float32(1e-4) + np.float32(1e-8))
    zero = _one("mean_std", "lerobot", mean=[0.25], std=[0.0])
    assert zero.unnormalize_actions(np.array([[3.0]])).tolist() == [[0.25]]


def test_openpi_mean_std_unnormalises_with_std_plus_eps() -> None:
    """openpi un-normalises with std + 1e-6 (the exact inverse of its normalisation)."""
    n = _one("mean_std", "openpi", mean=[0.0], std=[0.0])
    assert n.unnormalize_actions(np.array([[1.0]]))[0, 0] == np.float32(1e-6)


def test_lerobot_quantile_adds_eps_only_to_a_zero_range() -> None:
    """With span + 1e-8 everywhere (LeRobot adds it only where q99 == q01): 1% off on a 1e-6 range."""
    n = _one("quantile", "lerobot", q01=[0.0], q99=[1e-6])
    assert abs(float(n.normalize_state(np.array([5e-7]))[0])) < 1e-6


def test_lerobot_normalize_actions_is_the_exact_inverse_of_unnormalize() -> None:
    """Without `divide_by_inverse`, normalize_actions divided by std + 1e-8 where LeRobot's
    un-normalisation multiplied by std: rtc read the executing chunk back off by 1e-4 relative."""
    n = _one("mean_std", "lerobot", mean=[0.0], std=[1e-4])
    assert n.normalize_actions(np.array([[1e-4]], np.float32))[0, 0] == pytest.approx(1.0, rel=1e-6)
    y = np.array([[0.3], [-1.7]], np.float32)
    np.testing.assert_allclose(n.normalize_actions(n.unnormalize_actions(y)), y, rtol=1e-6)


def test_identity_normalisation_returns_a_copy() -> None:
    """`return x` handed the caller's own float64 array back; writing the result changed the input."""
    x = np.array([1.0, 2.0])
    out = Normalizer().normalize_state(x)
    out[0] = 9.0
    assert x[0] == 1.0


def test_an_explicit_mode_wins_over_the_files(tmp_path) -> None:
    """`data.get("mode") or mode` let the file's mode override the one the caller passed."""
    _one("quantile", "openpi", q01=[0.0], q99=[1.0], mean=[0.0], std=[1.0]).save(tmp_path / "norm_stats.json")
    assert Normalizer.load(tmp_path / "norm_stats.json").mode == "quantile"
    assert Normalizer.load(tmp_path / "norm_stats.json", mode="mean_std").mode == "mean_std"


def test_lerobot_postprocessor_of_another_mode_is_refused(tmp_path) -> None:
    """LeRobot saves every statistic (mean, std, q01, q99, ...) in both files: with the
    postprocessor un-normalising MEAN_STD and the preprocessor QUANTILES, the compared statistics
    are equal, and only the mode check refuses the folder."""
    folder = _lerobot_copy(tmp_path)
    assert Normalizer.find(folder).mode == "quantile"
    post = folder / "policy_postprocessor.json"
    content = json.loads(post.read_text())
    content["steps"][0]["config"]["norm_map"] = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    post.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=r"the action statistics \(or mode mean_std\) the postprocessor"):
        Normalizer.find(folder)


def test_resize_truncates_the_size_and_floors_the_top_padding():
    out = resize_with_pad(torch.ones(1, 3, 7, 9), 10)[0, 0]  # 7 * 10/9 = 7.78 -> 7 rows (openpi: int)
    rows = out.sum(dim=1) > 0
    assert rows.tolist() == [False] + [True] * 7 + [False] * 2  # top pad (10 - 7) // 2 = 1


def test_negative_float_pixels_are_refused():
    with pytest.raises(ValueError, match=r"expected float values in \[0, 1\]"):
        to_unit_float(np.full((4, 4, 3), -0.5, dtype=np.float32))


def test_four_channel_frames_are_refused():
    with pytest.raises(ValueError, match="expected an HxWx3 RGB image"):
        to_unit_float(np.zeros((4, 4, 4), dtype=np.uint8))
    assert "expected an RGB frame" in frame_error(np.zeros((8, 8, 4), dtype=np.uint8), 224)


def test_a_prompt_of_exactly_prompt_len_tokens_is_not_cut(tokenizer_file):
    tok = PromptTokenizer(tokenizer_file, prompt_len=5)
    t = tok.pad([2, 7, 8, 9, 10])
    assert not t.truncated and t.mask.all() and t.length == 5


def test_a_cut_prompt_reports_its_full_length(tokenizer_file):
    t = PromptTokenizer(tokenizer_file, prompt_len=4).pad(list(range(2, 12)))
    assert t.truncated and t.length == 10 and t.ids.tolist() == [2, 3, 4, 5]
