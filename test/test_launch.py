"""launch/flashrt.launch.py (launch and launch_ros are not installable here): it parses, declares
the documented arguments, and every executable and parameters file it names exists in the
repository and is installed by CMakeLists.txt; run on recording stand-ins for launch and
launch_ros, it starts each node with what its arguments say; the YAML files load, parse as ROS
parameter files, and validate against the nodes' parameter checks."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flashrt_ros.ros.params import PARAMETERS, NodeConfig, load_yaml_parameters

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch" / "flashrt.launch.py"
CONFIGS = sorted((REPO / "config").glob("*.yaml"))


def launch_tree() -> ast.Module:
    return ast.parse(LAUNCH.read_text(), filename=str(LAUNCH))


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == name
    ]


def keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return ast.literal_eval(kw.value) if isinstance(kw.value, ast.Constant) else kw.value
    return None


# ---- CMakeLists.txt install() rules ----------------------------------------------------------


def cmake_installs() -> dict[str, set[str]]:
    """{'programs': {repo paths installed to lib/<pkg>}, 'share': {repo dirs installed to share/<pkg>}}.
    Understands install(PROGRAMS ...), install(DIRECTORY ...) and foreach(var items) around them."""
    text = re.sub(r"#[^\n]*", "", (REPO / "CMakeLists.txt").read_text())
    loops = {m.group(1): m.group(2).split() for m in re.finditer(r"foreach\(\s*(\w+)\s+([^)]*)\)", text)}
    out: dict[str, set[str]] = {"programs": set(), "share": set()}
    for body in re.findall(r"\binstall\(([^)]*)\)", text):
        words = body.split()
        if "DESTINATION" not in words:
            continue
        kind, dest = words[0], words[words.index("DESTINATION") + 1]
        items = words[1 : words.index("DESTINATION")]
        expanded = []
        for item in items:
            var = re.fullmatch(r"\$\{(\w+)\}", item)
            expanded += loops.get(var.group(1), []) if var else [item]
        if kind == "PROGRAMS" and dest == "lib/${PROJECT_NAME}":
            out["programs"].update(expanded)
        if kind == "DIRECTORY" and dest == "share/${PROJECT_NAME}":
            out["share"].update(e.rstrip("/") for e in expanded)
    return out


# ---- the launch file -------------------------------------------------------------------------


def test_launch_file_parses_and_declares_its_arguments():
    tree = launch_tree()
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in functions
    declared = {
        ast.literal_eval(c.args[0]) for c in calls(tree, "DeclareLaunchArgument") if isinstance(c.args[0], ast.Constant)
    }
    expected = {"params_file", "namespace", "use_synthetic", "synthetic_params_file", "remappings"}
    expected |= {"use_sim_time", "start_enabled", "lifecycle", "autostart", "fastdds_profile", "log_level"}
    assert declared == expected, declared
    overrides = launch_function("NODE_OVERRIDES")  # declared in a loop, one argument each
    docs = (REPO / "docs" / "ros.md").read_text()
    for name in declared:  # the launch file's docstring and docs/ros.md's table name each of them
        assert f"    {name} " in LAUNCH.read_text() and f"| `{name}` |" in docs, name
    assert f"    {', '.join(overrides)}\n" in LAUNCH.read_text()
    assert f"| {', '.join(f'`{n}`' for n in overrides)} |" in docs


def test_node_parameter_arguments():
    """The launch arguments named after flashrt_node parameters: each is one of its string
    parameters (the node checks the value at start), and only the non-empty ones are set."""
    overrides, pick = launch_function("NODE_OVERRIDES"), launch_function("node_overrides")
    assert overrides and set(overrides) <= set(PARAMETERS)
    for name in overrides:
        assert isinstance(getattr(NodeConfig(), name), str), name
    given = {name: "" for name in overrides} | {"checkpoint": "/models/pi05", "prompt": "yes"}
    assert pick(given) == {"checkpoint": "/models/pi05", "prompt": "yes"}
    assert pick({name: " " for name in overrides}) == {}
    with pytest.raises(ValueError, match="not an overridable flashrt_node parameter: rate_hz"):
        pick({"rate_hz": "5"})


def test_every_executable_exists_and_is_installed():
    tree = launch_tree()
    nodes = calls(tree, "Node")
    named = {keyword(n, "executable") for n in nodes}
    by_flag = launch_function("NODE_EXECUTABLES")  # the policy node's, by the `lifecycle` argument
    assert by_flag == {False: "flashrt_node", True: "flashrt_lifecycle_node"}
    executables = {e for e in named if isinstance(e, str)} | set(by_flag.values())
    assert executables == {"flashrt_node", "flashrt_lifecycle_node", "synthetic_sensors"}
    assert 'executable=NODE_EXECUTABLES[parse_flag("lifecycle", arg("lifecycle"))]' in LAUNCH.read_text()
    installed = cmake_installs()["programs"]
    for exe in executables:
        script = REPO / "scripts" / "ros" / exe
        assert script.is_file(), f"launch names {exe}, but {script} does not exist"
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert f"scripts/ros/{exe}" in installed, f"{exe} is not installed by CMakeLists.txt install(PROGRAMS)"
        module = {"flashrt_node": "node", "flashrt_lifecycle_node": "lifecycle_node"}.get(exe, exe)
        assert f"from flashrt_ros.ros.{module} import main" in script.read_text()
    # the console that prints what the node publishes, for `ros2 run` (not launched)
    echo = REPO / "scripts" / "ros" / "flashrt_echo"
    assert os.access(echo, os.X_OK) and "scripts/ros/flashrt_echo" in installed
    assert "from flashrt_ros.ros.echo import main" in echo.read_text()
    packages = {keyword(n, "package") for n in nodes}
    assert all(isinstance(p, ast.Name) and p.id == "PACKAGE" for p in packages)
    assert 'PACKAGE = "flashrt_ros"' in LAUNCH.read_text()


def test_every_config_file_it_names_exists_and_is_installed():
    tree = launch_tree()
    named = {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and str(c.value).endswith(".yaml")}
    assert named == {"flashrt.yaml", "synthetic_sensors.yaml"}
    for name in named:
        assert (REPO / "config" / name).is_file(), name
    joins = [c for c in calls(tree, "join") if any(isinstance(a, ast.Constant) and a.value == "config" for a in c.args)]
    assert joins, "config files are expected under the package share's config/ folder"
    share = cmake_installs()["share"]
    assert {"launch", "config"} <= share, f"CMakeLists.txt installs {share} to share/flashrt_ros"


def launch_function(name: str):
    """One of the launch file's plain functions (and its constants), run without launch itself."""
    tree = launch_tree()
    # plain `import x` (os) too; `from launch ...` imports are left out: launch is not installable here
    body = [n for n in tree.body if isinstance(n, ast.Assign | ast.Import) or getattr(n, "name", None) == name]
    namespace: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(LAUNCH), "exec"), namespace)  # noqa: S102
    return namespace[name]


