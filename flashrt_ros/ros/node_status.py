"""~/status, /diagnostics and the periodic stats line: what the node counted, and how healthy
it is from what changed since the last status."""

from __future__ import annotations

import time

from diagnostic_msgs.msg import DiagnosticStatus

from flashrt_ros.engine.stats import RATE_SPAN_S
from flashrt_ros.ros import messages
from flashrt_ros.ros.reasons import ABSENT, NODE_ERROR, STOPS_DECISIONS

HUNG_FACTOR = 10
"""A decision computing this many times two periods or the slowest recent decision is no longer
slow but hung (`_hung_after_s`)."""


class StatusReports:
    """A part of FlashRTNode (ros/node.py): its attributes are the node's."""

    def snapshot(self) -> messages.StatusSnapshot:
        return self._snapshot_with_baseline()[0]

    def _snapshot_with_baseline(self, advance: bool = False) -> tuple[messages.StatusSnapshot, tuple]:
        """The snapshot and the health baseline (the counts the last status judged), read - and,
        with `advance`, the baseline replaced by this snapshot's counts - under one lock: a
        ~/reset, which zeroes both, falls before or after the pair, never between (the next
        status then hid what it counted, or this one reported every count since the start)."""
        d = self.description
        node_stage = [s for s in self.node_stats.summaries() if s.name == "node_overhead"]
        with self._lock:
            snap = messages.StatusSnapshot(
                stamp=self.get_clock().now().to_msg(),
                stages=self.state.pipeline.stats.summaries() + node_stage,
                target_rate_hz=self.cfg.rate_hz,
                decisions=self.decisions,
                deadline_misses=self.deadline_misses,
                dropped_decisions=self.dropped_decisions,
                dropped_inputs=self.dropped_inputs,
                prefix_reuses=self.prefix_reuses,
                rtc_guided=self.rtc_guided,
                invalid=dict(self.invalid),
                policy=d["policy"],
                device=d["device"],
                precision=d["precision"],
                enabled=self.enabled,
            )
            baseline = (self._last_health, self._last_invalid)
            if advance:
                self._last_health = (snap.dropped_decisions, snap.deadline_misses)
                self._last_invalid = dict(snap.invalid)
        return snap, baseline

    def _on_status(self) -> None:
        """The status timer. A failure here is a bug of ours, not the robot's: it is logged (with
        the error, throttled) and the next period tries again; raised, it would end the executor
        and with it the decisions."""
        try:
            self._publish_status()
        except Exception as exc:
            self._our_failure("status_failed", f"status not published: {exc!r}")

    def _publish_status(self) -> None:
        self._watch_ros_time()
        snap, baseline = self._snapshot_with_baseline(advance=True)
        self._status_pub.publish(messages.pipeline_status(snap))
        level, text = self._health(snap, baseline)
        name = f"{self.get_fully_qualified_name()}: pipeline"
        d = self.description
        extra = {"backend": d["backend"], "prompt": self.cfg.prompt, "actions": d["actions"]}
        inputs = self._input_topics
        self._diag_pub.publish(
            messages.diagnostics(
                snap, name=name, level=level, message=text, extra=extra, paused=self.PAUSED_DIAG, inputs=inputs
            )
        )
        self._maybe_log_stats(snap)

    @property
    def _input_topics(self) -> frozenset[str]:
        """The subscribed topics (counters keyed by anything else are node-wide events: refused
        parameters, a stalled clock, refused capsule calls)."""
        return frozenset(slot.topic for slot in self.slots)

    def _health(self, snap: messages.StatusSnapshot, baseline: tuple) -> tuple[bytes, str]:
        """Level and message from what changed since the last status: since `baseline`, taken
        with `snap` (`_snapshot_with_baseline`)."""
        now = (snap.dropped_decisions, snap.deadline_misses)
        dropped, missed = (a - b for a, b in zip(now, baseline[0], strict=True))
        new_invalid = counts_since(snap.invalid, baseline[1])
        idle_s = self._idle_s()
        overdue = self.enabled and (self._clock_watch.stalled or idle_s > self._idle_limit_s())
        # overdue, but late rather than stopped: a slow decision on good inputs, or inputs not yet
        # come within the wait the log calls expected (both WARN below)
        in_flight = self._slow_decision_in_flight(snap) if overdue else ""
        # a stalled clock keeps its ERROR whatever the inputs
        if overdue and not in_flight and (self._clock_watch.stalled or not self._waiting_for_first_inputs()):
            if self._clock_watch.stalled:
                why, idle_s = self._clock_watch.describe(time.monotonic()), time.monotonic() - self._last_decision_at
            else:
                why = self._why_no_decision(snap)
            return DiagnosticStatus.ERROR, f"no decision for {idle_s:.1f} s ({why})"
        invalid, absent, events = messages.split_counts(new_invalid, ABSENT, self._input_topics)
        counts = (
            (dropped, "skipped decisions"),
            (missed, "deadline misses"),
            (invalid, "input refusals"),
            (absent, "waits for absent inputs"),
            *((n, reason) for reason, n in events),
        )
        problems = [f"{n} {what}" for n, what in counts if n > 0]
        # what lasts beyond the counts: a slow decision on good inputs (late, not stopped), and a
        # miss the next decision has not yet made good (statuses come faster than decisions)
        ongoing = [in_flight] if in_flight else []
        if not (in_flight or missed) and self._last_missed is not None and self.enabled:
            took, period = f"{self._last_missed:.3f}", f"{1.0 / self.cfg.rate_hz:.3f}"
            ongoing.append(f"the last decision missed its deadline ({took} s for a {period} s period)")
        # whether a decision could run now: what an operator asks before engaging, and, engaged,
        # between two skipped ticks (statuses faster than decisions read OK while nothing was usable)
        unready = self._unready_inputs()
        state = f"running, not ready ({unready})" if unready else "running"
        unheard = self._unheard_outputs() if self.enabled else []
        if unheard:  # decisions fine, and the robot gets nothing
            state += f"; nothing subscribes to {', '.join(unheard)} (the controller's topic? a remap?)"
        if not self.enabled:
            if self._clock_watch.stalled:  # held samples stop ageing with the clock: the timer would not fire
                unready = ", ".join(filter(None, (unready, self._clock_watch.describe(time.monotonic()))))
            state = f"{self.PAUSED_STATE} (no decisions): " + (f"not ready ({unready})" if unready else "ready")
        twin = self._twin()
        state += "".join(f"; {note}" for note in (twin, *ongoing) if note)
        if problems:
            return DiagnosticStatus.WARN, f"{state}, with " + ", ".join(problems) + " since the last status"
        if unready or unheard or twin or ongoing:
            return DiagnosticStatus.WARN, state
        return DiagnosticStatus.OK, f"running at {self.cfg.rate_hz:g} Hz" if self.enabled else state

    def _twin(self) -> str:
        """Another node publishing this node's chunks: most often a second node of this name (a
        launch and a forgotten `ros2 run`), which the parameters and ~/enable reach too, and whose
        trajectories interleave with these. Said in /diagnostics while it lasts, logged once."""
        topic = self._chunk_pub.topic_name
        others = self.count_publishers(topic) - 1
        if others <= 0:
            return ""
        text = f"{others} other publisher(s) of {topic}: another {self.get_fully_qualified_name()}?"
        if not self._twin_said:
            self._twin_said = True
            self.get_logger().warning(
                f"{text} Both take this name's parameters and ~/enable, and their chunks and trajectories "
                "interleave: stop one (ros2 node list)"
            )
        return text

    def _unheard_outputs(self) -> list[str]:
        """The outputs set up to drive controllers (trajectory_groups; the command stream, any of
        its topics) that nothing subscribes to: a controller on another topic than the node
        publishes gets nothing, without a word. ~/joint_trajectory and ~/action_chunk are optional."""
        unheard = [pub.topic_name for pub, _, _ in self._group_pubs if not pub.get_subscription_count()]
        if self._command_pubs and not any(pub.get_subscription_count() for pub, _, _ in self._command_pubs):
            unheard.append(" or ".join(pub.topic_name for pub, _, _ in self._command_pubs))
        return unheard

    def _waiting_for_first_inputs(self) -> bool:
        """Every input a decision would skip for is absent within the wait the log calls expected
        (DDS discovery after the start, or max_age_s after a ~/reset: `_just_emptied`): WARN "not
        ready", not the idle ERROR, as a launch whose cameras come up a moment after the node."""
        if self._started_at is None:  # no decision tick yet: none was due
            return True
        with self._lock:
            found = self._held_problems(self.get_clock().now().nanoseconds, self.cfg.max_age_s)
            return bool(found) and all(err is None and self._just_emptied(slot) for slot, err in found)

    def _unready_inputs(self) -> str:
        """The inputs a decision now would skip for, as 'absent /cam, stale /joints', or ''."""
        with self._lock:
            found = self._held_problems(self.get_clock().now().nanoseconds, self.cfg.max_age_s)
        return ", ".join(f"{ABSENT if err is None else err.reason} {slot.topic}" for slot, err in found)

    def _why_no_decision(self, snap: messages.StatusSnapshot) -> str:
        """What went wrong since the last decision, on the inputs that still stop one (an input
        absent just after a reset and arriving since is not named) and node-wide; else the decision
        computing (after an outage, or on good inputs all along: hung), or none."""
        causes = self._stop_causes(snap)
        if causes:
            return ", ".join(causes)
        if not self._deciding:
            return "no decision ran"
        if self._outage:
            return "the inputs are good again; a decision is computing"
        return f"a decision computing for {time.monotonic() - self._decision_began:.1f} s: does the policy hang?"

    def _stop_causes(self, snap: messages.StatusSnapshot) -> list[str]:
        """What stopped decisions since the last one: the refusals on the inputs that stopped the
        last tick (none while a decision computes), the node-wide events that stop one (a refused
        chunk, the policy's error) and failed ticks."""
        since = counts_since(snap.invalid, self._invalid_at_decision)
        blocking, inputs = self._blocking, self._input_topics
        causes = [
            f"{r} {t}".strip()
            for (t, r) in sorted(since)
            if t in blocking or (t not in inputs and r in STOPS_DECISIONS)
        ]
        if self._tick_failures > self._tick_failures_at_decision:
            causes.append(f"{NODE_ERROR} (decision tick)")
        return causes

    def _slow_decision_in_flight(self, snap: messages.StatusSnapshot) -> str:
        """A decision computing on inputs that were good at its start (no outage before it: only
        the expected wait for inputs skipped ticks since the last decision, and no tick ended
        refused by the policy or failed) and slower than the recent ones: said as a WARN while it
        lasts (the idle ERROR is for decisions that do not run), up to `_hung_after_s`: beyond, the
        policy hangs, and that is the ERROR. '' otherwise."""
        if not self._deciding or self._outage or self._clock_watch.stalled or self._stop_causes(snap):
            return ""  # stopped (an outage, chunks refused, failed ticks), not slow
        computing_s = time.monotonic() - self._decision_began
        if computing_s > self._hung_after_s():
            return ""
        yardstick = self._yardstick()
        if yardstick is None:
            return f"a decision computing for {computing_s:.1f} s"
        seconds, which = yardstick
        return f"a decision computing for {computing_s:.1f} s ({which} took {seconds:.2f} s)"

    def _hung_after_s(self) -> float:
        """How long one decision may compute before the policy reads as hung: HUNG_FACTOR times
        two periods or the yardstick, not the status period (a 0.1 Hz status would give a hung fast
        policy 100 s of WARN)."""
        yardstick = self._yardstick()
        slowest = 0.0 if yardstick is None else yardstick[0]
        return max(self._idle_limit_s(), HUNG_FACTOR * max(2.0 / self.cfg.rate_hz, slowest))

    def _yardstick(self) -> tuple[float, str] | None:
        """What a computing decision is judged by: (seconds, which decision) of the slowest recent
        decision, before any the warm-up decision's; None before both."""
        if self._decision_s:
            return max(self._decision_s), "the slowest of the last ones"
        warm_up = self.state.pipeline.warm_up_ms
        return None if warm_up is None else (warm_up / 1e3, "the warm-up decision")

    def _idle_limit_s(self) -> float:
        """How long without a decision is an ERROR: two periods, one status period, or - for a
        policy slower than rate_hz, which is WARN (deadline misses) - twice its slowest recent
        decision (of the last 8: one slow one among fast ones does not make an ERROR)."""
        cfg = self.cfg
        return max(2.0 / cfg.rate_hz, 1.0 / cfg.status_rate_hz, 2.0 * max(self._decision_s, default=0.0))

    def _timer_seconds(self) -> float:
        """Now on the clock the decision timer runs on: ROS time under sim time (a simulator
        slower than real time decides less often per wall second, as it should), else monotonic."""
        clock = self.get_clock()
        if clock.ros_time_is_active:
            return clock.now().nanoseconds / 1e9
        return time.monotonic()

    def _idle_s(self) -> float:
        """Seconds since the last decision on the clock the decision timer runs on: under sim time
        a simulator slower than real time spaces decisions further apart in wall time, which is
        not a fault (a stalled clock is reported by the clock watch)."""
        clock = self.get_clock()
        if clock.ros_time_is_active:
            now_ns = clock.now().nanoseconds
            if self._last_decision_ros_ns == 0 and now_ns > 0:
                # taken before /clock's first message (ROS time 0): from the first time seen, not
                # the simulation's (or a bag's) whole run
                self._last_decision_ros_ns = now_ns
            if now_ns >= self._last_decision_ros_ns:
                return (now_ns - self._last_decision_ros_ns) / 1e9
            # the last decision is ahead: ROS time went back since (a simulator reset), and the
            # idle ERROR could not fire for as long as the simulator had run. From where it
            # landed; where no jump explains it (use_sim_time switched on), wall time
            if self._jump_to_ns and self._jump_to_ns <= now_ns:
                return (now_ns - self._jump_to_ns) / 1e9
        return time.monotonic() - self._last_decision_at

    def _maybe_log_stats(self, snap: messages.StatusSnapshot) -> None:
        period = self.cfg.stats_log_period_s
        if period <= 0 or time.monotonic() - self._last_stats_log < period:
            return
        self._last_stats_log = time.monotonic()
        self.get_logger().info(self.stats_line(snap))

    def stats_line(self, snap: messages.StatusSnapshot | None = None) -> str:
        """One line for the logs: counts, then p50/p99 per stage and per input conversion."""
        snap = snap or self.snapshot()
        with self._lock:
            conversions = " ".join(
                f"{s.name} {s.p50_ms:.2f} ({s.rate_hz:.1f} Hz)" for s in self.conversion_stats.summaries()
            )
        rate = next((s.rate_hz for s in snap.stages if s.name == "node_overhead"), 0.0)
        # the rate over the window's completions: paused or stopped, it falls over that window
        rate_text = f"{rate:.1f} Hz over the last {RATE_SPAN_S:g} s" if snap.enabled else "paused"
        stages = " | ".join(f"{s.name} {s.p50_ms:.2f}/{s.p99_ms:.2f} ms" for s in snap.stages)
        return (
            f"stats: {self.PAUSED_STATS + ', ' if not snap.enabled else ''}"
            f"{snap.decisions} decisions ({rate_text}), {snap.dropped_decisions} skipped, "
            f"{snap.deadline_misses} deadline misses, {snap.prefix_reuses} re-used the prefix, "
            f"{messages.input_counts(snap.invalid, ABSENT, self._input_topics)}"
            + (f", {self.commands_sent} commands sent" if self._command_pubs else "")
            + (f" | {stages} (p50/p99)" if stages else "")
            + f" | convert ms p50 (accepted rate): {conversions or '-'}"
        )


def counts_since(now: dict[tuple[str, str], int], before: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The (topic, reason) counts that rose since `before`, by how much."""
    return {k: n - before.get(k, 0) for k, n in now.items() if n > before.get(k, 0)}
