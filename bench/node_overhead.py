"""Benchmark (not a test) of flashrt_node's own overhead: from the arrival of the newest input a
decision used to the publication of its chunk, minus the policy's compute.

    python bench/node_overhead.py [--duration 20] [--out out/]    (after `source scripts/env.sh`)

Set-up, as on a robot: ``synthetic_sensors`` in another process publishes 3 cameras at 640x480
rgb8 (30 Hz) and 14 joint states at 200 Hz; a subscriber (``flashrt_ros.ros.echo``) in a
third process receives the chunks; the node runs here, on the CPU, with the embedded default
policy and a MultiThreadedExecutor, exactly as ``flashrt_node`` does, so its internal timings
can be read without a window limit.

Reported (median / p90 / p99 over every decision after the warm-up):
  node_overhead       converting the newest input + the decision callback - policy compute
  input_wait          the newest converted input waiting for the decision timer (rate-bound)
  arrival_to_publish  both together: newest input's arrival -> chunk published, minus compute
  convert <topic>     each message's conversion + validation in its callback
  policy stages       preprocess / prefix / denoise / postprocess, for reference
Writes JSON with the commit, versions and settings.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from flashrt_ros.bench.args import number_above, out_problem  # noqa: E402  (stdlib only: checked before the run)

# Fast DDS puts messages larger than its shared-memory segment (512 KiB by default) on UDP in
# fragments; best-effort readers then lose whole 900 KB frames under load (measured here: 30 Hz
# cameras arrive at ~25 Hz). A 16 MiB segment delivers all of them. Robots want the same.
FASTDDS_PROFILE = """<?xml version="1.0" encoding="UTF-8" ?>
<profiles xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles">
  <transport_descriptors>
    <transport_descriptor>
      <transport_id>shm_16mib</transport_id>
      <type>SHM</type>
      <segment_size>16777216</segment_size>
    </transport_descriptor>
  </transport_descriptors>
  <participant profile_name="large_messages" is_default_profile="true">
    <rtps>
      <userTransports><transport_id>shm_16mib</transport_id></userTransports>
      <useBuiltinTransports>true</useBuiltinTransports>
    </rtps>
  </participant>