def test_flag_and_log_level_arguments():
    flag, level = launch_function("parse_flag"), launch_function("parse_log_level")
    assert [flag("use_synthetic", t) for t in ("true", "False", " YES ", "0")] == [True, False, True, False]
    assert flag("use_sim_time", "", empty="unset") == "unset" and flag("use_sim_time", "TRUE", empty="x") is True
    with pytest.raises(ValueError, match=r"use_synthetic must be true or false \(any case\), got ''"):
        flag("use_synthetic", "")
    with pytest.raises(ValueError, match=r"use_sim_time must be true or false \(any case\), or empty, got 'on'"):
        flag("use_sim_time", "on", empty="unset")
    assert level("WARN") == "warn" and level("fatal") == "fatal"
    with pytest.raises(ValueError, match="log_level must be one of debug, info, warn, error, fatal"):
        level("verbose")


def test_path_arguments_must_name_files(tmp_path, monkeypatch):
    """launch_ros drops a params file that does not exist with a warning and starts the node on
    its defaults (the random-weight policy): the launch refuses the path instead."""
    existing = launch_function("existing_file")
    params = tmp_path / "robot.yaml"
    params.write_text("flashrt_node:\n  ros__parameters: {}\n")
    assert existing("params_file", f" {params} ", "YAML") == str(params)
    with pytest.raises(ValueError, match=r"params_file '/nope.yaml' is not a file; expected YAML"):
        existing("params_file", "/nope.yaml", "YAML")
    with pytest.raises(ValueError, match="is not a file"):
        existing("synthetic_params_file", str(tmp_path), "YAML")  # a folder
    monkeypatch.setenv("HOME", str(tmp_path))  # `~` as typed in `params_file:=~/robot.yaml`
    assert existing("params_file", "~/robot.yaml", "YAML") == str(params)


