"""Start flashrt_node with a parameters file; optionally the synthetic sensors too.

    ros2 launch flashrt_ros flashrt.launch.py                          # embedded default policy
    ros2 launch flashrt_ros flashrt.launch.py use_synthetic:=true      # + cameras and joints
    ros2 launch flashrt_ros flashrt.launch.py params_file:=/path/robot.yaml namespace:=robot1 \\
        remappings:="cam_high/image_raw:=/camera/color/image_raw;joint_states:=/robot/joint_states"
    ros2 launch flashrt_ros flashrt.launch.py params_file:=/path/robot.yaml \\
        checkpoint:=/models/pi05_aloha tokenizer:=/models/paligemma_tokenizer.model prompt:="fold the towel"
    ros2 launch flashrt_ros flashrt.launch.py lifecycle:=true           # managed: ros2 lifecycle set ...
    ros2 launch flashrt_ros flashrt.launch.py lifecycle:=true autostart:=true  # managed, configures itself

Arguments:
    params_file            flashrt_node parameters (default: the package's config/flashrt.yaml)
    namespace              namespace of both nodes; relative topic names resolve inside it
    use_synthetic          true: also start synthetic_sensors (for demos without a robot)
    synthetic_params_file  its parameters (default: config/synthetic_sensors.yaml)
    remappings             "from:=to" pairs separated by ";" (or ","), applied to both nodes
    use_sim_time           true / false for both nodes; empty (default): as the params files say
    start_enabled          true / false over params_file; false: flashrt_node starts paused (loaded
                           and warm, nothing published until ~/enable true; the lifecycle node
                           with autostart configures and stays inactive); empty (default): as
                           params_file says
    lifecycle              true: flashrt_lifecycle_node, the managed (lifecycle) node, instead of
                           flashrt_node: it starts unconfigured, for a lifecycle manager or
                           `ros2 lifecycle set /flashrt_node configure` then `activate`
    autostart              true / false over params_file (the parameter autostart): with lifecycle:=true
                           the node configures and activates itself at start; empty (default): as
                           params_file says
    fastdds_profile        a Fast DDS XML profile for both nodes (FASTRTPS_DEFAULT_PROFILES_FILE), e.g.
                           the package's config/fastdds_large_messages.xml for 640x480 cameras at 30 Hz
                           (empty, default: that one with use_synthetic:=true unless
                           FASTRTPS_DEFAULT_PROFILES_FILE is set, none otherwise)
    log_level              debug | info | warn | error | fatal (any case)
    policy, checkpoint, tokenizer, device, precision, fp8, backend, prompt
                           flashrt_node's parameter of that name, over what params_file says;
                           empty (default): as params_file says

A params file that does not exist stops the launch (launch_ros would only warn and start the node
on its defaults: the embedded random-weight policy). When flashrt_node (or synthetic_sensors)
exits, so does the launch, and with a status other than 0 the launch fails (exit 1).
"""

import difflib
import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
from launch.logging import get_logger
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription

PACKAGE = "flashrt_ros"