</profiles>
"""
HEADER = f"{'what':<46} {'median':>8} {'p90':>8} {'p99':>8} {'n':>6}   (ms)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=number_above(0.0), default=20.0, help="measured seconds")
    p.add_argument("--warmup", type=number_above(0.0), default=4.0, help="seconds before measuring")
    p.add_argument("--rate", type=number_above(0.0), default=10.0, help="decision rate_hz")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--camera-rate", type=number_above(0.0), default=30.0)
    p.add_argument("--joint-rate", type=number_above(0.0), default=200.0)
    p.add_argument("--encoding", default="rgb8", choices=["rgb8", "bgr8", "jpeg"])
    p.add_argument(
        "--default-dds",
        action="store_true",
        help="keep Fast DDS's default 512 KiB shared-memory segment (frames then drop)",
    )
    p.add_argument("--out", default=None, help="folder for the JSON result")
    args = p.parse_args(argv)
    if args.out is not None and out_problem(Path(args.out)):
        p.error(out_problem(Path(args.out)))
    return args


def start_peers(args: argparse.Namespace, env: dict[str, str]) -> list[subprocess.Popen]:
    sensors = [
        sys.executable,
        "-m",
        "flashrt_ros.ros.synthetic_sensors",
        "--ros-args",
        "-p",
        f"image_width:={args.width}",
        "-p",
        f"image_height:={args.height}",
        "-p",
        f"camera_rate_hz:={args.camera_rate}",
        "-p",
        f"joint_rate_hz:={args.joint_rate}",
        "-p",
        f"encoding:={args.encoding}",
    ]
    listener = [
        sys.executable,
        "-m",
        "flashrt_ros.ros.echo",
        "--quiet",
        "--duration",
        str(args.warmup + args.duration + 10),
    ]
    logs = Path(tempfile.mkdtemp(prefix="flashrt_bench_peers_"))
    procs = []
    for name, cmd in (("synthetic_sensors", sensors), ("echo", listener)):
        with open(logs / f"{name}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        procs[-1].log_path = logs / f"{name}.log"  # type: ignore[attr-defined]
    return procs


def peers_problem(procs: list[subprocess.Popen]) -> str | None:
    """A peer that has exited (synthetic_sensors refusing its parameters): the bench would measure
    an idle node. Its exit code and last lines, or None while both run."""
    for proc in procs:
        if proc.poll() is not None:
            path = proc.log_path  # type: ignore[attr-defined]
            tail = "\n  ".join(path.read_text(errors="replace").splitlines()[-5:])
            return f"{path.stem} exited with code {proc.returncode} during the warm-up; its last lines:\n  {tail}"
    return None


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(2)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fresh_stats(node) -> tuple[int, int, int, int]:
    """Start measuring now: new, unbounded timing windows (the warm-up is dropped); returns the
    counts (decisions, deadline misses, dropped decisions, invalid inputs) to subtract later."""
    from flashrt_ros.engine.stats import PipelineStats

    big = 10**7
    with node._lock:
        node.node_stats = PipelineStats(big)
        node.conversion_stats = PipelineStats(big)
        node.state.pipeline.stats = PipelineStats(big)
        counts = (node.decisions, node.deadline_misses, node.dropped_decisions, *input_problems(node))
    return counts


def input_problems(node) -> tuple[int, int]:
    """(inputs refused, waits for an input with nothing good yet), as the node's status tells them
    apart: a wait is not a bad input. Called under the node's lock."""
    from flashrt_ros.ros import messages
    from flashrt_ros.ros.node import ABSENT

    refused, waits, _ = messages.split_counts(node.invalid, ABSENT, node._input_topics)
    return refused, waits


