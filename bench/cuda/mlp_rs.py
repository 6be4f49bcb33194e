"""Prototype (bench only): the expert's MLP half (adaRMS norm -> gate|up + GeGLU -> down, gated
residual) for 18 layers at pi0.5's shape in one persistent CUDA launch (`mlp_rs.cu`), both GEMMs
with their weights in registers. Step 1 of docs/step_megakernel.md: compare its time per layer
with the Triton step kernel's phases 5-7 and their barriers (about 14 us per layer, traced).
How the weights reach the registers is the run's STAGED digit (MlpArgs.staged): 0 each thread's
loads from global memory; 1 one TMA copy into shared memory, taken out while waiting at the next
barrier; 2 (ahead) each GEMM's copy into a region of its own a whole layer ahead; 3 (late) as 1,
gate|up's taken out at the norm's barrier; 4 (overlapped) as 2, issued by warpgroup 1 beside the
epilogue; 5 (paced) as 4, in chunks spread over the layer (--pace). The other digits: every layer
on layer 0's weights (L2-resident: the bound without HBM waits), the L2 prefetch and (paced only)
slice_sync: no grid barrier between gate|up and the down, each down unit waiting on a counter of
the 16 gate|up units of its K slice. Prints
the time per layer, the error of the final residual stream against torch (fp32 with the kernel's
bf16 roundings) and, with --trace, a per-layer timeline. GPU only (sm_90a).

Measured (H200, docs/results/README.md, twenty-second to twenty-fourth sessions): staged
13.7-14.1 us per layer, __ldg 14.3-15.8, L2-resident 10.8-11.2; the L2 prefetch 16.5-21.6 (three
placements, two reverted); ahead 14.0-14.1, late 13.8, overlapped 14.2-14.4; **paced 12.03-12.20**
with the down's weights at gate|up's start (9.47 L2-resident); the norm folded into the down's
last K-slice and gate|up's epilogue 18.8 (8b079bb, reverted); the down reduced into h by red.add
and every gate|up CTA normalising all rows of h itself 21.6-21.7 (80ca4aa, reverted); against ~14
for the Triton step kernel's phases 5-7 (final residual vs torch: cosine 0.999999). slice_sync ties with paced
(12.54-12.60 vs 12.49-12.70; L2-resident 9.55 vs 9.54).

    python bench/cuda/mlp_rs.py [--trace] [--runs 100 500:64,128,0 5001:64,128,0 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F
from clock_trace import show_spans
from gate_up_rs import fragments
from nvcc_build import build

from flashrt_ros.bench.timing import graph_ms, write_result

LAYERS, ROWS, WIDTH, FF, GRID, NWG, SPLITS, EPS = 18, 50, 1024, 4096, 132, 2, 8, 1e-6
RUNS = "000 100 200 300 400 500 101 010 110 210 310 410 510"
TRACE = ("norm start", "gate|up start", "gate|up MMA done", "down start", "down MMA done", "arrive")


class MlpArgs(ctypes.Structure):
    """mlp_rs.cu's MlpArgs."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("w_gu", "w_dn", "h", "part", "xn", "act", "scale", "shift", "gate", "counter", "trace")] + [
        ("layers", ctypes.c_int), ("rows", ctypes.c_int), ("eps", ctypes.c_float),
        ("staged", ctypes.c_int), ("one_layer", ctypes.c_int), ("prefetch", ctypes.c_int),
        ("gu_cut", ctypes.c_int * 2), ("dn_cut", ctypes.c_int), ("slice_sync", ctypes.c_int),
        ("slice_counter", ctypes.c_void_p)]  # fmt: skip


