"""The demo console's lines (flashrt_ros.ros.echo) on real messages."""

from __future__ import annotations

import array
import contextlib

import numpy as np
import pytest

pytestmark = pytest.mark.ros


def test_the_first_chunk_and_a_status_before_any_decision_say_so():
    from flashrt_ros.msg import ActionChunk, PipelineStatus, StageStats

    from flashrt_ros.ros.echo import chunk_line, status_line

    actions = np.arange(2 * 3, dtype=np.float32).reshape(2, 3) / 10
    msg = ActionChunk(chunk_id=1, horizon=2, action_dim=3, inference_latency_ms=933.6)
    msg.actions = array.array("f", actions.ravel().tobytes())
    first = chunk_line(msg)
    assert "latency 933.60 ms" in first and "newest input    nan ms old" in first  # no source stamps
    # the inputs' age on arrival, on the console's clock (the chunk's own stamp is its joint state's)
    from builtin_interfaces.msg import Time

    msg.header.stamp, msg.source_stamps = Time(sec=5), [Time(sec=6), Time(sec=5, nanosec=900_000_000)]
    assert "newest input   42.0 ms old on arrival" in chunk_line(msg, 6_042_000_000)
    msg.source_stamps = []
    assert first.endswith("[+0.000 +0.100 +0.200]")
    status = PipelineStatus(policy="pi05_tiny", device="cpu", precision="float32")
    assert status_line(status).endswith("ms p50/p90/p99: (no decision yet)")
    assert "PAUSED" not in status_line(status)  # enabled unless the node says otherwise
    status.enabled = False
    paused = "PAUSED (~/enable false, or a lifecycle node inactive)"
    assert status_line(status).startswith(f"status  pi05_tiny cpu float32: {paused}, 0 decisions, 0 skipped")
    status.stages = [StageStats(name="full", rate_hz=7.6)]  # the rate of before the pause, decaying
    assert "Hz" not in status_line(status).splitlines()[0]
    status.stages = []
    status.enabled = True
    status.stages = [StageStats(name="full", latency_p50_ms=20.0, latency_p90_ms=21.0, latency_p99_ms=22.5)]
    assert status_line(status).endswith("ms p50/p90/p99: full 20.00/21.00/22.50")
    # waits for a topic with nothing yet are not rejected messages: listed apart
    from flashrt_ros.msg import InputCounter

    status.invalid_inputs = [
        InputCounter(topic="/cam", reason="absent", count=50),
        InputCounter(topic="/joints", reason="stale", count=2),
    ]
    status.prefix_reuses = 7
    line = status_line(status).splitlines()[0]
    assert line.endswith("input refusals: stale /joints: 2; waits for absent /cam: 50"), line
    assert "0 deadline misses, 7 re-used the prefix, input refusals" in line
    assert "(prefix re-used)" not in chunk_line(msg)
    msg.prefix_reused = True
    assert "latency 933.60 ms (prefix re-used)  newest input" in chunk_line(msg)
    msg.source_stamps = [Time(sec=5, nanosec=800_000_000), Time(sec=5, nanosec=880_000_000), Time(sec=6)]
    assert "(prefix re-used, frames up to 200.0 ms before the joint state)  newest" in chunk_line(msg)
    msg.source_stamps = [Time(sec=6, nanosec=30_000_000), Time(sec=6, nanosec=10_000_000), Time(sec=6)]
    assert "(prefix re-used, frames 10.0 ms after the joint state)" in chunk_line(msg)


def test_a_malformed_chunk_is_said_and_a_services_refusals_are_node_wide():
    """Another publisher's chunk whose sizes disagree is a line saying so, not a traceback that
    ends the console; a capsule service's refusals are not listed as input refusals."""
    from flashrt_ros.msg import ActionChunk, InputCounter, PipelineStatus

    from flashrt_ros.ros.echo import chunk_line, status_line

    msg = ActionChunk(chunk_id=3, horizon=2, action_dim=3)
    msg.actions = array.array("f", [0.0] * 5)
    assert chunk_line(msg) == "chunk     3  malformed: 5 action values for horizon 2 x action_dim 3"
    msg.horizon, msg.action_dim, msg.actions = 0, 0, array.array("f")
    assert chunk_line(msg) == "chunk     3  malformed: 0 action values for horizon 0 x action_dim 0"
    status = PipelineStatus(policy="pi05_tiny", device="cpu", precision="float32")
    status.invalid_inputs = [
        InputCounter(topic="/joints", reason="stale", count=2),
        InputCounter(topic="/flashrt_node/capsule/restore", reason="unknown_capsule", count=4),
        InputCounter(topic="", reason="clock_jumped_back", count=1),
    ]
    line = status_line(status).splitlines()[0]
    assert line.endswith(
        "input refusals: stale /joints: 2; node: unknown_capsule /flashrt_node/capsule/restore: 4, clock_jumped_back: 1"
    ), line


