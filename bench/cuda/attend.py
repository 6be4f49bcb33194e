"""Prototype (bench only): step 2's attention (`attend.cu`) at pi0.5's shape, 18 layers in one
persistent launch: 50 suffix queries x 8 heads of 256 over one KV head of 1018 keys (968 prefix +
50 suffix), as flash-style chunks of 64 keys per CTA, then a combine, a grid barrier after each.
Compare its time per layer with the Triton step kernel's attention phases and their barriers
(kernels README, "Step kernel": about 8.6 us of attention + 1.8 of combine + two barriers of
~1.4, traced). Prints the time per layer with the K / V caches L2-resident (warm) and after an
L2 flush (cold: the flush timed alone is subtracted), the error against torch and a timeline.
GPU only.

Measured (H200, docs/results/attend_{e999cd2,ee98384,ae946b0}.log): 10.07-10.59 us per layer
(cold 9.98-10.39), cosine 0.999998; traced: attend 5.1-5.5, barrier 0.9, combine 1.7-2.0,
barrier 1.2-1.3 us. A tie with the Triton kernel. Splitting each query block's dims over 2 or 4
warps lost (11.7, 16.2; reverted).

    python bench/cuda/attend.py [--out DIR]
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

LAYERS, ROWS, KEYS, HEADS, HD, GRID = 18, 50, 1018, 8, 256, 132
KEYS_PAD, QROWS, CHUNKS = 1024, 64, 16


class AttendArgs(ctypes.Structure):
    """attend.cu's AttendArgs."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("q", "k", "v", "out", "po", "pm", "pl", "counter", "trace")] + [
        ("layers", ctypes.c_int), ("rows", ctypes.c_int), ("keys", ctypes.c_int)]  # fmt: skip


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[layers, ROWS, HEADS * HD]: softmax(q k^T / 16) v per head in fp32, over the valid keys."""
    out = []
    for i in range(LAYERS):
        qh = q[i, :ROWS].float().view(ROWS, HEADS, HD).transpose(0, 1)
        s = qh @ k[i, :KEYS].float().T / HD**0.5
        o = torch.softmax(s, -1) @ v[i, :KEYS].float()
        out.append(o.transpose(0, 1).reshape(ROWS, HEADS * HD))
    return torch.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = build("attend", "attend_launch", [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p])
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.zeros(LAYERS, QROWS, HEADS * HD, device=dev, dtype=torch.bfloat16)
    q[:, :ROWS] = torch.randn(LAYERS, ROWS, HEADS * HD, device=dev, generator=g).bfloat16()
    k = torch.zeros(LAYERS, KEYS_PAD, HD, device=dev, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    k[:, :KEYS] = torch.randn(LAYERS, KEYS, HD, device=dev, generator=g).bfloat16()
    v[:, :KEYS] = torch.randn(LAYERS, KEYS, HD, device=dev, generator=g).bfloat16()
    out = torch.zeros_like(q)
    po = torch.zeros(HEADS, CHUNKS, QROWS, HD, device=dev)
    pm, pl = torch.zeros(HEADS, CHUNKS, QROWS, device=dev), torch.zeros(HEADS, CHUNKS, QROWS, device=dev)
    counter = torch.zeros(4, device=dev, dtype=torch.int32)
    flush = torch.empty(256 * 2**20, device=dev, dtype=torch.uint8)  # > the 60 MB L2
    ptrs = {name: t.data_ptr() for name, t in dict(q=q, k=k, v=v, out=out, po=po, pm=pm, pl=pl).items()}
    a = AttendArgs(**ptrs, counter=counter.data_ptr(), trace=None, layers=LAYERS, rows=ROWS, keys=KEYS)

    def launch() -> None:
        counter.zero_()
        rc = lib.attend_launch(ctypes.byref(a), GRID, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"launch failed: cudaError {rc}")

    launch()
    torch.cuda.synchronize()
    want = reference(q, k, v)
    got = out[:, :ROWS].float()
    err = float((got - want).abs().max())
    cos = float(F.cosine_similarity(got.flatten(), want.flatten(), dim=0))
    warm = graph_ms(launch) * 1e3 / LAYERS
    flush_us = graph_ms(lambda: flush.fill_(1)) * 1e3
    cold = (graph_ms(lambda: (flush.fill_(1), launch())) * 1e3 - flush_us) / LAYERS
    print(f"attention x {LAYERS} layers (attend + combine, 2 grid barriers): {warm:5.2f} us per layer, "
          f"K / V in L2; {cold:5.2f} after an L2 flush; vs torch max abs {err:.2e}, cosine {cos:.6f}")  # fmt: skip
    trace = torch.zeros(LAYERS, GRID, 4, device=dev, dtype=torch.int64)
    a.trace = trace.data_ptr()
    launch()
    t = trace[:, : HEADS * CHUNKS].double().cpu()
    spans = span_medians({"attend (load, MMAs, partials out)": t[:, :, 1] - t[:, :, 0],
                          "barrier": t[:, :, 2] - t[:, :, 1], "combine": t[:, :, 3] - t[:, :, 2],
                          "barrier after combine": t[1:, :, 0] - t[:-1, :, 3]})  # fmt: skip
    print("    " + ", ".join(f"{name} {us:.2f}" for name, us in spans.items()) + " us (traced, K / V in L2)")
    write_result(args.out, "attend", dev, results=dict(us_per_layer_warm=warm, us_per_layer_cold=cold,
                                                       max_abs=err, cosine=cos, timeline_us=spans))  # fmt: skip


if __name__ == "__main__":
    main()
