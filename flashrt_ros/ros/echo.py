"""A small console for the demo: prints the node's action chunks and status lines.

``python -m flashrt_ros.ros.echo [--node /flashrt_node] [--duration 15] [--every 10]``

Prints one line per chunk (id, shape, latency, input age, first action row) and one per
PipelineStatus (counts, then p50/p90/p99 per stage). With ``--duration`` it exits by
itself, with status 0 only if at least one chunk arrived - the demo's success check.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.utilities import remove_ros_args

from flashrt_ros.msg import ActionChunk, PipelineStatus
from flashrt_ros.ros.joint_convert import stamp_to_ns


def chunk_line(msg: ActionChunk, first: bool = False) -> str:
    actions = np.frombuffer(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
    newest_input_ns = max((stamp_to_ns(s) for s in msg.source_stamps), default=0)
    age_ms = (stamp_to_ns(msg.header.stamp) - newest_input_ns) / 1e6 if newest_input_ns else float("nan")
    row = " ".join(f"{v:+.3f}" for v in actions[0, :7]) + (" ..." if msg.action_dim > 7 else "")
    # `first`: the first chunk this console received; from a node just started, its first decision,
    # which warms the caches up (chunk ids restart at 1 after ~/reset, with the caches warm)
    note = "  (the first one received: a node's first decision warms its caches up)" if first else ""
    return (
        f"chunk {msg.chunk_id:5d}  {msg.horizon}x{msg.action_dim}  latency {msg.inference_latency_ms:6.2f} ms  "
        f"newest input {age_ms:6.1f} ms old  first action [{row}]{note}"
    )


def status_line(msg: PipelineStatus) -> str:
    skipped = sum(c.count for c in msg.invalid_inputs if c.reason == "dropped_decision")
    invalid = ", ".join(f"{c.reason} {c.topic}: {c.count}" for c in msg.invalid_inputs if c.topic) or "none"
    node_wide = [f"{c.reason}: {c.count}" for c in msg.invalid_inputs if not c.topic and c.reason != "dropped_decision"]
    invalid += f"; node: {', '.join(node_wide)}" if node_wide else ""
    stages = " | ".join(
        f"{s.name} {s.latency_p50_ms:.2f}/{s.latency_p90_ms:.2f}/{s.latency_p99_ms:.2f}" for s in msg.stages
    )
    stages = stages or "(no decision yet)"
    rate = msg.stages[0].rate_hz if msg.stages else 0.0
    return (
        f"status  {msg.policy} {msg.device} {msg.precision}: {msg.decisions} decisions ({rate:.1f} Hz), "
        f"{skipped} skipped, {msg.deadline_misses} deadline misses, invalid inputs: {invalid}\n"
        f"        ms p50/p90/p99: {stages}"
    )


class Echo(Node):
    def __init__(self, node: str, every: int, quiet: bool):
        super().__init__("flashrt_echo")
        self.every, self.quiet = max(every, 1), quiet
        self.chunks: list[tuple[int, float]] = []  # (chunk id, latency ms)
        self.first_at: float | None = None
        self.create_subscription(ActionChunk, f"{node}/action_chunk", self._on_chunk, 10)
        self.create_subscription(PipelineStatus, f"{node}/status", self._on_status, 10)

    def _on_chunk(self, msg: ActionChunk) -> None:
        self.first_at = self.first_at or time.monotonic()
        self.chunks.append((msg.chunk_id, msg.inference_latency_ms))
        if not self.quiet and (len(self.chunks) - 1) % self.every == 0:
            print(chunk_line(msg, first=len(self.chunks) == 1), flush=True)

    def _on_status(self, msg: PipelineStatus) -> None:
        if not self.quiet:
            print(status_line(msg), flush=True)

    def summary(self) -> str:
        if not self.chunks:
            return "echo: no action chunks received"
        ids = [c for c, _ in self.chunks]
        span = time.monotonic() - (self.first_at or time.monotonic())
        rate = (len(ids) - 1) / span if span > 0 else 0.0
        latency = np.median([ms for _, ms in self.chunks])
        return (
            f"echo: received {len(ids)} chunks ({rate:.1f} Hz), ids {ids[0]}..{ids[-1]}, "
            f"median inference latency {latency:.2f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="flashrt_echo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--node", default="/flashrt_node", help="node whose ~/action_chunk and ~/status to print")
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0 = Ctrl-C)")
    parser.add_argument("--every", type=int, default=1, help="print every Nth chunk")
    parser.add_argument("--quiet", action="store_true", help="print only the summary at the end")
    args = parser.parse_args(remove_ros_args(argv)[1:])
    rclpy.init(args=argv)
    node = Echo(args.node, args.every, args.quiet)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    deadline = time.monotonic() + args.duration if args.duration > 0 else float("inf")
    try:
        while rclpy.ok() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        print(node.summary(), flush=True)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0 if node.chunks else 1


if __name__ == "__main__":
    sys.exit(main())
