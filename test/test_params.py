"""The node's parameters: defaults, validation reasons, runtime-change rules, YAML loading, and
the declaration on a real rclpy node (no process, no DDS traffic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashrt_ros.ros.params import (
    PARAMETERS,
    RUNTIME,
    NodeConfig,
    check_update,
    load_yaml_parameters,
    unknown_names,
)

REPO = Path(__file__).resolve().parents[1]


def problems(**values) -> list[str]:
    return NodeConfig.from_values(values).validate(check_paths=False)


def test_defaults_are_the_embedded_demo():
    cfg = NodeConfig()
    assert cfg.validate() == []
    assert cfg.policy == "pi05_tiny" and cfg.checkpoint == "" and cfg.is_tiny
    assert len(cfg.camera_topics) == 3 and len(cfg.joint_names) == 14
    assert cfg.transports == ["raw"] * 3 and cfg.output_joint_names == cfg.joint_names
    assert cfg.expected_hw is None


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"rate_hz": 0.0}, "rate_hz must be > 0 and <= 1000, got 0.0"),
        ({"rate_hz": "fast"}, "rate_hz must be a number, got str 'fast'"),
        ({"max_age_s": -1.0}, "max_age_s must be > 0"),
        ({"status_rate_hz": float("nan")}, "status_rate_hz must be > 0"),
        ({"prompt": "  "}, "prompt is empty"),
        ({"policy": "pi1"}, "policy must be one of pi05, pi0, pi05_tiny, pi0_tiny, got 'pi1'"),
        ({"policy": "pi05"}, "tokenizer is empty: policy 'pi05' needs PaliGemma's tokenizer.model"),
        ({"device": "gpu"}, "device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
        ({"precision": "fp16"}, "precision must be one of float32, bfloat16, got 'fp16'"),
        ({"fp8": "all"}, "fp8 must be one of none, prefix_mlp, got 'all'"),
        (
            {"fp8": "prefix_mlp"},
            "fp8 'prefix_mlp' needs precision bfloat16 and the fused backend (auto or fused), "
            "got precision 'float32', backend 'auto'",
        ),
        (
            {"fp8": "prefix_mlp", "precision": "bfloat16", "backend": "reference"},
            "got precision 'bfloat16', backend 'reference'",
        ),
        ({"seed": -1}, "seed must be >= 0"),
        ({"seed": 1.5}, "seed must be an integer, got float 1.5"),
        ({"camera_topics": []}, "camera_topics is empty"),
        ({"camera_topics": ["a", "a"]}, "camera_topics lists ['a'] more than once"),
        ({"camera_topics": ["bad topic"]}, "camera_topics: 'bad topic' is not a valid ROS topic name"),
        ({"camera_transports": ["raw"]}, "camera_transports has 1 entries for 3 camera_topics"),
        ({"camera_transports": ["raw", "raw", "theora"]}, "camera_transports ['theora'] not understood"),
        ({"image_height": 480}, "image_height=480, image_width=0: set both"),
        ({"joint_names": []}, "joint_names is empty"),
        ({"joint_names": ["a", "b", "a"]}, "joint_names lists ['a'] more than once"),
        ({"joint_names": [f"j{i}" for i in range(33)]}, "joint_names has 33 joints; pi05_tiny takes at most 32"),
        ({"action_joint_names": ["x", ""]}, "action_joint_names has an empty name"),
        ({"step_duration_s": 0}, "step_duration_s must be > 0"),
        ({"joint_state_topic": "/joint states"}, "joint_state_topic: '/joint states' is not a valid ROS topic name"),
    ],
)
def test_invalid_values_have_precise_reasons(values, reason):
    found = problems(**values)
    assert any(reason in p for p in found), found


def test_all_problems_reported_at_once():
    found = problems(rate_hz="x", seed=-2, prompt="")
    assert len(found) == 3, found
    for reason in ("rate_hz must be a number", "seed must be >= 0", "prompt is empty"):
        assert any(reason in p for p in found), (reason, found)


def test_integers_are_accepted_for_numbers_and_empty_yaml_lists_as_empty():
    cfg = NodeConfig.from_values({"rate_hz": 20, "camera_transports": None, "action_joint_names": None})
    assert cfg.rate_hz == 20.0 and isinstance(cfg.rate_hz, float)
    assert cfg.camera_transports == [] and cfg.validate() == []


def test_paths_must_exist_when_checked(tmp_path):
    cfg = NodeConfig.from_values({"checkpoint": str(tmp_path / "nope"), "tokenizer": str(tmp_path / "t.model")})
    found = cfg.validate()
    assert any("checkpoint" in p and "is not a folder" in p for p in found)
    assert any("tokenizer" in p and "is not a file" in p for p in found)
    assert cfg.validate(check_paths=False) == []


def test_runtime_changes_allowed_and_refused():
    cfg = NodeConfig()
    assert RUNTIME == {"rate_hz", "max_age_s", "prompt", "status_rate_hz", "stats_log_period_s", "log_throttle_s"}
    assert check_update(cfg, {"rate_hz": 5, "prompt": "fold the towel"}) is None
    assert check_update(cfg, {"use_sim_time": True}) is None  # not ours: rclpy's business
    assert "rate_hz must be > 0" in check_update(cfg, {"rate_hz": -1.0})
    reason = check_update(cfg, {"policy": "pi0_tiny", "rate_hz": 5.0})
    assert reason.startswith("policy is read-only at runtime: set it in the params file and restart the node")
    reason = check_update(cfg, {"camera_topics": ["a"], "device": "cpu"})
    assert reason.startswith("camera_topics, device are read-only at runtime")


def test_yaml_sections_wildcard_then_node(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "/**:\n  ros__parameters:\n    rate_hz: 5\n    prompt: a\n"
        "/**/flashrt_node:\n  ros__parameters:\n    prompt: b\n"
        "other_node:\n  ros__parameters:\n    prompt: c\n"
    )
    assert load_yaml_parameters(path) == {"rate_hz": 5, "prompt": "b"}
    assert NodeConfig.from_yaml(path).prompt == "b"


def test_unknown_names_spot_typos():
    assert unknown_names({"rate_h", "rate_hz", "use_sim_time", "qos_overrides./x.reliability"}) == ["rate_h"]


def test_every_parameter_documented():
    for name, info in PARAMETERS.items():
        assert info.description, name
    docs = (REPO / "docs" / "ros.md").read_text()
    for name in PARAMETERS:
        assert f"`{name}`" in docs, f"docs/ros.md does not document {name}"


@pytest.mark.ros
def test_declared_on_a_real_node_with_overrides(rclpy_context):
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.params import declare_parameters

    node = Node(
        "params_test",
        context=rclpy_context,
        parameter_overrides=[Parameter("rate_hz", value=20), Parameter("camera_topics", value=["a", "b"])],
    )
    try:
        declare_parameters(node)
        cfg = NodeConfig.from_parameters(node)
        assert cfg.rate_hz == 20.0 and cfg.camera_topics == ["a", "b"] and cfg.validate() == []
        described = node.describe_parameter("rate_hz")
        assert "changeable at runtime" in described.description
        assert "restart" in node.describe_parameter("policy").description
        # empty lists are string arrays, not the byte arrays rclpy makes of a bare []
        for name in ("action_joint_names", "camera_transports", "camera_topics"):
            assert node.get_parameter(name).type_ == Parameter.Type.STRING_ARRAY, name
        assert cfg.action_joint_names == [] and cfg.camera_transports == []
    finally:
        node.destroy_node()
