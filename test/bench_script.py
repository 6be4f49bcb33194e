"""Run one of bench/'s scripts in its smoke mode, as a user would, and read what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_bench_script(name: str, out: Path, *args: str, timeout: float = 600) -> tuple[str, dict]:
    """`python bench/<name>.py *args --out out`: its stdout and the one JSON result it wrote
    (`<name>_*.json` in `out`); fails with the script's stderr if it did not exit 0."""
    run = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (path,) = out.glob(f"{name}_*.json")
    return run.stdout, json.loads(path.read_text())
