"""The node's parameters: defaults, validation reasons, runtime-change rules, YAML loading, and
the declaration on a real rclpy node (no process, no DDS traffic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flashrt_ros.ros.params import (
    PARAMETERS,
    RUNTIME,
    NodeConfig,
    check_update,
    expand_in_namespace,
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
        ({"rate_hz": 0.0}, "rate_hz must be >= 0.01 and <= 1000, got 0.0"),
        # a 1e19 ns timer period does not fit rcl's int64: refused, not a crash of the node
        ({"rate_hz": 1e-10}, "rate_hz must be >= 0.01 and <= 1000, got 1e-10"),
        ({"status_rate_hz": 1e-10}, "status_rate_hz must be >= 0.01 and <= 1000, got 1e-10"),
        ({"rate_hz": "fast"}, "rate_hz must be a number, got str 'fast'"),
        ({"max_age_s": -1.0}, "max_age_s must be > 0"),
        ({"status_rate_hz": float("nan")}, "status_rate_hz must be >= 0.01"),
        ({"prompt": "  "}, "prompt is empty"),
        ({"policy": "pi1"}, "policy must be one of pi05, pi0, pi05_tiny, pi0_tiny, got 'pi1'"),
        ({"policy": "pi05"}, "tokenizer is empty: policy 'pi05' needs PaliGemma's tokenizer.model"),
        # a misspelt `checkpoint` key leaves it empty: random weights on a real arm, unless said
        (
            {"policy": "pi0", "tokenizer": "t.model"},
            "checkpoint is empty: policy 'pi0' needs its weights (a folder with model.safetensors); random weights "
            "move a robot without meaning: set checkpoint: random for that (benchmarks)",
        ),
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
        (
            {"camera_topics": ["a", "a"]},
            "camera_topics[0] 'a' and camera_topics[1] 'a' both resolve to /a; "
            "expected each camera on a topic of its own",
        ),
        (
            {"camera_topics": ["bad topic"]},
            "camera_topics: 'bad topic' is not a valid ROS topic name: topic name must not contain characters other "
            "than alphanumerics",
        ),
        ({"camera_transports": ["raw"]}, "camera_transports has 1 entries for 3 camera_topics"),
        ({"camera_transports": ["raw", "raw", "theora"]}, "camera_transports ['theora'] not understood"),
        ({"image_height": 480}, "image_height=480, image_width=0: set both"),
        ({"joint_names": []}, "joint_names is empty"),
        ({"joint_names": ["a", "b", "a"]}, "joint_names lists ['a'] more than once"),
        ({"joint_names": [f"j{i}" for i in range(33)]}, "joint_names has 33 joints; pi05_tiny takes at most 32"),
        ({"action_joint_names": ["x", ""]}, "action_joint_names has an empty name"),
        ({"step_duration_s": 0}, "step_duration_s must be >= 1e-06 and <= 60, got 0.0"),
        # all the trajectory's points would be at time_from_start 0
        ({"step_duration_s": 1e-10}, "step_duration_s must be >= 1e-06 and <= 60, got 1e-10"),
        ({"joint_state_topic": "/joint states"}, "joint_state_topic: '/joint states' is not a valid ROS topic name"),
        ({"prompt_topic": "task prompt"}, "prompt_topic: 'task prompt' is not a valid ROS topic name"),
        ({"prompt_topic": "joint_states"}, "joint_state_topic 'joint_states' and prompt_topic 'joint_states' both"),
        ({"trajectory_stamp": "now"}, "trajectory_stamp must be one of observation, publication, zero, got 'now'"),
        ({"prompt_durability": "latched"}, "prompt_durability must be one of volatile, transient_local, got 'latched'"),
        (
            {"trajectory_groups": ["arm/joint_trajectory: left_waist"]},  # a ':' where '=' belongs
            "trajectory_groups[0] 'arm/joint_trajectory: left_waist': expected 'TOPIC=joint, joint, ...'",
        ),
        (
            {"trajectory_groups": ["arm/joint_trajectory=left_waist, wrist"]},
            "trajectory_groups[0] 'arm/joint_trajectory=left_waist, wrist': wrist not among action_joint_names",
        ),
        (
            {"trajectory_groups": ["arm/joint_trajectory=left_waist, ,left_elbow"]},
            "trajectory_groups[0] 'arm/joint_trajectory=left_waist, ,left_elbow': an empty joint name",
        ),
        (
            {"trajectory_groups": ["arm/joint_trajectory=left_waist, left_waist"]},
            "lists ['left_waist'] more than once; expected each joint once",
        ),
        (
            {"trajectory_groups": ["arm/jt=left_waist", "/arm/jt=right_waist"]},
            "trajectory_groups[0] 'arm/jt' and trajectory_groups[1] '/arm/jt' both resolve to /arm/jt; "
            "expected each trajectory group on a topic of its own",
        ),
        (
            {"trajectory_groups": ["bad topic=left_waist"]},
            "trajectory_groups: 'bad topic' is not a valid ROS topic name",
        ),
        (
            {"trajectory_groups": ["joint_states=left_waist"]},  # the input topic, of another type
            "joint_state_topic 'joint_states' and trajectory_groups[0] 'joint_states' both resolve to /joint_states, "
            "which cannot carry sensor_msgs/msg/JointState and trajectory_msgs/msg/JointTrajectory at once",
        ),
        ({"command_rate_hz": 0.001}, "command_rate_hz must be 0 (off) or >= 0.01, got 0.001"),
        ({"command_rate_hz": 2000.0}, "command_rate_hz must be >= 0 and <= 1000, got 2000.0"),
        ({"command_rate_hz": -5.0}, "command_rate_hz must be >= 0 and <= 1000, got -5.0"),
        (
            {"command_groups": ["arm/commands=left_waist"]},
            "command_groups is set but command_rate_hz is 0 (off): expected command_rate_hz > 0",
        ),
        (
            {"command_rate_hz": 50, "command_groups": ["arm/commands left_waist"]},
            "command_groups[0] 'arm/commands left_waist': expected 'TOPIC=joint, joint, ...', "
            "e.g. 'arm_controller/commands=j1, j2'",
        ),
        (
            {"command_rate_hz": 50, "command_groups": ["arm/commands=left_waist, elbow"]},
            "command_groups[0] 'arm/commands=left_waist, elbow': elbow not among action_joint_names",
        ),
        (
            {"command_rate_hz": 50, "command_groups": ["arm/c=left_waist", "/arm/c=right_waist"]},
            "command_groups[0] 'arm/c' and command_groups[1] '/arm/c' both resolve to /arm/c; "
            "expected each command group on a topic of its own",
        ),
        (
            {"command_rate_hz": 50, "command_groups": ["arm/x=left_waist"], "trajectory_groups": ["arm/x=left_waist"]},
            "trajectory_groups[0] 'arm/x' and command_groups[0] 'arm/x' both resolve to /arm/x, which cannot carry "
            "std_msgs/msg/Float64MultiArray and trajectory_msgs/msg/JointTrajectory at once",
        ),
        (
            {"command_interpolation": "cubic"},
            "command_interpolation must be one of hold, linear, got 'cubic'",
        ),
        (
            {"action_upper_limits": [1.0, 2.0]},
            "action_upper_limits has 2 values for 14 action joints; expected one per joint",
        ),
        ({"action_max_step": [0.0]}, "action_max_step[0] must be > 0, got 0.0"),
        (
            {"action_lower_limits": [float("nan")]},
            "action_lower_limits[0] must be a finite number or -inf for no bound (a continuous joint), got nan",
        ),
        (
            {"action_lower_limits": [float("inf")]},
            "action_lower_limits[0] must be a finite number or -inf for no bound (a continuous joint), got inf",
        ),
        ({"action_max_step": [float("inf")]}, "action_max_step[0] must be a finite number, got inf"),
        ({"action_lower_limits": ["low"]}, "action_lower_limits must be a list of numbers, got list ['low']"),
        (
            {"action_lower_limits": [1.0], "action_upper_limits": [1.0] + [2.0] * 13},
            "action_lower_limits is not below action_upper_limits for left_waist (1.0 >= 1.0)",
        ),
        ({"command_blend_steps": -1}, "command_blend_steps must be >= 0 and <= 1000, got -1"),
        ({"command_blend_steps": 2.5}, "command_blend_steps must be an integer, got float 2.5"),
        ({"start_enabled": "yes"}, "start_enabled must be true or false, got str 'yes'"),
        ({"start_enabled": 1}, "start_enabled must be true or false, got int 1"),
    ],
)
def test_invalid_values_have_precise_reasons(values, reason):
    found = problems(**values)
    assert any(reason in p for p in found), found


def test_a_continuous_joint_has_no_position_bound():
    """A Kinova Gen3's continuous joints have no position limit: -.inf / .inf there (the others
    limited); an arm had to make up a bound, as the refusal said "must be a finite number"."""
    from flashrt_ros.engine.action_limits import ActionLimits

    inf = float("inf")
    assert problems(action_lower_limits=[-1.0] * 13 + [-inf], action_upper_limits=[1.0] * 13 + [inf]) == []
    limits = ActionLimits.from_lists(("j0", "j1"), lower=[-1.0, -inf], upper=[1.0, inf], max_step=[])
    out, clamped = limits.apply(np.array([[5.0, 5.0], [-7.0, -7.0]]), np.zeros(2))
    np.testing.assert_array_equal(out, [[1.0, 5.0], [-1.0, -7.0]])  # only the bounded joint clamped
    assert (clamped.values, clamped.joints) == (2, 1) and "j0" in clamped.worst, clamped


@pytest.mark.ros  # rcl's rules, through rclpy
@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (
            {"camera_topics": ["~cam", "b", "c"]},
            "camera_topics: '~cam' is not a valid ROS topic name: "
            "topic name must not have a tilde '~' that is not followed by a forward slash '/'",
        ),
        (
            {"joint_state_topic": "robot/1joints"},
            "joint_state_topic: 'robot/1joints' is not a valid ROS topic name: "
            "topic name token must not start with a number",
        ),
        (
            {"camera_topics": ["cam{", "b", "c"]},
            "camera_topics: 'cam{' is not a valid ROS topic name: "
            "topic name must not have unmatched (unbalanced) curly braces '{}'",
        ),
        (
            {"joint_state_topic": "a" * 300},
            f"joint_state_topic: {'a' * 40!r}... (300 characters) is not a valid ROS topic name: "
            "topic length should not exceed",
        ),
        (
            {"joint_state_topic": "cam_high/image_raw"},
            "camera_topics[0] 'cam_high/image_raw' and joint_state_topic 'cam_high/image_raw' both resolve to "
            "/cam_high/image_raw, which cannot carry sensor_msgs/msg/Image and sensor_msgs/msg/JointState at once; "
            "expected a topic of its own for each",
        ),
        (
            {"camera_topics": ["a", "b", "~/status"], "camera_transports": ["raw", "raw", "compressed"]},
            "camera_topics[2] '~/status' and the node's output '~/status' both resolve to /flashrt_node/status, "
            "which cannot carry flashrt_ros/msg/PipelineStatus and sensor_msgs/msg/CompressedImage at once",
        ),
    ],
)
def test_topic_names_judged_by_rcl_rules(values, reason):
    found = problems(**values)
    assert any(reason in p for p in found), found


@pytest.mark.ros
def test_topics_compared_by_resolved_name():
    """One camera spelled relative and absolute in the node's namespace: one topic, two views."""
    cfg = NodeConfig.from_values({"camera_topics": ["cam0/image_raw", "/robot1/cam0/image_raw", "cam1"]})
    assert cfg.validate(check_paths=False) == []  # in the root namespace they differ
    assert cfg.validate(check_paths=False, resolve=expand_in_namespace("/robot1")) == [
        "camera_topics[0] 'cam0/image_raw' and camera_topics[1] '/robot1/cam0/image_raw' both resolve to "
        "/robot1/cam0/image_raw; expected each camera on a topic of its own"
    ]
    # a runtime change is judged in the node's namespace too (no false duplicate from the root one)
    fine_in_ns = NodeConfig.from_values({"camera_topics": ["cam0", "/cam0", "cam1"]})
    assert check_update(fine_in_ns, {"rate_hz": 5.0}, resolve=expand_in_namespace("/robot1")) is None
    assert "both resolve to /cam0" in check_update(fine_in_ns, {"rate_hz": 5.0})