def parse_remappings(text):
    """'a:=b; c:=d' -> [('a', 'b'), ('c', 'd')]; raises ValueError naming a malformed pair."""
    pairs = []
    for item in text.replace(",", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        source, sep, target = item.partition(":=")
        if not sep or not source.strip() or not target.strip():
            raise ValueError(f"remappings: {item!r} is not of the form from:=to")
        pairs.append((source.strip(), target.strip()))
    return pairs


def parse_flag(name, text, empty=None):
    """'true' / 'false' (also 1 / 0, yes / no, any case) -> bool; '' -> `empty` where allowed."""
    value = text.strip().lower()
    if value == "" and empty is not None:
        return empty
    if value not in ("true", "false", "1", "0", "yes", "no"):
        allowed = "true or false (any case)" + (", or empty" if empty is not None else "")
        raise ValueError(f"{name} must be {allowed}, got {text!r}")
    return value in ("true", "1", "yes")


LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")

# the policy node's executable by the `lifecycle` argument: plain, or managed (lifecycle)
NODE_EXECUTABLES = {False: "flashrt_node", True: "flashrt_lifecycle_node"}

# flashrt_node's string parameters that a launch argument of the same name can set: the ones
# that change from one robot or checkpoint to the next. The others stay in params_file.
NODE_OVERRIDES = ("policy", "checkpoint", "tokenizer", "device", "precision", "fp8", "backend", "prompt")


def node_overrides(values):
    """{name: launch argument text} -> the flashrt_node parameters to set over params_file: the
    non-empty ones, as strings (the node checks them at start, as it checks the file's)."""
    unknown = sorted(set(values) - set(NODE_OVERRIDES))
    if unknown:
        raise ValueError(f"not an overridable flashrt_node parameter: {', '.join(unknown)}")
    return {name: text for name, text in values.items() if text.strip()}


def existing_file(name, text, what):
    """A path argument that must name a file: launch_ros drops a missing params file with a
    warning and starts the node without it. `~` is expanded (a launch argument reaches us as
    typed: `params_file:=~/robot.yaml`), as the node expands it in checkpoint and tokenizer."""
    path = os.path.expanduser(text.strip())
    if not os.path.isfile(path):
        raise ValueError(f"{name} {text!r} is not a file; expected {what}")
    return path


def parse_log_level(text):
    level = text.strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)} (any case), got {text!r}")
    return level


def exit_failure(name, returncode, shutting_down):
    """Why a node's exit fails the launch, or None: a status other than 0 before the launch was
    shutting down (a refused parameter: 2, a policy that could not be built: 1). Shutdown alone
    ends the launch with status 0 whatever the node's, so a systemd unit or a bring-up script saw
    success."""
    if shutting_down or not returncode:
        return None
    return f"{name} exited with status {returncode} (its lines above say why)"


def _ends_launch(name):
    """A node's on_exit: the launch ends with it (not the other node running on alone), and fails
    where the node failed (exit_failure: launch reports the exception and exits 1)."""

    def on_exit(event, context):
        failure = exit_failure(name, event.returncode, context.is_shutdown)
        if failure is not None:
            raise RuntimeError(failure)
        return [Shutdown(reason=f"{name} exited")]

    return on_exit


# configurations launch and launch_ros keep beside the arguments (PushRosNamespace's ros_namespace,
# SetRemap's ros_remaps, SetParameter's global_params, emulate_tty): never a user's typo
LAUNCH_OWN = frozenset({"ros_namespace", "ros_remaps", "global_params", "emulate_tty"})


def misspelt_arguments(given, declared):
    """Launch arguments given that are not declared but look like one that is (`param_file:=`):
    launch drops an undeclared argument without a word, and the node starts on what the file (or
    the embedded default) says. Names far from ours are left alone: an including launch file's
    arguments share the scope."""
    found = []
    for name in sorted(set(given) - set(declared) - LAUNCH_OWN):
        close = difflib.get_close_matches(name, declared, n=1, cutoff=0.8)
        if close:
            found.append(f"launch argument {name!r} is not one of this file's; did you mean {close[0]!r}? (ignored)")
    return found


