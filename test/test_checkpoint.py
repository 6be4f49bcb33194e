"""Real-format checkpoints (openpi and LeRobot layouts): round trips and precise errors."""

from __future__ import annotations

import json

import pytest
import torch
from policy_fixtures import tiny_inputs, tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from flashrt_ros.policies import checkpoint
from flashrt_ros.policies.checkpoint import (
    CheckpointError,
    config_from_lerobot,
    detect_layout,
    kind_from_keys,
    lerobot_config_dict,
    load_model,
    read_config,
    save_model,
    weight_names,
)
from flashrt_ros.policies.config import GEMMA_2B, PolicyConfig

LAYOUTS = ["openpi", "lerobot"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_round_trip_gives_identical_tensors_and_actions(tmp_path, layout, kind):
    model = tiny_model(kind, seed=3)
    save_model(model, tmp_path, layout=layout)
    assert detect_layout(tmp_path) == layout
    loaded, info = load_model(tmp_path)
    assert info.layout == layout and info.config == model.cfg
    ours = dict(model.named_parameters())
    for name, p in loaded.named_parameters():
        assert torch.equal(p, ours[name]), name
    x = tiny_inputs(model.cfg, batch=1)
    assert torch.equal(loaded.sample_actions(**x), model.sample_actions(**x))


def test_real_key_names_in_each_layout(tmp_path):
    model = tiny_model("pi05")
    save_model(model, tmp_path / "o", layout="openpi")
    save_model(model, tmp_path / "l", layout="lerobot")
    with safe_open(str(tmp_path / "o" / "model.safetensors"), "pt") as f:
        okeys = set(f.keys())
    with safe_open(str(tmp_path / "l" / "model.safetensors"), "pt") as f:
        lkeys = set(f.keys())
    assert "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight" in okeys
    assert "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight" in okeys
    assert "paligemma_with_expert.gemma_expert.model.layers.1.input_layernorm.dense.weight" in okeys
    assert "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.bias" in okeys
    assert {"time_mlp_in.weight", "action_in_proj.weight", "action_out_proj.bias"} <= okeys
    assert lkeys == {"model." + k for k in okeys}
    cfg = json.loads((tmp_path / "l" / "config.json").read_text())
    assert cfg["type"] == "pi05" and cfg["chunk_size"] == model.cfg.horizon


def test_openpi_aliases_tied_embedding_and_unused_heads(tmp_path):
    """pi0.5 exports may name the time MLP action_time_mlp_*, save the embedding only as
    the (tied) LM head, and carry vocab heads nobody uses."""
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="openpi")
    path = tmp_path / "model.safetensors"
    t = load_file(str(path))
    for leaf in ("weight", "bias"):
        t[f"action_time_mlp_in.{leaf}"] = t.pop(f"time_mlp_in.{leaf}")
    emb = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    t["paligemma_with_expert.paligemma.lm_head.weight"] = t.pop(emb)
    t["paligemma_with_expert.gemma_expert.lm_head.weight"] = torch.zeros(8, model.cfg.expert.width)
    save_file(t, str(path))
    loaded, _ = load_model(tmp_path)
    assert torch.equal(loaded.prefix_lm.embed_tokens.weight, model.prefix_lm.embed_tokens.weight)
    assert torch.equal(loaded.time_mlp_in.bias, model.time_mlp_in.bias)


def test_two_lm_heads_standing_in_for_the_embedding_are_refused(tmp_path):
    """Both spellings of the tied head and no embedding: which one became the embedding depended on
    key order, the other dropped without a word."""
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="openpi")
    path = tmp_path / "model.safetensors"
    t = load_file(str(path))
    root = "paligemma_with_expert.paligemma."
    t[f"{root}language_model.lm_head.weight"] = t.pop(f"{root}model.language_model.embed_tokens.weight")
    t[f"{root}lm_head.weight"] = torch.zeros_like(t[f"{root}language_model.lm_head.weight"])
    save_file(t, str(path))
    with pytest.raises(
        CheckpointError,
        match=rf"2 tensors map to the one parameter .*embed_tokens.weight: "
        rf"{root}language_model.lm_head.weight, {root}lm_head.weight; expected exactly one",
    ):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "layout, stated_in, partial",
    [
        ("openpi", "flashrt_config.json", False),
        ("lerobot", "flashrt_config.json", False),
        ("lerobot", "config.json", False),
        ("openpi", "flashrt_config.json", True),
        ("lerobot", "flashrt_config.json", True),
    ],
)
def test_a_config_file_stating_the_other_kind_is_refused_before_loading(tmp_path, layout, stated_in, partial):
    """A flashrt_config.json, whole or only `kind` (or LeRobot's config.json) saying pi0 over pi0.5
    weights: refused by the weights' names, naming the file, instead of ~30 tensor names or advice
    to switch the `policy` parameter to the wrong kind."""
    save_model(tiny_model("pi05"), tmp_path, layout=layout)
    stated_in = tmp_path / stated_in
    content = {} if partial else json.loads(stated_in.read_text())
    if stated_in.name == "config.json":  # LeRobot's config.json names the full-size variants alone
        (tmp_path / "flashrt_config.json").unlink()
        content.update(type="pi0", paligemma_variant="gemma_2b", action_expert_variant="gemma_300m")
    else:
        content["kind"] = "pi0"
    stated_in.write_text(json.dumps(content))
    expected = rf"^{stated_in} says kind 'pi0', but the weights are a pi05 policy \(they have .*input_layernorm.dense"
    with pytest.raises(CheckpointError, match=expected):
        read_config(tmp_path, layout)