def test_the_command_line_shows_count_rate_and_the_last_command():
    from std_msgs.msg import Float64MultiArray

    from flashrt_ros.ros.echo import command_line

    last = Float64MultiArray(data=[0.5, -0.25, 1.0])
    line = command_line(50, 1.0, last)
    assert line == "        commands: 50 since the last status (50.0 Hz), last [+0.500 -0.250 +1.000]"
    # the first window opens at its first command: 5 commands are 4 intervals
    assert "commands: 5 since the last status (40.0 Hz)" in command_line(5, 0.1, last, intervals=4)
    assert "(" not in command_line(1, 0.0, last, intervals=0).split("last [")[0]
    last.data = [float(i) for i in range(9)]
    assert command_line(3, 0.0, last).endswith("status, last [+0.000 +1.000 +2.000 +3.000 +4.000 +5.000 +6.000 ...]")


def test_chunk_ids_that_start_again_are_said_and_summed_per_run(rclpy_context, capsys, monkeypatch):
    """A node restarted (or reset) under a running echo: the summary said "ids 847..83" and averaged
    the rate over the downtime."""

    from flashrt_ros.ros import echo as echo_module

    clock = [100.0]
    monkeypatch.setattr(echo_module.time, "monotonic", lambda: clock[0])
    console = echo_module.Echo("/flashrt_node", 1, False, context=rclpy_context)
    try:
        for chunk_id, at in ((847, 100.0), (848, 100.1), (849, 100.2), (1, 130.0), (2, 130.1)):
            clock[0] = at
            console._on_chunk(chunk(chunk_id))
        said = "echo: chunk ids started again (849 -> 1): the node restarted or was reset, or a capsule was restored"
        assert said in capsys.readouterr().out
        summary = console.summary()
        assert summary.startswith("echo: received 5 chunks (10.0 Hz), ids 847..849, 1..2, median"), summary
    finally:
        console.destroy_node()


def chunk(chunk_id: int, latency_ms: float = 5.0, actions: int = 1):
    """A chunk of horizon 1 x action_dim 1 holding `actions` float32 values (1: well formed)."""
    from flashrt_ros.msg import ActionChunk

    data = [0.0] * actions
    return ActionChunk(chunk_id=chunk_id, horizon=1, action_dim=1, inference_latency_ms=latency_ms, actions=data)


def test_malformed_chunks_are_said_apart_and_the_latency_median_is_over_a_window(rclpy_context, capsys, monkeypatch):
    """Malformed chunks (another publisher on the topic) were counted as received, their latency in
    the median, and alone they passed the demo's success check; every chunk was kept, for a console
    left running for days."""
    from flashrt_ros.ros import echo as echo_module

    monkeypatch.setattr(echo_module, "LATENCY_WINDOW", 3)
    quiet = echo_module.Echo("/flashrt_node", 1, True, context=rclpy_context)
    try:  # --quiet: the summary alone, which counts them
        quiet._on_chunk(chunk(1, 1000.0, actions=0))
        assert capsys.readouterr().out == "" and quiet.summary().endswith("1 malformed")
    finally:
        quiet.destroy_node()
    console = echo_module.Echo("/flashrt_node", 1, False, context=rclpy_context)
    try:
        console._on_chunk(chunk(1, 1000.0, actions=0))
        assert "chunk     1  malformed: 0 action values for horizon 1 x action_dim 1" in capsys.readouterr().out
        assert (console.received, console.summary()) == (0, "echo: no action chunks received, 1 malformed")
        for chunk_id, ms in ((2, 1.0), (3, 9.0), (4, 2.0), (5, 3.0)):
            console._on_chunk(chunk(chunk_id, ms))
        summary = console.summary()
        assert (console.received, len(console.latencies)) == (4, 3)
        assert summary.endswith("ids 2..5, median inference latency 3.00 ms (the last 3), 1 malformed"), summary
    finally:
        console.destroy_node()


