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
        c = compile_offline(arch)
    except Exception as exc:  # only an older Triton whose ptxas does not know sm_110 is excused
        if "is not defined for option 'gpu-name'" not in str(exc):
            raise
        print(json.dumps(dict(arch=arch, unsupported_by_ptxas=str(exc).splitlines()[-1][:200])))
        continue
    print(json.dumps(dict(arch=arch, shared=c.metadata.shared, target=f".target sm_{{arch}}" in c.asm["ptx"],
                          **resource_usage(c.asm["cubin"]))))
"""


def offline_builds(module: str) -> dict[int, dict]:
    """`module.compile_offline(arch)` for sm_90 (H200) and sm_110 (Jetson Thor), built with
    Triton's own ptxas in a subprocess without the interpreter: {arch: shared bytes, target,
    registers, stack bytes}, or {arch: unsupported_by_ptxas} where that ptxas predates the
    target (Triton 3.6's and sm_110). sm_90 must build."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = (str(root), str(root / "scripts"), env.get("PYTHONPATH", ""))  # kernels, compile_check
    env["PYTHONPATH"] = os.pathsep.join(paths)
    code = _BUILD.format(module=module)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["arch"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert set(results) == {90, 110} and "unsupported_by_ptxas" not in results[90]
    return results