def test_all_problems_reported_at_once():
    found = problems(rate_hz="x", seed=-2, prompt="")
    assert len(found) == 3, found
    for reason in ("rate_hz must be a number", "seed must be >= 0", "prompt is empty"):
        assert any(reason in p for p in found), (reason, found)


def test_a_mistyped_value_is_reported_once_not_again_through_its_stand_in():
    """image_height 480.0 is judged as its type only: checked as the default 0 that stands in for
    it, it would also give a false "set both or neither"; a real pairing mistake still shows."""
    assert problems(image_height=480.0, image_width=640) == ["image_height must be an integer, got float 480.0"]
    assert problems(image_height=480, image_width=0) == [
        "image_height=480, image_width=0: set both (> 0) or neither (0 = any size)"
    ]
    # a size no camera gives (a digit too many): the warm-up decided on three such frames (14 GB, 43 s)
    assert problems(image_height=20000, image_width=30000) == [
        "image_height x image_width = 20000 x 30000, more pixels than any robot camera gives; expected at most "
        "33177600 (8K, 7680 x 4320): a digit too many?"
    ]
    assert problems(image_height=4320, image_width=7680) == []
    # a problem that does not depend on the mistyped value stays, even where it names it
    assert problems(policy=5, joint_names=[]) == [
        "policy must be a string, got int 5",
        "joint_names is empty; expected the joints of the policy's state, in order",
    ]
    # one that quotes the stand-in (here backend 'auto') would misreport: it waits for the type's fix
    assert problems(backend=3, fp8="prefix_mlp", precision="float32") == ["backend must be a string, got int 3"]


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