def test_bad_arguments_exit_2_with_one_line(ros_env):
    """A trailing slash in --node is the same node; impossible durations, counts, ROS arguments
    and node names are refused in one line, not a traceback or a silent run for ever."""
    import subprocess
    import sys

    def echo(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "flashrt_ros.ros.echo", *args]
        return subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=timeout)

    for args, said in (
        (["--duration", "-1"], "expected a number of seconds >= 0, got '-1'"),
        (["--duration", "nan"], "expected a number of seconds >= 0, got 'nan'"),
        (["--every", "0"], "expected an integer >= 1, got '0'"),
        (["--ros-args", "-r", "__ns:=bad"], "echo: cannot start: the ROS arguments are invalid: "),
        (["--ros-args", "--param-file", "x.yaml"], "unknown ROS arguments ['--param-file', 'x.yaml'] (a typo?"),
        (["--node", "bad name", "--duration", "1"], "echo: cannot start: topic name must not contain"),
        (["--ros-args", "-p", "use_sim_time:=7"], "echo: cannot start: use_sim_time must be true or false, got "),
    ):
        done = echo(*args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    # nothing publishes there: said after a few seconds, not silence until the end
    done = echo("--node", "/nobody/", "--duration", "5")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "echo: no publisher of /nobody/action_chunk yet (nodes seen: " in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("echo: no action chunks received")


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_the_entry_script_stopped_by_a_signal_prints_its_summary(ros_env, signum):
    """`ros2 run flashrt_ros flashrt_echo` (scripts/ros/flashrt_echo), stopped while it listens:
    the summary and the exit status say what came, not the import-time guard's "not starting"
    line with status 0."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "ros" / "flashrt_echo"
    cmd = [sys.executable, str(script), "--node", "/nobody", "--hint-after", "0.5"]
    live_hup = lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)  # noqa: E731 - as a shell starts it (not nohup's)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(cmd, env=ros_env, preexec_fn=live_hup, **pipes)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while "no publisher of /nobody/action_chunk" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()  # the hint: it listens, past its imports and rclpy.init
        proc.send_signal(getattr(signal, signum))
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1 and out.rstrip().endswith("echo: no action chunks received"), (out, err)
    assert "not starting" not in err, err


def test_the_entry_script_stopped_while_importing_exits_1(ros_env):
    """Stopped in its first tenths of a second (the import-time guard): no chunk came, so status 1,
    as when stopped later; a script checking `flashrt_echo --duration N` saw 0 and took it for chunks."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "ros" / "flashrt_echo"
    assert 'stop_cleanly_while_importing("flashrt_echo", status=1)' in script.read_text()
    guarded = (  # the guard as the script installs it, then a stop signal while it holds
        "import os, signal; from flashrt_ros.ros.early_stop import stop_cleanly_while_importing as guard; "
        "guard('flashrt_echo', status=1); os.kill(os.getpid(), signal.SIGTERM); signal.pause()"
    )
    done = subprocess.run([sys.executable, "-c", guarded], env=ros_env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "[flashrt_echo] not starting: stopped by SIGTERM while starting" in done.stderr, done.stderr


def test_the_silence_hint_names_a_paused_node_and_one_that_publishes_nothing(ros_env, rclpy_context):
    """A paused node (its status says enabled false) was told "inputs missing?"; a lifecycle node
    there that publishes nothing (not configured) "check --node", with that very node listed; a
    plain node that publishes nothing yet is loading its policy."""
    import subprocess
    import sys
    import threading

    from flashrt_ros.msg import PipelineStatus
    from rclpy.node import Node

    def echo(node: str) -> str:
        cmd = [sys.executable, "-m", "flashrt_ros.ros.echo", "--node", node, "--duration", "10", "--hint-after", "4"]
        done = subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        return done.stdout

    from lifecycle_msgs.srv import GetState

    quiet = Node("flashrt_node", namespace="/echo_quiet", context=rclpy_context)
    quiet.create_service(GetState, "/echo_quiet/flashrt_node/get_state", lambda request, response: response)
    loading = Node("flashrt_node", namespace="/echo_loading", context=rclpy_context)
    paused = Node("flashrt_node", namespace="/echo_paused", context=rclpy_context)
    status = paused.create_publisher(PipelineStatus, "/echo_paused/flashrt_node/status", 10)
    stop = threading.Event()

    def publish() -> None:
        while not stop.wait(0.2):
            status.publish(PipelineStatus(enabled=False))

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        out = echo("/echo_quiet/flashrt_node")
        running = "echo: /echo_quiet/flashrt_node is running but publishes no /echo_quiet/flashrt_node/action_chunk: "
        assert running in out, out
        assert "ros2 lifecycle set /echo_quiet/flashrt_node configure" in out, out
        out = echo("/echo_loading/flashrt_node")
        assert "echo: no publisher of /echo_loading/flashrt_node/action_chunk yet (nodes seen: " in out, out
        assert "the node is still starting (loading its policy)" in out, out
        out = echo("/echo_paused/flashrt_node")
        assert "echo: /echo_paused/flashrt_node is paused (its ~/status: enabled false): ros2 service call " in out, out
        assert out.rstrip().endswith("echo: no action chunks received (the node was paused)"), out
    finally:
        stop.set()
        thread.join()
        quiet.destroy_node()
        loading.destroy_node()
        paused.destroy_node()


def _echo_while_publishing(ros_env, rclpy_context, node: str, sources: int, seconds: float, period_s: float):
    """`python -m flashrt_ros.ros.echo --node <node>` for `seconds`, while `sources` nodes each
    publish a well-formed chunk (ids counting up) on its action_chunk every `period_s`."""
    import subprocess
    import sys
    import threading

    from flashrt_ros.msg import ActionChunk
    from rclpy.node import Node

    nodes = [Node(f"chunk_source_{i}", context=rclpy_context) for i in range(sources)]
    pubs = [n.create_publisher(ActionChunk, f"{node}/action_chunk", 10) for n in nodes]
    stop = threading.Event()

    def publish() -> None:
        chunk_id = 0
        while not stop.wait(period_s):
            chunk_id += 1
            for pub in pubs:
                pub.publish(ActionChunk(chunk_id=chunk_id, horizon=1, action_dim=1, actions=[0.0]))

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        cmd = [sys.executable, "-m", "flashrt_ros.ros.echo", "--node", node, "--duration", str(seconds)]
        return subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=60)
    finally:
        stop.set()
        thread.join()
        for n in nodes:
            n.destroy_node()


def test_two_publishers_of_the_chunks_are_said(ros_env, rclpy_context):
    """Two demos on one ROS domain merged: the console counted both nodes' chunks as one node's
    (13.4 Hz against 10) and said OK."""
    done = _echo_while_publishing(ros_env, rclpy_context, "/echo_two/flashrt_node", 2, seconds=4, period_s=0.2)
    topic = "/echo_two/flashrt_node/action_chunk"
    assert f"echo: 2 publishers of {topic}: chunks of more than one node" in done.stdout, done.stdout


def test_chunk_line_without_a_receive_time_gives_no_age():
    """chunk_line(msg) (received_ns 0 = unknown) must not turn the stamps into a huge negative age."""
    import numpy as np
    from builtin_interfaces.msg import Time
    from flashrt_ros.msg import ActionChunk

    from flashrt_ros.ros.echo import chunk_line

    msg = ActionChunk(chunk_id=1, horizon=1, action_dim=2)
    msg.actions = array.array("f", np.zeros(2, np.float32).tobytes())
    msg.source_stamps = [Time(sec=5)]
    assert "newest input    nan ms old" in chunk_line(msg)


def _echo_chunk(dim: int, stamps_ns: list[int], reused: bool = True):
    import numpy as np
    from builtin_interfaces.msg import Time
    from flashrt_ros.msg import ActionChunk

    msg = ActionChunk(chunk_id=3, horizon=1, action_dim=dim, prefix_reused=reused)
    msg.actions = array.array("f", np.arange(dim, dtype=np.float32).tobytes())
    msg.source_stamps = [Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000) for t in stamps_ns]
    return msg


