"""Does the eager HF SigLIP + Gemma prefix (bench/adopt_hf.py's model) run slower once
torch.compile has run in the process? adopt_hf.py times eager after compiling; three of its GPU
runs showed eager at 25-43 ms where its own gate had timed 21-24 minutes before.

    python bench/eager_after_compile.py        (a GPU; ~2 min)

Prints the eager median per round of 30 calls before compiling, after, after 20 s idle, and after
inductor's compile workers are shut down, with the process's children's CPU share at each point.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from adopt_hf import build, run  # noqa: E402  (bench/ beside this file)

from flashrt_ros.bench.timing import time_call  # noqa: E402


def eager_round(model, inputs, device: torch.device, tag: str) -> None:
    with torch.no_grad():
        s = time_call(lambda: run(model, inputs), 30, 3, device)
    print(f"{tag:40s} median {statistics.median(s):7.2f}  min {min(s):7.2f}  max {max(s):7.2f}", flush=True)


def children() -> None:
    """This process's children (inductor's compile workers) and their CPU share."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,pcpu,comm"], capture_output=True, text=True).stdout
    mine = [line.split() for line in out.splitlines()[1:] if line.split()[1] == str(os.getpid())]
    pcpu = sum(float(f[2]) for f in mine)
    print(f"  children: {len(mine)}; their CPU {pcpu:.1f} %; load average {os.getloadavg()}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        print("eager_after_compile.py needs a CUDA GPU (none here)", file=sys.stderr)
        raise SystemExit(2)  # the wrong machine, not a benchmark that failed
    device = torch.device("cuda")
    torch.manual_seed(0)
    model, inputs = build(False, 27, 18)
    model = model.to(device, torch.bfloat16).eval()
    inputs = {k: v.to(device, torch.bfloat16) for k, v in inputs.items()}
    for i in range(3):
        eager_round(model, inputs, device, f"eager before compile, round {i}")
    children()
    t0 = time.perf_counter()
    compiled = {name: torch.compile(part) for name, part in model.items()}
    with torch.no_grad():
        run(compiled, inputs)
    print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    children()
    for i in range(3):
        eager_round(model, inputs, device, f"eager after compile, round {i}")
    with torch.no_grad():
        s = time_call(lambda: run(compiled, inputs), 30, 3, device)
    print(f"{'compiled':40s} median {statistics.median(s):7.2f}", flush=True)
    time.sleep(20)
    children()
    eager_round(model, inputs, device, "eager after compile + 20 s sleep")
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()
    print("compile workers shut down", flush=True)
    children()
    for i in range(2):
        eager_round(model, inputs, device, f"eager after workers shut, round {i}")


if __name__ == "__main__":
    main()
