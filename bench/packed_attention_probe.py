"""Each launch setting of kernels/packed_attention.py at SigLIP's shape (3 views x 256 tokens,
16 heads of dim 72, bf16), each in its own process (a memory fault poisons the CUDA context):
20 eager calls, then 10 calls captured in a CUDA graph and replayed 20 times; prints ok and the
max abs error against the fp32 maths, or the error. GPU only.

    python bench/packed_attention_probe.py [BMxBN,wW,sS ...]

(Written for a variant that split the head dim into two MMA tiles, 72 = 64 + 16: it faulted at
every 1-stage launch, 128 x 128 and 64 x 256, and gained 0.1-0.2 us, so it was dropped.)
"""

from __future__ import annotations

import subprocess
import sys

import torch

DEFAULT = ("64x64,w4,s2", "64x128,w4,s2", "128x64,w8,s2", "128x128,w8,s1", "128x128,w4,s1", "64x256,w4,s1")


def probe(spec: str) -> str:
    from flashrt_ros.kernels.packed_attention import packed_attention, packed_attention_ref

    tile, w, s = spec.split(",")
    bm, bn = (int(t) for t in tile.split("x"))
    kw = dict(block_m=bm, block_n=bn, num_warps=int(w[1:]), num_stages=int(s[1:]))
    torch.manual_seed(0)
    qkv = torch.randn(3 * 256, 3 * 16 * 72, device="cuda", dtype=torch.bfloat16)
    want = packed_attention_ref(qkv.float(), 16, 256)
    for _ in range(20):
        out = packed_attention(qkv, 16, 256, **kw)
    torch.cuda.synchronize()
    err = float((out.float() - want).abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            out = packed_attention(qkv, 16, 256, **kw)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    return f"ok, eager max abs {err:.2e}, graph max abs {float((out.float() - want).abs().max()):.2e}"


def main() -> None:
    if not torch.cuda.is_available() or any(arg.startswith("--") and arg != "--one" for arg in sys.argv[1:]):
        print(
            f"usage: {sys.argv[0]} [TILES,wWARPS,sSTAGES ...] (default {' '.join(DEFAULT)}); needs a CUDA GPU",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(probe(sys.argv[2]))
        return
    for spec in sys.argv[1:] or DEFAULT:
        run = subprocess.run([sys.executable, __file__, "--one", spec], capture_output=True, text=True)
        lines = (run.stdout + run.stderr).strip().splitlines() or ["(no output)"]
        said = lines[-1] if run.returncode == 0 else next((ln for ln in lines if "Error" in ln), lines[-1])
        print(f"{spec:<22} {'' if run.returncode == 0 else 'FAILED: '}{said}")


if __name__ == "__main__":
    main()
