"""Prototype (bench only): the step kernel's gate|up phase with the weights in registers as wgmma's
A operand and only the activations through shared memory (`gate_up_rs.cu`), 18 layers with a
grid barrier after each. Prints the time per layer (phase + barrier), the error against torch and,
with --trace, a per-layer timeline. The weights reach the registers either by each thread's loads
from global memory or (mode 2) by a TMA copy into shared memory after the MMAs and from there
between arriving at the grid barrier and waiting on it. Compare with `gate_up_ws.py` (both
operands through shared memory) and the Triton step kernel's gate|up phase + barrier (6.6-8.3
us). GPU only (sm_90a).

Measured (H200, docs/results/gate_up_rs_7c6e7f8.log), 2 warpgroups, per layer with its barrier:
7.00 us from HBM staged (8.08 by __ldg), 5.44 from L2 (5.97); the MMA 0.70-0.84 us.

    python bench/cuda/gate_up_rs.py [--nwg 2 4] [--modes 0 1 2 3] [--trace] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F
from clock_trace import span_medians
from nvcc_build import build

from flashrt_ros.bench.timing import graph_ms, write_result

LAYERS, ROWS, WIDTH, FF, GRID = 18, 50, 1024, 4096, 132
FEAT = 32  # features per CTA: 128 tiles
W_FROM_L2, W_STAGED = 1, 2  # gate_up_rs.cu's mode bits
TRACE = ("layer start", "first box in", "MMA done", "arrive")  # gate_up_rs.cu's marks
ARGS = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5 + [ctypes.c_void_p]


def fragments(gate: torch.Tensor, up: torch.Tensor, nwg: int) -> torch.Tensor:
    """[FF, K] gate and up of one layer -> wgmma's A fragments: [tiles, nwg, K/16/nwg, 128 threads,
    8] bf16. Warp w of a tile holds features 8w..8w+7 (rows 0-7 gate, 8-15 up); lane = 4 * feature
    + q holds k pairs 2q, 2q+1 and 2q+8, 2q+9 of each 16-wide K step."""
    tiles, ksteps = FF // FEAT, WIDTH // 16
    g = gate.view(tiles, 4, 8, ksteps, 2, 4, 2)  # tile, warp, feature, k step, half, q, pair
    u = up.view(tiles, 4, 8, ksteps, 2, 4, 2)
    v = torch.stack([g, u], dim=6)  # ..., half, q, gate|up, pair
    v = v.permute(0, 3, 1, 2, 5, 4, 6, 7)  # tile, k step, warp, feature, q, half, gate|up, pair
    return v.reshape(tiles, nwg, ksteps // nwg, 128, 8).contiguous()


def timeline(trace: torch.Tensor) -> dict[str, float]:
    """Median over busy CTAs and inner layers of each interval, in us at the 1.98 GHz SM clock."""
    t = trace[:, : FF // FEAT].double().cpu()
    start, first, mma, arrive = (t[:, :, i] for i in range(len(TRACE)))
    spans = {
        "barrier open -> first box in": first - start,
        "MMA (first box in -> done)": mma - first,
        "epilogue + next W issue + CTA sync": arrive - mma,
        "grid barrier (arrive -> open)": start[1:] - arrive[:-1],
    }
    out = span_medians(spans)
    print("    " + ", ".join(f"{name} {us:.2f}" for name, us in out.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nwg", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--modes", type=int, nargs="+", default=[0, W_FROM_L2, W_STAGED, W_STAGED | W_FROM_L2])
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = build("gate_up_rs", "gate_up_rs_launch", ARGS)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.zeros(64, WIDTH, device=dev, dtype=torch.bfloat16)
    x[:ROWS] = torch.randn(ROWS, WIDTH, device=dev, generator=g).to(torch.bfloat16)
    gate = (torch.randn(LAYERS, FF, WIDTH, device=dev, generator=g) / 32).to(torch.bfloat16)
    up = (torch.randn(LAYERS, FF, WIDTH, device=dev, generator=g) / 32).to(torch.bfloat16)
    act = torch.zeros(64, FF, device=dev, dtype=torch.bfloat16)
    counter = torch.zeros(4, device=dev, dtype=torch.int32)
    xf = x[:ROWS].float()
    want = {m: F.gelu(xf @ gate[i].float().T, approximate="tanh") * (xf @ up[i].float().T) for m, i in
            ((0, LAYERS - 1), (W_FROM_L2, 0))}  # fmt: skip

    results = {}
    for nwg in args.nwg:
        frag = torch.stack([fragments(gate[i], up[i], nwg) for i in range(LAYERS)])

        def launch(mode: int, trace: torch.Tensor | None = None, frag=frag, nwg=nwg) -> None:
            counter.zero_()
            marks = trace.data_ptr() if trace is not None else None
            ptrs = (x.data_ptr(), frag.data_ptr(), act.data_ptr(), counter.data_ptr(), marks)
            stream = torch.cuda.current_stream().cuda_stream
            rc = lib.gate_up_rs_launch(*ptrs, LAYERS, ROWS, GRID, nwg, mode, stream)
            if rc:
                raise RuntimeError(f"launch failed: {rc}")

        for mode in args.modes:
            act.zero_()
            launch(mode)
            torch.cuda.synchronize()
            got, ref = act[:ROWS].float(), want[mode & W_FROM_L2]
            err = float((got - ref).abs().max())
            cos = float(F.cosine_similarity(got.flatten(), ref.flatten(), dim=0))
            full = graph_ms(lambda m=mode: launch(m)) * 1e3
            path = "TMA -> shared -> registers" if mode & W_STAGED else "__ldg -> registers"
            label = f"nwg {nwg}, {'W from L2' if mode & W_FROM_L2 else 'W per layer (HBM)'}, {path}"
            results[label] = dict(us_per_layer=full / LAYERS, max_abs=err, cosine=cos)
            print(f"{label}: {full / LAYERS:5.2f} us per layer (phase + grid barrier); vs torch max abs {err:.2e}, "
                  f"cosine {cos:.6f}", flush=True)  # fmt: skip
            if args.trace:
                trace = torch.zeros(LAYERS, GRID, len(TRACE), device=dev, dtype=torch.int64)
                launch(mode, trace)
                results[label]["timeline_us"] = timeline(trace)
            write_result(args.out, "gate_up_rs", dev, results=results)


if __name__ == "__main__":
    main()