def measure(args: argparse.Namespace, peers: list[subprocess.Popen]) -> dict | str:
    """The node's timings over the measured seconds, or why there are none (a peer exited)."""
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.node import FlashRTNode
    from flashrt_ros.ros.process import stop_executor

    rclpy.init()
    node = FlashRTNode(
        stats_window=10**7,
        parameter_overrides=[Parameter("rate_hz", value=args.rate), Parameter("stats_log_period_s", value=0.0)],
    )
    executor = MultiThreadedExecutor(num_threads=node.callback_threads)  # as flashrt_node's main()
    executor.add_node(node)
    stop = threading.Event()

    def spin() -> None:  # short waits, so that it stops before the executor's pool is shut down
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.1)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        time.sleep(args.warmup)
        if problem := peers_problem(peers):
            return problem
        before = fresh_stats(node)
        cpu0, wall0 = _cpu_seconds(), time.monotonic()
        time.sleep(args.duration)
        cpu1, wall1 = _cpu_seconds(), time.monotonic()
        stop.set()
        spinner.join()  # (it submitted to a shut-down pool: "cannot schedule new futures after shutdown")
        stop_executor(executor)  # no decision may add to the statistics while they are read
        with node._lock:
            after = (node.decisions, node.deadline_misses, node.dropped_decisions, *input_problems(node))
            conversions = node.conversion_stats.summaries()
        node_stages = node.node_stats.summaries()
        policy_stages = node.state.pipeline.stats.summaries()
    finally:
        stop.set()
        spinner.join()
        stop_executor(executor)
        node.destroy_node()
        rclpy.try_shutdown()
    seconds = wall1 - wall0
    decisions, misses, dropped, refused, waits = (a - b for a, b in zip(after, before, strict=True))
    return {
        "seconds": seconds,
        "decisions": decisions,
        "decision_rate_hz": decisions / seconds,
        "deadline_misses": misses,
        "dropped_decisions": dropped,
        "inputs_refused": refused,
        "absent_input_waits": waits,
        "node_process_cpu_percent": 100 * (cpu1 - cpu0) / seconds,
        "node": [_row(s) for s in node_stages],
        "conversions": [_row(s, rate=True) for s in conversions],
        "policy": [_row(s) for s in policy_stages],
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _row(summary, rate: bool = False) -> dict:
    row = {
        "name": summary.name,
        "n": summary.count,
        "median_ms": summary.p50_ms,
        "p90_ms": summary.p90_ms,
        "p99_ms": summary.p99_ms,
    }
    if rate:
        row["rate_hz"] = summary.rate_hz
    return row


def print_table(result: dict, args: argparse.Namespace) -> None:
    print(
        f"\nnode overhead, {args.duration:g} s at rate_hz {args.rate:g}: 3 cameras {args.width}x{args.height} "
        f"{args.encoding} at {args.camera_rate:g} Hz + joints at {args.joint_rate:g} Hz (synthetic_sensors)"
    )
    print(HEADER)
    groups = [("", result["node"]), ("convert ", result["conversions"]), ("policy ", result["policy"])]
    for prefix, rows in groups:
        for r in rows:
            name = prefix + r["name"] + (f" ({r['rate_hz']:.0f} Hz)" if "rate_hz" in r else "")
            print(f"{name:<46} {r['median_ms']:8.3f} {r['p90_ms']:8.3f} {r['p99_ms']:8.3f} {r['n']:6d}")
    print(
        f"decisions {result['decisions']} ({result['decision_rate_hz']:.2f} Hz), deadline misses "
        f"{result['deadline_misses']}, skipped {result['dropped_decisions']}, inputs refused "
        f"{result['inputs_refused']}, waits for absent inputs {result['absent_input_waits']}, node process CPU "
        f"{result['node_process_cpu_percent']:.0f}%"
    )
    median = next((r["median_ms"] for r in result["node"] if r["name"] == "node_overhead"), None)
    if median is None:
        print("node_overhead: no decision in the measured seconds (no inputs? see the counts above)")
    else:
        print(f"node_overhead median {median:.3f} ms: {'meets' if median < 1.0 else 'MISSES'} the < 1 ms target")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # DDS stays on this machine
    # its own domain, not the shell's (a robot's): synthetic sensors and a deciding node run here
    os.environ["ROS_DOMAIN_ID"] = os.environ.get("FLASHRT_BENCH_DOMAIN_ID", str(20 + os.getpid() % 40))
    if not args.default_dds and "FASTRTPS_DEFAULT_PROFILES_FILE" not in os.environ:
        profile = Path(tempfile.mkdtemp(prefix="flashrt_bench_")) / "fastdds.xml"
        profile.write_text(FASTDDS_PROFILE)
        os.environ["FASTRTPS_DEFAULT_PROFILES_FILE"] = str(profile)
    env = dict(os.environ)
    sys.path.insert(0, str(REPO))
    peers = start_peers(args, env)
    try:
        result = measure(args, peers)
    finally:
        stop(peers)
    if isinstance(result, str):
        print(f"node_overhead: {result}", file=sys.stderr)
        return 1
    print_table(result, args)
    if args.out:
        import torch

        from flashrt_ros.bench.timing import write_result

        settings = vars(args) | {
            "policy": "pi05_tiny (embedded default)",
            "device": "cpu",
            "cameras": 3,
            "ros_domain_id": env["ROS_DOMAIN_ID"],
            "executor": "MultiThreadedExecutor",
            "fastdds_profile": "16 MiB shared-memory segment" if not args.default_dds else "default",
        }
        versions = {"rclpy": _version("rclpy"), "numpy": _version("numpy"), "cpus": os.cpu_count()}
        # a suffix where two runs finish in one second; NaN as null (strict JSON)
        cpu = torch.device("cpu")
        write_result(Path(args.out), "node_overhead", cpu, settings=settings, versions=versions, result=result)
    return 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in (f"ros-jazzy-{package}", package):  # the ROS wheel's own version first
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


if __name__ == "__main__":
    sys.exit(main())