def test_loaded_weights_do_not_follow_the_file_on_disk(tmp_path):
    """On the CPU at the stored dtype the weights were views of the file's memory map: a file
    rewritten in place (cp over it, rsync --inplace) changed the running policy, a truncated one
    killed the process at its next read."""
    save_model(tiny_model("pi0"), tmp_path, layout="openpi")
    loaded, _ = load_model(tmp_path, device="cpu")
    before = {name: p.clone() for name, p in loaded.named_parameters()}
    path = tmp_path / "model.safetensors"
    header = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    with path.open("r+b") as f:  # every tensor's bytes zeroed in place: the same inode, as cp over it leaves it
        f.seek(header)
        f.write(bytes(path.stat().st_size - header))
    assert torch.count_nonzero(load_file(str(path))["state_proj.weight"]) == 0
    for name, p in loaded.named_parameters():
        assert torch.equal(p, before[name]), name


@pytest.mark.parametrize("embedding_saved", [False, True])
def test_the_older_transformers_nesting_loads_with_its_lm_head(tmp_path, embedding_saved):
    """transformers < 4.52 nested PaliGemma's LM as a GemmaForCausalLM: its layers under
    language_model.model. and its (tied) head as language_model.lm_head, saved with the embedding
    or in its place."""
    model = tiny_model("pi0")
    save_model(model, tmp_path, layout="openpi")
    path = tmp_path / "model.safetensors"
    root = "paligemma_with_expert.paligemma."
    moves = {
        f"{root}model.language_model.": f"{root}language_model.model.",
        f"{root}model.vision_tower.": f"{root}vision_tower.",
        f"{root}model.multi_modal_projector.": f"{root}multi_modal_projector.",
    }
    t = {}
    for key, value in load_file(str(path)).items():
        for new, old in moves.items():
            key = key.replace(new, old)
        t[key] = value
    emb = f"{root}language_model.model.embed_tokens.weight"
    t[f"{root}language_model.lm_head.weight"] = t[emb].clone() if embedding_saved else t.pop(emb)
    save_file(t, str(path))
    loaded, _ = load_model(tmp_path)
    assert torch.equal(loaded.prefix_lm.embed_tokens.weight, model.prefix_lm.embed_tokens.weight)
    assert torch.equal(loaded.vision_proj.weight, model.vision_proj.weight)


def _corrupt(tmp_path, edit):
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="lerobot")
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path)
    return str(err.value)


QPROJ = "model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"


def test_missing_key_is_named(tmp_path):
    msg = _corrupt(tmp_path, lambda t: t.pop("model.action_out_proj.weight"))
    assert "model.safetensors: does not match a pi05 model of this config:" in msg  # the file named
    assert "missing 1 tensor(s): model.action_out_proj.weight" in msg  # as the file spells its tensors


def test_wrong_shape_is_named_with_both_shapes(tmp_path):
    msg = _corrupt(tmp_path, lambda t: t.__setitem__(QPROJ, torch.zeros(3, 5)))
    assert f"{QPROJ}: shape [3, 5], expected [64, 64]" in msg


def test_wrong_dtype_is_named(tmp_path):
    msg = _corrupt(tmp_path, lambda t: t.__setitem__(QPROJ, torch.zeros(64, 64, dtype=torch.int32)))
    assert f"{QPROJ}: dtype I32, expected F32, BF16 or F16 (cast it to one)" in msg


def test_two_keys_for_one_parameter_are_refused_naming_both(tmp_path):
    """The new and old transformers nesting of one tensor, and pi0.5's time_mlp_in beside its
    action_time_mlp_in alias: neither is picked by key order, both are named."""
    new = "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.post_layernorm.weight"
    old = "model.paligemma_with_expert.paligemma.vision_tower.vision_model.post_layernorm.weight"

    def edit(t):
        t[old] = torch.full_like(t[new], 7.0)
        t["model.action_time_mlp_in.bias"] = torch.full_like(t["model.time_mlp_in.bias"], 3.0)

    msg = _corrupt(tmp_path, edit)
    assert f"2 tensors map to the one parameter {new[len('model.') :]}: {new}, {old}; expected exactly one" in msg
    assert (
        "2 tensors map to the one parameter time_mlp_in.bias: model.action_time_mlp_in.bias, model.time_mlp_in.bias"
        in msg
    )
    assert "time_mlp_in.weight:" not in msg  # only the duplicated leaf is named


def test_all_problems_reported_at_once(tmp_path):
    def edit(t):
        t.pop("model.action_in_proj.bias")
        t["model.something_else.weight"] = torch.zeros(2)
        t[QPROJ] = torch.zeros(1)

    msg = _corrupt(tmp_path, edit)
    assert "missing 1 tensor(s): model.action_in_proj.bias" in msg
    assert "unexpected 1 tensor(s): model.something_else.weight" in msg
    assert "shape [1], expected [64, 64]" in msg


def test_non_finite_weights_are_named(tmp_path):
    """NaN / inf weights would make every action NaN: refused at load, each tensor named."""
    proj = "model.action_out_proj.weight"

    def edit(t):
        t[QPROJ][3, 4] = float("nan")
        t[proj][0, :2] = float("inf")

    msg = _corrupt(tmp_path, edit)
    assert "2 tensors hold NaN or inf values" in msg
    assert f"{QPROJ} (1 of 4096 values)" in msg and f"{proj} (2 of " in msg and "expected finite weights" in msg


