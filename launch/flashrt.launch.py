"""Start flashrt_node with a parameters file; optionally the synthetic sensors too.

    ros2 launch flashrt_ros flashrt.launch.py                          # embedded default policy
    ros2 launch flashrt_ros flashrt.launch.py use_synthetic:=true      # + cameras and joints
    ros2 launch flashrt_ros flashrt.launch.py params_file:=/path/robot.yaml namespace:=robot1 \\
        remappings:="cam_high/image_raw:=/camera/color/image_raw;joint_states:=/robot/joint_states"

Arguments:
    params_file            flashrt_node parameters (default: the package's config/flashrt.yaml)
    namespace              namespace of both nodes; relative topic names resolve inside it
    use_synthetic          true: also start synthetic_sensors (for demos without a robot)
    synthetic_params_file  its parameters (default: config/synthetic_sensors.yaml)
    remappings             "from:=to" pairs separated by ";" (or ","), applied to both nodes
    log_level              debug | info | warn | error
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
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


def _nodes(context):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    remappings = parse_remappings(arg("remappings"))
    common = dict(
        namespace=arg("namespace"),
        remappings=remappings,
        output="screen",
        emulate_tty=True,
        ros_arguments=["--log-level", arg("log_level")],
    )
    nodes = [
        Node(package=PACKAGE, executable="flashrt_node", name="flashrt_node", parameters=[arg("params_file")], **common)
    ]
    synthetic = arg("use_synthetic").strip().lower()
    if synthetic not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"use_synthetic must be true or false (any case), got {arg('use_synthetic')!r}")
    if synthetic in ("true", "1", "yes"):
        nodes.append(
            Node(
                package=PACKAGE,
                executable="synthetic_sensors",
                name="synthetic_sensors",
                parameters=[arg("synthetic_params_file")],
                **common,
            )
        )
    return nodes


def generate_launch_description():
    config = os.path.join(get_package_share_directory(PACKAGE), "config")
    return LaunchDescription(
        [
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
                "log_level",
                default_value="info",
                choices=["debug", "info", "warn", "error"],
                description="log level of the nodes",
            ),
            OpaqueFunction(function=_nodes),
        ]
    )
