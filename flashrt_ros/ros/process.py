"""Process life of our nodes: spin until SIGINT/SIGTERM, then stop cleanly.

Shared by flashrt_node and synthetic_sensors (and the benchmark), so both shut down the same
way: stop spinning, wait for callbacks in flight, destroy the node, shut rclpy down.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import rclpy
from rclpy._rclpy_pybind11 import RCLError
from rclpy.executors import ExternalShutdownException
from rclpy.signals import SignalHandlerOptions

from flashrt_ros.ros.params import rcl_reason

POLL_S = 0.1  # longest a signal waits for the executor's wait to return


def init_rclpy(argv: list[str], node_name: str) -> bool:
    """rclpy.init with our signal handling (see spin_until_signal). ROS arguments or a params file
    that rcl refuses (e.g. a list mixing strings and numbers) give one line naming the node, after
    rcl's own "[ERROR] [rcl]" line, and False: the caller exits 2, without a traceback."""
    try:
        rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    except RCLError as exc:
        reason = rcl_reason(exc)
        print(f"[{node_name}] not starting: the ROS arguments or a params file are invalid: {reason}", file=sys.stderr)
        return False
    return True


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


def interrupt_on_signals() -> None:
    """Before spinning (while a node is built): the first SIGINT or SIGTERM raises
    KeyboardInterrupt, for the caller to stop cleanly; later ones are ignored, so that a second
    signal (a terminal's Ctrl-C and a script's kill, a double Ctrl-C) cannot interrupt that stop
    with a traceback. Set explicitly: a process started in the background by a script inherits
    SIGINT as ignored, and would otherwise drop it until spinning starts."""

    def on_signal(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (delivered when the block ends) while something that must not
    be cut short is built: a KeyboardInterrupt inside rclpy's Executor.__init__ leaves a half-built
    executor whose __del__ prints a traceback at exit."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def drain(executor: Any) -> None:
    """Wait for the callbacks already handed to the executor's thread pool to finish."""
    pool = getattr(executor, "_executor", None)  # MultiThreadedExecutor's ThreadPoolExecutor
    if pool is not None:
        pool.shutdown(wait=True)


def stop_executor(executor: Any) -> None:
    """After spinning stopped: let the callbacks already handed to the thread pool (a decision
    in flight, queued sensor messages) finish, then shut the executor down, so that the node is
    never destroyed under them. rclpy 7.1.6's ``shutdown()`` does not wait (it tests the flag
    it has just set) and destroys the guard condition that a queued callback triggers when it
    starts: shut down first, such a callback raised InvalidHandle ("The following exception was
    never retrieved: cannot use Destroyable ..." at exit). So the pool is joined first."""
    drain(executor)
    executor.shutdown()


def run_until_signal(
    node: Any,
    executor: Any,
    on_stop: Callable[[], None] | None = None,
    on_signal: Callable[[], None] | None = None,
) -> int:
    """Spin `node` on `executor` until a signal. Then `on_signal` runs (e.g. the node stops
    publishing), the callbacks in flight finish, and `on_stop` runs (so what it reports counts
    them) before anything is torn down. A signal before spinning starts (KeyboardInterrupt from
    `interrupt_on_signals`) stops it the same way."""
    try:
        try:
            executor.add_node(node)
            spin_until_signal(executor)
        except KeyboardInterrupt:
            pass
        if on_signal is not None:
            on_signal()
        drain(executor)
        if on_stop is not None:
            on_stop()
    finally:
        stop_executor(executor)
        node.destroy_node()
        rclpy.try_shutdown()
        # the process ends now: Python's exit resets its own handlers to the default action, and a
        # second signal (a terminal's Ctrl-C after a script's kill) would make a clean stop a death
        # by signal (exit -2 in ros2 launch's log); ignored ones stay ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 0
