"""`-h` / `--help` for the ROS executables: print what the node takes and exit, before rclpy
starts anything.

Without this, `flashrt_node --help` built the policy and started deciding, and
`synthetic_sensors --help` started publishing fake joint states on whatever ROS domain the
shell was in: on a robot, beside the real ones.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Mapping

HELP_FLAGS = ("-h", "--help")


def outside_ros_args(argv: list[str]) -> list[str]:
    """The arguments outside `--ros-args ... [--]` (split by hand: rclpy's own parser would
    already read, and refuse, a broken params file)."""
    inside, outside = False, []
    for arg in argv[1:]:
        if arg == "--ros-args":
            inside = True
        elif inside and arg == "--":
            inside = False
        elif not inside:
            outside.append(arg)
    return outside


def help_requested(argv: list[str]) -> bool:
    """Whether `-h` / `--help` is among the arguments outside `--ros-args ... [--]`."""
    return any(arg in HELP_FLAGS for arg in outside_ros_args(argv))


def command_line(executable: str, argv: list[str], help_text: Callable[[], str]) -> int | None:
    """The exit code when the command line ends the program before rclpy starts: 0 after
    printing the help (`-h` / `--help`), 2 after saying why stray arguments are refused; None to
    go on."""
    if help_requested(argv):
        print(help_text())
        return 0
    refused = stray_arguments(executable, argv)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    return None


def stray_arguments(executable: str, argv: list[str]) -> str | None:
    """Why the command line is refused, or None. The nodes take no arguments of their own, and
    rcl ignores a `--params-file` or `-p` given before `--ros-args`: the node would start on its
    defaults (the random-weight policy) without a word."""
    stray = outside_ros_args(argv)
    if not stray:
        return None
    return (
        f"{executable}: unexpected arguments {stray} outside --ros-args; ROS parameters go after it, e.g. "
        f"{executable} --ros-args --params-file FILE -p NAME:=VALUE (--help lists the parameters)"
    )


def usage(executable: str, summary: str, parameters: Mapping[str, tuple[object, str]], example: str) -> str:
    """The help text: what the executable does, how to set its ROS parameters, and each parameter
    with its default and description."""
    width = max(len(name) for name in parameters)
    lines = [
        f"usage: ros2 run flashrt_ros {executable} [--ros-args (-p NAME:=VALUE | --params-file FILE) ...]",
        "",
        textwrap.fill(summary, 100),
        "",
        "parameters (default: description):",
    ]
    lines += [f"  {name:<{width}}  {_as_ros(default)}: {text}" for name, (default, text) in parameters.items()]
    lines += ["", f"example: {example}"]
    return "\n".join(lines)


def _as_ros(value: object) -> str:
    """A default as it is written in a params file or after -p NAME:= (true, not Python's True)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_as_ros(v) for v in value) + "]"
    return repr(value)