def test_malformed_config_json_names_the_file(tmp_path):
    save_model(tiny_model("pi05"), tmp_path, layout="lerobot")
    for name in ("flashrt_config.json", "config.json"):  # ours wins when present, then LeRobot's
        (tmp_path / name).write_text('{"type": "pi05",')
        with pytest.raises(CheckpointError, match=rf"{tmp_path / name} is not valid JSON"):
            load_model(tmp_path)
        (tmp_path / name).unlink()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"n_action_steps": "8"}, "extra.n_action_steps must be an integer >= 1 (or absent), got '8'"),
        ({"n_action_steps": 0}, "extra.n_action_steps must be an integer >= 1"),
        ({"n_action_steps": 11}, "extra.n_action_steps is 11, more than horizon 10"),
        ({"camera_names": "top"}, "extra.camera_names must be a list of strings (or absent), got 'top'"),
    ],
)
def test_a_bad_extra_in_flashrt_config_json_names_the_field(tmp_path, extra, said):
    """The keys of `extra` the node reads (n_action_steps: a TypeError in the node's start-up check
    naming neither file nor field)."""
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    path = tmp_path / "flashrt_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "extra": extra}))
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path)
    assert str(path) in str(err.value) and said in str(err.value), err.value


def test_a_lerobot_config_with_memory_on_is_refused_by_field(tmp_path):
    """LeRobot's MEM (use_visual_memory) adds no tensor: such a checkpoint loaded and ran on single
    frames, which it was not trained on, without a word."""
    save_model(tiny_model("pi05"), tmp_path, layout="lerobot")  # its flashrt_config.json kept: config.json read too
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "use_visual_memory": False, "memory_frames": 6}))
    assert read_config(tmp_path, "lerobot").kind == "pi05"  # off: as plain pi0.5
    path.write_text(json.dumps({**data, "use_visual_memory": True, "memory_frames": 6}))
    with pytest.raises(CheckpointError, match=r"turns on use_visual_memory: True \(MEM: a history of frames"):
        read_config(tmp_path, "lerobot")


def test_a_stray_tensor_name_in_a_lerobot_file_is_named(tmp_path):
    """One name without LeRobot's `model.` prefix made the folder read as openpi: config.json was
    then read as openpi's and every tensor reported missing, with no word about why."""
    save_model(tiny_model("pi05"), tmp_path, layout="lerobot")
    weights = tmp_path / "model.safetensors"
    save_file({**load_file(str(weights)), "foo.bar": torch.zeros(1)}, str(weights))
    with pytest.raises(CheckpointError, match=r"tensors carry LeRobot's 'model.' prefix and 1 do not \(foo.bar\)"):
        detect_layout(tmp_path)


def test_a_lerobot_checkpoint_from_before_0_4_is_named_with_its_migration(tmp_path):
    """LeRobot 0.3 kept the statistics inside the weights (`normalize_inputs.buffer_*`, no `model.`
    prefix) and wrote adapt_to_pi_aloha / num_steps: read as a mixed layout, whose advice (drop
    the stray tensors) then loaded it with the ALOHA conversion and the step count dropped."""
    save_model(tiny_model("pi0"), tmp_path, layout="lerobot")
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    legacy = {f"normalize_inputs.buffer_observation_state.{s}": torch.zeros(14) for s in ("mean", "std")}
    save_file({**tensors, **legacy}, str(weights))
    with pytest.raises(CheckpointError, match=r"a LeRobot < 0.4 checkpoint, its normalisation statistics") as err:
        detect_layout(tmp_path)
    assert "normalize_inputs.buffer_observation_state.mean" in str(err.value)
    assert "lerobot.processor.migrate_policy_normalization" in str(err.value)
    old = {**lerobot_config_dict(PolicyConfig.pi0()), "adapt_to_pi_aloha": True, "num_steps": 4}
    with pytest.raises(CheckpointError, match=r"LeRobot < 0.4 config fields \['adapt_to_pi_aloha', 'num_steps'\]"):
        checkpoint.config_from_lerobot(old)


def test_lerobots_n_action_steps_is_kept_for_the_node_to_say(tmp_path):
    """How many actions LeRobot executes per chunk (config.json's n_action_steps) is kept in the
    config's extra; more than the chunk is refused."""
    good = lerobot_config_dict(PolicyConfig.pi05())
    assert checkpoint.config_from_lerobot({**good, "n_action_steps": 10}).extra["n_action_steps"] == 10
    assert checkpoint.config_from_lerobot({**good, "n_action_steps": 50}).extra["n_action_steps"] == 50
    with pytest.raises(CheckpointError, match=r"field 'n_action_steps' is 51, more than chunk_size 50"):
        checkpoint.config_from_lerobot({**good, "n_action_steps": 51})