def test_a_row_of_exactly_seven_actions_is_not_marked_cut():
    from flashrt_ros.ros.echo import chunk_line

    assert chunk_line(_echo_chunk(7, [])).endswith("+6.000]")
    assert chunk_line(_echo_chunk(8, [])).endswith("+6.000 ...]")


def test_a_reused_chunk_with_one_source_stamp_does_not_crash_the_console():
    from flashrt_ros.ros.echo import chunk_line

    line = chunk_line(_echo_chunk(2, [5_000_000_000]), 5_010_000_000)
    assert "(prefix re-used)" in line


def test_frames_stamped_with_the_joint_state_are_not_after_it():
    from flashrt_ros.ros.echo import chunk_line

    line = chunk_line(_echo_chunk(2, [5_000_000_000, 5_000_000_000]), 5_010_000_000)
    assert "frames up to 0.0 ms before the joint state" in line, line


def test_skipped_decisions_are_counted_once_not_again_as_node_wide():
    """The node's dropped_decision counter (no topic) is the "skipped" count; listed again under
    "node:" it read as a second kind of trouble."""
    from flashrt_ros.msg import InputCounter, PipelineStatus

    from flashrt_ros.ros.echo import status_line

    status = PipelineStatus(policy="p", device="cpu", precision="float32")
    status.invalid_inputs = [InputCounter(topic="", reason="dropped_decision", count=3)]
    line = status_line(status)
    assert "3 skipped" in line and "node:" not in line, line