def test_random_weights_for_a_full_size_policy_are_asked_for_by_name(tmp_path):
    """`checkpoint: random` is no path: not checked as one, and the loader gets none."""
    (tmp_path / "t.model").write_bytes(b"")
    for policy in ("pi05", "pi0"):
        cfg = NodeConfig.from_values({"policy": policy, "checkpoint": "random", "tokenizer": str(tmp_path / "t.model")})
        assert cfg.validate() == [] and cfg.checkpoint_folder is None
    assert NodeConfig().checkpoint_folder is None and NodeConfig().validate(check_paths=False) == []  # tiny
    assert NodeConfig.from_values({"checkpoint": str(tmp_path)}).checkpoint_folder == str(tmp_path)


def test_more_cameras_than_any_policy_has_views_are_refused_by_name():
    """17 cameras passed the check and then failed building the policy with a traceback that
    named no parameter (exit 1, not 2)."""
    topics = [f"cam{i}/image_raw" for i in range(17)]
    assert problems(camera_topics=topics) == ["camera_topics has 17 topics; expected at most 16 (one per view)"]
    assert problems(camera_topics=topics[:16]) == []


def test_a_leading_tilde_in_a_path_is_the_home_folder_for_the_check_and_the_loader(tmp_path, monkeypatch):
    """YAML, -p and launch arguments pass `~/models/pi05` as it is: the config holds it expanded,
    so the start-up check and the loader read the same path (the check used to expand it and the
    loader not, which failed the start on a file that exists)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "tok.model").write_bytes(b"")
    cfg = NodeConfig.from_values({"checkpoint": "~/ckpt", "tokenizer": "~/tok.model"})
    assert cfg.checkpoint == str(tmp_path / "ckpt") and cfg.tokenizer == str(tmp_path / "tok.model")
    assert cfg.validate() == []
    assert NodeConfig.from_values({"checkpoint": "ckpt~"}).checkpoint == "ckpt~"  # only a leading ~
    nobody = NodeConfig.from_values({"checkpoint": "~no_such_user_here/ckpt"})  # no traceback: named
    assert nobody.validate() == [
        "checkpoint '~no_such_user_here/ckpt' is not a folder; expected one with model.safetensors"
    ]


def test_limits_take_integers_one_value_for_all_or_one_per_joint():
    assert problems(action_lower_limits=[-1], action_upper_limits=[1], action_max_step=[1]) == []
    cfg = NodeConfig.from_values({"action_lower_limits": [-1], "action_max_step": [0.5] * 14})
    assert cfg.action_lower_limits == [-1.0] and isinstance(cfg.action_lower_limits[0], float)
    assert cfg.validate(check_paths=False) == []


def test_runtime_changes_allowed_and_refused():
    cfg = NodeConfig()
    assert RUNTIME == {
        "rate_hz",
        "prefix_trigger",
        "prefix_period_s",
        "max_age_s",
        "prompt",
        "status_rate_hz",
        "stats_log_period_s",
        "log_throttle_s",
        "command_rate_hz",
        "command_interpolation",
        "command_blend_steps",
        "rtc_max_guidance",
        "rtc_schedule",
        "rtc_delay_steps",
    }
    assert check_update(cfg, {"rate_hz": 5, "prompt": "fold the towel"}) is None
    assert check_update(cfg, {"command_blend_steps": 3}) is None
    assert check_update(cfg, {"command_rate_hz": 50.0}).startswith(
        "command_rate_hz 0 -> 50: the command stream is turned on or off only at start"
    )
    streaming = cfg.with_values({"command_rate_hz": 50.0})
    assert check_update(streaming, {"command_rate_hz": 100}) is None
    assert "on or off only at start" in check_update(streaming, {"command_rate_hz": 0.0})
    too_fast = check_update(streaming, {"command_rate_hz": 5000.0})
    assert too_fast == "command_rate_hz must be >= 0 and <= 1000, got 5000.0"
    assert check_update(cfg, {"use_sim_time": True}) is None  # not ours: rclpy's business
    assert "rate_hz must be >= 0.01" in check_update(cfg, {"rate_hz": -1.0})
    assert check_update(cfg, {"status_rate_hz": 1e-10}) == "status_rate_hz must be >= 0.01 and <= 1000, got 1e-10"
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


@pytest.mark.ros
def test_yaml_sections_merge_in_the_files_order_as_rcl_gives_them(tmp_path):
    """The helper applied /** first whatever the file's order, so a /** after the node's own
    section lost here and won on the node (tests and offline checks read another value)."""
    import rclpy
    from rclpy.context import Context

    path = tmp_path / "p.yaml"
    path.write_text(
        "/**/flashrt_node:\n  ros__parameters:\n    max_age_s: 0.25\n    prompt: own\n"
        "/**:\n  ros__parameters:\n    max_age_s: 1.0\n"
    )
    context = Context()
    rclpy.init(args=["--ros-args", "--params-file", str(path)], context=context)
    try:
        node = rclpy.create_node("flashrt_node", context=context, automatically_declare_parameters_from_overrides=True)
        given = {name: node.get_parameter(name).value for name in ("max_age_s", "prompt")}
        node.destroy_node()
    finally:
        context.try_shutdown()
    assert load_yaml_parameters(path) == given == {"max_age_s": 1.0, "prompt": "own"}


