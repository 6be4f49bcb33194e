"""One denoise step of the action expert's layers (18 x: QKV, attention, O, gate|up, down at
50 tokens, each layer its own weights so they stream from HBM as in a real step), captured in a
CUDA graph: cuBLAS GEMMs alone (the weight-streaming baseline) against `kernels.skinny_gemm`
(norm / RoPE / GeGLU / gated residual fused, split-K reduced in-kernel) with tile settings
searched one GEMM at a time, with and without programmatic dependent launch (PDL). GPU only.

    python bench/expert_gemm.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from flashrt_ros.bench.timing import environment
from kernels.attention import attention
from kernels.rope import rope_inv_freq
from kernels.skinny_gemm import (
    GemmConfig,
    NormPrologue,
    Workspace,
    fold_shift,
    linear_gated_residual,
    norm_geglu,
    norm_qkv_rope,
)

M, W, F_MLP, H, D, LAYERS, PREFIX = 50, 1024, 4096, 8, 256, 18, 968
# (block_n, K per split) candidates per GEMM; each is one-shot (block_k = K per split)
CANDIDATES = {
    "qkv": [(32, 256), (64, 256), (32, 128), (64, 128), (16, 256)],
    "o": [(64, 256), (64, 128), (128, 256), (32, 256), (64, 512)],
    "gate_up": [(64, 256), (32, 256), (32, 512), (64, 128), (16, 512)],
    "down": [(64, 256), (64, 512), (128, 512), (32, 512), (128, 256)],
}
K_OF = {"qkv": W, "o": H * D, "gate_up": W, "down": F_MLP}


def one_shot(name: str, bn: int, ks: int, warps: int = 4) -> GemmConfig:
    return GemmConfig(64, bn, ks, K_OF[name] // ks, warps, 1)


def graph_ms(fn, replays: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


class Step:
    def __init__(self, dev: torch.device):
        dt = torch.bfloat16
        torch.manual_seed(0)
        rnd = lambda *shape, s=1.0: (torch.randn(*shape, device=dev) * s).to(dt)  # noqa: E731
        self.layers = [
            dict(
                qkv=rnd((H + 2) * D, W, s=1 / 32),
                o=rnd(W, H * D, s=1 / 45),
                gate_up=rnd(2 * F_MLP, W, s=1 / 32),
                down=rnd(W, F_MLP, s=1 / 64),
            )
            for _ in range(LAYERS)
        ]
        mod = torch.randn(3 * W, device=dev) * 0.1
        self.gate = mod[2 * W :].contiguous()
        self.norms = [
            (
                NormPrologue(1 + mod[:W], fold_shift(mod[W : 2 * W], lw["qkv"])),
                NormPrologue(1 + mod[:W], fold_shift(mod[W : 2 * W], lw["gate_up"])),
            )
            for lw in self.layers
        ]
        self.h0 = rnd(M, W)
        self.h = self.h0.clone()
        self.k = rnd(LAYERS, PREFIX + M, D)
        self.v = rnd(LAYERS, PREFIX + M, D)
        self.kb = torch.full((PREFIX + M,), -(2**30), dtype=torch.int32, device=dev)
        self.kb[PREFIX:] = 1
        self.qb = torch.ones(M, dtype=torch.int32, device=dev)
        self.pos = torch.arange(PREFIX, PREFIX + M, device=dev)
        self.inv = rope_inv_freq(D, 10000.0, dev)
        self.attn, self.act = rnd(M, H * D), rnd(M, F_MLP)
        self.ws = Workspace(dev, floats=1 << 23, tiles=8192)

    def cublas(self) -> None:
        for lw in self.layers:
            F.linear(self.h, lw["qkv"])
            F.linear(self.attn, lw["o"])
            F.linear(self.h, lw["gate_up"])
            F.linear(self.act, lw["down"])

    def fused(self, cfg: dict[str, GemmConfig | None], pdl: bool, with_attention: bool = True) -> None:
        h, ws, own = self.h, self.ws, slice(PREFIX, PREFIX + M)
        h.copy_(self.h0)
        for i, (lw, (n_attn, n_mlp)) in enumerate(zip(self.layers, self.norms, strict=True)):
            q, _, _ = norm_qkv_rope(
                h, lw["qkv"], self.pos, self.inv, H, D, 1, k_out=self.k[i, own], v_out=self.v[i, own],
                norm=n_attn, config=cfg["qkv"], workspace=ws, pdl=pdl,
            )  # fmt: skip
            a = self.attn
            if with_attention:
                a = attention(q, self.k[i], self.v[i], key_blocks=self.kb, query_blocks=self.qb, pdl=pdl)
                a = a.view(M, -1)
            linear_gated_residual(a, lw["o"], h, self.gate, config=cfg["o"], workspace=ws, pdl=pdl)
            y = norm_geglu(h, lw["gate_up"], n_mlp, config=cfg["gate_up"], workspace=ws, pdl=pdl)
            linear_gated_residual(y, lw["down"], h, self.gate, config=cfg["down"], workspace=ws, pdl=pdl)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    step = Step(dev)
    mb = sum(w.numel() * 2 for lw in step.layers for w in lw.values()) / 1e6
    results: dict = {"weights_mb": mb}

    def show(label: str, ms: float) -> None:
        print(f"{label:<64} {ms * 1e3:8.1f} us/step {ms * 1e3 / LAYERS:6.2f} us/layer {mb / ms / 1e3:6.2f} TB/s")
        results[label] = ms

    print(f"{LAYERS} layers, {mb:.0f} MB of weights per step")
    show("cuBLAS GEMMs only (4 per layer)", graph_ms(step.cublas))
    default = {k: None for k in CANDIDATES}
    show("fused, default tiles, no PDL", graph_ms(lambda: step.fused(default, False)))
    best = {k: one_shot(k, *CANDIDATES[k][0]) for k in CANDIDATES}
    for pdl in (False, True):
        show(f"fused, one-shot base tiles, pdl={pdl}", graph_ms(lambda p=pdl: step.fused(best, p)))
    # search one GEMM at a time (with PDL), the others at their best so far
    for name, cands in CANDIDATES.items():
        timed = []
        for bn, ks in cands:
            for warps in (4, 8):
                cfg = dict(best, **{name: one_shot(name, bn, ks, warps)})
                try:
                    ms = graph_ms(lambda c=cfg: step.fused(c, True), replays=10)
                except Exception as exc:  # e.g. out of shared memory / registers
                    print(f"  {name} bn={bn} ks={ks} w={warps}: {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                timed.append((ms, bn, ks, warps))
        timed.sort()
        print(f"  {name}: " + ", ".join(f"bn{bn}/ks{ks}/w{w} {ms * 1e3:.0f}" for ms, bn, ks, w in timed[:5]))
        best[name] = one_shot(name, *timed[0][1:])
        results[f"search_{name}"] = timed
    for pdl in (False, True):
        show(f"fused, searched tiles, pdl={pdl}", graph_ms(lambda p=pdl: step.fused(best, p)))
    show("fused, searched tiles, pdl=True, GEMMs only", graph_ms(lambda: step.fused(best, True, False)))
    # PDL must not change a single bit: same step with and without it, replayed from graphs
    outs = []
    for pdl in (False, True):
        graph_ms(lambda p=pdl: step.fused(best, p), replays=1)
        outs.append(step.h.clone())
    same = torch.equal(outs[0], outs[1])
    print("PDL result bit-identical to no PDL:", same)
    results["pdl_bit_identical"] = same
    results["best"] = {k: str(v) for k, v in best.items()}
    print("best:", results["best"])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"expert_gemm_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(dict(env=environment(dev), results=results), indent=1, default=str))
    print("wrote", path)


if __name__ == "__main__":
    main()