def test_a_flashrt_config_json_that_differs_from_lerobots_says_so(tmp_path, caplog):
    """save_model writes both files: one that then changed (config.json edited, or ours written by
    hand for fewer steps) runs ours, field by field said in a warning; agreeing files say nothing."""
    save_model(tiny_model("pi05"), tmp_path, layout="lerobot")
    with caplog.at_level("WARNING", logger=checkpoint.__name__):
        read_config(tmp_path, "lerobot")
    assert not caplog.records
    data = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "chunk_size": 5, "num_inference_steps": 2}))
    with caplog.at_level("WARNING", logger=checkpoint.__name__):
        cfg = read_config(tmp_path, "lerobot")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].endswith(
        f"horizon is {cfg.horizon}, where {tmp_path / 'config.json'} says 5: this runs "
        f"{cfg.horizon} (LeRobot would run 5)"
    ), lines
    assert f"num_steps is {cfg.num_steps}, where {tmp_path / 'config.json'} says 2" in lines[1], lines
    # a camera more in config.json (the weights do not depend on the number of views): said too
    features = {**data["input_features"], "observation.images.wrist": {"type": "VISUAL", "shape": [3, 56, 56]}}
    (tmp_path / "config.json").write_text(json.dumps({**data, "input_features": features}))
    caplog.clear()
    with caplog.at_level("WARNING", logger=checkpoint.__name__):
        cfg = read_config(tmp_path, "lerobot")
    (line,) = [r.getMessage() for r in caplog.records]
    views = cfg.camera_views
    assert line.endswith(
        f"{views} camera views, where {tmp_path / 'config.json'} lists {views + 1} "
        "(observation.images.cam0, observation.images.cam1, observation.images.wrist): "
        f"this runs {views} (LeRobot would run {views + 1})"
    ), line


def test_a_field_of_config_json_is_blamed_on_config_json(tmp_path):
    """A partial flashrt_config.json reads config.json for the rest: a bad field there names
    config.json alone (it was prefixed with flashrt_config.json's path too, blaming a good file)."""
    save_model(tiny_model("pi05"), tmp_path, layout="lerobot")
    good = PolicyConfig.tiny("pi05")
    (tmp_path / "flashrt_config.json").write_text(json.dumps({"num_steps": 3}))
    (tmp_path / "config.json").write_text(json.dumps({**lerobot_config_dict(PolicyConfig.pi05()), "chunk_size": "x"}))
    with pytest.raises(CheckpointError) as err:
        read_config(tmp_path, "lerobot", good)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: field 'chunk_size'"), str(err.value)
    assert "flashrt_config.json" not in str(err.value)


def _refused_config(folder, name: str, data: object, layout: str) -> str:
    """Write `data` as the folder's `name` and return read_config's CheckpointError message."""
    path = folder / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    with pytest.raises(CheckpointError) as err:
        read_config(folder, layout)
    path.unlink()
    assert str(err.value).startswith(str(path)), str(err.value)  # the file is named first
    return str(err.value)


def test_malformed_lerobot_config_json_names_the_file_and_field(tmp_path):
    good = lerobot_config_dict(PolicyConfig.pi05(), ["a", "b", "c"], robot_dof=14)
    resolution = "field 'image_resolution' must be [size, size] with an integer size >= 1, got "
    for field, value, expected in [
        ("chunk_size", "abc", "field 'chunk_size' must be an integer >= 1, got 'abc'"),
        ("num_inference_steps", None, "field 'num_inference_steps' must be an integer >= 1, got None"),
        ("chunk_size", 10**30, f"field 'chunk_size' must be from 1 to 1000, got {10**30}"),  # not "horizon"
        ("tokenizer_max_length", 5000, "field 'tokenizer_max_length' must be from 1 to 4096, got 5000"),
        ("input_features", ["observation.images.a"], "field 'input_features' must be an object of feature name"),
        ("image_resolution", [], resolution + "[]"),
        ("image_resolution", "224", resolution + "'224'"),
    ]:
        assert expected in _refused_config(tmp_path, "config.json", {**good, field: value}, "lerobot")
    msg = _refused_config(tmp_path, "config.json", b"\xff\xfe{}", "lerobot")
    assert "config.json is not UTF-8 text" in msg and "expected a UTF-8 JSON file" in msg


def test_malformed_flashrt_config_json_names_the_file_and_field(tmp_path):
    ours = PolicyConfig.tiny().to_dict()
    for data, expected in [
        ({**ours, "prompt_len": "96"}, "prompt_len must be an integer from 1 to 4096, got '96' (str)"),
        ({**ours, "vision": {**ours["vision"], "patch_size": 0}}, "vision.patch_size must be from 1 to 1048576, got 0"),
        ({**ours, "vision": {**ours["vision"], "bogus": 1}}, "vision: unknown fields ['bogus']; expected the fields"),
        ({**ours, "expert": {"width": 32}}, "expert: missing fields ['depth', 'head_dim', 'mlp_dim', 'num_heads',"),
        ({**ours, "rms_norm_eps": None}, "rms_norm_eps must be a finite number > 0, got None (NoneType)"),
        ({**ours, "max_period": 0.0}, "max_period must be a finite number > 0, got 0.0"),
        ({**ours, "rope_base": float("nan")}, "rope_base must be a finite number > 0, got nan"),
        ({**ours, "min_period": 8.0}, "min_period 8.0 must be <= max_period 4.0"),
    ]:
        assert expected in _refused_config(tmp_path, "flashrt_config.json", data, "openpi")


def test_the_header_is_read_once_per_version_of_the_weights(tmp_path, monkeypatch):
    """Start-up asks for the tensor names several times: one read of the header, and a file
    rewritten in place (another export over the old one) is read again, not served stale."""
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    opened = []
    real_open = checkpoint._open
    monkeypatch.setattr(checkpoint, "_open", lambda path: opened.append(path) or real_open(path))
    assert detect_layout(tmp_path) == "openpi"
    read_config(tmp_path, "openpi")
    weight_names(tmp_path / "model.safetensors")
    assert len(opened) == 1
    save_model(tiny_model("pi05"), tmp_path, layout="lerobot")
    assert detect_layout(tmp_path) == "lerobot" and len(opened) == 2