def _nodes(context, declared=()):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    for warning in misspelt_arguments(context.launch_configurations, declared):
        get_logger("flashrt.launch").warning(warning)

    sim_time = parse_flag("use_sim_time", arg("use_sim_time"), empty="unset")
    extra = [] if sim_time == "unset" else [{"use_sim_time": sim_time}]  # after the file: it wins
    overrides = node_overrides({name: arg(name) for name in NODE_OVERRIDES})
    start_enabled = parse_flag("start_enabled", arg("start_enabled"), empty="unset")
    if start_enabled != "unset":
        overrides["start_enabled"] = start_enabled
    autostart = parse_flag("autostart", arg("autostart"), empty="unset")
    if autostart != "unset":
        overrides["autostart"] = autostart
    synthetic = parse_flag("use_synthetic", arg("use_synthetic"))
    profile = arg("fastdds_profile").strip()
    # three 640x480 cameras at 30 Hz lose frames on the default transport; a profile the user
    # exported (FASTRTPS_DEFAULT_PROFILES_FILE: discovery server, network set-up) stays theirs
    if not profile and synthetic and not os.environ.get("FASTRTPS_DEFAULT_PROFILES_FILE"):
        profile = os.path.join(get_package_share_directory(PACKAGE), "config", "fastdds_large_messages.xml")
    if profile:
        profile = existing_file("fastdds_profile", profile, "a Fast DDS XML profile")
    params = existing_file("params_file", arg("params_file"), "flashrt_node's parameters (YAML)")
    common = dict(
        namespace=arg("namespace"),
        remappings=parse_remappings(arg("remappings")),
        output="screen",
        emulate_tty=True,
        ros_arguments=["--log-level", parse_log_level(arg("log_level"))],
        additional_env={"FASTRTPS_DEFAULT_PROFILES_FILE": profile} if profile else None,
    )
    nodes = [
        Node(
            package=PACKAGE,
            executable=NODE_EXECUTABLES[parse_flag("lifecycle", arg("lifecycle"))],
            name="flashrt_node",  # both executables: the parameters are addressed to it
            parameters=[params, *extra, *([overrides] if overrides else [])],
            on_exit=_ends_launch("flashrt_node"),  # not the sensors publishing on alone
            **common,
        )
    ]
    if synthetic:
        sensors = existing_file("synthetic_params_file", arg("synthetic_params_file"), "synthetic_sensors' parameters")
        nodes.append(
            Node(
                package=PACKAGE,
                executable="synthetic_sensors",
                name="synthetic_sensors",
                parameters=[sensors, *extra],
                on_exit=_ends_launch("synthetic_sensors"),  # the node would wait for absent inputs
                **common,
            )
        )
    return nodes


def generate_launch_description():
    config = os.path.join(get_package_share_directory(PACKAGE), "config")
    arguments = [
        DeclareLaunchArgument(
            "params_file",
            default_value=os.path.join(config, "flashrt.yaml"),
            description="flashrt_node parameters (YAML)",
        ),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the nodes"),
        DeclareLaunchArgument(
            "use_synthetic",
            default_value="false",
            description="also start synthetic_sensors (true / false, any case)",
        ),
        DeclareLaunchArgument(
            "synthetic_params_file",
            default_value=os.path.join(config, "synthetic_sensors.yaml"),
            description="synthetic_sensors parameters (YAML)",
        ),
        DeclareLaunchArgument(
            "remappings",
            default_value="",
            description='topic remappings "from:=to;from2:=to2", applied to both nodes',
        ),
        DeclareLaunchArgument(
            "use_sim_time",
            default_value="",
            description="true / false for both nodes; empty: as the params files say",
        ),
        DeclareLaunchArgument(
            "start_enabled",
            default_value="",
            description="false: flashrt_node starts paused until ~/enable true; empty: as params_file says",
        ),
        DeclareLaunchArgument(
            "lifecycle",
            default_value="false",
            description="true: the managed (lifecycle) node, which starts unconfigured (true / false, any case)",
        ),
        DeclareLaunchArgument(
            "autostart",
            default_value="",
            description="true: with lifecycle:=true the node configures and activates itself at start; "
            "empty: as params_file says",
        ),
        DeclareLaunchArgument(
            "fastdds_profile",
            default_value="",
            description="Fast DDS XML profile for both nodes (empty: config/fastdds_large_messages.xml "
            "with use_synthetic, none otherwise)",
        ),
        DeclareLaunchArgument(
            "log_level",
            default_value="info",
            description="log level of the nodes: debug, info, warn, error or fatal (any case)",
        ),
        *[
            DeclareLaunchArgument(
                name, default_value="", description=f"flashrt_node's {name}; empty: as params_file says"
            )
            for name in NODE_OVERRIDES
        ],
    ]
    declared = [a.name for a in arguments]
    return LaunchDescription([*arguments, OpaqueFunction(function=_nodes, kwargs={"declared": declared})])
