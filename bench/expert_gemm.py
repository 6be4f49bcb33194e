"""The action expert's four GEMMs at 50 tokens: cuBLAS (+ the separate epilogue kernels the
fused path used before) against `kernels.skinny_gemm` (one launch with the norm / RoPE / GeGLU /
gated residual fused and split-K reduced in-kernel), and a sweep of its tile settings.

Each variant is captured 20 times in a row in one CUDA graph, so the time per call includes the
launch gaps of a real denoise graph. GPU only.

    python bench/expert_gemm.py [--sweep] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from flashrt_ros.bench.timing import environment
from kernels.ada_rms_norm import ada_rms_norm
from kernels.geglu import geglu
from kernels.rope import qkv_rope, rope_inv_freq
from kernels.skinny_gemm import (
    GemmConfig,
    NormPrologue,
    Workspace,
    default_config,
    fold_shift,
    linear_gated_residual,
    norm_geglu,
    norm_qkv_rope,
)

M, W, F_MLP, H, D = 50, 1024, 4096, 8, 256
REPEAT = 20


def graph_us(fn, replays: int = 30) -> float:
    """Median microseconds per call of `fn`, replayed from a graph of REPEAT calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPEAT):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / REPEAT)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also sweep tile settings")
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    h = torch.randn(M, W, device=dev).to(dt)
    attn = torch.randn(M, H * D, device=dev).to(dt)
    act = torch.randn(M, F_MLP, device=dev).to(dt)
    wts = {
        "qkv": (torch.randn((H + 2) * D, W, device=dev) / 32).to(dt),
        "o": (torch.randn(W, H * D, device=dev) / 45).to(dt),
        "gate_up": (torch.randn(2 * F_MLP, W, device=dev) / 32).to(dt),
        "down": (torch.randn(W, F_MLP, device=dev) / 64).to(dt),
    }
    mod = torch.randn(3 * W, device=dev) * 0.1
    mult, shift, gate = 1 + mod[:W], mod[W : 2 * W], mod[2 * W :]
    pos = torch.arange(900, 900 + M, device=dev)
    inv = rope_inv_freq(D, 10000.0, dev)
    k_cache, v_cache = torch.empty(M, D, device=dev, dtype=dt), torch.empty(M, D, device=dev, dtype=dt)
    ws = Workspace(dev, floats=1 << 22, tiles=4096)
    nq = NormPrologue(mult, fold_shift(shift, wts["qkv"]))
    ng = NormPrologue(mult, fold_shift(shift, wts["gate_up"]))
    res = h.clone()

    fused = {
        "qkv": lambda cfg=None: norm_qkv_rope(
            h, wts["qkv"], pos, inv, H, D, 1, k_out=k_cache, v_out=v_cache, norm=nq, config=cfg, workspace=ws
        ),
        "o": lambda cfg=None: linear_gated_residual(attn, wts["o"], res, gate, config=cfg, workspace=ws),
        "gate_up": lambda cfg=None: norm_geglu(h, wts["gate_up"], ng, config=cfg, workspace=ws),
        "down": lambda cfg=None: linear_gated_residual(act, wts["down"], res, gate, config=cfg, workspace=ws),
    }
    modv = mod.contiguous()
    # What the fused path ran before: norm kernel + cuBLAS + epilogue kernel (+ gated residual
    # folded into the next norm, counted here as one norm launch).
    unfused = {
        "qkv": lambda: qkv_rope(
            F.linear(ada_rms_norm(h, modv), wts["qkv"]), pos, H, D, 1, k_out=k_cache, v_out=v_cache, inv_freq=inv
        ),
        "o": lambda: F.linear(attn, wts["o"]),
        "gate_up": lambda: geglu(F.linear(ada_rms_norm(h, modv), wts["gate_up"])),
        "down": lambda: F.linear(act, wts["down"]),
    }
    inputs = dict(qkv=h, o=attn, gate_up=h, down=act)
    cublas = {name: (lambda w=w, x=inputs[name]: F.linear(x, w)) for name, w in wts.items()}
    rows = []
    print(f"{'gemm':<8} {'MB':>6} {'cuBLAS':>8} {'before':>8} {'fused':>8} {'GB/s':>7}  default config")
    for name, w in wts.items():
        mb = w.numel() * 2 / 1e6
        K = w.shape[1]
        paired = name in ("qkv", "gate_up")
        groups, gw = ((H + 2), D // 2) if name == "qkv" else (1, w.shape[0] // (2 if paired else 1))
        cfg = default_config(M, gw, groups, K, paired, dev)
        t_cublas, t_before, t_fused = graph_us(cublas[name]), graph_us(unfused[name]), graph_us(fused[name])
        print(f"{name:<8} {mb:6.1f} {t_cublas:8.2f} {t_before:8.2f} {t_fused:8.2f} {mb * 1e3 / t_fused:7.0f}  {cfg}")
        row = dict(gemm=name, weight_mb=mb, cublas_us=t_cublas, before_us=t_before, fused_us=t_fused, config=str(cfg))
        if args.sweep:
            best = (t_fused, cfg)
            sweep = []
            bns = (16, 32, 64) if paired else (32, 64, 128)
            for bn, bk, split, stages, warps in itertools.product(bns, (64, 128, 256), (1, 2, 4, 8, 16), (3,), (4,)):
                if K // split < bk or (name == "qkv" and bn > D // 2):
                    continue
                c = GemmConfig(64, bn, bk, split, warps, stages)
                try:
                    t = graph_us(lambda c=c, op=fused[name]: op(c), replays=10)
                except Exception as exc:  # e.g. out of shared memory
                    print(f"  {c}: {type(exc).__name__}")
                    continue
                sweep.append((t, str(c)))
                best = min(best, (t, c), key=lambda x: x[0])
            print(f"  best {best[0]:.2f} us  {best[1]}  (of {len(sweep)})")
            row["sweep"] = sorted(sweep)[:10]
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"expert_gemm_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(dict(env=environment(dev), rows=rows), indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
