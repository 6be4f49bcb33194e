"""A small console for the demo: prints the node's action chunks and status lines.

``python -m flashrt_ros.ros.echo [--node /flashrt_node] [--duration 15] [--every 10]``
(installed as ``ros2 run flashrt_ros flashrt_echo``)

Prints one line per chunk (id, shape, latency, input age, first action row) and one per
PipelineStatus (counts, then p50/p90/p99 per stage, and the commands of ``~/joint_command``
received since the last status where the node streams them). With ``--duration`` it exits by
itself, with status 0 only if at least one well-formed chunk arrived - the demo's success check.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import rclpy
from rclpy._rclpy_pybind11 import RCLError, UnknownROSArgsError
from rclpy.exceptions import InvalidNamespaceException, InvalidNodeNameException, InvalidTopicNameException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.utilities import remove_ros_args
from std_msgs.msg import Float64MultiArray

from flashrt_ros.msg import ActionChunk, PipelineStatus
from flashrt_ros.ros.early_stop import STOP_SIGNALS
from flashrt_ros.ros.input_error import REASONS
from flashrt_ros.ros.joint_convert import stamp_to_ns
from flashrt_ros.ros.params import ConfigError, rcl_reason, rclpy_parameter_refusals

INPUT_REASONS = REASONS | {"absent"}
"""What an input topic's counters are; anything else keyed by a name is a service's or the prompt's."""
SILENT_S = 3.0  # the default of --hint-after
"""After this long with no chunk, say whether anything publishes them (a wrong --node is silent)."""


LATENCY_WINDOW = 10_000
"""The summary's median inference latency is over the last this many chunks: a console left
running for days holds a bounded list."""


def malformed(msg: ActionChunk) -> str | None:
    """What is wrong with a chunk whose actions do not fill horizon x action_dim, or None. Another
    publisher on the topic (this node's chunks always match): said, not crashed on, not counted."""
    values = np.frombuffer(msg.actions, dtype=np.float32).size
    if msg.horizon < 1 or msg.action_dim < 1 or values != msg.horizon * msg.action_dim:
        return f"{values} action values for horizon {msg.horizon} x action_dim {msg.action_dim}"
    return None


def chunk_line(msg: ActionChunk, received_ns: int = 0) -> str:
    """One line per chunk; `received_ns`: this console's clock when it arrived (0: unknown), against
    which the newest input's stamp gives the age of what the chunk was computed from."""
    problem = malformed(msg)
    if problem is not None:
        return f"chunk {msg.chunk_id:5d}  malformed: {problem}"
    actions = np.frombuffer(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
    newest_input_ns = max((stamp_to_ns(s) for s in msg.source_stamps), default=0)
    age_ms = (received_ns - newest_input_ns) / 1e6 if newest_input_ns and received_ns else float("nan")
    row = " ".join(f"{v:+.3f}" for v in actions[0, :7]) + (" ..." if msg.action_dim > 7 else "")
    reused = " (prefix re-used" + _frames_behind(msg) + ")" if msg.prefix_reused else ""
    if msg.rtc_overlap:
        reused += f" (rtc: {msg.rtc_held_actions} held, {msg.rtc_overlap} overlap)"
    return (
        f"chunk {msg.chunk_id:5d}  {msg.horizon}x{msg.action_dim}  latency {msg.inference_latency_ms:6.2f} ms{reused}  "
        f"newest input {age_ms:6.1f} ms old on arrival  first action [{row}]"
    )


def _frames_behind(msg: ActionChunk) -> str:
    """How far the oldest camera frame of a chunk is stamped before its joint state (the last
    source): under prefix_trigger period a re-used prefix can be that much older."""
    if len(msg.source_stamps) < 2:
        return ""
    stamps = [stamp_to_ns(s) for s in msg.source_stamps]
    lag_ms = (stamps[-1] - min(stamps[:-1])) / 1e6
    if lag_ms < 0:  # every frame stamped after the joint state
        return f", frames {-lag_ms:.1f} ms after the joint state"
    return f", frames up to {lag_ms:.1f} ms before the joint state"


def status_line(msg: PipelineStatus) -> str:
    skipped = sum(c.count for c in msg.invalid_inputs if c.reason == "dropped_decision")
    # absent: waits for a topic with nothing good yet, not rejected messages (the node's stats line
    # counts them apart too)
    # an input's refusals (a service's, e.g. unknown_capsule on ~/capsule/restore, are node-wide)
    counts = [c for c in msg.invalid_inputs if c.topic and c.reason in INPUT_REASONS]
    invalid = ", ".join(f"{c.reason} {c.topic}: {c.count}" for c in counts if c.reason != "absent") or "none"
    waits = ", ".join(f"{c.topic}: {c.count}" for c in counts if c.reason == "absent")
    invalid += f"; waits for absent {waits}" if waits else ""
    node_wide = [
        f"{c.reason}: {c.count}" if not c.topic else f"{c.reason} {c.topic}: {c.count}"
        for c in msg.invalid_inputs
        if (not c.topic or c.reason not in INPUT_REASONS) and c.reason != "dropped_decision"
    ]
    invalid += f"; node: {', '.join(node_wide)}" if node_wide else ""
    stages = " | ".join(
        f"{s.name} {s.latency_p50_ms:.2f}/{s.latency_p90_ms:.2f}/{s.latency_p99_ms:.2f}" for s in msg.stages
    )
    stages = stages or "(no decision yet)"
    rate = msg.stages[0].rate_hz if msg.stages else 0.0
    paused = " PAUSED (~/enable false, or a lifecycle node inactive)," if not msg.enabled else ""
    rate_text = f" ({rate:.1f} Hz)" if msg.enabled else ""  # paused, the rate of before only decays
    return (
        f"status  {msg.policy} {msg.device} {msg.precision}:{paused} {msg.decisions} decisions{rate_text}, "
        f"{skipped} skipped, {msg.deadline_misses} deadline misses, {msg.prefix_reuses} re-used the prefix, "
        f"{f'{msg.rtc_guided} guided (rtc), ' if msg.rtc_guided else ''}input refusals: {invalid}\n"
        f"        ms p50/p90/p99: {stages}"
    )


def command_line(count: int, seconds: float, last: Float64MultiArray, intervals: int | None = None) -> str:
    """The commands received since the last status line: how many, their rate (`intervals` over
    `seconds`: one fewer than `count` in the first window, which starts at the first command),
    the last one."""
    row = " ".join(f"{v:+.3f}" for v in last.data[:7]) + (" ..." if len(last.data) > 7 else "")
    intervals = count if intervals is None else intervals
    rate = f" ({intervals / seconds:.1f} Hz)" if seconds > 0 and intervals > 0 else ""
    return f"        commands: {count} since the last status{rate}, last [{row}]"


@dataclass
class ChunkRun:
    """Chunks whose ids went up, one after the other, and when the first and last arrived."""

    first_id: int
    last_id: int
    count: int
    first_at: float
    last_at: float


class Echo(Node):
    def __init__(self, node: str, every: int, quiet: bool, **node_kwargs):
        super().__init__("flashrt_echo", **node_kwargs)
        self.every, self.quiet = max(every, 1), quiet
        self.received = 0  # well-formed chunks
        self.malformed = 0  # chunks whose actions do not fill horizon x action_dim: printed, not counted
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)  # inference ms of the last chunks
        # runs of chunk ids that go up: a new one when they start again (the node restarted or was
        # reset, a capsule restored)
        self.runs: list[ChunkRun] = []
        self.topic = f"{node}/action_chunk"
        self.create_subscription(ActionChunk, self.topic, self._on_chunk, 10)
        self.create_subscription(PipelineStatus, f"{node}/status", self._on_status, 10)
        self.commands = 0  # all received
        self._commands_shown = 0  # up to the last status line
        self._last_command: Float64MultiArray | None = None
        self._status_at = time.monotonic()
        self.last_status: PipelineStatus | None = None
        self._said_publishers = False  # more than one node publishes the chunks: said once
        self.create_subscription(Float64MultiArray, f"{node}/joint_command", self._on_command, 10)

    def _on_command(self, msg: Float64MultiArray) -> None:
        if not self.commands:  # the first window's rate counts from the first command
            self._status_at = time.monotonic()
        self.commands += 1
        self._last_command = msg

    def _on_chunk(self, msg: ActionChunk) -> None:
        if not self._said_publishers and self.count_publishers(self.topic) > 1:  # two demos on one domain
            self._said_publishers = True
            print(
                f"echo: {self.count_publishers(self.topic)} publishers of {self.topic}: chunks of more than one node "
                "(another on this ROS domain?) are printed and counted together",
                flush=True,
            )
        if malformed(msg) is not None:
            self.malformed += 1
            if not self.quiet:  # the summary counts them
                print(chunk_line(msg), flush=True)
            return
        now = time.monotonic()
        # with two publishers their ids interleave: one run, no restarts (said above)
        again = bool(self.runs) and msg.chunk_id <= self.runs[-1].last_id and not self._said_publishers
        if again and not self.quiet:
            print(
                f"echo: chunk ids started again ({self.runs[-1].last_id} -> {msg.chunk_id}): the node restarted or was "
                "reset, or a capsule was restored",
                flush=True,
            )
        if not self.runs or again:
            self.runs.append(ChunkRun(msg.chunk_id, msg.chunk_id, 0, now, now))
        run = self.runs[-1]
        run.last_id, run.count, run.last_at = msg.chunk_id, run.count + 1, now
        self.received += 1
        self.latencies.append(msg.inference_latency_ms)
        if not self.quiet and (self.received - 1) % self.every == 0:
            now = self.get_clock().now().nanoseconds
            print(chunk_line(msg, now), flush=True)

    def _on_status(self, msg: PipelineStatus) -> None:
        now = time.monotonic()
        if not self.quiet:
            new = self.commands - self._commands_shown
            intervals = new - 1 if self._commands_shown == 0 else new  # the first window opens at a command
            extra = "\n" + command_line(new, now - self._status_at, self._last_command, intervals) if new else ""
            print(status_line(msg) + extra, flush=True)
        self._commands_shown, self._status_at = self.commands, now
        self.last_status = msg

    def summary(self) -> str:
        bad = f", {self.malformed} malformed" if self.malformed else ""
        if not self.received:
            paused = self.last_status is not None and not self.last_status.enabled
            return "echo: no action chunks received" + (" (the node was paused)" if paused else "") + bad
        # the rate within each run (to its last chunk: a node that stopped), not across a restart's gap
        span = sum(run.last_at - run.first_at for run in self.runs)
        rate = sum(run.count - 1 for run in self.runs) / span if span > 0 else 0.0
        latency = np.median(self.latencies)
        over = f" (the last {len(self.latencies)})" if self.received > len(self.latencies) else ""
        commands = f", {self.commands} commands" if self.commands else ""
        ids = ", ".join(f"{run.first_id}..{run.last_id}" for run in self.runs)
        return (
            f"echo: received {self.received} chunks ({rate:.1f} Hz), ids {ids}, "
            f"median inference latency {latency:.2f} ms{over}{commands}{bad}"
        )

    def _lifecycle(self, node: str) -> bool:
        """Whether `node` offers a lifecycle node's ~/get_state (a plain one publishes nothing only
        while it loads its policy)."""
        ns, _, name = node.rpartition("/")
        try:
            services = self.get_service_names_and_types_by_node(name, ns or "/")
        except Exception:  # gone meanwhile
            return False
        return any(s == f"{node}/get_state" for s, _ in services)

    def silence_hint(self) -> str:
        """Why nothing arrives, as far as the graph and the node's status tell: paused (its status
        says so), a node there that publishes nothing (a lifecycle node not configured), no
        publisher of the topic (a wrong --node or namespace: the other nodes seen are listed), or
        one that has not published."""
        node = self.resolve_topic_name(self.topic).removesuffix("/action_chunk")
        if self.last_status is not None and not self.last_status.enabled:
            return (
                f"echo: {node} is paused (its ~/status: enabled false): ros2 service call {node}/enable "
                f"std_srvs/srv/SetBool '{{data: true}}' (a lifecycle node: ros2 lifecycle set {node} activate)"
            )
        if self.count_publishers(self.topic):
            return f"echo: {self.topic} has a publisher but no chunk came yet (inputs missing? see its ~/status)"
        seen = sorted(f"{ns.rstrip('/')}/{n}" for n, ns in self.get_node_names_and_namespaces() if n != self.get_name())
        if node in seen and self._lifecycle(node):
            return (
                f"echo: {node} is running but publishes no {self.topic}: a lifecycle node not configured yet? "
                f"ros2 lifecycle set {node} configure (then activate)"
            )
        return (
            f"echo: no publisher of {self.topic} yet (nodes seen: {', '.join(seen) or 'none'}); "
            "check --node, or the node is still starting (loading its policy)"
        )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _every(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `... | head`: the reader is gone; no traceback, no more output
        _stdout_gone()
        return 0


def _stdout_gone() -> None:
    """The reader of stdout is gone: what is still printed, Python's flush at exit too, goes nowhere."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="ros2 run flashrt_ros flashrt_echo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node", default="/flashrt_node", help="node whose ~/action_chunk and ~/status to print")
    parser.add_argument("--duration", type=_seconds, default=0.0, help="exit after this many seconds (0 = Ctrl-C)")
    parser.add_argument("--every", type=_every, default=1, help="print every Nth chunk")
    parser.add_argument("--quiet", action="store_true", help="print only the summary at the end")
    parser.add_argument(
        "--hint-after",
        type=_seconds,
        default=SILENT_S,
        help="seconds without a chunk before saying why (no publisher, or one that has not published)",
    )
    try:
        rest = remove_ros_args(argv)[1:]
    except (RCLError, UnknownROSArgsError) as exc:
        print(f"echo: cannot start: the ROS arguments are invalid: {rcl_reason(exc)}", file=sys.stderr)
        return 2
    args = parser.parse_args(rest)
    # the entry script's import-time handlers (early_stop) exit at once: from here a signal ends
    # the loop below and the summary is printed (rclpy's own handlers chain to these)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.SIGHUP in STOP_SIGNALS:  # else early_stop's handler stays: "not starting", status 0
        signal.signal(signal.SIGHUP, signal.default_int_handler)
    try:
        rclpy.init(args=argv)
        with rclpy_parameter_refusals():  # `-p use_sim_time:=7`: one sentence, not rclpy's traceback
            node = Echo(args.node.rstrip("/") or "/", args.every, args.quiet)
    except ConfigError as exc:
        print(f"echo: cannot start: {'; '.join(exc.problems)}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    except (
        RCLError,
        UnknownROSArgsError,
        InvalidTopicNameException,
        InvalidNodeNameException,
        InvalidNamespaceException,
    ) as exc:
        print(f"echo: cannot start: {rcl_reason(exc)} (--node {args.node!r}, ROS arguments)", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    except KeyboardInterrupt:  # a signal while rclpy starts (the handler above raises it): no chunk, status 1
        print("echo: not starting: stopped by a signal", file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    start = time.monotonic()
    deadline = start + args.duration if args.duration > 0 else float("inf")
    hint, hint_at = "", start  # said again when it changes (a node found later, a status that says paused)
    try:
        while rclpy.ok() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
            now = time.monotonic()
            if not node.received and now - hint_at > args.hint_after:
                hint_at, said = now, hint
                hint = node.silence_hint()
                if hint != said:
                    print(hint, flush=True)
    except (KeyboardInterrupt, ExternalShutdownException, BrokenPipeError):  # the last: `| head` closed
        pass
    finally:
        try:
            print(node.summary(), flush=True)
        except BrokenPipeError:
            _stdout_gone()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0 if node.received else 1


if __name__ == "__main__":
    sys.exit(main())
