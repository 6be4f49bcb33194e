"""Where the expert step kernel's warps wait, line by line, under Nsight Compute.

    bash scripts/gpu_check.sh ncu            (on the GPU machine: profile, then summarise)

which runs

    ncu --kernel-name _expert_step_kernel --launch-skip 3 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --section SpeedOfLight \\
        --import-source yes -o step python3 bench/step_ncu.py
    ncu --import step.ncu-rep --page source --print-source cuda,sass --csv > step_source.csv
    python3 bench/step_ncu.py --summarize step_source.csv

Run plainly, the script launches the kernel a few times (not from a CUDA graph, so that ncu
can replay the launch it profiles; `--launch-skip` leaves out the warm-up ones). Triton emits
line info, so ncu's source page maps stall samples to lines of kernels/*.py; `--summarize`
sums them per source line and prints the top ones.
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path


def summarize(path: Path, top: int = 40) -> None:
    """Stall samples per source line from ncu's `--print-source cuda,sass --csv` page: rows of a
    source line (line number set) are followed by its instructions' rows (line number empty)."""
    samples: collections.Counter = collections.Counter()
    text: dict[tuple[str, int], str] = {}
    where = None
    file = "?"
    with path.open() as f:
        for row in csv.reader(f):
            if len(row) >= 2 and row[0] == "File Path":
                file = row[1].rsplit("/", 1)[-1]
            elif len(row) >= 5 and row[0].isdigit():  # a source line (headers and others skipped)
                where = (file, int(row[0]))
                text[where] = row[1].strip()
            elif len(row) >= 5 and row[0] == "" and where is not None and row[4].isdigit():
                samples[where] += int(row[4])
    total = sum(samples.values()) or 1
    print(f"warp stall samples by source line ({total} in all)")
    for (name, line), n in samples.most_common(top):
        print(f"{n:8d} {100 * n / total:5.1f}%  {name}:{line}  {text[(name, line)][:100]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summarize", type=Path, help="ncu source-page CSV to sum per source line")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    import torch
    from expert_step import make_problem

    *_, step = make_problem(torch.device("cuda"))
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print("ran 5 launches")


if __name__ == "__main__":
    main()