def test_the_commands_rate_counts_from_the_first_command_then_from_each_status(rclpy_context, capsys, monkeypatch):
    """The first window opens at the first command (not at the console's start); later windows at
    each status line, not restarted by every command (which would read as a far higher rate)."""
    from flashrt_ros.msg import PipelineStatus
    from std_msgs.msg import Float64MultiArray

    from flashrt_ros.ros import echo as echo_module

    clock = [100.0]
    monkeypatch.setattr(echo_module.time, "monotonic", lambda: clock[0])
    console = echo_module.Echo("/flashrt_node", 1, False, context=rclpy_context)
    try:
        for window_start in (105.0, 106.0):
            for k in range(11):  # 11 commands 0.1 s apart: 10 intervals over 1 s, then a status
                clock[0] = window_start + 0.1 * k
                console._on_command(Float64MultiArray(data=[0.5]))
            clock[0] = window_start + 1.0
            console._on_status(PipelineStatus(policy="p", device="cpu", precision="float32"))
        lines = [line for line in capsys.readouterr().out.splitlines() if "commands:" in line]
        assert "commands: 11 since the last status (10.0 Hz)" in lines[0], lines
        assert "commands: 11 since the last status (11.0 Hz)" in lines[1], lines  # 11 intervals: from the status
    finally:
        console.destroy_node()


# ---- edges of the console: malformed sizes, restarts, --every, --quiet, the exit status ---------


def _chunk(horizon: int, dim: int, values: int, chunk_id: int = 1):
    from flashrt_ros.msg import ActionChunk

    msg = ActionChunk(chunk_id=chunk_id, horizon=horizon, action_dim=dim)
    msg.actions = array.array("f", [0.0] * values)
    return msg


def test_a_chunk_of_horizon_0_is_malformed_not_a_crash():
    """horizon 0 x action_dim 3 with no values passed as well formed, then actions[0] raised."""
    from flashrt_ros.ros.echo import chunk_line, malformed

    msg = _chunk(0, 3, 0)
    assert malformed(msg) == "0 action values for horizon 0 x action_dim 3"
    assert chunk_line(msg).endswith("malformed: 0 action values for horizon 0 x action_dim 3")


def test_a_chunk_of_action_dim_0_is_malformed_not_received():
    """horizon 2 x action_dim 0 with no values is no chunk: it must not pass the demo's check."""
    from flashrt_ros.ros.echo import malformed

    assert malformed(_chunk(2, 0, 0)) == "0 action values for horizon 2 x action_dim 0"


def test_a_chunk_without_source_stamps_has_no_age_even_with_a_receive_time():
    """no source stamp: the age is unknown (nan), not the console's clock read as an age."""
    from flashrt_ros.ros.echo import chunk_line

    line = chunk_line(_chunk(1, 1, 1), 6_042_000_000)
    assert "newest input    nan ms old" in line, line


def test_the_status_line_shows_the_decision_rate():
    """the first stage's rate, enabled."""
    from flashrt_ros.msg import PipelineStatus, StageStats

    from flashrt_ros.ros.echo import status_line

    status = PipelineStatus(policy="p", device="cpu", precision="float32", decisions=40)
    status.stages = [StageStats(name="full", rate_hz=9.6)]
    assert "40 decisions (9.6 Hz), 0 skipped" in status_line(status), status_line(status)


def test_one_command_in_a_window_has_no_rate():
    """the first window's single command is 0 intervals: no '(0.0 Hz)'."""
    from std_msgs.msg import Float64MultiArray

    from flashrt_ros.ros.echo import command_line

    line = command_line(1, 0.5, Float64MultiArray(data=[0.5]), intervals=0)
    assert line == "        commands: 1 since the last status, last [+0.500]", line


@contextlib.contextmanager
def _console(rclpy_context, monkeypatch, every: int = 1, publishers: int = 1):
    """An Echo on a clock the test sets, seeing `publishers` publishers, and a `feed(id, at)` for
    its chunks (`at`: the clock when it arrives)."""
    from flashrt_ros.ros import echo as echo_module

    clock = [100.0]
    monkeypatch.setattr(echo_module.time, "monotonic", lambda: clock[0])
    console = echo_module.Echo("/flashrt_node", every, False, context=rclpy_context)
    console.count_publishers = lambda topic: publishers

    def feed(*ids_at: tuple[int, float]) -> None:
        for chunk_id, at in ids_at:
            clock[0] = at
            console._on_chunk(chunk(chunk_id))

    try:
        yield console, feed
    finally:
        console.destroy_node()


def test_a_chunk_id_repeated_is_a_restart(rclpy_context, capsys, monkeypatch):
    """A node restarted after its first chunk sends id 1 again: said, and a run of its own."""
    with _console(rclpy_context, monkeypatch) as (console, feed):
        feed((1, 100.0), (1, 130.0), (2, 130.1))
        assert "chunk ids started again (1 -> 1)" in capsys.readouterr().out
        assert ", ids 1..1, 1..2, " in console.summary(), console.summary()


def test_two_publishers_interleaved_ids_are_not_restarts(rclpy_context, capsys, monkeypatch):
    """With two publishers (said once) the interleaved ids are one run, no restart lines."""
    with _console(rclpy_context, monkeypatch, publishers=2) as (console, feed):
        feed((1, 100.0), (1, 100.05), (2, 100.1), (2, 100.15))
        out = capsys.readouterr().out
        assert "2 publishers of /flashrt_node/action_chunk" in out and "started again" not in out, out
        assert ", ids 1..2, " in console.summary(), console.summary()


def test_every_n_prints_the_first_chunk_then_every_nth(rclpy_context, capsys, monkeypatch):
    """--every 3 prints chunks 1 and 4 (the first at once), not 3."""
    with _console(rclpy_context, monkeypatch, every=3) as (_, feed):
        feed(*((chunk_id, 100.0 + chunk_id) for chunk_id in range(1, 5)))
        printed = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("chunk ")]
        assert printed == ["1", "4"], printed


def test_the_summary_says_the_last_n_only_when_chunks_fell_out_of_the_window(rclpy_context, monkeypatch):
    """2 chunks in a window of 10000: the median is over all of them, not 'the last 2'."""
    with _console(rclpy_context, monkeypatch) as (console, feed):
        feed((1, 100.0), (2, 100.1))
        assert console.summary().endswith("median inference latency 5.00 ms"), console.summary()


def test_quiet_prints_no_chunk_line(rclpy_context, capsys, monkeypatch):
    """--quiet prints only the summary."""
    from flashrt_ros.ros import echo as echo_module

    console = echo_module.Echo("/flashrt_node", 1, True, context=rclpy_context)
    try:
        console._on_chunk(chunk(1))
        assert capsys.readouterr().out == "" and console.received == 1
    finally:
        console.destroy_node()


def test_a_duration_of_0_is_accepted_as_until_ctrl_c():
    """--duration 0 is the documented 'until Ctrl-C', not refused."""
    from flashrt_ros.ros.echo import _seconds

    assert _seconds("0") == 0.0


def test_echo_exits_0_once_a_chunk_arrived(ros_env, rclpy_context):
    """The demo's success check: status 0 when a well-formed chunk came."""
    done = _echo_while_publishing(ros_env, rclpy_context, "/echo_ok/flashrt_node", 1, seconds=3, period_s=0.1)
    assert "echo: received " in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