def test_truncated_file_is_a_clear_error(tmp_path):
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or not a safetensors file"):
        load_model(tmp_path)
    path.write_bytes(b"\x00\x01garbage")
    with pytest.raises(CheckpointError, match=str(path)):
        load_model(tmp_path)


def test_pi0_weights_with_pi05_config_fail_clearly(tmp_path):
    save_model(tiny_model("pi0"), tmp_path, layout="openpi")
    (tmp_path / "flashrt_config.json").unlink()
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path, config=PolicyConfig.tiny("pi05"))
    msg = str(err.value)
    assert "missing" in msg and "time_mlp_in.weight" in msg and "it holds pi0's state_proj" in msg, msg


def test_openpi_folder_without_config_needs_one(tmp_path):
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    (tmp_path / "flashrt_config.json").unlink()
    with pytest.raises(CheckpointError, match="pass a config"):
        load_model(tmp_path)
    model, _ = load_model(tmp_path, config=PolicyConfig.tiny("pi05"))
    assert model.cfg.kind == "pi05"


def test_openpi_folder_of_the_other_kind_is_named_before_loading(tmp_path):
    """No config file names the kind in an openpi export: the weights' names do, so a `policy` of
    the other kind is one sentence (not ~800 tensor names) and comes before any weight is read."""
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    (tmp_path / "flashrt_config.json").unlink()
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    kind, evidence = kind_from_keys(keys)
    assert kind == "pi05" and ".input_layernorm.dense." in evidence
    assert kind_from_keys([k for k in keys if "gemma_expert" not in k]) is None
    assert kind_from_keys(["model.state_proj.weight"]) == ("pi0", "model.state_proj.weight")
    assert kind_from_keys(["state_proj.weight", *keys]) == (kind, evidence)  # a pi0.5 export's unused leftover
    with pytest.raises(CheckpointError) as err:
        read_config(tmp_path, "openpi", PolicyConfig.tiny("pi0"))
    assert str(err.value) == (
        f"{tmp_path} holds a pi05 policy (it has {evidence}), not the pi0 one asked for; "
        "expected a matching `policy` parameter"
    )


def test_openpi_converter_config_json_sets_the_chunk_and_variants(tmp_path):
    """openpi's PyTorch converter writes config.json with the chunk length (pi05_libero: 10), the
    padded action dims and the variants; its precision is left to the deployment."""
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    (tmp_path / "flashrt_config.json").unlink()
    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps({"action_dim": 32, "action_horizon": 7, "precision": "bfloat16"}))
    cfg = read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))
    assert (cfg.horizon, cfg.action_dim, cfg.state_dim, cfg.dtype) == (7, 32, 32, "float32")
    model, _ = load_model(tmp_path, cfg)
    assert model.cfg.horizon == 7
    full = {"action_dim": 32, "action_horizon": 10, "paligemma_variant": "gemma_2b_lora"}
    config_json.write_text(json.dumps({**full, "action_expert_variant": "gemma_300m"}))
    cfg = read_config(tmp_path, "openpi")  # no fallback: the weights' kind, at openpi's full size
    assert cfg.kind == "pi05" and cfg.prefix == GEMMA_2B and cfg.horizon == 10 and cfg.prompt_len == 200
    for bad, field in (
        ({"paligemma_variant": "gemma_7b"}, "paligemma_variant"),
        ({"action_horizon": "10"}, "action_horizon"),
    ):
        config_json.write_text(json.dumps({**full, **bad}))
        with pytest.raises(CheckpointError, match=f"config.json: field '{field}'"):
            read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))


def test_openpi_config_fields_that_some_converters_copy_are_followed(tmp_path):
    """Pi0Config's max_token_len and discrete_state_input, where a converter copies them into
    config.json (pi05_libero: no state in the prompt), were dropped; a pi05 flag that contradicts
    the weights is refused."""
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    (tmp_path / "flashrt_config.json").unlink()
    config_json = tmp_path / "config.json"
    fields = {"action_dim": 32, "action_horizon": 10, "max_token_len": 100, "discrete_state_input": False}
    config_json.write_text(json.dumps({**fields, "pi05": True}))
    cfg = read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))
    assert (cfg.prompt_len, cfg.discrete_state_input, cfg.state_in_prompt) == (100, False, False)
    config_json.write_text(json.dumps({**fields, "pi05": False}))
    with pytest.raises(CheckpointError, match=r"config.json: field 'pi05' is False, but the weights are a pi05"):
        read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))
    config_json.write_text(json.dumps({**fields, "pi05": 1}))
    with pytest.raises(CheckpointError, match=r"field 'pi05' must be true or false, got 1"):
        read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))
    config_json.write_text(json.dumps({**fields, "discrete_state_input": "no"}))
    with pytest.raises(CheckpointError, match=r"field 'discrete_state_input' must be true or false, got 'no'"):
        read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))


