"""How regular the node's command stream is while its policy runs in the same process.

The command timer shares the node's Python process with the decisions, so a decision that holds
the interpreter delays the next command. This runs, for ``--seconds``:

- the node (``config/flashrt.yaml``: ``--policy``, ``rate_hz`` ``--rate``, ``command_rate_hz``
  ``--command-rate``, ``step_duration_s`` ``--step``) on ``synthetic_sensors``, and
- a baseline: a bare rclpy node in its own process publishing the same message on a timer at
  the same rate (what this machine's timers and DDS give with no policy beside them),

and records, in this process, when each command arrives on each topic. Printed: commands, rate,
the intervals between arrivals (p50 / p90 / p99 / max, ms) and the share longer than 1.5 periods,
per source; written: JSON with the commit, machine and versions.

    python bench/command_timing.py --seconds 30 --out out/     (after `source scripts/env.sh`)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BASELINE_TOPIC = "/command_timing_baseline"


def baseline_publisher(rate_hz: float, dof: int) -> None:
    """The baseline's own process: a timer that publishes a command of `dof` values."""
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from std_msgs.msg import Float64MultiArray

    rclpy.init()
    node = rclpy.create_node("command_timing_baseline")
    pub = node.create_publisher(Float64MultiArray, BASELINE_TOPIC, 1)
    msg = Float64MultiArray(data=[0.0] * dof)
    node.create_timer(1.0 / rate_hz, lambda: pub.publish(msg))
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10.0
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def record(topics: list[str], warmup_s: float, seconds: float) -> tuple[dict[str, list[int]], int]:
    """Arrival times (monotonic ns) per topic over `seconds`, after `warmup_s`; and when the
    recording began (monotonic ns)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Float64MultiArray

    rclpy.init()
    node = rclpy.create_node("command_timing_listener")
    arrivals: dict[str, list[int]] = {t: [] for t in topics}
    recording = [False]

    def on(topic: str):
        return lambda _msg: recording[0] and arrivals[topic].append(time.monotonic_ns())

    for topic in topics:
        node.create_subscription(Float64MultiArray, topic, on(topic), 10)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    t0 = time.monotonic()
    began = t0 + warmup_s
    while time.monotonic() - t0 < warmup_s + seconds:
        recording[0] = time.monotonic() - t0 >= warmup_s
        executor.spin_once(timeout_sec=0.005)
    executor.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    return arrivals, int(began * 1e9)


def summary(arrivals: list[int], began_ns: int, rate_hz: float) -> dict[str, float]:
    """The stream's rate over the span it ran (a stream that started late in the recording is not
    a slow one: `first_after_s` says how late), and its intervals' percentiles."""
    gaps = np.diff(np.asarray(arrivals, dtype=np.int64)) / 1e6
    if len(gaps) == 0:
        return {"commands": len(arrivals)}
    period_ms = 1e3 / rate_hz
    return {
        "commands": len(arrivals),
        "rate_hz": len(gaps) / (max(arrivals[-1] - arrivals[0], 1) / 1e9),
        "first_after_s": (arrivals[0] - began_ns) / 1e9,
        "p50_ms": float(np.percentile(gaps, 50)),
        "p90_ms": float(np.percentile(gaps, 90)),
        "p99_ms": float(np.percentile(gaps, 99)),
        "max_ms": float(gaps.max()),
        "late_share": float((gaps > 1.5 * period_ms).mean()),
    }


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from flashrt_ros.bench.args import number_above, number_at_least, out_problem  # stdlib only

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="pi05_tiny")
    positive = number_above(0.0)
    parser.add_argument("--rate", type=positive, default=10.0, help="the node's rate_hz (decisions)")
    parser.add_argument("--command-rate", type=positive, default=50.0, help="command_rate_hz, and the baseline's")
    step = "step_duration_s: chunks that outlast a slow decision"
    parser.add_argument("--step", type=positive, default=0.05, help=step)
    parser.add_argument("--seconds", type=positive, default=30.0)
    parser.add_argument("--warmup", type=number_at_least(0.0), default=5.0, help="seconds before recording (start-up)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON")
    parser.add_argument("--baseline-publisher", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.out is not None and out_problem(args.out):
        parser.error(out_problem(args.out))
    if args.baseline_publisher:
        baseline_publisher(args.command_rate, 14)
        return 0
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    # its own domain, not the shell's (a robot's): synthetic sensors and a deciding node run here
    os.environ["ROS_DOMAIN_ID"] = os.environ.get("FLASHRT_BENCH_DOMAIN_ID", str(20 + os.getpid() % 40))
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"command_timing_{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    procs = [
        start(
            [python, "-m", "flashrt_ros.ros.synthetic_sensors", "--ros-args", "--params-file",
             "config/synthetic_sensors.yaml"],
            logs / "sensors.log",
        ),
        start(
            [python, "-m", "flashrt_ros.ros.node", "--ros-args", "--params-file", "config/flashrt.yaml",
             "-p", f"policy:={args.policy}", "-p", f"rate_hz:={args.rate}",
             "-p", f"command_rate_hz:={args.command_rate}", "-p", f"step_duration_s:={args.step}",
             "-p", "stats_log_period_s:=0.0"],
            logs / "node.log",
        ),
        start([python, __file__, "--baseline-publisher", "--command-rate", str(args.command_rate)], logs / "base.log"),
    ]  # fmt: skip
    topics = {
        "node (policy in the same process)": "/flashrt_node/joint_command",
        "baseline (bare timer)": BASELINE_TOPIC,
    }
    try:
        arrivals, began_ns = record(list(topics.values()), args.warmup, args.seconds)
    finally:
        stop(procs)
    rows = {name: summary(arrivals[topic], began_ns, args.command_rate) for name, topic in topics.items()}
    final = [line for line in (logs / "node.log").read_text().splitlines() if "shutting down; stats:" in line]
    node_stats = final[-1].split("stats: ", 1)[1].split(" | ")[0] if final else "(no final stats line)"
    print(
        f"command stream at {args.command_rate:g} Hz, {args.policy} deciding at {args.rate:g} Hz, "
        f"{args.seconds:g} s (logs: {logs})"
    )
    print(
        f"{'source':36s} {'commands':>8s} {'Hz':>6s} {'first':>6s} {'p50':>7s} {'p90':>7s} {'p99':>7s} {'max':>7s} "
        f"{'>1.5T':>6s}"
    )
    for name, r in rows.items():
        if "p50_ms" not in r:
            print(f"{name:36s} {r['commands']:8d}  (too few commands: see the logs)")
            continue
        print(
            f"{name:36s} {r['commands']:8d} {r['rate_hz']:6.1f} {r['first_after_s']:6.2f} {r['p50_ms']:7.2f} "
            f"{r['p90_ms']:7.2f} "
            f"{r['p99_ms']:7.2f} {r['max_ms']:7.2f} {100 * r['late_share']:5.1f}%"
        )
    print(
        "Hz: over the span the stream ran; first: its first command's seconds into the recording; intervals "
        "between arrivals, ms; >1.5T: share of intervals longer than 1.5 command periods"
    )
    print(
        f"node, whole run with its start-up and warm-up: {node_stats} "
        "(chunk_exhausted: no chunk to command from, not timer jitter)"
    )
    if args.out is not None:  # a file per run (a second run at one commit, e.g. another --rate, keeps the first)
        import torch

        from flashrt_ros.bench.timing import write_result

        settings = {k: str(v) for k, v in vars(args).items()} | {"ros_domain_id": os.environ["ROS_DOMAIN_ID"]}
        write_result(args.out, "command_timing", torch.device("cpu"), settings=settings, rows=rows, node=node_stats)
    return 0 if all("p50_ms" in r for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
