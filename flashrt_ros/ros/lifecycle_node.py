"""``flashrt_lifecycle_node``: flashrt_node as a ROS 2 managed (lifecycle) node.

For robots whose bring-up is driven by a lifecycle manager (nav2's, a system launch, or by hand
with ``ros2 lifecycle set``): the process starts *unconfigured*, holding only its parameters,
and the transitions do the rest:

- configure: read and check the parameters, load the policy, warm it up and make every topic,
  timer and service (as flashrt_node does at start). A bad parameter or checkpoint fails the
  transition with the reason in the log; the node stays unconfigured and can be configured
  again after the parameter is fixed (``ros2 param set`` works in every state).
- activate / deactivate: decide and publish, or pause (as ``~/enable`` does on flashrt_node,
  which this node does not offer): inactive, the inputs are still checked and the status and
  diagnostics still published, and a deactivation stops the trajectory controllers where the
  last chunk has them.
- cleanup: every topic and timer of the pipeline goes and the policy's GPU memory is given back;
  the parameters stay, and so do the services, which answer that the node is not configured (as
  they do from the start until the first configure).
- shutdown (from any state): as cleanup, then the process exits (code 0).

With the parameter ``autostart`` the node configures and activates itself at start, for a launch
without a lifecycle manager (as ouster_ros's ``auto_start``); a failed configure leaves it
unconfigured, as a failed ``ros2 lifecycle set`` would. With ``start_enabled: false`` too, it
configures only and stays inactive (a paused start, as flashrt_node's): activating is then the
operator's.

Same name (``flashrt_node``), parameters, topics and services as flashrt_node otherwise.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from flashrt_ros.ros.node import FlashRTNode, forward_python_logs, node_usage
from flashrt_ros.ros.params import NODE_NAME, ConfigError, param_sources
from flashrt_ros.ros.process import init_rclpy, interrupt_on_signals, run_until_signal, signals_held, stopping
from flashrt_ros.ros.startup import StartupError
from flashrt_ros.ros.usage import command_line

EXECUTABLE = "flashrt_lifecycle_node"
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE
MIN_THREADS = 14  # what 8 cameras with commands take (flashrt_node.callback_threads); made as needed
REPLY_GRACE_S = 0.5
"""After a shutdown transition, how long the process keeps its DDS participant before it goes: the
transition's reply is written after our callback returns, and a reliable reply that needs a resend
is lost with the participant. (A CI run under load once saw no reply in 60 s; not reproduced.)"""
LIFECYCLE_USAGE = (
    " This is the managed (lifecycle) node: it starts unconfigured; configure loads the policy, activate "
    "decides and publishes, deactivate pauses, cleanup unloads, shutdown exits (ros2 lifecycle set ...)."
)


def _logs_errors(transition: Callable) -> Callable:
    """rclpy turns an exception in a transition callback into the ERROR transition without a
    word (then `on_error` runs): the log says what it was."""

    @functools.wraps(transition)
    def run(self: FlashRTLifecycleNode, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            return transition(self, state)
        except Exception:
            what = transition.__name__.removeprefix("on_")
            self.get_logger().error(f"{what} from {state.label} failed:\n{traceback.format_exc()}")
            raise

    return run


class FlashRTLifecycleNode(FlashRTNode, LifecycleNode):
    """See the module docstring. A transition callback that raises is the lifecycle's ERROR:
    rclpy then calls `on_error`, which tears down whatever was made and returns to unconfigured."""

    executor_threads: int | None = None  # set by main: the executor's pool, sized once at the start

    MANAGED = True
    PAUSED_STATE = "inactive (lifecycle)"
    PAUSED_STATS = "INACTIVE (lifecycle)"
    PAUSED_DIAG = "no (inactive: activate it)"  # it has no ~/enable
    PAUSED_DROP = "deactivated"

    def __init__(self, **kwargs: Any):
        super().__init__(set_up=False, **kwargs)
        self.finalized = threading.Event()  # shutdown done: main stops spinning and exits
        self._autostarting = False  # its configure's line gives no activate hint
        self._refuse_invalid_transitions()
        fqn = self.get_fully_qualified_name()
        if not self.wants_autostart():
            next_step = f"next: ros2 lifecycle set {fqn} configure"
        elif self.get_parameter("start_enabled").value is False:
            next_step = "autostart: configure follows (start_enabled false: it stays inactive until activated)"
        else:
            next_step = "autostart: configure and activate follow"
        self.get_logger().info(f"unconfigured, no policy loaded; {next_step}")

    def _refuse_invalid_transitions(self) -> None:
        """A `change_state` request by id for a transition the current state does not have (configure
        when autostart already activated, as a lifecycle manager may send) is refused (success false,
        logged), as rclcpp refuses it. rclpy (Jazzy) raises RCLError out of the executor instead,
        which ended the process with no hold point for the trajectory controllers."""
        service = getattr(self, "_service_change_state", None)  # rclpy's own; absent: leave it be
        if service is None:
            return
        change = service.callback

        def refusing(request: Any, response: Any) -> Any:
            try:
                return change(request, response)
            except _rclpy.RCLError as exc:
                _, label = self._state_machine.current_state
                self.get_logger().warning(
                    f"change_state: transition {request.transition.id} ({request.transition.label or 'by id'}) "
                    f"is not one of state {label}'s: refused ({str(exc).splitlines()[0]})"
                )
                response.success = False
                return response

        service.callback = refusing

    def wants_autostart(self) -> bool:
        """The autostart parameter; ConfigError for a value that is not a bool (a params file's
        `autostart: 1` or `"true"` would otherwise leave the node unconfigured without a word)."""
        value = self.get_parameter("autostart").value
        if not isinstance(value, bool):
            raise ConfigError([f"autostart must be true or false, got {value!r} ({type(value).__name__})"])
        return value

    @_logs_errors
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self.set_up()
            failure = None
        except (ConfigError, StartupError) as exc:
            failure = str(exc)  # not the error: its traceback holds the frames that built the policy
        if failure is not None:
            self.tear_down()  # gives back what a policy that failed half-way had allocated
            self.get_logger().error(f"configure failed, still unconfigured: {failure}")
            return FAILURE
        if self.stopping.is_set():  # not the activate hint: the node is going away
            self.get_logger().info("configured, but a stop signal came meanwhile: stopping")
            return SUCCESS
        if self._autostarting and self.cfg.start_enabled:  # not the operator's to activate: autostart does
            self.get_logger().info("configured (inactive): autostart activates it next")
        else:
            self.get_logger().info(f"configured (inactive): nothing is decided until activated{self._activate_hint()}")
        self._warn_if_threads_short()
        return SUCCESS

    def _warn_if_threads_short(self) -> None:
        """More callback groups than the executor has threads (more cameras configured since the
        start): nothing deadlocks, but the command timer can wait behind camera conversions."""
        if self.executor_threads is not None and self.callback_threads > self.executor_threads:
            self.get_logger().warning(
                f"{self.callback_threads} callback groups for {self.executor_threads} executor threads (sized "
                "when the process started): commands and decisions can wait behind camera conversions; restart "
                "the process to size it for these cameras"
            )

    @_logs_errors
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        message = self.set_enabled(True, "activated")
        if message is None:
            self.get_logger().error("activate refused: the node is shutting down")
            return FAILURE
        self.get_logger().warning(f"activated: {message}")
        return SUCCESS

    @_logs_errors
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        message = self.set_enabled(False, "activated")
        self.get_logger().warning(f"deactivated: {message or 'the node is shutting down'}")
        return SUCCESS

    @_logs_errors
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        store = self.capsules
        self.tear_down()  # waits for the callbacks in flight (a snapshot under way among them)
        kept = len(store.list()) if store is not None else 0
        dropped = f", and its {kept} capsule(s)" if kept else ""
        self.get_logger().info(f"cleaned up (unconfigured): the policy and its topics and timers are gone{dropped}")
        return SUCCESS

    @_logs_errors
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self.is_set_up:
            if self.enabled:  # as a deactivate: the trajectory controllers stop where the last chunk has them
                self.get_logger().warning(f"deactivated for the shutdown: {self.set_enabled(False, None)}")
            if self.stop_owes_hold:  # a stop signal came with the transition: main's stop finds nothing to hold
                self.hold_at_stop()
            self.get_logger().info(f"shutting down from {state.label}; {self.stats_line()}")
            self.tear_down()
        else:
            self.get_logger().info(f"shutting down from {state.label}")
        self.finalized.set()
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.get_logger().error(f"a transition from {state.label} failed: tearing down, back to unconfigured")
        self.tear_down()
        return SUCCESS

    def autostart(self) -> None:
        """Configure, then activate (parameter autostart), before the executor spins: the
        transitions run as `ros2 lifecycle set` runs them, and a failure stops there."""
        log = self.get_logger()
        log.info("autostart: configuring")
        self._autostarting = True
        try:
            configured = self.trigger_configure() == SUCCESS
        finally:
            self._autostarting = False
        if not configured:
            fqn = self.get_fully_qualified_name()
            log.error(
                f"autostart: configure failed, staying unconfigured; once fixed: ros2 lifecycle set {fqn} configure"
            )
            return
        if not self.cfg.start_enabled:  # the operator asked for a paused start: activation is theirs
            log.warning(f"autostart: start_enabled false: configured, staying inactive until{self._activate_hint()}")
            return
        if self.trigger_activate() != SUCCESS:
            log.error("autostart: activate failed, staying inactive")

    def _activate_hint(self) -> str:
        return f": ros2 lifecycle set {self.get_fully_qualified_name()} activate"

    def _restart_hint(self, reason: str) -> str:
        if "restart" not in reason:
            return reason
        return f"{reason}; on this lifecycle node: cleanup, set it, configure"


def main(args: list[str] | None = None) -> int:
    """Entry point of ``ros2 run flashrt_ros flashrt_lifecycle_node``. Exit codes: 0 after a
    shutdown transition or a signal, 2 for invalid ROS arguments or autostart."""
    argv = args if args is not None else sys.argv
    code = command_line(EXECUTABLE, argv, lambda: node_usage(EXECUTABLE, LIFECYCLE_USAGE))
    if code is not None:
        return code
    interrupt_on_signals()
    log = forward_python_logs()
    try:
        if not init_rclpy(argv, NODE_NAME):
            return 2
        node = FlashRTLifecycleNode(sources=param_sources(argv))
        with signals_held():  # the threads are counted from the parameters at start (a floor for more cameras later)
            node.executor_threads = max(node.callback_threads, MIN_THREADS)
            executor = MultiThreadedExecutor(num_threads=node.executor_threads)
        if node.wants_autostart():  # a signal during it: "not starting" below
            node.autostart()
    except ConfigError as exc:
        stopping()
        log.error(f"not starting: {exc}")
        rclpy.try_shutdown()
        return 2
    except KeyboardInterrupt:
        stopping()
        log.info("not starting: stopped by a signal")
        rclpy.try_shutdown()
        return 0

    def on_stop() -> None:  # after a shutdown transition its own line said it all
        if node.finalized.is_set():
            time.sleep(REPLY_GRACE_S)
        else:
            node.hold_at_stop()
            node.get_logger().info(f"shutting down; {node.stats_line() if node.is_set_up else 'unconfigured'}")

    return run_until_signal(
        node,
        executor,
        on_signal=node.begin_shutdown,
        on_stop=on_stop,
        done=node.finalized.is_set,
        on_error=node.on_callback_error,
    )


if __name__ == "__main__":
    sys.exit(main())
