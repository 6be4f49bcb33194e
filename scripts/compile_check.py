"""Build the GPU code of the expert step kernel for CUDA targets without a GPU.

    python scripts/compile_check.py [--trace] [--no-update] [--sms N] [--shape pi05|tiny] [--set NAME=VALUE ...]
                                    [ARCH ...]
                                                 e.g. 90 (H200) 100 110 (Jetson Thor)

The launch ends with the denoise update (the fused path's); --no-update builds it without the tail.
--trace builds the variant that records phase timestamps (`ExpertStepPlan.enable_trace`);
--sms builds the launch for a GPU with N SMs (default 132, the H200's; Jetson AGX Thor has 20),
which changes the grid-dependent tiles (attention key splits, the denoise tail's chunks);
--shape tiny builds PolicyConfig.tiny's expert (what the GPU fused tests build) instead of pi0.5's;
--set changes a tile setting first (`ExpertStepPlan.set_tiles`, e.g. --set bk=64 --set att_bn=32).
Each target builds the attention it runs (`two_pass_by_default`: two-pass on sm_90, the split path
on the others); --set att_two_pass=0 / 1 chooses.
Each line reports the registers per thread and the spill stack (bytes per thread) that
Triton's bundled cuobjdump reads from the cubin, and how many of its loops are software-
pipelined. The build is specialised like the JIT's (16-byte aligned pointers, integers divisible
by 16): without that, no GEMM loop is pipelined and the code, registers and spills are another
kernel's (this tool reported that one until 2026-11-29).

Uses Triton's bundled ptxas; the launch is the real pi0.5 one (50 suffix tokens, Gemma-300M
expert, 968 prefix tokens, 132 SMs) built on meta tensors. Prints one JSON line per target.
Must run without TRITON_INTERPRET (the interpreter replaces the kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time

import torch
import triton

from flashrt_ros.kernels.denoise_update import DenoiseUpdate
from flashrt_ros.kernels.expert_step import ExpertStepPlan, ExpertWeights, compile_for, two_pass_by_default

# rows, width, mlp, heads, head dim, layers, prefix tokens
SHAPES = {
    "pi05": (50, 1024, 4096, 8, 256, 18, 968),  # the real expert (3 views, 200 prompt tokens)
    "tiny": (10, 32, 64, 4, 16, 2, 128),  # PolicyConfig.tiny's, which the GPU fused tests build
}


def shape_launch(
    trace: bool = False,
    tiles: dict[str, int] | None = None,
    with_update: bool = True,
    sms: int = 132,
    shape: str = "pi05",
) -> tuple[tuple, dict]:
    """The step kernel's launch arguments for one of SHAPES, on meta tensors."""
    M, W, F, H, D, L, P = SHAPES[shape]
    meta, bf16 = torch.device("meta"), torch.bfloat16
    plan = ExpertStepPlan(M, W, F, H, D, 10, meta, bf16, gpu=True, sm_count=sms)
    if trace:
        plan.enable_trace(L)
    plan.set_tiles(**(tiles or {}))
    vec, fin = torch.empty(10, L, W, device=meta), torch.empty(10, W, device=meta)
    w = ExpertWeights(
        torch.empty(L, (H + 2) * D, W, dtype=bf16, device=meta), torch.empty(L, W, H * D, dtype=bf16, device=meta),
        torch.empty(L, 2 * F, W, dtype=bf16, device=meta), torch.empty(L, W, F, dtype=bf16, device=meta),
        vec, vec, vec, vec, vec, vec, fin, fin,
    )  # fmt: skip
    w = plan.lay_out(w)
    cache = torch.empty(L, P + M, D, dtype=bf16, device=meta)
    i32 = dict(dtype=torch.int32, device=meta)
    h = torch.empty(M, W, dtype=bf16, device=meta)
    f32 = lambda *shape: torch.empty(*shape, device=meta)  # noqa: E731
    A = 32  # action dims; pi0.5's update: the next input into h
    update = DenoiseUpdate(f32(M, A), f32(A, W), f32(A), -0.1, f32(W, A), f32(W), h)
    return plan.launch_args(
        h, w, 3, cache, cache, torch.empty(P + M, **i32),
        torch.empty(M, **i32), f32(2, M, D // 2), P, 3, 1e-6, update=update if with_update else None,
    )  # fmt: skip


def resource_usage(cubin: bytes) -> dict[str, int | None]:
    """Registers and spill stack per thread of the kernel in `cubin` (None where cuobjdump is
    missing or does not read this target)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=60).stdout
        except OSError:
            out = ""
    found = {key: re.search(rf"{key}:(\d+)", out) for key in ("REG", "STACK")}
    value = {key: int(m.group(1)) if m else None for key, m in found.items()}
    return dict(registers=value["REG"], stack_bytes=value["STACK"])


def main(
    archs: list[int], trace: bool, tiles: dict[str, int], with_update: bool, sms: int = 132, shape: str = "pi05"
) -> None:
    for arch in archs:
        # the attention each arch runs (`two_pass_by_default`: Hopper two-pass, others split); TMA
        # (the split path's descriptors) is sm_90+: an older target builds the pointer loads
        arch_tiles = {"att_two_pass": int(two_pass_by_default(arch)), **({} if arch >= 90 else {"att_tma": 0}), **tiles}
        args, kwargs = shape_launch(trace, arch_tiles, with_update, sms, shape)
        t0 = time.perf_counter()
        try:
            compiled = compile_for(args, kwargs, arch)
        except Exception as exc:  # e.g. an older Triton whose ptxas does not know sm_110
            if "is not defined for option 'gpu-name'" not in str(exc):
                raise
            print(json.dumps(dict(arch=arch, unsupported_by_ptxas=str(exc).splitlines()[-1][:200])), flush=True)
            continue
        ptx = compiled.asm["ptx"]
        print(
            json.dumps(
                dict(
                    arch=arch,
                    sms=sms,
                    shape=shape,
                    seconds=round(time.perf_counter() - t0, 1),
                    target=f".target sm_{arch}" in ptx,
                    shared_bytes=compiled.metadata.shared,
                    cooperative=bool(kwargs.get("launch_cooperative_grid")),
                    trace=trace and "%globaltimer" in ptx,
                    update=with_update,
                    # loops whose loads are asynchronous copies: software-pipelined
                    pipelined_loops=sum(
                        "async.token" in line for line in compiled.asm["ttgir"].splitlines() if "scf.for" in line
                    ),
                    # L2 prefetch requests in the code (the barrier-time weight prefetches)
                    prefetches=ptx.count("prefetch.global.L2"),
                    tiles=tiles,
                    **resource_usage(compiled.asm["cubin"]),
                )
            ),
            flush=True,
        )


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", type=int, default=[90, 110])
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--no-update", action="store_true")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="pi05")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    return ap.parse_args()


if __name__ == "__main__":
    a = _args()
    tiles = {name: int(value) for name, value in (item.split("=") for item in a.set)}
    main(a.archs, a.trace, tiles, not a.no_update, a.sms, a.shape)
