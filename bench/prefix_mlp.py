"""The prefix LM's MLP (968 rows, Gemma 2B: 2048 -> 2 x 16384 -> 2048): one gate|up GEMM, GeGLU
and the down GEMM as now, against the same work in chunks along the MLP width, so that each
chunk's gate|up output (written by the GEMM) is still in L2 when GeGLU reads it, and the down
GEMM accumulates the chunks (beta = 1). GPU only.

    python bench/prefix_mlp.py [--rows 968] [--out DIR]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import graph_ms, write_result
from flashrt_ros.kernels.geglu import geglu

WIDTH, FF, LAYERS = 2048, 16384, 4


def chunked_weights(gate_up: torch.Tensor, down: torch.Tensor, chunks: int):
    """[gate | up] rows -> per chunk [gate_c | up_c]; down's columns -> per chunk (contiguous)."""
    gate, up = gate_up.chunk(2)
    gu = [torch.cat([g, u]).contiguous() for g, u in zip(gate.chunk(chunks), up.chunk(chunks), strict=True)]
    dn = [d.contiguous() for d in down.chunk(chunks, dim=1)]
    return gu, dn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=968)
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "prefix_mlp.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    M = args.rows
    x = torch.randn(M, WIDTH, device=dev, dtype=dt)
    layers = [
        ((torch.randn(2 * FF, WIDTH, device=dev) / 45).to(dt), (torch.randn(WIDTH, FF, device=dev) / 128).to(dt))
        for _ in range(LAYERS)
    ]
    out = torch.empty(M, WIDTH, device=dev, dtype=dt)
    gu_buf = torch.empty(M, 2 * FF, device=dev, dtype=dt)
    act = torch.empty(M, FF, device=dev, dtype=dt)

    def whole():
        for gu, dn in layers:
            torch.mm(x, gu.t(), out=gu_buf)
            geglu(gu_buf, out=act)
            torch.mm(act, dn.t(), out=out)

    results = {}
    ms = graph_ms(whole) / LAYERS
    ref = out.clone()
    results["whole"] = dict(us=ms * 1e3, max_abs=0.0)
    print(f"{'variant':<12} {'us/layer':>9} {'max abs vs whole':>17}")
    print(f"{'whole':<12} {ms * 1e3:9.2f} {0.0:17.3e}")
    for chunks in (2, 4, 8):
        split = [chunked_weights(gu, dn, chunks) for gu, dn in layers]
        f = FF // chunks
        gu_c = gu_buf[:, : 2 * f]
        act_c = act[:, :f]

        def chunked(split=split, gu_c=gu_c, act_c=act_c, chunks=chunks):
            for gus, dns in split:
                for c in range(chunks):
                    torch.mm(x, gus[c].t(), out=gu_c)
                    geglu(gu_c, out=act_c)
                    if c == 0:
                        torch.mm(act_c, dns[c].t(), out=out)
                    else:
                        torch.addmm(out, act_c, dns[c].t(), out=out)

        ms = graph_ms(chunked) / LAYERS
        err = float((out.float() - ref.float()).abs().max())
        results[f"chunks={chunks}"] = dict(us=ms * 1e3, max_abs=err)
        print(f"{'chunks=' + str(chunks):<12} {ms * 1e3:9.2f} {err:17.3e}")
        del split
    # the parts alone, for the record
    gu, dn = layers[0]
    results["gate_up gemm"] = graph_ms(lambda: torch.mm(x, gu.t(), out=gu_buf), calls=4) * 1e3
    results["geglu"] = graph_ms(lambda: geglu(gu_buf, out=act), calls=4) * 1e3
    results["down gemm"] = graph_ms(lambda: torch.mm(act, dn.t(), out=out), calls=4) * 1e3
    results["F.linear down"] = graph_ms(lambda: F.linear(act, dn), calls=4) * 1e3
    for k in ("gate_up gemm", "geglu", "down gemm", "F.linear down"):
        print(f"{k:<14} {results[k]:8.2f} us")
    write_result(args.out, "prefix_mlp", dev, rows=M, results=results)


if __name__ == "__main__":
    main()
