# shellcheck shell=bash
# Source me (bash/zsh): `source scripts/env.sh`. Sets up the shell for the development venv that
# scripts/setup_env.sh builds, for tests, demos and benchmarks:
#   PATH/VIRTUAL_ENV    the venv (python, pytest, ruff, flashrt)
#   AMENT_PREFIX_PATH   the venv, where our package and the ROS wheels are registered
#                       (ament_index_python.get_package_share_directory("flashrt_ros") works)
#   LD_LIBRARY_PATH     the venv's lib/ (ROS and our typesupport libraries), for non-Python tools;
#                       Python in the venv finds them anyway (ros_wheels_bootstrapper.pth)
#   ROS_*/RMW_*         Jazzy, Fast DDS, and discovery kept on this machine unless already set
# It does not set ROS_DOMAIN_ID: scripts/test.sh picks one per run; pick your own for a demo.
# shellcheck disable=SC2296  # ${(%):-%x} is zsh: the path of the sourced file
_flashrt_root="$(cd "$(dirname "${BASH_SOURCE[0]:-${(%):-%x}}")/.." && pwd)"
if [ ! -x "$_flashrt_root/.venv/bin/python" ]; then
  echo "scripts/env.sh: no $_flashrt_root/.venv; run: bash scripts/setup_env.sh" >&2
  unset _flashrt_root
  # shellcheck disable=SC2317
  return 1 2>/dev/null || exit 1
fi
# a checkout copied with its .venv: the venv's scripts and its editable install name the other
# checkout, whose code would run (setup_env.sh rebuilds such a venv)
_flashrt_made_for="$(cat "$_flashrt_root/.venv/.flashrt/venv" 2>/dev/null || true)"
if [ -n "$_flashrt_made_for" ] && [ "$_flashrt_made_for" != "$_flashrt_root/.venv" ]; then
  echo "scripts/env.sh: $_flashrt_root/.venv was made for $_flashrt_made_for; run: bash scripts/setup_env.sh" >&2
  unset _flashrt_root _flashrt_made_for
  # shellcheck disable=SC2317
  return 1 2>/dev/null || exit 1
fi
unset _flashrt_made_for
_flashrt_prepend() {  # _flashrt_prepend VAR DIR: put DIR first in the :-list VAR, once
  local cur
  eval "cur=\"\${$1:-}\""
  case ":$cur:" in
    *":$2:"*) ;;
    *) export "$1=$2${cur:+:$cur}" ;;
  esac
}
# a sourced /opt/ros (Python 3.12) on PYTHONPATH would shadow the venv's rclpy; another ros-wheels
# venv's bootstrap flag would keep its library path instead of this venv's
case ":${PYTHONPATH:-}:" in
  *:/opt/ros/*)
    echo "scripts/env.sh: PYTHONPATH entries under /opt/ros (a sourced ROS install) shadow the venv's rclpy: removed" >&2
    PYTHONPATH="$(printf '%s' "$PYTHONPATH" | tr ':' '\n' | grep -v '^/opt/ros/' | paste -sd: -)"
    if [ -n "$PYTHONPATH" ]; then export PYTHONPATH; else unset PYTHONPATH; fi
    ;;
esac
unset _ROS_WHEELS_BOOTSTRAP_COMPLETE
export VIRTUAL_ENV="$_flashrt_root/.venv"
_flashrt_prepend PATH "$VIRTUAL_ENV/bin"
_flashrt_prepend AMENT_PREFIX_PATH "$VIRTUAL_ENV"
_flashrt_prepend LD_LIBRARY_PATH "$VIRTUAL_ENV/lib"
export ROS_VERSION="${ROS_VERSION:-2}"
export ROS_PYTHON_VERSION="${ROS_PYTHON_VERSION:-3}"
export ROS_DISTRO="${ROS_DISTRO:-jazzy}"
export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
if [ ! -e "$VIRTUAL_ENV/lib/lib$RMW_IMPLEMENTATION.so" ]; then
  echo "scripts/env.sh: RMW_IMPLEMENTATION $RMW_IMPLEMENTATION is not in the venv (only rmw_fastrtps_cpp): using that" >&2
  export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
fi
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
unset -f _flashrt_prepend
unset _flashrt_root