def test_unknown_names_spot_typos():
    names = {"rate_h", "rate_hz", "use_sim_time", "qos_overrides./x.reliability"}
    assert unknown_names(names) == ["rate_h"]  # at start: a shared /** section may hold others' QoS
    # at runtime the node has no qos_overrides (its QoS is fixed): a set of one would do nothing
    assert unknown_names(names, runtime=True) == ["qos_overrides./x.reliability", "rate_h"]


@pytest.mark.ros
def test_what_rclpy_declares_itself_is_no_typo(rclpy_context):
    """start_type_description_service was warned about as ignored (and counted as
    unknown_parameter) though rclpy applies it: every name a bare rclpy Node declares is excluded."""
    from rclpy.node import Node

    bare = Node("bare_for_params", context=rclpy_context)
    try:
        own = sorted(bare._parameters)
    finally:
        bare.destroy_node()
    assert "start_type_description_service" in own and "use_sim_time" in own
    assert unknown_names(set(own), runtime=True, known={}) == [], own


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


@pytest.mark.ros
def test_an_empty_list_set_at_runtime_keeps_the_fields_type(rclpy_context):
    """`ros2 param set ... "[]"` sends a bool array, rclpy's Parameter(value=[]) a byte array:
    stored as given, `ros2 param get` then showed "Boolean values are: []" for a double limit."""
    from node_harness import in_process_node
    from rclpy.parameter import Parameter

    node = in_process_node(rclpy_context)
    try:
        doubles, strings, bools = Parameter.Type.DOUBLE_ARRAY, Parameter.Type.STRING_ARRAY, Parameter.Type.BOOL_ARRAY
        for name, given, want in (
            ("action_lower_limits", Parameter("action_lower_limits", value=[]), doubles),  # a byte array
            ("action_max_step", Parameter("action_max_step", bools, []), doubles),
            ("camera_transports", Parameter("camera_transports", bools, []), strings),
        ):
            assert given.type_ != want
            assert node.set_parameters([given])[0].successful, name
            assert node.get_parameter(name).type_ == want, name
    finally:
        node.destroy_node()