def test_the_node_exiting_ends_the_launch_and_synthetic_runs_get_the_large_message_profile():
    """A node that exits (a bad checkpoint: status 1 or 2) left the sensors publishing and the
    error scrolled away; with use_synthetic and no fastdds_profile, three 640x480 cameras lost
    frames on the default transport (11-26 Hz of 30)."""
    tree = launch_tree()
    for name in ("flashrt_node", "synthetic_sensors"):  # the node waited on for absent inputs, too
        (node,) = [n for n in calls(tree, "Node") if keyword(n, "name") == name]
        on_exit = keyword(node, "on_exit")
        assert isinstance(on_exit, ast.Call) and on_exit.func.id == "_ends_launch", name
        assert [a.value for a in on_exit.args] == [name]
    assert calls(tree, "Shutdown"), "the launch must end with either node"
    # a node that failed fails the launch (Shutdown alone: status 0, so systemd or a script saw success)
    failure = launch_function("exit_failure")
    assert failure("flashrt_node", 2, False) == "flashrt_node exited with status 2 (its lines above say why)"
    assert failure("flashrt_node", 0, False) is None  # ~/ shutdown of the lifecycle node
    assert failure("flashrt_node", -15, True) is None  # stopped by the launch itself (Ctrl-C)
    assert '"config", "fastdds_large_messages.xml"' in LAUNCH.read_text()
    assert (REPO / "config" / "fastdds_large_messages.xml").is_file()


def test_a_misspelt_launch_argument_is_named():
    """launch drops an argument it does not declare without a word: `param_file:=robot.yaml` ran
    the node on the embedded default. One close to ours is named; others may be a parent's."""
    tree = launch_tree()
    constants = [c.args[0].value for c in calls(tree, "DeclareLaunchArgument") if isinstance(c.args[0], ast.Constant)]
    declared = constants + list(launch_function("NODE_OVERRIDES"))
    assert {"params_file", "checkpoint", "use_synthetic"} <= set(declared)
    misspelt = launch_function("misspelt_arguments")
    given = {"param_file": "robot.yaml", "checkpont": "/models/x", "robot_ip": "10.0.0.2", "params_file": "a"}
    given |= {"ros_namespace": "/robot1", "ros_remaps": []}  # launch_ros' own, under PushRosNamespace
    assert misspelt(given, declared) == [
        "launch argument 'checkpont' is not one of this file's; did you mean 'checkpoint'? (ignored)",
        "launch argument 'param_file' is not one of this file's; did you mean 'params_file'? (ignored)",
    ]
    assert '"declared": declared' in LAUNCH.read_text()


