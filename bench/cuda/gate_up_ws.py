"""Prototype (bench only): the step kernel's gate|up phase as a warp-specialised CUDA kernel
(`gate_up_ws.cu`: TMA producer warp, 4-stage mbarrier ring, wgmma consumer warpgroup, GeGLU
epilogue), walking 18 layers' weights with a grid barrier after each, as the persistent step
kernel does. Prints its time per layer (one phase + one barrier) and its error against torch.
Built with nvcc at run time (sm_90a). GPU only.

Measured (H200, 2026-12-01; docs/results/gate_up_ws_8cb07c4.log), per layer (phase + barrier),
every mode within 2.5e-2 of torch (cosine 0.999999): plain 7.64 / 8.49 us in two runs, the next
layer's weight tiles issued before the grid barrier 7.94, two wgmma groups in flight 9.68 (ptxas
serialises wgmma in the divergent consumer branch), A multicast over 2-CTA clusters 16.7-17.5.
The Triton step kernel's gate|up phase + its barrier: 6.6-8.3 us. So this first CUDA version
does not beat Triton; its multicast, as built (a cluster-wide release of every ring slot), loses.
Since 76e05aa / ae9e117 (2026-12-02, docs/results/gate_up_ws_76e05aa.log, gate_up_ws_ae9e117.log):
the wgmmas are no longer serialised by ptxas (7.85-7.94 us); with the weight tile resident in
shared memory (mode 8) 6.04-6.26 us, with 8 / 12 ring slots 6.08 / 6.31, with the 2-CTA multicast
on top 10.55-10.87. Not the broadcast itself (1.1 us in one burst, `broadcast.py`): at cce2c28
(docs/results/gate_up_ws_cce2c28.log) the ring without MMAs took 4.67 us and the MMAs, with both
operands in shared memory, add 2.1-2.3 us. `gate_up_rs.py` keeps the weights in registers.

    python bench/cuda/gate_up_ws.py [--modes 0 8 1 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F
from nvcc_build import build

from flashrt_ros.bench.timing import graph_ms, write_result

LAYERS, ROWS, WIDTH, FF, TILE = 18, 50, 1024, 4096, 64
RESIDENT_W, W_FROM_L2, NO_MMA = 8, 256, 512  # gate_up_ws.cu's mode bits that change the expected output


def reference(x: torch.Tensor, w_layer: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x @ gate.T) * (x @ up.T) for one layer's weight interleaved in blocks of 32."""
    blocks = w_layer.float().view(2 * FF // TILE, 2, TILE // 2, WIDTH)
    gate, up = blocks[:, 0].reshape(FF, WIDTH), blocks[:, 1].reshape(FF, WIDTH)
    xf = x[:ROWS].float()
    return F.gelu(xf @ gate.T, approximate="tanh") * (xf @ up.T)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--modes", type=int, nargs="+", default=[0, 4, 1, 5, 2, 6, 7])
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = build("gate_up_ws", "gate_up_ws_launch", [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + [ctypes.c_void_p])
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.zeros(64, WIDTH, device=dev, dtype=torch.bfloat16)
    x[:ROWS] = torch.randn(ROWS, WIDTH, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(LAYERS * 2 * FF, WIDTH, device=dev, generator=g) / 32).to(torch.bfloat16)
    act = torch.zeros(64, FF, device=dev, dtype=torch.bfloat16)
    counter = torch.zeros(4, device=dev, dtype=torch.int32)

    def launch(mode: int, layers: int = LAYERS) -> None:
        counter.zero_()
        stream = torch.cuda.current_stream().cuda_stream
        ptrs = (x.data_ptr(), w.data_ptr(), act.data_ptr(), counter.data_ptr())
        rc = lib.gate_up_ws_launch(*ptrs, layers, ROWS, 132, mode, stream)
        if rc:
            raise RuntimeError(f"launch failed: cudaError {rc}")

    want = reference(x, w[(LAYERS - 1) * 2 * FF :])
    want_resident = reference(x, w[: 2 * FF])
    results = {}
    # mode bits (gate_up_ws.cu): 1 next layer's weight tiles before the grid barrier, 2 A multicast
    # over 2-CTA clusters, 4 two wgmma groups in flight, 8 the weight tile resident in shared
    # memory (layer 0's for every layer), 32 / 64 rings of 8 / 12 slots instead of 4, 128 the whole
    # A tile in one burst after the barrier (W through the ring), 256 every layer streaming layer 0's
    # weights (from L2), 512 no MMAs (data movement only; not checked)
    for mode in args.modes:
        act.zero_()
        launch(mode)
        torch.cuda.synchronize()
        got = act[:ROWS].float()
        ref = want_resident if mode & (RESIDENT_W | W_FROM_L2) else want
        err = float((got - ref).abs().max()) if not mode & NO_MMA else float("nan")
        cos = float(F.cosine_similarity(got.flatten(), ref.flatten(), dim=0)) if not mode & NO_MMA else float("nan")
        full = graph_ms(lambda m=mode: launch(m)) * 1e3
        results[mode] = dict(us_18_layers=full, us_per_layer=full / LAYERS, max_abs=err, cosine=cos)
        print(
            f"mode {mode}: {LAYERS} layers {full:7.1f} us -> {full / LAYERS:5.2f} us per layer (phase + grid "
            f"barrier); vs torch max abs {err:.2e}, cosine {cos:.6f}",
            flush=True,
        )
        write_result(args.out, "gate_up_ws", dev, results=results)  # after each mode: kept if a later one hangs


if __name__ == "__main__":
    main()
