"""The fused path's fall-back on a CUDA GPU (`backend: auto`, the node's default).

A Triton kernel that cannot be built here (as Triton 3.6's ptxas cannot build sm_110 for Thor)
leaves the pipeline on the reference, with a warning that says why, and its chunks are the
reference's. A kernel that faults leaves no working device: then there is no fall-back but one
clear error at start-up (in the capture or in the warm-up decision), instead of every later
decision failing. Each case runs in a process of
its own: a faulted CUDA context cannot be used again, and Triton's compiler settings are read
from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import logging, os, sys
    import numpy as np, torch
    import triton, triton.language as tl
    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies import fused
    from flashrt_ros.policies.policy import Observation, default_policy

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    rng = np.random.default_rng(0)
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(2)],
                      rng.normal(size=6).astype(np.float32) * 0.3, "pick up the cube")
    policy = lambda: default_policy(device="cuda", num_views=2, action_dof=6)

    @triton.jit
    def wild_store(p):
        tl.store(p + (1 << 40), 1.0)  # 4 TB past a 4-byte buffer: an illegal address

    def fault(*_):
        wild_store[(1,)](torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()

    if sys.argv[1] == "warm-up-fault":  # built, then a stage faults in the warm-up decision
        pipeline = Pipeline(policy(), backend="fused")
        fused.FusedPi0.run = fault
        try:
            pipeline.warm_up(6, "pick up the cube")
        except Exception as exc:
            print("WARM-UP REFUSED:", type(exc).__name__, exc, flush=True)
        # no interpreter shutdown: the captured graphs' and memory pool's destructors run on the
        # broken context, which may abort the process (the one GPU run of this case failed, its
        # output unseen)
        os._exit(0)

    if sys.argv[1] == "fault":
        fused.FusedPi0.capture = fault
        try:
            Pipeline(policy(), backend="auto")
        except RuntimeError as exc:
            print("REFUSED:", exc)
        sys.exit(0)

    auto = Pipeline(policy(), seed=3, backend="auto")
    print("BACKEND:", auto.backend)
    ref = Pipeline(policy(), seed=3, backend="reference")
    same = all(auto.decide(obs).actions.tobytes() == ref.decide(obs).actions.tobytes() for _ in range(2))
    print("SAME_AS_REFERENCE:", same)
    try:
        Pipeline(policy(), backend="fused")
        print("FUSED: built")
    except Exception as exc:
        print("FUSED: raised", type(exc).__name__)
    """
)


def run_case(case: str, tmp_path: Path, **env: str) -> str:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(os.environ, PYTHONPATH=path, TRITON_CACHE_DIR=str(tmp_path / "triton"), **env)
    full_env.pop("TRITON_INTERPRET", None)  # the GPU compiler is what is under test
    script = tmp_path / "fallback_case.py"  # a file: Triton reads a @jit function's source
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), case], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


FAILING_PTXAS = """#!/bin/sh
case "$*" in *--version*) echo "Cuda compilation tools, release 12.8, V12.8.93"; exit 0;; esac
echo "ptxas fatal : injected by test_fallback.py" >&2
exit 1
"""


@pytest.mark.gpu
def test_a_kernel_that_cannot_be_built_falls_back_to_the_reference(tmp_path):
    """A ptxas that fails every build stands for any kernel this GPU's toolchain cannot build
    (given through both of Triton's knobs for it); a fresh Triton cache makes every kernel
    compile."""
    ptxas = tmp_path / "ptxas"
    ptxas.write_text(FAILING_PTXAS)
    ptxas.chmod(0o755)
    out = run_case("unbuildable", tmp_path, TRITON_PTXAS_PATH=str(ptxas), PTXAS_OPTIONS="--no-such-ptxas-option")
    assert "BACKEND: reference" in out, out
    # one log line that names the cause: the failing ptxas's message (or ptxas refusing the option)
    warning = [line for line in out.splitlines() if "fused path unavailable (" in line]
    assert len(warning) == 1 and warning[0].endswith("): running the reference path"), out
    assert any(m in warning[0] for m in ("injected by test_fallback.py", "no-such-ptxas-option")), warning
    assert "SAME_AS_REFERENCE: True" in out, out
    assert "FUSED: raised" in out, out  # backend "fused" asked for explicitly: no silent fall-back


@pytest.mark.gpu
def test_a_kernel_fault_is_not_covered_by_a_fall_back(tmp_path):
    out = run_case("fault", tmp_path)
    assert "REFUSED: the fused path failed (" in out, out
    assert "left the GPU unusable" in out and "not falling back to the reference" in out, out


@pytest.mark.gpu
def test_a_kernel_fault_in_the_warm_up_says_the_gpu_is_unusable(tmp_path):
    """The node turns this into a failed start (test_node.py), not a warning and a node whose
    every decision fails."""
    out = run_case("warm-up-fault", tmp_path)
    assert "WARM-UP REFUSED: DeviceUnusable the warm-up decision failed (" in out, out
    assert "left the GPU unusable" in out and "restart the process" in out, out


@pytest.mark.gpu
def test_the_fused_path_builds_where_nothing_is_wrong(tmp_path):
    """The control: with the same script and no injected failure the fused path is active, so
    the two tests above fail for the reason they inject."""
    out = run_case("unbuildable", tmp_path)
    assert "BACKEND: fused" in out and "fused path active" in out and "FUSED: built" in out, out
