"""Runtime parameter changes (`ros2 param set`): checked as a whole, refused with a reason and a
counter, applied between decisions; the timers' rates changed in place."""

from __future__ import annotations

import math
from typing import Any

from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter

from flashrt_ros.policies.listing import shown, some
from flashrt_ros.ros.params import (
    PARAMETERS,
    NodeConfig,
    check_update,
    floats_as_doubles,
    node_resolver,
    refused_by_rclpy,
    unknown_names,
)
from flashrt_ros.ros.reasons import INVALID_PARAMETER, UNKNOWN_PARAMETER
from flashrt_ros.ros.startup import guidance_cap, rtc_settings


class ParameterUpdates:
    """A part of FlashRTNode (ros/node.py): its attributes are the node's."""

    def _before_set_parameters(self, params: list) -> list:
        """Integers for float parameters made doubles; and a set that rclpy itself will refuse (a
        string for use_sim_time) logged and counted here, as _on_set_parameters does its own
        refusals: rclpy refuses it before that callback, without a word in the log."""
        params = floats_as_doubles(params)
        reason = refused_by_rclpy(self, params)
        if reason is not None:
            self._refused_parameter(reason)
        return params

    def _on_set_parameters(self, params: list) -> SetParametersResult:
        changes = {p.name: p.value for p in params}
        unknown = unknown_names(set(changes), runtime=True)
        if unknown:
            names = some([shown(n) for n in unknown], 5)
            reason = f"unknown parameter(s) [{names}]: not set; known: {', '.join(PARAMETERS)}"
            self._refused_parameter(reason, UNKNOWN_PARAMETER)
            return SetParametersResult(successful=False, reason=reason)
        unset = sorted(p.name for p in params if p.name in PARAMETERS and p.type_ == Parameter.Type.NOT_SET)
        if unset:  # `ros2 param delete`: a list would read as [] (no limits), a number as nothing at all
            reason = f"{', '.join(unset)} cannot be deleted (unset): set a value instead (an empty list is [])"
            self._refused_parameter(reason)
            return SetParametersResult(successful=False, reason=reason)
        if not self.is_set_up:  # a lifecycle node before configure: all of them are checked then
            return SetParametersResult(successful=True)
        reason = check_update(self.cfg, changes, resolve=node_resolver(self))
        if reason is not None:
            reason = self._restart_hint(reason)
        if reason is None and isinstance(changes.get("prompt"), str):
            reason = self.state.pipeline.policy.prompt_problem(changes["prompt"], len(self.cfg.joint_names))
        level = "warning"  # the request's fault
        if reason is None:
            reason, level = self._retime(changes), "error"  # ours: validation should have left nothing to fail
        if reason is None:
            return SetParametersResult(successful=True)
        self._refused_parameter(reason, level=level)
        return SetParametersResult(successful=False, reason=reason)

    def _refused_parameter(self, reason: str, counter: str = INVALID_PARAMETER, level: str = "warning") -> None:
        """A parameter change refused (by us, by rclpy, or unreadable): counted and logged."""
        self._count_node_wide(counter)
        getattr(self.get_logger(), level)(f"parameter change refused: {reason}")

    def _restart_hint(self, reason: str) -> str:
        """A refusal's reason as the node says it (the lifecycle node adds its own way to apply it)."""
        return reason

    def _retime(self, changes: dict[str, Any]) -> str | None:
        """Apply the change's timer rates now, the last step before rclpy stores the values (this
        callback is its last gate), so that the reply says whether they took; None when they did.
        Validation should leave nothing to fail here; if something does, nothing of it is kept."""
        ours = {name: value for name, value in changes.items() if name in PARAMETERS}
        try:
            self._apply_timer_rates(self.cfg, self.cfg.with_values(ours))
        except Exception as exc:
            keep = "keeps its previous value" if len(ours) == 1 else "keep their previous values"
            return f"not applied ({', '.join(sorted(ours))} {keep}): {type(exc).__name__}: {exc}"
        return None

    def _after_set_parameters(self, params: list) -> None:
        changes = {p.name: p.value for p in params if p.name in PARAMETERS}
        self._set_since_start.update(changes)
        if not changes or not self.is_set_up:  # before set-up, set_up reads them
            return
        old, new = self.cfg, self.cfg.with_values(changes)
        self.cfg = new  # the timers took the new rates in _on_set_parameters
        self._throttle.period_s = new.log_throttle_s
        # from the next chunk that takes over, both at once
        self.commands.set_take_over(new.command_blend_steps, new.command_interpolation)
        self.commands.tick_ns = self._command_tick_ns(new)  # bounds max_move's refill after a gap
        self.state.pipeline.set_prefix_trigger(new.prefix_trigger, new.prefix_period_s)  # read by the next decision
        if self.state.pipeline.rtc is not None:  # read by the next decision
            self.state.pipeline.rtc = rtc_settings(new)
        diff = ", ".join(
            f"{n} {getattr(old, n)!r} -> {getattr(new, n)!r}" for n in changes if getattr(old, n) != getattr(new, n)
        )
        if diff:
            self.get_logger().info(f"parameters changed: {diff}")
        self._warn_chunk_gap(new, old)  # each only as it turns on: a slider says it once
        self._warn_rtc_blend(new, old)
        steps = self.state.pipeline.policy.cfg.num_steps
        rtc_on = self.state.pipeline.rtc is not None  # off: the warning below says it changes nothing
        if rtc_on and new.rtc_max_guidance > steps >= old.rtc_max_guidance:
            self.get_logger().warning(f"guidance weight at most {guidance_cap(new, steps)}: higher changes nothing")
        rtc_changed = sorted(n for n in changes if n.startswith("rtc_") and getattr(old, n) != getattr(new, n))
        if rtc_changed and self.state.pipeline.rtc is None:
            off = f"{', '.join(rtc_changed)} changed, but real-time chunking is off (rtc false, read at start)"
            later = "they take effect once the node restarts with rtc true"
            self.get_logger().warning(self._restart_hint(f"{off}: {later}"))

    @staticmethod
    def _command_tick_ns(cfg: NodeConfig) -> int | None:
        return round(1e9 / cfg.command_rate_hz) if cfg.command_rate_hz > 0 else None

    def _apply_timer_rates(self, old: NodeConfig, new: NodeConfig) -> None:
        """Every timer to its new rate, or none: every period is computed (and range-checked)
        before a timer changes, and a timer already changed is put back if the next one fails."""
        timers = [
            (self._decision_timer, old.rate_hz, new.rate_hz),
            (self._status_timer, old.status_rate_hz, new.status_rate_hz),
        ]
        if self._command_timer is not None:  # on or off is refused at runtime (check_update)
            timers.append((self._command_timer, old.command_rate_hz, new.command_rate_hz))
        changed = [(timer, _period_ns(before), _period_ns(after)) for timer, before, after in timers if before != after]
        done: list[tuple[Any, int]] = []
        try:
            for timer, before_ns, after_ns in changed:
                _set_period(timer, after_ns)
                done.append((timer, before_ns))
        except Exception:
            for timer, before_ns in done:
                _set_period(timer, before_ns)
            raise


def _period_ns(rate_hz: float) -> int:
    """A timer period in ns; rcl holds it as int64, which a tiny rate would overflow."""
    period_ns = round(1e9 / rate_hz) if math.isfinite(rate_hz) and rate_hz > 0 else 0
    if not 0 < period_ns < 2**63:
        raise ValueError(f"{rate_hz!r} Hz is not a timer period rcl can hold (1 ns to 2^63 ns)")
    return period_ns


def _set_period(timer: Any, period_ns: int) -> None:
    """The timer's new period. rcl keeps the next call where it was; where that is further away
    than the new period (a faster rate), the period restarts now. Restarting it on every change
    would let a client that sets the rate again and again (a slider) postpone every call."""
    timer.timer_period_ns = period_ns
    until = timer.time_until_next_call()
    if until is None or until > period_ns:
        timer.reset()
