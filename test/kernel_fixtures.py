"""What the kernel tests share: the device they run on and dtype-specific tolerances.

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET).
"""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


_BUILD = """
import json
import importlib
from compile_check import resource_usage
compile_offline = importlib.import_module({module!r}).compile_offline
for arch in (90, 110):
    try:
        c = compile_offline(arch, **{kwargs})
    except Exception as exc:  # only an older Triton whose ptxas does not know sm_110 is excused
        if "is not defined for option 'gpu-name'" not in str(exc):
            raise
        print(json.dumps(dict(arch=arch, unsupported_by_ptxas=str(exc).splitlines()[-1][:200])))
        continue
    print(json.dumps(dict(arch=arch, shared=c.metadata.shared, target=f".target sm_{{arch}}" in c.asm["ptx"],
                          **resource_usage(c.asm["cubin"]))))
"""


def run_offline(*argv: str) -> list[dict]:
    """`python argv...` in a process without the interpreter (GPU code is built, nothing runs),
    with the repo and scripts/ importable (kernels, compile_check); its JSON lines."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join((str(root), str(root / "scripts"), env.get("PYTHONPATH", "")))
    run = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert run.returncode == 0, run.stderr[-3000:]
    # JSON objects only: on the H200 box (Triton 3.6) the build printed another line starting with "{"
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"')]


def offline_builds(module: str, **kwargs) -> dict[int, dict]:
    """`module.compile_offline(arch)` for sm_90 (H200) and sm_110 (Jetson Thor), built with
    Triton's own ptxas: {arch: shared bytes, target, registers, stack bytes}, or {arch:
    unsupported_by_ptxas} where that ptxas predates the target (Triton 3.6's and sm_110).
    sm_90 must build. `kwargs`: passed on to compile_offline (literals)."""
    results = {r["arch"]: r for r in run_offline("-c", _BUILD.format(module=module, kwargs=repr(kwargs)))}
    assert set(results) == {90, 110} and "unsupported_by_ptxas" not in results[90]
    return results
