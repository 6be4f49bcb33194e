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