def test_a_partial_flashrt_config_changes_what_the_other_files_say(tmp_path):
    """What no export records (openpi's discrete_state_input, LIBERO / DROID's blank third view)
    goes into a flashrt_config.json of a few fields, on top of the converter's config.json and
    the fallback; a whole one (as save_model writes) is the config alone."""
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    whole = json.loads((tmp_path / "flashrt_config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"action_dim": 32, "action_horizon": 10}))
    assert read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05", num_views=3)) == PolicyConfig.from_dict(whole)
    (tmp_path / "flashrt_config.json").write_text(
        json.dumps({"discrete_state_input": False, "num_views": 3, "empty_cameras": 1})
    )
    cfg = read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))
    assert cfg == PolicyConfig.tiny("pi05", horizon=10, num_views=3, empty_cameras=1, discrete_state_input=False)
    assert (cfg.camera_views, cfg.state_in_prompt, cfg.prompt_format) == (2, False, "pi0")
    model, _ = load_model(tmp_path, cfg)
    assert model.cfg.num_views == 3
    (tmp_path / "flashrt_config.json").write_text(json.dumps({"kind": "pi05"}))  # the weights' kind, stated
    assert read_config(tmp_path, "openpi", PolicyConfig.tiny("pi0")).kind == "pi05"  # the node names the mismatch
    (tmp_path / "flashrt_config.json").write_text(json.dumps({"kind": "pi0"}))  # not the weights' kind
    with pytest.raises(CheckpointError, match=r"flashrt_config.json says kind 'pi0', but the weights are a pi05 "):
        read_config(tmp_path, "openpi", PolicyConfig.tiny("pi05"))
    with pytest.raises(ValueError, match="has no LeRobot config .* save it in the openpi layout"):
        lerobot_config_dict(PolicyConfig.pi05(discrete_state_input=False))
    # saved so, it is refused before anything is written (the weights alone loaded as a LeRobot folder)
    with pytest.raises(ValueError, match="has no LeRobot config"):
        save_model(tiny_model("pi05", discrete_state_input=False), tmp_path / "new", layout="lerobot")
    assert not (tmp_path / "new").exists()


def test_a_model_of_another_size_lists_a_bounded_sample_of_tensors(tmp_path):
    save_model(tiny_model("pi05"), tmp_path, layout="openpi")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path, config=PolicyConfig.tiny("pi05", vocab_size=640))  # one tensor differs
    assert "embed_tokens.weight: shape [512, 64], expected [640, 64]" in str(err.value)
    cfg = PolicyConfig.tiny("pi05", expert=PolicyConfig.tiny().prefix)  # every expert tensor differs
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path, config=cfg)
    msg = str(err.value)
    assert msg.count("expected [") == 12 and "more tensors of other shapes" in msg and len(msg) < 4000, msg
    tensors = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v.double() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path, config=PolicyConfig.tiny("pi05"))
    msg = str(err.value)
    assert (
        msg.count("dtype F64, expected F32, BF16 or F16") == 12
        and f"and {len(tensors) - 12} more tensors of other dtypes" in msg
    )


def test_missing_weights_file(tmp_path):
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(tmp_path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_dtype_converted_on_load(tmp_path, dtype):
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="lerobot")
    cfg = model.cfg.replace(dtype=dtype)
    (tmp_path / "flashrt_config.json").write_text(json.dumps(cfg.to_dict()))
    loaded, _ = load_model(tmp_path)
    assert loaded.prefix_lm.layers[0].self_attn.q_proj.weight.dtype == getattr(torch, dtype)
    assert loaded.expert.layers[0].input_layernorm.dense.weight.dtype == torch.float32
    assert loaded.vision.post_layernorm.weight.dtype == torch.float32


def test_lerobot_config_json_maps_to_full_size_config():
    cfg = config_from_lerobot(lerobot_config_dict(PolicyConfig.pi05(), ["a", "b", "c"], robot_dof=14))
    assert cfg == PolicyConfig.pi05(prompt_style="lerobot")
    named = config_from_lerobot(lerobot_config_dict(PolicyConfig.pi05(), ["a", "b", "c"], robot_dof=14))
    assert named.extra == {"n_action_steps": 50, "camera_names": [f"observation.images.{c}" for c in "abc"]}
    executed = named.replace(extra={**named.extra, "n_action_steps": 5})  # a re-saved LeRobot policy keeps both
    assert config_from_lerobot(lerobot_config_dict(executed)).extra == {**named.extra, "n_action_steps": 5}
    keys = ["observation.image", "observation.images.b", "c"]  # a key of its own, LeRobot's usual one, a bare name
    other = executed.replace(extra={**executed.extra, "camera_names": keys})
    assert list(lerobot_config_dict(other)["input_features"])[:3] == [
        "observation.image",
        "observation.images.b",
        "observation.images.c",
    ]
    cfg0 = config_from_lerobot(lerobot_config_dict(PolicyConfig.pi0(num_views=2, horizon=30)))
    assert cfg0.kind == "pi0" and cfg0.num_views == 2 and cfg0.horizon == 30 and cfg0.prompt_len == 48
    assert cfg0.prompt_format == "pi0_lerobot"
    with pytest.raises(CheckpointError, match="not a pi0/pi05 policy"):
        config_from_lerobot({"type": "act"})
    # the time embedding's periods, which LeRobot's model reads from its config (they were ignored)
    periods = config_from_lerobot({**lerobot_config_dict(PolicyConfig.pi05()), "min_period": 0.01, "max_period": 2.0})
    assert (periods.min_period, periods.max_period) == (0.01, 2.0)
    with pytest.raises(ValueError, match="min_period 3.0 must be <= max_period 2.0"):
        config_from_lerobot({**lerobot_config_dict(PolicyConfig.pi05()), "min_period": 3.0, "max_period": 2.0})
    custom = {**lerobot_config_dict(PolicyConfig.pi05()), "paligemma_variant": "gemma_2b_custom"}
    with pytest.raises(
        CheckpointError,
        match=r"unknown model variants \{'paligemma_variant': 'gemma_2b_custom'\}; "
        r"expected one of \['gemma_2b', 'gemma_300m'\]",
    ):
        config_from_lerobot(custom)