class _Recorded:
    """A launch action or launch_ros Node, as the launch file made it: its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.name = args[0] if args else None  # a DeclareLaunchArgument's


def launched(monkeypatch, **given: str) -> tuple[dict[str, dict], list[str]]:
    """The launch file run as `ros2 launch` runs it - generate_launch_description(), then its
    OpaqueFunction with the declared arguments' defaults and `given` - on recording stand-ins for
    launch and launch_ros (not installable here): each node's keyword arguments by name, and the
    warnings logged."""
    import importlib.util
    import types

    warnings: list[str] = []

    def module(name: str, **attrs) -> None:
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(__name__=name, **attrs))

    class LaunchConfiguration:
        def __init__(self, name: str):
            self.name = name

        def perform(self, context) -> str:
            return context.launch_configurations[self.name]

    module("launch", LaunchDescription=list)
    module("launch.actions", DeclareLaunchArgument=_Recorded, OpaqueFunction=_Recorded, Shutdown=_Recorded)
    module("launch.logging", get_logger=lambda _: types.SimpleNamespace(warning=warnings.append))
    module("launch.substitutions", LaunchConfiguration=LaunchConfiguration)
    module("launch_ros")
    module("launch_ros.actions", Node=_Recorded)
    module("ament_index_python")
    module("ament_index_python.packages", get_package_share_directory=lambda _: str(REPO))  # config/ as installed
    spec = importlib.util.spec_from_file_location("flashrt_launch", LAUNCH)
    launch_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch_file)
    *arguments, opaque = launch_file.generate_launch_description()
    config = {a.args[0]: a.kwargs["default_value"] for a in arguments} | given
    context = types.SimpleNamespace(launch_configurations=config, is_shutdown=False)
    nodes = opaque.kwargs["function"](context, **opaque.kwargs["kwargs"])
    return {n.kwargs["name"]: n.kwargs for n in nodes}, warnings


def test_the_launch_arguments_reach_the_nodes(monkeypatch, tmp_path):
    """What each node is started with, from the launch file's own code: the arguments over the
    params file (launch_ros applies the parameters in order, the last wins), the namespace,
    remappings and log level on both nodes, and the executable by `lifecycle`."""
    monkeypatch.delenv("FASTRTPS_DEFAULT_PROFILES_FILE", raising=False)
    nodes, warnings = launched(monkeypatch)
    (node,) = nodes.values()
    assert (node["executable"], node["namespace"], node["remappings"]) == ("flashrt_node", "", [])
    assert node["parameters"] == [str(REPO / "config" / "flashrt.yaml")]
    assert node["ros_arguments"] == ["--log-level", "info"] and node["additional_env"] is None
    assert warnings == []

    params = tmp_path / "robot.yaml"
    params.write_text("flashrt_node:\n  ros__parameters: {}\n")
    nodes, warnings = launched(
        monkeypatch,
        params_file=str(params),
        namespace="robot1",
        use_synthetic="true",
        remappings="cam_high/image_raw:=/camera/color/image_raw",
        use_sim_time="TRUE",
        start_enabled="false",
        lifecycle="yes",
        autostart="true",
        log_level="WARN",
        checkpoint="/models/pi05_aloha",
        prompt="fold the towel",
        param_file="typo.yaml",
    )
    node, sensors = nodes["flashrt_node"], nodes["synthetic_sensors"]
    overrides = {
        "checkpoint": "/models/pi05_aloha",
        "prompt": "fold the towel",
        "start_enabled": False,
        "autostart": True,
    }
    assert node["parameters"] == [str(params), {"use_sim_time": True}, overrides]  # the file first: the rest win
    assert sensors["parameters"] == [str(REPO / "config" / "synthetic_sensors.yaml"), {"use_sim_time": True}]
    assert (node["executable"], sensors["executable"]) == ("flashrt_lifecycle_node", "synthetic_sensors")
    profile = {"FASTRTPS_DEFAULT_PROFILES_FILE": str(REPO / "config" / "fastdds_large_messages.xml")}
    for each in (node, sensors):
        assert (each["namespace"], each["ros_arguments"]) == ("robot1", ["--log-level", "warn"])
        assert each["remappings"] == [("cam_high/image_raw", "/camera/color/image_raw")]
        assert each["additional_env"] == profile
    assert warnings == ["launch argument 'param_file' is not one of this file's; did you mean 'params_file'? (ignored)"]
    with pytest.raises(ValueError, match="params_file '/nope.yaml' is not a file"):
        launched(monkeypatch, params_file="/nope.yaml")


def test_remappings_argument_parser():
    parse = launch_function("parse_remappings")
    assert parse("") == []
    assert parse("cam_high/image_raw:=/camera/color/image_raw; joint_states:=/robot/joint_states") == [
        ("cam_high/image_raw", "/camera/color/image_raw"),
        ("joint_states", "/robot/joint_states"),
    ]
    assert parse("a:=b,c:=d") == [("a", "b"), ("c", "d")]
    with pytest.raises(ValueError, match="'a=b' is not of the form from:=to"):
        parse("a=b")


def test_package_declares_launch_dependencies():
    xml = (REPO / "package.xml").read_text()
    for dep in ("launch", "launch_ros", "ament_index_python"):
        assert f"<exec_depend>{dep}</exec_depend>" in xml, dep


# ---- the parameter files ---------------------------------------------------------------------


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_yaml_loads(path):
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and data
    for section in data.values():
        assert "ros__parameters" in section


@pytest.mark.parametrize("name", ["flashrt.yaml", "pi05_example.yaml"])
def test_node_config_files_name_only_its_parameters(name):
    """`from_yaml` drops names it does not know: a misspelt key in an example would pass the
    checks above and be ignored by the node (with a warning) on every robot that copies it."""
    from flashrt_ros.ros.params import load_yaml_parameters, unknown_names

    given = load_yaml_parameters(REPO / "config" / name)
    assert given and unknown_names(set(given)) == []


def test_default_config_validates_including_paths():
    cfg = NodeConfig.from_yaml(REPO / "config" / "flashrt.yaml")
    assert cfg.validate() == []
    # max_age_s: the default (0.5) suits a full-size chunk (1 s); the tiny policy's 0.2 s chunks,
    # decided every 0.1 s, want inputs at most 0.1 s old (else a start-up warning, and chunks can end early)
    assert cfg.max_age_s + 1 / cfg.rate_hz <= cfg.step_duration_s * 10
    assert cfg == NodeConfig.from_values({**NodeConfig().as_dict(), "camera_transports": ["raw"] * 3, "max_age_s": 0.1})


def test_real_checkpoint_example_validates_except_its_placeholder_paths():
    cfg = NodeConfig.from_yaml(REPO / "config" / "pi05_example.yaml")
    assert cfg.validate(check_paths=False) == []
    assert cfg.policy == "pi05" and cfg.checkpoint and cfg.tokenizer and cfg.precision == "bfloat16"


@pytest.mark.ros  # synthetic_sensors imports rclpy
def test_synthetic_sensors_config_matches_the_node_config():
    from flashrt_ros.ros.synthetic_sensors import SensorConfig

    sensors = SensorConfig.from_values(
        load_yaml_parameters(REPO / "config" / "synthetic_sensors.yaml", "synthetic_sensors")
    )
    assert sensors.validate() == []
    node = NodeConfig.from_yaml(REPO / "config" / "flashrt.yaml")
    assert sensors.camera_topics == node.camera_topics
    assert sensors.joint_state_topic == node.joint_state_topic
    assert sensors.joint_names == node.joint_names


@pytest.mark.ros
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses_as_a_ros_parameters_file(path, ros_env):
    """rcl's own YAML parser (stricter than PyYAML: e.g. no mixed-type lists)."""
    from rclpy.context import Context

    context = Context()
    context.init(["--ros-args", "--params-file", str(path)])  # raises RCLError on a bad file
    context.try_shutdown()


@pytest.mark.parametrize(
    "exe,flag", [("flashrt_node", "--help"), ("flashrt_lifecycle_node", "--help"), ("synthetic_sensors", "-h")]
)
def test_help_prints_the_parameters_and_starts_nothing(ros_env, exe, flag):
    """`--help` / `-h` (also after `--ros-args ... --`) prints every parameter with its default
    and exits 0 before rclpy starts: no policy is built, nothing is published (synthetic_sensors
    would otherwise put fake joint states on the shell's ROS domain)."""
    from flashrt_ros.ros.params import PARAMETERS
    from flashrt_ros.ros.synthetic_sensors import PARAMETER_HELP

    for args in ([flag], ["--ros-args", "-p", "rate_hz:=5.0", "--", flag]):
        done = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "ros" / exe), *args],
            env=ros_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(f"usage: ros2 run flashrt_ros {exe} "), done.stdout
        names = PARAMETER_HELP if exe == "synthetic_sensors" else PARAMETERS
        for name in names:
            assert f"\n  {name} " in done.stdout, (name, done.stdout)
        assert "publishing" not in done.stdout + done.stderr and "[INFO]" not in done.stdout + done.stderr
        if exe != "synthetic_sensors":  # defaults as a params file writes them, not as Python prints them
            assert re.search(r"\n  start_enabled +true: ", done.stdout), done.stdout
            assert "True" not in done.stdout and "False" not in done.stdout, done.stdout


@pytest.mark.parametrize("exe", ["flashrt_node", "flashrt_lifecycle_node", "synthetic_sensors"])
def test_arguments_outside_ros_args_are_refused(ros_env, exe):
    """`flashrt_node --params-file robot.yaml` (no `--ros-args`): rcl ignores it and the node ran on
    its defaults, the random-weight policy, without a word. Refused with exit 2 and the right form."""
    for args in (["--params-file", "config/pi05_example.yaml"], ["-p", "policy:=pi05"], ["--ros-args", "--", "x"]):
        done = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "ros" / exe), *args],
            env=ros_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        stray = [a for a in args if a not in ("--ros-args", "--")]
        assert f"{exe}: unexpected arguments {stray} outside --ros-args" in done.stderr, done.stderr
        assert f"{exe} --ros-args --params-file FILE -p NAME:=VALUE" in done.stderr
        assert "[INFO]" not in done.stdout + done.stderr
