"""The node's services: ~/reset, ~/enable and the capsule services, each taking turns with the
decisions where it touches the policy's state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from std_srvs.srv import SetBool, Trigger

from flashrt_ros.ros import messages


class NodeServices:
    """A part of FlashRTNode (ros/node.py): its attributes are the node's."""

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self._refuse_while_stopping("~/reset", response):
            return response
        with self._state_lock:  # between decisions
            if self._refuse_while_stopping("~/reset", response):  # began while this call waited
                return response
            self._stop_commands()  # before the counters: a tick between counts nothing
            with self._lock:
                self.state.reset()
                for slot in self.slots:
                    slot.clear(self._timer_seconds())
                self._reset_counters()
        self._throttle.clear()
        response.success = True
        response.message = (
            f"cleared held inputs (and the camera sizes they fixed), counters and statistics; noise generator "
            f"reseeded ({self.state.seed}), "
            "chunk ids restart at 1; capsules kept"
            + ("; no command until the next chunk" if self._command_pubs else "")
        )
        self.get_logger().info(f"reset: {response.message}")
        return response

    def _on_enable(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        """Engage (true) or pause (false) the policy: `set_enabled`."""
        if self._refuse_while_stopping("~/enable", response):
            return response
        message = self.set_enabled(bool(request.data), "~/enable true")
        if message is None:  # the stop began while this call waited
            self._refuse_while_stopping("~/enable", response)
            return response
        response.success, response.message = True, message
        self.get_logger().warning(f"~/enable: {message}")
        return response

    def set_enabled(self, want: bool, resume: str | None) -> str | None:
        """Engage (true) or pause (false) the policy; what was done, in words (None: the node is
        stopping, nothing changed). Paused, the node keeps its pipeline warm and checks its inputs,
        but decides nothing and publishes no chunk, trajectory or command. A pause acts at once:
        the commands stop, a decision in flight that has not begun to publish does not, and once it
        has ended a one-point trajectory holds the trajectory controllers where the last chunk has
        them now (else they would play it to its end). `resume` names what engages it again (None:
        nothing will, the node is shutting down)."""
        was = self.enabled
        if was and not want:
            self.enabled = False  # before the wait below: read by the decision in flight
            self._stop_commands()
            with self._lock:  # what is held now is owed no decision either (see _accept)
                for slot in self.slots:
                    slot.used = True
        with self._state_lock:  # between decisions
            if self.stopping.is_set():  # the stop holds the arm itself (hold_at_stop)
                if was and not want:
                    self.stop_owes_hold = True
                    return "paused and the commands stopped; the node is shutting down, and its stop holds the arm"
                return None
            held = ""
            if was and not want:
                self._stop_commands()  # what the decision in flight may have pushed before it saw the pause
                held = self._hold_trajectories()
            elif want and not was:  # the idle time, the wait for inputs and the skips count from now
                with self._lock:
                    self._last_decision_at = time.monotonic()
                    self._last_decision_ros_ns = self.get_clock().now().nanoseconds
                    self._dropped_streak, self._outage = 0, False
                self._started_at = None
                self.enabled = True
        if was == want:
            return f"already {'enabled' if was else 'paused'}: nothing changed"
        if want:
            return f"enabled: deciding at {self.cfg.rate_hz:g} Hz from the next tick"
        until = "from now on" if resume is None else f"until {resume}"
        return (
            f"paused: no decision, chunk, trajectory or command {until}; "
            + held
            + ("; the command controllers hold their last command" if self._command_pubs else "")
        )

    def _paused_at_start(self) -> str:
        return (
            "paused (start_enabled false): inputs are checked, but nothing is decided or published until: "
            f"ros2 service call {self.resolve_service_name('~/enable')} std_srvs/srv/SetBool '{{data: true}}'"
        )

    def _stop_commands(self) -> None:
        with self._command_lock:
            self._clear_commands()

    def _clear_commands(self) -> None:
        """The command stream and the executing chunk go (a reset, a pause, ROS time going back):
        the robot's next chunk is a fresh start, held to nothing by rtc. With self._command_lock held."""
        self.commands.clear()
        self._exhausted_counted = self._limited_chunk = self._executing = None

    def _hold_trajectories(self) -> str:
        """A one-point trajectory, starting now, to where the last published chunk has the
        trajectory controllers now (its trajectory interpolated, from where the joints were at its
        start; past its end, its last point): they stop there. What was done, in words, for the reply."""
        with self._command_lock:
            self._settle_jump_commands()
            last = self._last_trajectory
            ended, self._ended_since_hold = self._ended_since_hold, False
        if last is None:
            if ended:
                return (
                    "the trajectories published since the last hold had all ended on arrival "
                    "(chunk_ended): none to stop"
                )
            return "no trajectory published since the node started or was last paused: none to stop"
        self._last_trajectory = None  # the controllers are held; the next pause has nothing newer to stop
        here = last.trajectory_at(self.get_clock().now().nanoseconds)
        self._publish_trajectories(here[None, :], messages.time_msg(0), last.step_ns)  # stamp 0: start now
        return "the trajectory controllers are sent one point, one step ahead, where the last chunk has them now"

    def _capsule_call(self, service: str, response: Any, action: Callable[[], str]) -> Any:
        """Run a capsule operation; failures become success=False with the reason, a counter
        (topic = the service, reason = the error kind) and a warning."""
        if self._refuse_while_stopping(service, response):
            return response
        try:
            with self._state_lock:  # between decisions
                if self._refuse_while_stopping(service, response):  # began while this call waited
                    return response
                response.message = action()
            response.success = True
            self.get_logger().info(f"{service}: {response.message}")
        except (KeyError, ValueError) as exc:
            reason = _capsule_refusal(exc)
            with self._lock:
                self.invalid[(self.resolve_service_name(service), reason)] += 1
            response.success, response.message = False, str(exc)
            self.get_logger().warning(f"{service} refused: {exc}")
        return response

    def _refuse_while_stopping(self, service: str, response: Any) -> bool:
        if not self.stopping.is_set():
            return False
        response.success, response.message = False, "the node is shutting down: nothing was changed"
        self.get_logger().info(f"{service} refused: the node is shutting down")
        return True

    def _on_snapshot(self, request: Any, response: Any) -> Any:
        def snapshot() -> str:
            replaced = request.name in self.capsules
            capsule = self.capsules.snapshot(request.name)
            respelled = f" (stored as {capsule.name!r}, its NFC spelling)" if capsule.name != request.name else ""
            return ("replaced " if replaced else "") + capsule.summary() + respelled

        return self._capsule_call("~/capsule/snapshot", response, snapshot)

    PERIOD_RESTORE = (
        "; under prefix_trigger period a chunk repeats the first run's only where that run built its prefix at "
        "the same decision (the capsule holds no prefix)"
    )

    def _on_restore(self, request: Any, response: Any) -> Any:
        def restore() -> str:
            said = "restored " + self.capsules.restore(request.name).summary()
            return said + (self.PERIOD_RESTORE if self.state.pipeline.prefix_cache.trigger == "period" else "")

        return self._capsule_call("~/capsule/restore", response, restore)

    def _on_fork(self, request: Any, response: Any) -> Any:
        return self._capsule_call(
            "~/capsule/fork",
            response,
            lambda: f"forked {request.source!r} -> " + self.capsules.fork(request.source, request.target).summary(),
        )

    def _on_drop(self, request: Any, response: Any) -> Any:
        return self._capsule_call(
            "~/capsule/drop", response, lambda: "dropped " + self.capsules.drop(request.name).summary()
        )

    def _on_list(self, request: Any, response: Any) -> Any:
        capsules = self.capsules.list()
        response.names = [c.name for c in capsules]
        response.size_bytes = [c.size_bytes for c in capsules]
        response.created = [messages.time_msg(c.created_ns) for c in capsules]
        response.success, response.message = True, f"{len(capsules)} capsule(s)"
        return response


def _capsule_refusal(exc: Exception) -> str:
    """The status counter's reason for a refused capsule call."""
    from flashrt_ros.engine.capsule import CapsuleStoreFull

    if isinstance(exc, KeyError):
        return "unknown_capsule"
    return "capsule_store_full" if isinstance(exc, CapsuleStoreFull) else "invalid_request"
