"""CUDA-graph capture with one warm-up stream per GPU for the whole process.

Why not a fresh side stream per capture (the PyTorch docs' recipe): PyTorch gives every
(cuBLAS handle, stream) pair its own cuBLAS workspace and keeps it until the process ends, so
each new stream that runs a GEMM leaves its workspace behind (32 MiB on the H200, torch 2.11).
The fused path captured each (view count, prompt bucket) after a warm-up on a new stream: pi0.5
at 3 views x 3 buckets left 297 MiB allocated after its graphs and itself were gone, up to
~1 GiB per process once PyTorch's pool of 32 streams per device came round
(`docs/results/capture_memory_494fc0d.log`). One stream per device makes that one workspace,
whatever the number of captures or rebuilds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_WARMUP_STREAMS: dict[int, torch.cuda.Stream] = {}


def warmup_stream(device: torch.device | str | int) -> torch.cuda.Stream:
    """The process's side stream on `device`, for the warm-up calls before a capture."""
    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    stream = _WARMUP_STREAMS.get(index)
    if stream is None:
        stream = _WARMUP_STREAMS[index] = torch.cuda.Stream(index)
    return stream


def warm_up(fn: Callable[[], object], device: torch.device | str | int, calls: int = 1) -> None:
    """Run `fn` `calls` times on the warm-up stream (kernel builds, cuBLAS heuristics,
    lazily made buffers) and make the current stream wait for it."""
    current = torch.cuda.current_stream(device)
    side = warmup_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(calls):
            fn()
    current.wait_stream(side)


def capture(fn: Callable[[], object], device: torch.device | str | int, pool=None, warmup: int = 1):
    """`fn`'s launches as a CUDA graph, after `warmup` calls on the warm-up stream."""
    warm_up(fn, device, warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph
