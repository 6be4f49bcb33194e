"""process.stop_executor with real rclpy: callbacks already handed to the thread pool finish
before the executor shuts down, and none of them fails on a destroyed guard condition."""

from __future__ import annotations

import gc
import time

import pytest

from flashrt_ros.ros.process import stop_executor

pytestmark = pytest.mark.ros


def test_queued_callbacks_finish_before_the_executor_shuts_down(rclpy_context, capfd):
    """Two pool threads, four slow timer callbacks handed over: two run, two wait in the queue.
    Shutting the executor down first destroyed the guard condition those two trigger when they
    start ('The following exception was never retrieved: cannot use Destroyable ...')."""
    import rclpy
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import MultiThreadedExecutor

    node = rclpy.create_node("stop_executor_test", context=rclpy_context)
    done: list[int] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append(1)

    group = ReentrantCallbackGroup()
    timers = [node.create_timer(0.001, slow, callback_group=group) for _ in range(4)]
    executor = MultiThreadedExecutor(num_threads=2, context=rclpy_context)
    executor.add_node(node)
    for _ in timers:
        executor.spin_once(timeout_sec=0.1)
    stop_executor(executor)
    node.destroy_node()
    gc.collect()  # a failed callback's task reports its exception when it is collected
    assert len(done) == 4
    assert "never retrieved" not in capfd.readouterr().err


def _run_python(code: str) -> str:
    """`code` in a fresh interpreter (signal handlers are process-wide): its stdout."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_signals_held_acts_after_the_block_whichever_thread_received_them():
    """A signal mask holds only the masking thread's delivery: with another thread alive, the
    kernel handed the signal to it and Python ran the handler inside the held block (the
    executor's constructor, cut short, left a traceback at exit). Recorded instead: the block
    runs to its end and the KeyboardInterrupt comes after it."""
    out = _run_python(
        """
import os, signal, threading, time
from flashrt_ros.ros.process import interrupt_on_signals, signals_held
interrupt_on_signals()
threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
try:
    with signals_held():
        sent = threading.Event()
        threading.Timer(0.1, lambda: (os.kill(os.getpid(), signal.SIGTERM), sent.set())).start()
        sent.wait(10)  # the signal is in while the block runs, however late the timer fires
        time.sleep(0.1)
        print("block done")
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted after the block")
"""
    )
    assert out.split() == ["block", "done", "interrupted", "after", "the", "block"], out


def test_a_swallowed_interrupt_leaves_the_next_signal_live_and_a_stop_ignores_later_ones():
    """A KeyboardInterrupt raised in a __del__ is printed and dropped by Python: the next signal
    must still stop the build (a handler that ignored all signals after the first left the node
    unstoppable until it spun). Once the caller says it is stopping, a second signal is a no-op."""
    out = _run_python(
        """
import os, signal, time
from flashrt_ros.ros.process import REPEAT_S, interrupt_on_signals, stopping
interrupt_on_signals()

class Garbage:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here: its KeyboardInterrupt is swallowed

Garbage()
try:
    time.sleep(REPEAT_S + 0.2)  # the next Ctrl-C, a moment later
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)
    print("not stopped")
except KeyboardInterrupt:
    os.kill(os.getpid(), signal.SIGINT)  # a double Ctrl-C, before the caller says it stops
    time.sleep(0.05)
    stopping()
    time.sleep(REPEAT_S + 0.2)  # past the window that ignores a repeat anyway: only stopping() ignores it
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    print("stopped once")
"""
    )
    assert out.strip() == "stopped once", out


def test_a_hang_up_stops_the_nodes_unless_ignored_at_start() -> None:
    """SIGHUP is a stop signal like SIGINT / SIGTERM, except under nohup (ignored at start)."""
    import signal
    import subprocess
    import sys

    probe = "import signal; from flashrt_ros.ros.early_stop import STOP_SIGNALS; print(signal.SIGHUP in STOP_SIGNALS)"

    def run(**kwargs) -> str:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, **kwargs)
        return done.stdout.strip()

    # the child's SIGHUP as a shell gives it (a suite run under nohup would pass it on ignored)
    assert run(preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)) == "True"
    assert run(preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) == "False"


def test_a_failed_callback_reaches_on_error_once():
    """rclpy's MultiThreadedExecutor raises one failed callback's exception again at a later
    spin_once (the task is queued twice): each failure was counted and logged as node_error twice
    or three times."""
    out = _run_python(
        """
import threading, time
import rclpy
from rclpy.executors import MultiThreadedExecutor
from std_srvs.srv import Trigger
from flashrt_ros.ros.process import spin_until_signal

rclpy.init()
server, caller = rclpy.create_node("raising_server"), rclpy.create_node("raising_caller")
def fails(request, response):
    raise ValueError("boom")
server.create_service(Trigger, "raising_service", fails)
client = caller.create_client(Trigger, "raising_service")
executor = MultiThreadedExecutor(num_threads=8)
executor.add_node(server)
def calls():
    client.wait_for_service(timeout_sec=10)
    for _ in range(5):
        client.call_async(Trigger.Request())
        time.sleep(0.3)
threading.Thread(target=calls, daemon=True).start()
seen, end = [], time.monotonic() + 4
spin_until_signal(executor, done=lambda: time.monotonic() > end, on_error=seen.append)
print(len(seen), len({id(e) for e in seen}))
"""
    )
    handled, distinct = map(int, out.split())
    assert handled >= 1 and handled == distinct, out


def test_a_list_mixing_integers_and_decimals_is_named_with_its_fix(tmp_path, ros_env):
    """rcl refuses `[0.05, 1]` naming only a line; the start's one line names the parameter and
    says to write 1.0 (flow and block lists; any other refusal gets no such hint)."""
    import subprocess
    import sys

    from flashrt_ros.ros.process import mixed_list_hint

    flow = tmp_path / "flow.yaml"
    flow.write_text("flashrt_node:\n  ros__parameters:\n    device: cpu\n    action_max_step: [0.05, 0.05, 1]\n")
    block = tmp_path / "block.yaml"
    block.write_text("flashrt_node:\n  ros__parameters:\n    action_upper_limits:\n      - 0.5\n      - 2\n")
    fix = "mixes integers and decimals: write every number with a decimal point (1.0, not 1)"
    names = tmp_path / "names.yaml"  # a gantry's joints: rcl reads the bare y as a bool
    names.write_text("flashrt_node:\n  ros__parameters:\n    joint_names: [x, y, theta]\n")
    quote = "; joint_names (line 3) mixes bools with other items: quote every item that is text ('y', '1')"
    unbounded = tmp_path / "unbounded.yaml"  # rcl reads a plain -inf as a double, PyYAML as text
    unbounded.write_text("flashrt_node:\n  ros__parameters:\n    action_lower_limits: [-3, -inf]\n")
    for path, said in (
        (flow, f"; action_max_step (line 4) {fix}"),
        (block, f"; action_upper_limits (line 5) {fix}"),
        (names, quote),
        (unbounded, f"; action_lower_limits (line 3) {fix}"),
    ):
        cmd = [sys.executable, "-m", "flashrt_ros.ros.node", "--ros-args", "--params-file", str(path)]
        done = subprocess.run(cmd, env=ros_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.rstrip().endswith(said), done.stderr
    assert mixed_list_hint("Couldn't parse params file: '--params-file x.yaml'. Error: bad indentation") == ""
    # the list at rcl's line, not the first of its name: two arms' sections with one key
    two = tmp_path / "two.yaml"
    two.write_text(
        "left:\n  ros__parameters:\n    action_max_step: [0.05, 1e999]\n"
        "right:\n  ros__parameters:\n    action_max_step: [0.05, 1]\n"
    )
    rcl = f"Couldn't parse params file: '--params-file {two}'. Error: Sequence should be of same type. Value type "
    assert mixed_list_hint(rcl + "'integer' do not belong at line_num 6") == f"; action_max_step (line 6) {fix}"
    beyond = (
        "; action_max_step (line 3) holds a number rcl cannot read as one (beyond a double? write .inf for no bound)"
    )
    assert mixed_list_hint(rcl + "'string' do not belong at line_num 3") == beyond


@pytest.mark.parametrize(
    "items, rcl_type, kind",
    [("left_arm, 1", "integer", "integers"), ("y, 0.5", "double", "doubles")],  # a bare y is YAML's true: text
)
def test_a_number_among_text_in_a_list_gets_the_quote_hint(tmp_path, items, rcl_type, kind):
    """Text first, then a number: the hint is to quote the text, not to write decimals."""
    from flashrt_ros.ros.process import mixed_list_hint

    path = tmp_path / "p.yaml"
    path.write_text(f"flashrt_node:\n  ros__parameters:\n    joint_names: [{items}]\n")
    rcl = f"Couldn't parse params file: '--params-file {path}'. Error: Sequence should be of same type. Value type "
    said = mixed_list_hint(rcl + f"'{rcl_type}' do not belong at line_num 3")
    assert said == f"; joint_names (line 3) mixes {kind} with other items: quote every item that is text ('y', '1')"


def test_a_missing_tilde_params_file_says_tilde_is_not_expanded(capsys):
    from flashrt_ros.ros.process import init_rclpy

    assert init_rclpy(["x", "--ros-args", "--params-file", "~/no_such_flashrt_dir/p.yaml"], "flashrt_node") is False
    err = capsys.readouterr().err
    assert "no params file ~/no_such_flashrt_dir/p.yaml" in err and "~ is not expanded in a quoted path" in err
