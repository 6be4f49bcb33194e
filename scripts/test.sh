#!/usr/bin/env bash
# The test command (README, CI): sets up the development venv (scripts/setup_env.sh:
# idempotent, a second or so when nothing changed), then ruff, then the pytest suite. Extra arguments go to pytest instead of the default `test`,
# e.g. `bash scripts/test.sh test/test_interfaces.py -k roundtrip`.
#
# DDS discovery stays on this machine, and the run gets its own ROS_DOMAIN_ID (60-101, from
# the PID, unless set) so that parallel runs do not see each other. Not above 101: a higher
# domain's DDS ports fall in Linux's ephemeral range, where any socket may hold them (ROS 2's
# "About Domain ID"); the demo and the node benches take 20-59. FLASHRT_REQUIRE_ROS=1 makes
# `ros` tests fail instead of skipping when rclpy or the interfaces are missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp   # the venv's only one (a shell's Cyclone DDS would fail every ROS test)
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$((60 + $$ % 42))}"
export FLASHRT_REQUIRE_ROS="${FLASHRT_REQUIRE_ROS:-1}"
[ $# -gt 0 ] || set -- test

echo "[test] ruff check ."
ruff check .

echo "[test] pytest $* (ROS_DOMAIN_ID=$ROS_DOMAIN_ID, discovery $ROS_AUTOMATIC_DISCOVERY_RANGE)"
rc=0
# the slowest tests at the end of the log: CI must stay well under its 30 minutes
python -m pytest -q --timeout="${FLASHRT_TEST_TIMEOUT:-600}" --durations=15 "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[test] FAILED: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
