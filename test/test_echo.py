"""The demo console's lines (flashrt_ros.ros.echo) on real messages."""

from __future__ import annotations

import array

import numpy as np
import pytest

pytestmark = pytest.mark.ros


def test_the_first_chunk_and_a_status_before_any_decision_say_so():
    from flashrt_ros.msg import ActionChunk, PipelineStatus, StageStats

    from flashrt_ros.ros.echo import chunk_line, status_line

    actions = np.arange(2 * 3, dtype=np.float32).reshape(2, 3) / 10
    msg = ActionChunk(chunk_id=1, horizon=2, action_dim=3, inference_latency_ms=933.6)
    msg.actions = array.array("f", actions.ravel().tobytes())
    first = chunk_line(msg, first=True)
    assert "latency 933.60 ms" in first
    note = "(the first one received: a node's first decision warms its caches up)"
    assert first.endswith(f"[+0.000 +0.100 +0.200]  {note}")
    assert chunk_line(msg).endswith("[+0.000 +0.100 +0.200]")  # id 1 again after a ~/reset: no note
    status = PipelineStatus(policy="pi05_tiny", device="cpu", precision="float32")
    assert status_line(status).endswith("ms p50/p90/p99: (no decision yet)")
    status.stages = [StageStats(name="full", latency_p50_ms=20.0, latency_p90_ms=21.0, latency_p99_ms=22.5)]
    assert status_line(status).endswith("ms p50/p90/p99: full 20.00/21.00/22.50")
