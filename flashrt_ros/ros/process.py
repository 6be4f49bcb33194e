"""Process life of our nodes: spin until SIGINT/SIGTERM/SIGHUP (`STOP_SIGNALS`), then stop cleanly.

Shared by flashrt_node and synthetic_sensors (and the benchmark), so both shut down the same
way: stop spinning, wait for callbacks in flight, destroy the node, shut rclpy down.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import rclpy
from rclpy._rclpy_pybind11 import RCLError, UnknownROSArgsError
from rclpy.executors import ExternalShutdownException
from rclpy.signals import SignalHandlerOptions

from flashrt_ros.ros.early_stop import STOP_SIGNALS
from flashrt_ros.ros.params import UNSURE, list_at_line, param_sources, rcl_reason

POLL_S = 0.1  # longest a signal waits for the executor's wait to return


def init_rclpy(argv: list[str], node_name: str) -> bool:
    """rclpy.init with our signal handling (see spin_until_signal). ROS arguments or a params file
    that rcl refuses (e.g. a list mixing strings and numbers) give one line naming the node, after
    rcl's own "[ERROR] [rcl]" line, and False: the caller exits 2, without a traceback."""
    missing = [src[1] for src in param_sources(argv) if src[0] == "file" and not os.path.exists(src[1])]
    if missing:  # rcl says only "Error opening YAML file", naming neither the file nor where it looked
        notes = [f"relative paths are from {os.getcwd()}"] if any(not os.path.isabs(p) for p in missing) else []
        notes += ["~ is not expanded in a quoted path"] if any(p.startswith("~") for p in missing) else []
        where = f" ({'; '.join(notes)})" if notes else ""
        print(f"[{node_name}] not starting: no params file {', '.join(missing)}{where}", file=sys.stderr)
        return False
    try:
        # held: a KeyboardInterrupt inside rcl's init (C++ calling back into Python) made the
        # process die of SIGINT at exit although main caught it and returned 0
        with signals_held():
            rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    except (RCLError, UnknownROSArgsError) as exc:
        reason = rcl_reason(exc)
        reason += mixed_list_hint(reason)
        print(f"[{node_name}] not starting: the ROS arguments or a params file are invalid: {reason}", file=sys.stderr)
        return False
    return True


_MIXED_LIST = re.compile(
    r"--params-file (.+?)'\. Error: Sequence should be of same type\. Value type '(\w+)' .* at line_num (\d+)"
)


def mixed_list_hint(reason: str) -> str:
    """rcl's refusal of a list whose items it reads as different types names neither the
    parameter nor the fix: both, from the file at the line it names ('' for any other refusal).
    Numbers only (`[0.05, 1]`, the mistake the config comments warn about): a decimal point on
    each; text among them (`[x, y, theta]`: rcl reads a bare y as a bool): quotes."""
    found = _MIXED_LIST.search(reason)
    if found is None:
        return ""
    path, line = os.path.expanduser(found.group(1)), int(found.group(3))
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError):
        return ""
    name, items = list_at_line(text, line)  # items as rcl types them (-inf a double, y a bool), not PyYAML
    what = f"{name} (line {line})" if name else f"the list at line {line}"
    kind = found.group(2)  # the type rcl refused, among the list's others
    texts = [v for v in items if isinstance(v, str | bool)]
    if kind in ("integer", "double") and not texts:
        return f"; {what} mixes integers and decimals: write every number with a decimal point (1.0, not 1)"
    if kind == "string" and any(v is UNSURE for v in items) and not texts:  # 1e309: rcl reads it as text
        return f"; {what} holds a number rcl cannot read as one (beyond a double? write .inf for no bound)"
    return f"; {what} mixes {kind}s with other items: quote every item that is text ('y', '1')"


