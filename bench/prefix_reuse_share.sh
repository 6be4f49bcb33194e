#!/usr/bin/env bash
# How many of the node's decisions re-use the prefix on moving synthetic sensors (CPU is enough:
# the share depends on the inputs, not on the speed, as long as the node keeps its rate).
#
#   bash bench/prefix_reuse_share.sh [POLICY] [CAMERA_HZ] [RATE_HZ] [SECONDS] [TRIGGER] [PERIOD_S]
#        (defaults: pi0_tiny 10 30 35 new_inputs 0.1; after `source scripts/env.sh`)
#
# synthetic_sensors publishes 3 cameras together (64x48 rgb8, small enough for a CPU decision to
# keep RATE_HZ) and 14 joints on slow sinusoids at 200 Hz; flashrt_node runs config/flashrt.yaml
# with POLICY, RATE_HZ, prefix_trigger TRIGGER and prefix_period_s PERIOD_S; the console's last
# status line gives decisions and re-uses.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
policy="${1:-pi0_tiny}" camera_hz="${2:-10}" rate_hz="${3:-30}" seconds="${4:-35}"
trigger="${5:-new_inputs}" period_s="${6:-0.1}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$((20 + $$ % 40))}" PYTHONUNBUFFERED=1
logs="$(mktemp -d)"
python -m flashrt_ros.ros.synthetic_sensors --ros-args --params-file config/synthetic_sensors.yaml \
  -p image_width:=64 -p image_height:=48 -p "camera_rate_hz:=$camera_hz" > "$logs/sensors.log" 2>&1 &
sensors=$!
python -m flashrt_ros.ros.node --ros-args --params-file config/flashrt.yaml -p "policy:=$policy" \
  -p "rate_hz:=$rate_hz" -p "prefix_trigger:=$trigger" -p "prefix_period_s:=$period_s" \
  -p stats_log_period_s:=0.0 > "$logs/node.log" 2>&1 &
node=$!
stop() {  # INT, then KILL what is still there after 10 s
  kill -INT "$node" "$sensors" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$node" 2>/dev/null || kill -0 "$sensors" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$node" "$sensors" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop EXIT
python -m flashrt_ros.ros.echo --duration "$seconds" --every 100000 > "$logs/echo.log" 2>&1 || true
echo "$policy, cameras at $camera_hz Hz, rate_hz $rate_hz, prefix_trigger $trigger (prefix_period_s $period_s), $seconds s (logs: $logs):"
if ! grep "^status" "$logs/echo.log" | tail -1 | grep .; then
  echo "no status received; the node's log ends:" >&2
  tail -5 "$logs/node.log" >&2
  exit 1
fi