@pytest.mark.ros
def test_empty_lists_in_a_params_file_read_back_as_empty_lists(rclpy_context, tmp_path):
    """rcl reads a params file's `[]` as "not set": declared as such, `ros2 param get` and
    describe said "not set" for config/flashrt.yaml's empty limits and groups. Typed as the field
    is: doubles for the limits, strings for the groups."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.params import declare_parameters

    path = tmp_path / "p.yaml"
    path.write_text("/**:\n  ros__parameters:\n    action_lower_limits: []\n    trajectory_groups: []\n")
    node = Node("params_empty_test", context=rclpy_context, cli_args=["--ros-args", "--params-file", str(path)])
    try:
        declare_parameters(node)
        lower, groups = node.get_parameter("action_lower_limits"), node.get_parameter("trajectory_groups")
        assert (lower.type_, list(lower.value)) == (Parameter.Type.DOUBLE_ARRAY, [])
        assert (groups.type_, list(groups.value)) == (Parameter.Type.STRING_ARRAY, [])
        cfg = NodeConfig.from_parameters(node)
        assert cfg.action_lower_limits == [] and cfg.trajectory_groups == [] and cfg.validate() == []
    finally:
        node.destroy_node()


def test_a_restart_only_parameter_set_to_its_value_in_use_is_no_change():
    """`ros2 param load` of the node's own params file sets every parameter: the restart-only
    ones at their values in use are accepted (as numbers by value, arrays element by element),
    only a real change is refused."""
    import array

    cfg = NodeConfig()
    same = {
        "policy": cfg.policy,
        "camera_topics": list(cfg.camera_topics),
        "image_height": cfg.image_height,
        "action_lower_limits": array.array("d"),
        "rate_hz": 5.0,
    }
    assert check_update(cfg, same) is None
    assert check_update(cfg.with_values({"step_duration_s": 1.0}), {"step_duration_s": 1}) is None  # 1 is 1.0
    home = cfg.with_values({"tokenizer": "~/tok.model"})  # held expanded; the parameter keeps the ~
    assert home.tokenizer != "~/tok.model" and check_update(home, {"tokenizer": "~/tok.model"}) is None
    assert check_update(home, {"tokenizer": "~/other.model"}).startswith("tokenizer is read-only")
    assert check_update(cfg, {"policy": cfg.policy + "x"}).startswith("policy is read-only at runtime")
    assert check_update(cfg, {"camera_topics": cfg.camera_topics[:1]}).startswith("camera_topics is read-only")
    assert check_update(cfg, {"seed": cfg.seed + 1}).startswith("seed is read-only")
    assert check_update(cfg, {"seed": True}).startswith("seed is read-only")  # a bool is not the int 1 or 0
    assert check_update(cfg, {"image_height": float(cfg.image_height)}).startswith("image_height is read-only")


@pytest.mark.ros
def test_sets_rclpy_refuses_itself_are_named(rclpy_context):
    """use_sim_time has a fixed type: rclpy refuses a string for it before the node's callback,
    silently; refused_by_rclpy says so (for the node to log and count it), and only then."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.params import declare_parameters, refused_by_rclpy

    node = Node("params_test", context=rclpy_context, allow_undeclared_parameters=True)
    try:
        declare_parameters(node)
        T = Parameter.Type
        wrong = Parameter("use_sim_time", T.STRING, "yes")
        assert refused_by_rclpy(node, [wrong]) == "use_sim_time must be a bool, got string 'yes'"
        assert not node.set_parameters([wrong])[0].successful  # rclpy does refuse it
        unset = Parameter("use_sim_time", T.NOT_SET, None)
        assert (
            refused_by_rclpy(node, [unset]) == "use_sim_time cannot be unset: it is declared with a fixed type (bool)"
        )
        assert not node.set_parameters([unset])[0].successful
        fine = [
            Parameter("use_sim_time", T.BOOL, False),
            Parameter("rate_hz", T.STRING, "fast"),  # ours: typed freely, judged by the node
            Parameter("no_such_parameter", T.DOUBLE, 1.0),  # not declared: the node's callback says so
        ]
        assert refused_by_rclpy(node, fine) is None
        read_only = Parameter("start_type_description_service", T.BOOL, False)  # rclpy's own, read-only
        assert refused_by_rclpy(node, [read_only]) == "start_type_description_service is read-only"
        assert not node.set_parameters([read_only])[0].successful
        assert refused_by_rclpy(node, [*fine, wrong]) == "use_sim_time must be a bool, got string 'yes'"
    finally:
        node.destroy_node()


@pytest.mark.ros
def test_number_ranges_are_declared_and_judged_as_rclpy_judges_them(rclpy_context):
    """`ros2 param describe` and rqt_reconfigure show each number's range: rclpy then refuses a set
    outside it before the node's callback, and refused_by_rclpy names it for the node's log and
    counter. rclpy's ends are closed and what is within its tolerance of them passes."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.params import INTEGER_RANGES, NUMBER_RANGES, declare_parameters, refused_by_rclpy

    node = Node("params_test", context=rclpy_context)
    try:
        declare_parameters(node)
        for name, (low, high, _) in NUMBER_RANGES.items():
            (declared,) = node.describe_parameter(name).floating_point_range
            assert (declared.from_value, declared.to_value, declared.step) == (low, high, 0.0), name
        for name, (low, high) in INTEGER_RANGES.items():
            (declared,) = node.describe_parameter(name).integer_range
            assert (declared.from_value, declared.to_value, declared.step) == (low, high, 1), name
        blend = [Parameter("command_blend_steps", Parameter.Type.INTEGER, 1001)]
        assert refused_by_rclpy(node, blend) == (
            "command_blend_steps must be within its declared range [0, 1000], got 1001"
        )
        assert not node.set_parameters(blend)[0].successful
        top = [Parameter("command_blend_steps", Parameter.Type.INTEGER, 1000)]
        assert refused_by_rclpy(node, top) is None and node.set_parameters(top)[0].successful
        fast = Parameter("rate_hz", Parameter.Type.DOUBLE, 5000.0)
        assert refused_by_rclpy(node, [fast]) == "rate_hz must be within its declared range [0.01, 1000], got 5000.0"
        assert not node.set_parameters([fast])[0].successful
        edge = [Parameter("rate_hz", Parameter.Type.DOUBLE, 1000.0 * (1 + 1e-12))]
        assert refused_by_rclpy(node, edge) is None and node.set_parameters(edge)[0].successful
        assert refused_by_rclpy(node, [Parameter("log_throttle_s", Parameter.Type.DOUBLE, -1.0)]) == (
            "log_throttle_s must be within its declared range [0, 86400], got -1.0"
        )
    finally:
        node.destroy_node()


@pytest.mark.ros
def test_a_start_value_outside_its_range_gets_the_nodes_sentence(rclpy_context):
    """rclpy would raise at the declaration with its own words: the parameter is declared without
    its range instead, and validation names the value and the bounds."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.params import declare_parameters

    overrides = [
        Parameter("rate_hz", value=5000.0),
        Parameter("status_rate_hz", value=2.0),
        Parameter("command_blend_steps", value=5000),
    ]
    node = Node("params_test", context=rclpy_context, parameter_overrides=overrides)
    try:
        declare_parameters(node)
        cfg = NodeConfig.from_parameters(node)
        assert (cfg.rate_hz, cfg.status_rate_hz, cfg.command_blend_steps) == (5000.0, 2.0, 5000)
        assert cfg.validate(check_paths=False) == [
            "rate_hz must be >= 0.01 and <= 1000, got 5000.0",
            "command_blend_steps must be >= 0 and <= 1000, got 5000",
        ]
        assert node.describe_parameter("status_rate_hz").floating_point_range  # the others keep theirs
    finally:
        node.destroy_node()