def test_lerobot_empty_cameras_are_views_without_a_camera():
    """LeRobot's `empty_cameras` are masked views no camera feeds; LeRobot saves them among the
    input features too (validate_features), so they are not counted twice."""
    saved = lerobot_config_dict(PolicyConfig.pi05(num_views=3, empty_cameras=1), ["top", "wrist"])
    assert "observation.images.empty_camera_0" in saved["input_features"] and saved["empty_cameras"] == 1
    cfg = config_from_lerobot(saved)
    assert (cfg.num_views, cfg.empty_cameras, cfg.camera_views) == (3, 1, 2)
    features = {k: v for k, v in saved["input_features"].items() if "empty_camera" not in k}
    assert config_from_lerobot({**saved, "input_features": features}) == cfg  # written by hand, without them
    with pytest.raises(ValueError, match="empty_cameras 1 must leave at least one of the 1 views to a camera"):
        PolicyConfig.pi05(num_views=1, empty_cameras=1)


def test_lerobot_normaliser_files_and_a_truncated_one(tmp_path):
    """LeRobot 0.6 keeps statistics in the preprocessor pipeline's safetensors file; a cut file
    is a clear error naming it, not safetensors' bare exception."""
    import numpy as np
    from safetensors.numpy import save_file as save_numpy

    from flashrt_ros.policies.normalize import Normalizer

    stats_file = "policy_preprocessor_step_2_normalizer_processor.safetensors"
    norm_map = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    step = {"registry_name": "normalizer_processor", "state_file": stats_file, "config": {"norm_map": norm_map}}
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"steps": [step]}))
    q = {f"{k}.{s}": np.full(n, v, np.float32) for k, n in [("observation.state", 6), ("action", 5)]
         for s, v in [("q01", -2.0), ("q99", 2.0)]}  # fmt: skip
    save_numpy(q, str(tmp_path / stats_file))
    norm = Normalizer.find(tmp_path)
    assert (norm.mode, norm.convention, norm.dims()) == ("quantile", "lerobot", (6, 5))
    np.testing.assert_allclose(norm.normalize_state(np.ones(6)), np.full(6, 0.5))
    data = (tmp_path / stats_file).read_bytes()
    (tmp_path / stats_file).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"cannot read normalisation statistics {tmp_path / stats_file}: "):
        Normalizer.find(tmp_path)


def test_a_lerobot_config_json_makes_a_folder_lerobot_without_its_processor_files(tmp_path):
    """Weights and config.json only (the processor files not downloaded), the tensors without the
    `model.` prefix: LeRobot's config is read as LeRobot's. Read as openpi's converter's, its chunk,
    prompt length and steps fell back to openpi's defaults (horizon 50, 200 tokens, 10 steps)."""
    save_file({"action_in_proj.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    theirs = PolicyConfig.pi05(horizon=10, num_steps=5).replace(prompt_len=64)
    (tmp_path / "config.json").write_text(json.dumps(lerobot_config_dict(theirs)))
    assert detect_layout(tmp_path) == "lerobot"
    cfg = read_config(tmp_path, "lerobot")
    assert (cfg.horizon, cfg.prompt_len, cfg.num_steps, cfg.prompt_style) == (10, 64, 5, "lerobot")
    (tmp_path / "config.json").write_text(json.dumps({"action_horizon": 10, "paligemma_variant": "gemma_2b"}))
    assert detect_layout(tmp_path) == "openpi"  # what openpi's converter writes: no "type"


def test_lerobot_names_without_the_prefix_and_the_embedding_saved_as_the_lm_head_load(tmp_path):
    """As openpi exports converted for LeRobot are saved: LeRobot's loader adds the prefix and
    takes the LM head for the tied embedding; so does ours (the head's key was looked up with the
    prefix only, and the embedding was "missing")."""
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="lerobot")
    path = tmp_path / "model.safetensors"
    t = {k.removeprefix("model."): v for k, v in load_file(str(path)).items()}
    t["paligemma_with_expert.paligemma.lm_head.weight"] = t.pop(
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    )
    save_file(t, str(path))
    assert detect_layout(tmp_path) == "lerobot"
    loaded, info = load_model(tmp_path)
    assert info.layout == "lerobot"
    assert torch.equal(loaded.prefix_lm.embed_tokens.weight, model.prefix_lm.embed_tokens.weight)


def test_the_pi05_tensors_lerobot_drops_on_load_are_dropped(tmp_path):
    """LeRobot's PI05Policy drops a pi05 file's state_proj and the expert's plain norm weights (its
    norms are adaRMS), on keys without its prefix: such a file loads there, and was refused here
    as "unexpected"; with the prefix LeRobot refuses them too."""
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="lerobot")
    path = tmp_path / "model.safetensors"
    t = {k.removeprefix("model."): v for k, v in load_file(str(path)).items()}
    expert = "paligemma_with_expert.gemma_expert.model."
    extra = {
        "state_proj.weight": torch.ones(64, 32),
        "state_proj.bias": torch.ones(64),
        f"{expert}layers.1.input_layernorm.weight": torch.ones(32),
        f"{expert}layers.0.post_attention_layernorm.weight": torch.ones(32),
        f"{expert}norm.weight": torch.ones(32),
    }
    save_file({**t, **extra}, str(path))
    loaded, _ = load_model(tmp_path)
    ours = dict(model.named_parameters())
    assert all(torch.equal(p, ours[name]) for name, p in loaded.named_parameters())
    save_file({**t, **{f"model.{k}": v for k, v in extra.items()}}, str(path))
    with pytest.raises(CheckpointError, match=r"unexpected 5 tensor\(s\): model\.paligemma_with_expert"):
        load_model(tmp_path)