def down_fragments(down: torch.Tensor) -> torch.Tensor:
    """[WIDTH, FF] down weight of one layer -> [16 feature tiles, SPLITS, NWG, K steps per warpgroup,
    128 threads, 8] bf16: warp w holds rows 16w..16w+15 of the tile (mma.m16n8k16's A layout)."""
    ksteps = FF // 16
    v = down.view(WIDTH // 64, 4, 2, 8, ksteps, 2, 4, 2)  # tile, warp, row half, row, k step, col half, q, pair
    v = v.permute(0, 4, 1, 3, 6, 5, 2, 7)  # tile, k step, warp, row, q, col half, row half, pair
    return v.reshape(WIDTH // 64, SPLITS, NWG, ksteps // SPLITS // NWG, 128, 8).contiguous()


def reference(h, gate_w, up_w, down_w, scale, shift, gate):
    """The MLP stack in fp32 with the kernel's bf16 roundings (normed rows, GeGLU output)."""
    h = h.clone()
    for i in range(LAYERS):
        xn = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * scale[i] + shift[i]).bfloat16().float()
        a = (F.gelu(xn @ gate_w[i].float().T, approximate="tanh") * (xn @ up_w[i].float().T)).bfloat16().float()
        h = h + gate[i] * (a @ down_w[i].float().T)
    return h


def timeline(trace: torch.Tensor) -> dict[str, float]:
    """Median over the 128 busy CTAs and inner layers of each interval, in us at 1.98 GHz."""
    t = trace[:, :128].double().cpu()
    e = [t[:, :, i] for i in range(len(TRACE))]
    spans = {
        "norm + barrier": e[1] - e[0],
        "gate|up: barrier open -> MMA done": e[2] - e[1],
        "gate|up epilogue + barrier (+ unstage)": e[3] - e[2],
        "down: barrier open -> MMA done": e[4] - e[3],
        "down epilogue": e[5] - e[4],
        "barrier after down (+ unstage)": e[0][1:] - e[5][:-1],
    }
    return show_spans(spans)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument(
        "--runs",
        nargs="+",
        default=RUNS.split(),
        help=f"STAGED ONE_LAYER PREFETCH [SLICE_SYNC] digits per run (MlpArgs), default {RUNS}",
    )
    ap.add_argument("--pace", default="48,96,32",
                    help="staged=5: gate|up's cuts and the down's cut in KB (MlpArgs gu_cut, dn_cut); "
                         "a run may carry its own after a colon, 510:64,128,32")  # fmt: skip
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = build("mlp_rs", "mlp_rs_launch", [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p])
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape, s=1.0: torch.randn(*shape, device=dev, generator=g) * s  # noqa: E731
    gate_w, up_w = rnd(LAYERS, FF, WIDTH, s=1 / 32).bfloat16(), rnd(LAYERS, FF, WIDTH, s=1 / 32).bfloat16()
    down_w = rnd(LAYERS, WIDTH, FF, s=1 / 64).bfloat16()
    scale, shift, gate = 1 + 0.1 * rnd(LAYERS, WIDTH), 0.1 * rnd(LAYERS, WIDTH), 0.2 * rnd(LAYERS, WIDTH)
    h0 = rnd(ROWS, WIDTH)
    w_gu = torch.stack([fragments(gate_w[i], up_w[i], NWG) for i in range(LAYERS)])
    w_dn = torch.stack([down_fragments(down_w[i]) for i in range(LAYERS)])
    h = h0.clone()
    part = torch.zeros(SPLITS, ROWS, WIDTH, device=dev)
    xn = torch.zeros(64, WIDTH, device=dev, dtype=torch.bfloat16)
    act = torch.zeros(64, FF, device=dev, dtype=torch.bfloat16)
    counter = torch.zeros(4, device=dev, dtype=torch.int32)
    slice_counter = torch.zeros(SPLITS, device=dev, dtype=torch.int32)
    tensors = dict(w_gu=w_gu, w_dn=w_dn, h=h, part=part, xn=xn, act=act, scale=scale, shift=shift, gate=gate)

    def launch(mode: dict[str, int], pace: tuple[int, ...], trace: torch.Tensor | None = None) -> None:
        """One launch; `mode`: MlpArgs' staged, one_layer, prefetch and slice_sync."""
        h.copy_(h0)
        counter.zero_()
        slice_counter.zero_()
        ptrs = {k: v.data_ptr() for k, v in tensors.items()}
        marks = trace.data_ptr() if trace is not None else None
        margs = MlpArgs(
            **ptrs,
            **mode,
            counter=counter.data_ptr(),
            slice_counter=slice_counter.data_ptr(),
            trace=marks,
            layers=LAYERS,
            rows=ROWS,
            eps=EPS,
            gu_cut=(ctypes.c_int * 2)(*pace[:2]),
            dn_cut=pace[2],
        )
        rc = lib.mlp_rs_launch(ctypes.byref(margs), GRID, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"launch failed: cudaError {rc}")

    want_all = reference(h0, gate_w, up_w, down_w, scale, shift, gate)
    first = [w[:1].expand(LAYERS, -1, -1) for w in (gate_w, up_w, down_w)]
    want_first = reference(h0, *first, scale, shift, gate)
    results = {}
    for run in args.runs:
        staged, one_layer, prefetch, slice_sync = (int(c) for c in (run.split(":")[0] + "0")[:4])
        mode = dict(staged=staged, one_layer=one_layer, prefetch=prefetch, slice_sync=slice_sync)
        pace = tuple(int(c) for c in (run.split(":") + [args.pace])[1].split(","))
        if slice_sync and staged != 5:
            raise SystemExit(f"run {run}: slice_sync needs staged 5")
        want = want_first if one_layer else want_all
        launch(mode, pace)
        torch.cuda.synchronize()
        err = float((h - want).abs().max())
        cos = float(F.cosine_similarity(h.flatten(), want.flatten(), dim=0))
        full = graph_ms(lambda m=mode, c=pace: launch(m, c)) * 1e3  # with the h reset and counter zeroing
        label = ("weights by __ldg -> registers", "weights by TMA -> shared -> registers",
                 "weights by TMA -> shared a layer ahead -> registers",
                 "weights by TMA -> shared -> registers at the norm's barrier",
                 "weights by TMA -> shared a layer ahead, issued beside the epilogue -> registers",
                 "weights by TMA -> shared a layer ahead in paced chunks -> registers")[staged]  # fmt: skip
        label += ", layer 0's weights for all (L2)" if one_layer else ""
        label += ", next layer's weights prefetched into L2" if prefetch else ""
        label += f", chunks at {pace} KB" if staged == 5 else ""
        label += ", gate|up -> down by per-slice counters" if slice_sync else ""
        results[label] = dict(us_per_layer=full / LAYERS, max_abs=err, cosine=cos, ref_abs_max=float(want.abs().max()))
        syncs = "3 grid barriers" if not slice_sync else "2 grid barriers + per-slice counters"
        print(f"MLP x {LAYERS} layers, {label}: {full / LAYERS:5.2f} us per layer (3 phases, {syncs}); "
              f"final h vs torch max abs {err:.2e} (|h| max {results[label]['ref_abs_max']:.1f}), "
              f"cosine {cos:.6f}")  # fmt: skip
        if args.trace:
            trace = torch.zeros(LAYERS, GRID, len(TRACE), device=dev, dtype=torch.int64)
            launch(mode, pace, trace)
            results[label]["timeline_us"] = timeline(trace)
    write_result(args.out, "mlp_rs", dev, results=results)


if __name__ == "__main__":
    main()