@pytest.mark.ros
def test_params_file_sections_reach_the_nodes_rcl_says_they_do(rclpy_context, tmp_path):
    """section_applies against rcl itself: each key (wildcards, relative, namespaced) given to a
    node in each namespace applies exactly where rcl applies it."""
    import rclpy
    from rclpy.node import Node

    from flashrt_ros.ros.params import files_of, param_sources, unaddressed_params_files

    keys = ["/**", "/**/flashrt_node", "flashrt_node", "/flashrt_node", "/robot1/flashrt_node", "/*/flashrt_node"]
    keys += ["/robot1/*", "/**/other", "robot1/flashrt_node", "/robot1/**", "/a/**/flashrt_node"]
    sections = [f"{key}:\n  ros__parameters:\n    prompt: hit\n" for key in keys]
    # a namespace written as enclosing keys, as rcl allows
    sections += ["robot1:\n  flashrt_node:\n    ros__parameters:\n      prompt: hit\n"]
    sections += ["/a:\n  robot1:\n    flashrt_node:\n      ros__parameters:\n        prompt: hit\n"]
    sections += ["/**:\n  flashrt_node:\n    ros__parameters:\n      prompt: hit\n"]
    path, applied = tmp_path / "p.yaml", []
    for text in sections:
        path.write_text(text)
        argv = ["x", "--ros-args", "--params-file", str(path)]
        assert files_of(param_sources(argv)) == [str(path)]
        for ns in ("/", "/robot1", "/a/robot1", "/a/b/robot1"):
            context = rclpy.Context()
            rclpy.init(args=argv, context=context)
            try:
                node = Node("flashrt_node", namespace=ns, context=context)
                fqn, by_rcl = node.get_fully_qualified_name(), "prompt" in node._parameter_overrides
                node.destroy_node()
            finally:
                rclpy.shutdown(context=context)
            ours = load_yaml_parameters(path, "flashrt_node", ns) == {"prompt": "hit"}
            assert ours == by_rcl and (unaddressed_params_files([str(path)], fqn) == []) == by_rcl, (text, fqn)
            applied.append(by_rcl)
    assert 0 < sum(applied) < len(applied)  # both outcomes were exercised


def test_a_params_file_only_shared_sections_reach_is_refused(tmp_path):
    """A shared `/**` section (use_sim_time) beside a misspelt node key: a section applies, but
    none that sets this node's parameters; it would run its defaults. A `/**` section that sets
    them, or another file that names the node, addresses it."""
    from flashrt_ros.ros.params import unaddressed_params_files

    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "/**:\n  ros__parameters:\n    use_sim_time: true\nflashrt_nod:\n  ros__parameters:\n    rate_hz: 5.0\n"
    )
    fqn = "/robot1/flashrt_node"
    (problem,) = unaddressed_params_files([str(shared)], fqn)
    assert problem == (
        f"params files {shared}: only sections for every node ('/**' and the like) apply to this node {fqn}, and "
        "they set none of its parameters, so it would run its defaults; expected a section keyed "
        f"'/**/flashrt_node' or '{fqn}'"
    )
    ours = tmp_path / "ours.yaml"
    ours.write_text("/**/flashrt_node:\n  ros__parameters:\n    rate_hz: 5.0\n")
    assert unaddressed_params_files([str(shared), str(ours)], fqn) == []
    shared.write_text("/**:\n  ros__parameters:\n    use_sim_time: true\n    rate_hz: 5.0\n")
    assert unaddressed_params_files([str(shared)], fqn) == []


def _rcl_received(argv: list[str], names: list[str]) -> tuple[dict, str]:
    """What rcl itself gives a node named flashrt_node for `argv`'s ROS arguments."""
    import rclpy
    from rclpy.node import Node

    context = rclpy.Context()
    rclpy.init(args=argv, context=context)
    try:
        node = Node("flashrt_node", context=context, automatically_declare_parameters_from_overrides=True)
        received = {n: node.get_parameter(n).value for n in names if node.has_parameter(n)}
        fqn = node.get_fully_qualified_name()
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
    return received, fqn


def test_values_rcl_drops_between_params_files_and_p_are_refused(rclpy_context, tmp_path):
    """rcl merges its sources value by value only within one type: a robot overlay's
    `start_enabled: "false"` over the base file's `true` was dropped without a word and the node
    started enabled; `max_age_s: 0.25` over the base's `1` kept 1. Checked against rcl itself: a
    `-p` after the files wins, one before them loses like a file."""
    from flashrt_ros.ros.params import lost_values, param_sources

    base, overlay = tmp_path / "base.yaml", tmp_path / "robot.yaml"
    base.write_text("/**/flashrt_node:\n  ros__parameters:\n    start_enabled: true\n    max_age_s: 1\n    prompt: a\n")
    overlay.write_text(
        '/**/flashrt_node:\n  ros__parameters:\n    start_enabled: "false"\n    max_age_s: 0.25\n    prompt: b\n'
    )
    files = ["x", "--ros-args", "--params-file", str(base), "--params-file", str(overlay)]
    names = ["start_enabled", "max_age_s", "prompt"]
    cases = {  # ROS arguments -> (what rcl gives, the parameters said lost)
        "files": (files, {"start_enabled": True, "max_age_s": 1, "prompt": "b"}, ["start_enabled", "max_age_s"]),
        "-p after": (
            [*files, "-p", "start_enabled:=false", "-p", "max_age_s:=0.25"],
            {"start_enabled": False, "max_age_s": 0.25, "prompt": "b"},
            [],
        ),
        "-p before": (
            ["x", "--ros-args", "-p", "max_age_s:=0.25", "--params-file", str(base)],
            {"start_enabled": True, "max_age_s": 1, "prompt": "a"},
            [],  # the file's 1 comes last and is what the node got
        ),
    }
    for label, (argv, want, lost) in cases.items():
        received, fqn = _rcl_received(argv, names)
        assert received == want, (label, received)
        found = lost_values(param_sources(argv), fqn, received)
        assert [name for name, _ in found] == lost, (label, found)
        assert all(sentence.split(" gives ")[1].startswith(f"{name} ") for name, sentence in found), found
    received, fqn = _rcl_received(files, names)
    ((_, first), _) = lost_values(param_sources(files), fqn, received)
    assert first == (
        f"params file {overlay} gives start_enabled 'false' (string), but the node received True (bool) from an "
        "earlier source: rcl keeps a value of another type given before, without a word; expected one type for "
        "start_enabled in every params file and -p"
    )


