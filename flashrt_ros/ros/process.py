"""Process life of our nodes: spin until SIGINT/SIGTERM, then stop cleanly.

Shared by flashrt_node and synthetic_sensors (and the benchmark), so both shut down the same
way: stop spinning, wait for callbacks in flight, destroy the node, shut rclpy down.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.executors import ExternalShutdownException

POLL_S = 0.1  # longest a signal waits for the executor's wait to return


def spin_until_signal(executor: Any) -> None:
    """Spin until SIGINT or SIGTERM (``ros2 launch`` stops nodes with SIGINT, then SIGTERM).
    Call after ``rclpy.init(signal_handler_options=SignalHandlerOptions.NO)``: rclpy's own
    handlers shut the context down first, so nothing - e.g. the final stats line - could be
    logged to /rosout on the way out.

    The handler only sets a flag, checked between short waits: raising KeyboardInterrupt from
    it (Python's default) lands at any bytecode of the executor's own code, e.g. between taking
    a lock and the ``try`` that releases it, and can leave the executor unable to stop."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    # Both explicitly: a process started in the background by a script inherits SIGINT as
    # ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop.is_set() and executor.context.ok():
            executor.spin_once(timeout_sec=POLL_S)
    except ExternalShutdownException:
        pass


def stop_executor(executor: Any) -> None:
    """After spinning stopped: let the callbacks already handed to the thread pool (a decision
    in flight, queued sensor messages) finish, then shut the executor down, so that the node is
    never destroyed under them. rclpy 7.1.6's ``shutdown()`` does not wait (it tests the flag
    it has just set) and destroys the guard condition that a queued callback triggers when it
    starts: shut down first, such a callback raised InvalidHandle ("The following exception was
    never retrieved: cannot use Destroyable ..." at exit). So the pool is joined first."""
    pool = getattr(executor, "_executor", None)  # MultiThreadedExecutor's ThreadPoolExecutor
    if pool is not None:
        pool.shutdown(wait=True)
    executor.shutdown()


def run_until_signal(node: Any, executor: Any, on_stop: Callable[[], None] | None = None) -> int:
    """Spin `node` on `executor` until a signal; `on_stop` runs before anything is torn down."""
    executor.add_node(node)
    try:
        spin_until_signal(executor)
        if on_stop is not None:
            on_stop()
    finally:
        stop_executor(executor)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
