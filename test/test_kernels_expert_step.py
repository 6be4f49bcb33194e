"""kernels.expert_step: the expert's whole denoise-step pass in one persistent launch.

Numerics against the reference model run in test_fused.py (CPU: interpreter, one program; GPU:
compiled, one program per SM, inside the captured denoise graph). Here: the GPU code itself
builds at the real pi0.5 shapes for Hopper (sm_90, the H200) and Jetson Thor (sm_110) with
Triton's own ptxas and no GPU (scripts/compile_check.py, in a process without the interpreter):
the only check of Thor's target we can run in CI.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.expert_step import ExpertStepPlan

ROOT = Path(__file__).resolve().parents[1]


def _compile_check(*argv: str) -> list[dict]:
    """scripts/compile_check.py in a process without the interpreter; its JSON lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/compile_check.py"), *argv],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def test_step_kernel_builds_for_hopper_and_thor() -> None:
    results = {r["arch"]: r for r in _compile_check("90", "110")}
    assert set(results) == {90, 110}
    assert "unsupported_by_ptxas" not in results[90]
    if "unsupported_by_ptxas" in results[110]:  # Triton 3.6's ptxas predates sm_110 (seen on the H200 box)
        pytest.skip(f"this Triton's ptxas cannot build sm_110: {results[110]['unsupported_by_ptxas']}")
    for r in results.values():
        assert r["target"] and r["cooperative"]
        assert 0 < r["shared_bytes"] <= 227 * 1024  # fits Hopper's and Thor's shared memory


def test_traced_and_ptx_barrier_variants_build() -> None:
    """The variants bench/expert_step.py measures build too: phase timestamps, PTX barrier."""
    (result,) = _compile_check("--trace", "--ptx-barrier", "90")
    assert result["trace"] and result["ptx_barrier"] and result["target"]


def test_plan_refuses_too_many_suffix_tokens() -> None:
    with pytest.raises(ValueError, match="at most 64 suffix tokens"):
        ExpertStepPlan(65, 1024, 4096, 8, 256, 1, torch.device("meta"), torch.bfloat16, gpu=True, sm_count=132)


def test_phase_times_decodes_the_trace() -> None:
    """Trace layout: per phase (last program done, program 0 past the barrier), then the final
    phase, then the launch start; times in ns -> us."""
    plan = ExpertStepPlan(10, 32, 64, 4, 16, 1, torch.device("cpu"), torch.float32)
    plan.enable_trace(layers=2)
    n = 8 * 2 + 1
    stamps = []
    t = 1000
    for _ in range(n):
        stamps += [t + 3000, t + 4000]  # 3 us of work, 1 us of barrier
        t += 4000
    plan.trace.copy_(torch.tensor(stamps + [1000], dtype=torch.int64))
    rows = plan.phase_times()
    assert len(rows) == n and rows[9] == dict(layer=1, phase=1, work=3.0, barrier=1.0)
    assert rows[-1]["barrier"] == 0.0 and all(r["work"] == 3.0 for r in rows)