def test_scalars_are_typed_as_rcl_types_them(rclpy_context, tmp_path):
    """The check reads a params file as rcl does, not as PyYAML does (2e-2 and y are strings
    there, a double and a bool for rcl): one file alone is never refused."""
    from flashrt_ros.ros.params import lost_values, param_sources, rcl_scalar, unaddressed_params_files

    texts = ["2e-2", "1e3", "y", "N", "on", "0x10", "010", "-7", "+5", ".inf", "-.INF", "nan", "5.", "1_000", "~"]
    texts += ["' 5'", '"3"', "[1, 2]", "[1.5, -2.0]", "[y, n]", "9223372036854775808", "1e999", "abc"]
    texts += [
        "!!str 2024",
        "!!str true",
        "0x1p3",
        "nan(1)",
        "1e-400",
        "[[1]]",
        "0x8000000000000000",
        "4.9e-324",
        "|\n      x",
    ]
    path = tmp_path / "types.yaml"
    body = "".join(f"    p{i}: {t}\n" for i, t in enumerate(texts))
    path.write_text(f"/**/flashrt_node:\n  ros__parameters:\n{body}")
    argv = ["x", "--ros-args", "--params-file", str(path)]
    received, fqn = _rcl_received(argv, [f"p{i}" for i in range(len(texts))])
    assert len(received) == len(texts)
    assert lost_values(param_sources(argv), fqn, received) == []
    assert rcl_scalar("2e-2") == 0.02 and rcl_scalar("0x10") == 16 and rcl_scalar("y") is True
    assert rcl_scalar("false", quoted=True) == "false"
    # two documents and a section given twice: rcl merges them (a single-document reader refused the file)
    multi = tmp_path / "multi.yaml"
    multi.write_text(
        "/**/flashrt_node:\n  ros__parameters:\n    prompt: a\n---\n/**/flashrt_node:\n  ros__parameters:\n"
        "    rate_hz: 5.0\n"
    )
    argv = ["x", "--ros-args", "--params-file", str(multi)]
    received, fqn = _rcl_received(argv, ["prompt", "rate_hz"])
    assert received == {"prompt": "a", "rate_hz": 5.0}
    assert lost_values(param_sources(argv), fqn, received) == [] and unaddressed_params_files([str(multi)], fqn) == []


def test_an_empty_list_over_a_list_and_a_p_for_the_bare_node_name_are_refused(rclpy_context, tmp_path):
    """A file's [] has no type, so rcl keeps an earlier file's list (the overlay's "no step limit"
    was lost); `-p flashrt_node:name:=` reaches only /flashrt_node, not /robot1/flashrt_node.
    Values of one type from shared sections are rcl's section order, not refused."""
    from flashrt_ros.ros.params import lost_values, param_sources

    base, clear, shared = tmp_path / "base.yaml", tmp_path / "clear.yaml", tmp_path / "shared.yaml"
    base.write_text("/**/flashrt_node:\n  ros__parameters:\n    action_max_step: [0.05]\n    rate_hz: 10.0\n")
    clear.write_text("/**/flashrt_node:\n  ros__parameters:\n    action_max_step: []\n")
    shared.write_text("/**:\n  ros__parameters:\n    rate_hz: 30.0\n")
    argv = ["x", "--ros-args", "--params-file", str(base), "--params-file", str(clear), "--params-file", str(shared)]
    received, fqn = _rcl_received(argv, ["action_max_step", "rate_hz"])
    assert received["action_max_step"] == [0.05]
    ((name, found),) = lost_values(param_sources(argv), fqn, received)
    assert name == "action_max_step" and found.startswith(
        f"params file {clear} gives action_max_step [], but the node received [0.05]"
    ), found
    argv = ["x", "--ros-args", "-r", "__ns:=/robot1", "-p", "flashrt_node:start_enabled:=false"]
    received, fqn = _rcl_received(argv, ["start_enabled"])
    assert received == {} and fqn == "/robot1/flashrt_node"
    assert lost_values(param_sources(argv), fqn, received) == [
        (
            "start_enabled",
            "-p flashrt_node:start_enabled:=false reaches only /flashrt_node, not this node /robot1/flashrt_node; "
            "expected -p start_enabled:=... (or the value in a params file section for the node)",
        )
    ]


def test_rtc_settings_are_checked():
    """Real-time chunking's numbers and words, and the Jacobian only the reference can take."""
    found = problems(rtc_max_guidance=0.0, rtc_schedule="cosine", rtc_delay_steps=-3, rtc_jacobian="full")
    assert "rtc_max_guidance must be > 0 and <= 100, got 0.0" in found
    assert "rtc_schedule must be one of exp, linear, ones, zeros, got 'cosine'" in found
    assert "rtc_delay_steps must be -1 (from the latency) or 0..10000, got -3" in found
    assert "rtc_jacobian must be one of identity, exact, got 'full'" in found
    exact = problems(rtc=True, rtc_jacobian="exact")
    assert exact == [
        "rtc_jacobian 'exact' differentiates through the expert, which only backend 'reference' can (backend is "
        "'auto'); expected rtc_jacobian 'identity' or backend 'reference'"
    ]
    assert problems(rtc=True, rtc_jacobian="exact", backend="reference") == []
    assert problems(rtc_jacobian="exact") == []  # rtc off: nothing uses it