def spin_until_signal(
    executor: Any, done: Callable[[], bool] | None = None, on_error: Callable[[Exception], None] | None = None
) -> None:
    """Spin until SIGINT or SIGTERM (``ros2 launch`` stops nodes with SIGINT, then SIGTERM).
    Call after ``rclpy.init(signal_handler_options=SignalHandlerOptions.NO)``: rclpy's own
    handlers shut the context down first, so nothing - e.g. the final stats line - could be
    logged to /rosout on the way out.

    The handler only sets a flag, checked between short waits: raising KeyboardInterrupt from
    it (Python's default) lands at any bytecode of the executor's own code, e.g. between taking
    a lock and the ``try`` that releases it, and can leave the executor unable to stop. `done`,
    where given, also ends it when it turns true (a lifecycle node's shutdown transition).

    A callback that raises in the executor - not one of our nodes' own, which catch what they
    raise, but rclpy's, e.g. its /clock subscription under use_sim_time on a negative time - goes
    to `on_error`, and spinning goes on: raised, one bad message ended the process without the
    stop's hold point. Without `on_error` it ends spinning, as rclpy's own spin does."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    # Each explicitly: a process started in the background by a script inherits SIGINT as
    # ignored, and Python then leaves it ignored.
    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)
    while not stop.is_set() and executor.context.ok() and not (done is not None and done()):
        try:
            executor.spin_once(timeout_sec=POLL_S)
        except ExternalShutdownException:
            return
        except Exception as exc:
            if on_error is None:
                raise
            if not getattr(exc, "_flashrt_handled", False):  # rclpy raises one failed task's error again
                exc._flashrt_handled = True  # at a later spin_once: counted and logged once
                on_error(exc)


REPEAT_S = 1.0
"""After a KeyboardInterrupt from interrupt_on_signals, signals within this long are no-ops."""
_STOPPING = [False]  # a plain flag, no lock: the handler may interrupt whatever runs
"""Set where the KeyboardInterrupt of interrupt_on_signals is caught: a stop is under way."""


def interrupt_on_signals() -> None:
    """Before spinning (while a node is built): SIGINT or SIGTERM raises KeyboardInterrupt, for
    the caller to stop cleanly, until the caller says it is stopping (:func:`stopping`): a second
    signal (a terminal's Ctrl-C and a script's kill, a double Ctrl-C) then cannot interrupt that
    stop with a traceback, and a KeyboardInterrupt Python swallowed (raised in a ``__del__``)
    leaves the next signal live. Set explicitly: a process started in the background by a script
    inherits SIGINT as ignored, and would otherwise drop it until spinning starts."""
    _STOPPING[0] = False
    _ignore_signals_at_exit()
    raised_at = [-math.inf]

    def on_signal(signum: int, frame: Any) -> None:
        # also quiet for a moment after raising: a second signal could otherwise land between the
        # raise and the caller's stopping(); a swallowed interrupt is long over by the next Ctrl-C
        now = time.monotonic()
        if not _STOPPING[0] and now - raised_at[0] > REPEAT_S:
            raised_at[0] = now
            raise KeyboardInterrupt

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)


def stopping() -> None:
    """First thing where interrupt_on_signals' KeyboardInterrupt is caught: later signals no-ops."""
    _STOPPING[0] = True


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (acted on when the block ends) while something that must not
    be cut short is built: a KeyboardInterrupt inside rclpy's Executor.__init__ leaves a half-built
    executor whose __del__ prints a traceback at exit. Recorded by a handler rather than masked:
    a mask holds only this thread's delivery, and Python runs handlers in the main thread
    whichever thread the kernel picked."""
    held = STOP_SIGNALS
    previous = {signum: signal.getsignal(signum) for signum in held}
    caught: list[int] = []
    for signum in held:
        signal.signal(signum, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(caught[0])


def _ignore_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _ignore_signals_at_exit() -> None:
    """When the process ends, Python's exit puts its own handlers back to the default action: a
    second signal then (a terminal's Ctrl-C after a script's kill) made a clean stop a death by
    signal (exit -2 in ros2 launch's log). Ignored ones stay ignored; at exit only, so that a
    caller that goes on in this process, or its children, can still be stopped."""
    atexit.unregister(_ignore_signals)
    atexit.register(_ignore_signals)


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
    done: Callable[[], bool] | None = None,
    on_error: Callable[[Exception], None] | None = None,
) -> int:
    """Spin `node` on `executor` until a signal (or until `done` turns true). Then `on_signal`
    runs (e.g. the node stops publishing), the callbacks in flight finish, and `on_stop` runs (so
    what it reports counts them) before anything is torn down. A signal before spinning starts
    (KeyboardInterrupt from `interrupt_on_signals`) stops it the same way. `on_error`: see
    `spin_until_signal`."""
    try:
        try:
            executor.add_node(node)
            spin_until_signal(executor, done, on_error)
        except KeyboardInterrupt:
            stopping()
        if on_signal is not None:
            on_signal()
        drain(executor)
        if on_stop is not None:
            on_stop()
    finally:
        stop_executor(executor)
        node.destroy_node()
        rclpy.try_shutdown()
        _ignore_signals_at_exit()
    return 0
