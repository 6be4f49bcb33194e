#!/usr/bin/env bash
# The main job (README): the node with the embedded default policy on synthetic cameras and joint
# states, printing the action chunks it publishes and the per-stage latency.
#
#   bash scripts/demo.sh [SECONDS]        (or DURATION=30 bash scripts/demo.sh; default 15)
#
# SECONDS counts from the start, the node's start-up (a few seconds) included.
# Sets up .venv itself (scripts/setup_env.sh), keeps DDS on this machine with its own
# ROS_DOMAIN_ID (20-59, whatever the shell exports; FLASHRT_DEMO_DOMAIN_ID sets it), starts synthetic_sensors, flashrt_node (config/flashrt.yaml) and a console
# (flashrt_ros.ros.echo), stops them all on exit (also on Ctrl-C), and exits 0 only if action
# chunks were received.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  echo "usage: bash scripts/demo.sh [SECONDS]   (the run's length, start-up included; default 15)" >&2
  exit 2
fi
DURATION="${1:-${DURATION:-15}}"
if ! [[ "$DURATION" =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ "$DURATION" =~ ^0+([.]0+)?$ ]]; then
  echo "demo.sh: the duration (first argument, or DURATION) must be a number of seconds > 0, got '$DURATION'" >&2
  exit 2
fi

bash scripts/setup_env.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
# its own domain, not the shell's: on a robot computer whose ROS_DOMAIN_ID is the robot's, the synthetic
# /joint_states and cameras would reach robot_state_publisher and the rest (FLASHRT_DEMO_DOMAIN_ID picks one)
export ROS_DOMAIN_ID="${FLASHRT_DEMO_DOMAIN_ID:-$((20 + $$ % 40))}"   # 20-59: apart from the tests' 60-101
export RCUTILS_COLORIZED_OUTPUT=0 RCUTILS_LOGGING_BUFFERED_STREAM=0 PYTHONUNBUFFERED=1
# 640x480 frames at 30 Hz arrive whole over Fast DDS with a larger shared-memory segment (docs/ros.md,
# "Large images over Fast DDS"); without it some are lost in fragments
export FASTRTPS_DEFAULT_PROFILES_FILE="${FASTRTPS_DEFAULT_PROFILES_FILE:-$ROOT/config/fastdds_large_messages.xml}"

pids=()
cleanup() {
  local pid
  # TERM, which the nodes treat as INT: background jobs start with INT ignored, so one still
  # importing (before it sets its handlers) would drop an INT and be killed 10 s later
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP  # a closed terminal: the nodes stop as on Ctrl-C

echo "[demo] ROS_DOMAIN_ID=$ROS_DOMAIN_ID, discovery $ROS_AUTOMATIC_DISCOVERY_RANGE, running ${DURATION} s"
echo "[demo] synthetic_sensors: 3 cameras 640x480 rgb8 at 30 Hz, 14 joints at 200 Hz"
# the prefixers ignore Ctrl-C and a hang-up, so that they live to print the nodes' last lines (the final stats)
python -m flashrt_ros.ros.synthetic_sensors --ros-args --params-file config/synthetic_sensors.yaml \
  > >(trap '' INT HUP; sed -u 's/^/[sensors] /') 2>&1 &
pids+=($!)
echo "[demo] flashrt_node: config/flashrt.yaml (embedded tiny pi0.5, random weights, CPU, inputs at most 0.1 s old:" \
  "its chunks last 0.2 s), commands at 50 Hz, real-time chunking on"
python -m flashrt_ros.ros.node --ros-args --params-file config/flashrt.yaml -p stats_log_period_s:=5.0 \
  -p command_rate_hz:=50.0 -p rtc:=true \
  > >(trap '' INT HUP; sed -u 's/^/[node] /') 2>&1 &
node=$!
pids+=("$node")

# the console in the background, waited for: bash runs the INT / TERM traps only between
# commands, so a console in the foreground held off a SIGTERM until its duration ran out
rc=0
# the node takes a few seconds to load its policy: no hint about a missing publisher meanwhile
python -m flashrt_ros.ros.echo --node /flashrt_node --duration "$DURATION" --every 10 --hint-after 20 &
console=$!
pids+=("$console")
# whichever ends first: a node that exits at start (a bad parameter) ends the demo with its status
first="$console"
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501 )); then  # `wait -n -p` (bash 5.1; Ubuntu 24.04 has 5.2)
  wait -n -p first "$node" "$console" || rc=$?
else
  wait "$console" || rc=$?
fi
if [ "$first" = "$node" ]; then
  sleep 0.5  # its last lines through the prefixer
  echo "[demo] FAILED: flashrt_node exited with status $rc before the run's end (see the [node] lines above)" >&2
  [ "$rc" -ne 0 ] || rc=1
elif [ "$rc" -eq 0 ]; then
  echo "[demo] OK: action chunks received"
else
  echo "[demo] FAILED: no action chunks received in ${DURATION} s, start-up included (see the [node] lines)" >&2
fi
exit "$rc"