def test_each_ranged_parameters_description_gives_its_upper_bound():
    """`--help` and `ros2 param describe` print these descriptions: "s > 0" for max_age_s hid that
    7200 is refused."""
    from flashrt_ros.ros.params import NUMBER_RANGES, PARAMETERS

    for name, (_, high, _) in NUMBER_RANGES.items():
        assert f"{high:g}" in PARAMETERS[name].description, (name, PARAMETERS[name].description)


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(),
    reason="checks device cuda refused without a CUDA GPU (with one, it is taken)",
)
def test_device_cuda_without_a_gpu_is_said_with_the_policys_other_problems() -> None:
    """device: cuda on a CPU machine stopped the start with that alone: what the policy's files
    refuse (here a prompt longer than the policy takes) came only at the next start."""
    from flashrt_ros.ros.params import NodeConfig
    from flashrt_ros.ros.startup import StartupError, build_pipeline_state

    cfg = NodeConfig(device="cuda", prompt="stack the blocks " * 60)  # pi05_tiny takes 96 prompt tokens
    with pytest.raises(StartupError) as err:
        build_pipeline_state(cfg)
    text = str(err.value)
    assert text.startswith("device 'cuda' requested but torch sees no CUDA device; "), text
    assert "prompt" in text.split("; use device: cpu or auto; ", 1)[1], text


def test_prefix_period_zero_is_refused():
    assert any("prefix_period_s must be > 0" in p for p in problems(prefix_period_s=0.0))


@pytest.mark.parametrize(
    "values",
    [
        {"rate_hz": 1000.0},
        {"status_rate_hz": 1000.0},
        {"max_age_s": 3600.0},
        {"step_duration_s": 60.0},
        {"rate_hz": 0.01},
        {"command_rate_hz": 0.01},
        {"command_rate_hz": 1000.0},
        {"command_blend_steps": 1000},
        {"rtc_delay_steps": 10_000},
    ],
)
def test_documented_range_ends_are_accepted(values):
    assert problems(**values) == []


def test_crossed_limits_of_a_later_joint_are_refused():
    got = problems(joint_names=["a", "b"], action_lower_limits=[0.0, 1.0], action_upper_limits=[2.0, 0.5])
    assert any("not below action_upper_limits for b (1.0 >= 0.5)" in p for p in got), got


def test_fp8_with_backend_auto_is_accepted():
    assert problems(fp8="prefix_mlp", precision="bfloat16", backend="auto") == []
    assert any("fp8" in p for p in problems(fp8="prefix_mlp", precision="bfloat16", backend="reference"))


@pytest.mark.parametrize("device", ["cuda:0", "cuda:1", "cuda:10"])
def test_cuda_n_is_accepted(device):
    assert problems(device=device) == []


@pytest.mark.parametrize("device", ["cuda:01", "cuda:\u0663", "cuda:", "cuda:-1"])
def test_a_device_index_torch_would_refuse_is_refused_here(device):
    """torch.device refuses "cuda:01" and a non-ASCII digit: the node says so at start (exit 2), not the GPU build."""
    assert problems(device=device) == [f"device must be auto, cpu, cuda or cuda:N, got {device!r}"]


def test_as_many_joints_as_the_policy_takes_are_accepted():
    names = [f"j{i}" for i in range(32)]  # pi05_tiny: state_dim = action_dim = 32
    assert problems(joint_names=names) == []
    assert problems(joint_names=names[:2], action_joint_names=names) == []
    assert any("takes at most 32" in p for p in problems(joint_names=[*names, "x"]))


def test_a_blank_joint_name_is_refused():
    assert any("joint_names has an empty name" in p for p in problems(joint_names=["a", " "]))


def test_a_group_topic_with_spaces_around_it_is_accepted():
    got = problems(
        joint_names=["a", "b"],
        trajectory_groups=["arm/joint_trajectory = a, b"],
        command_rate_hz=50.0,
        command_groups=["arm/commands =a"],
    )
    assert got == []


def test_a_group_without_a_topic_is_refused():
    got = problems(joint_names=["a", "b"], trajectory_groups=["=a, b"])
    assert any("expected 'TOPIC=joint, joint, ...'" in p for p in got), got


def test_booleans_are_not_numbers():
    assert any("seed must be an integer, got bool" in p for p in problems(seed=True))
    assert any("rate_hz must be a number, got bool" in p for p in problems(rate_hz=True))
    got = problems(joint_names=["a"], action_max_step=[True])
    assert any("action_max_step must be a list of numbers" in p for p in got), got


def test_a_foreign_name_is_not_taken_for_a_typo():
    from flashrt_ros.ros.params import did_you_mean

    assert did_you_mean(["joints", "image_topic", "frame_prefix"]) == ""
    assert did_you_mean(["rate_h"]) == " did you mean rate_hz for rate_h?"


def test_p_empty_list_after_a_file_list_is_no_lost_value(tmp_path):
    from flashrt_ros.ros.params import lost_values

    path = tmp_path / "p.yaml"
    path.write_text("flashrt_node:\n  ros__parameters:\n    action_max_step: [0.1]\n")
    sources = [("file", str(path)), ("arg", "action_max_step", "[]")]
    # what the node received does not matter to the rule: -p's [] is no file's []
    assert lost_values(sources, "/flashrt_node", {"action_max_step": [0.1]}) == []


def test_p_with_the_node_name_reaches_the_node():
    from flashrt_ros.ros.params import lost_values

    sources = [("arg", "flashrt_node:rate_hz", "5.0")]
    assert lost_values(sources, "/flashrt_node", {"rate_hz": 5.0}) == []
    far = lost_values([("arg", "flashrt_node:rate_hz", "5.0")], "/robot1/flashrt_node", {})
    assert far and "reaches only /flashrt_node" in far[0][1]


def test_a_namespace_wide_section_alone_is_said(tmp_path):
    from flashrt_ros.ros.params import unaddressed_params_files

    path = tmp_path / "p.yaml"
    path.write_text("/robot1/*:\n  ros__parameters:\n    use_sim_time: true\n")
    got = unaddressed_params_files([str(path)], "/robot1/flashrt_node")
    assert len(got) == 1 and "only sections for every node" in got[0], got