def test_lerobot_camera_names_are_kept_in_the_order_lerobot_stacks_the_views():
    """The node logs which camera topic feeds which of the checkpoint's cameras: LeRobot stacks
    the views in its input_features' order, and the topics feed them in camera_topics' order."""
    saved = lerobot_config_dict(PolicyConfig.pi05(num_views=3, empty_cameras=1), ["wrist", "top"])
    cfg = config_from_lerobot(saved)
    assert cfg.extra["camera_names"] == ["observation.images.wrist", "observation.images.top"]


def test_the_camera_names_come_from_lerobots_config_json_beside_a_flashrt_config(tmp_path):
    """Our flashrt_config.json keeps the config's extra, names of an earlier save included: the
    names LeRobot stacks the views by are config.json's."""
    folder = save_model(tiny_model("pi05", num_views=2), tmp_path, layout="lerobot", camera_names=["wrist", "top"])
    ours = json.loads((folder / "flashrt_config.json").read_text())
    ours["extra"] = {"camera_names": ["observation.images.top", "observation.images.wrist"]}  # stale
    (folder / "flashrt_config.json").write_text(json.dumps(ours))
    cfg = read_config(folder, "lerobot")
    assert cfg.extra["camera_names"] == ["observation.images.wrist", "observation.images.top"]


def test_a_checkpoint_path_that_is_no_folder_is_said_as_such(tmp_path):
    """A wrong path said "holds a LeRobot policy without its config.json" (read_config with the
    LeRobot layout) or "no model.safetensors in ...": it names what the path is."""
    missing, a_file = tmp_path / "nope", tmp_path / "model.safetensors"
    a_file.write_bytes(b"")
    for call in (lambda p: read_config(p, "lerobot"), detect_layout, load_model):
        with pytest.raises(CheckpointError, match=rf"checkpoint folder {missing} does not exist; expected a folder"):
            call(missing)
        with pytest.raises(CheckpointError, match=rf"checkpoint folder {a_file} is a file; expected a folder"):
            call(a_file)


def test_a_folder_without_a_readable_weights_file_says_what_is_there(tmp_path):
    """A link into a cache copied without its blobs, a directory, or a sharded checkpoint: each is
    named as what it is, not as a folder with no weights at all."""
    save_model(tiny_model("pi0"), tmp_path / "whole", layout="openpi")
    for case in ("link", "directory", "sharded", "nothing"):
        folder = tmp_path / case
        folder.mkdir()
        (folder / "flashrt_config.json").write_bytes((tmp_path / "whole" / "flashrt_config.json").read_bytes())
        weights = folder / "model.safetensors"
        if case == "link":
            weights.symlink_to("../blobs/0123abcd")
        elif case == "directory":
            weights.mkdir()
        elif case == "sharded":
            (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
        with pytest.raises(CheckpointError) as err:
            load_model(folder)
        expected = {
            "link": f"{weights} is a broken or looping link; expected the policy's weights file there",
            "directory": f"{weights} is a directory; expected the policy's weights file there",
            "sharded": f"{folder} holds a sharded checkpoint (model.safetensors.index.json and its shards); "
            "expected one model.safetensors",
            "nothing": f"no model.safetensors in {folder}",
        }[case]
        assert str(err.value).startswith(expected), str(err.value)


def test_a_whole_flashrt_config_json_that_differs_from_the_converters_says_so(tmp_path, caplog):
    """openpi's layout: a flashrt_config.json with every field ran over a config.json that says
    another chunk length without a word (the LeRobot layout said it, field by field)."""
    model = tiny_model("pi05")
    save_model(model, tmp_path, layout="openpi")
    cfg = model.cfg
    same = {"action_horizon": cfg.horizon, "action_dim": cfg.action_dim}
    (tmp_path / "config.json").write_text(json.dumps(same))
    with caplog.at_level("WARNING", logger=checkpoint.__name__):
        assert read_config(tmp_path, "openpi") == cfg
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    (tmp_path / "config.json").write_text(json.dumps({**same, "action_horizon": 50, "paligemma_variant": "gemma_2b"}))
    with caplog.at_level("WARNING", logger=checkpoint.__name__):
        assert read_config(tmp_path, "openpi") == cfg  # ours runs
    lines = [r.getMessage() for r in caplog.records]
    ours, theirs = tmp_path / "flashrt_config.json", tmp_path / "config.json"
    prefix = f"a Gemma of width {cfg.prefix.width} and depth {cfg.prefix.depth}"
    assert lines == [
        f"{ours}: horizon is {cfg.horizon}, where {theirs} says 50: this runs {cfg.horizon}",
        f"{ours}: prefix is {prefix}, where {theirs} says gemma_2b: this runs {prefix}",
    ], lines
