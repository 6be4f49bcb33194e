"""Where the expert step kernel's warps wait, line by line: run under Nsight Compute.

    ncu --kernel-name _expert_step_kernel --launch-skip 3 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --import-source yes \\
        --page source --print-source cuda --csv python3 bench/step_ncu.py > stalls.csv

The kernel is launched a few times plainly (not from a CUDA graph, so that ncu can replay the
launch it profiles); `--launch-skip` leaves out the warm-up launches. Triton emits line info,
so the source page maps stall samples to lines of kernels/*.py.
"""

from __future__ import annotations

import torch
from expert_step import make_problem


def main() -> None:
    *_, step = make_problem(torch.device("cuda"))
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print("ran 5 launches")


if __name__ == "__main__":
    main()
