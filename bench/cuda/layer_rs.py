"""Prototype (bench only): the expert's whole layer (norm1 -> QKV + RoPE -> attention -> O -> norm2 ->
gate|up + GeGLU -> down, both residuals gated) for 18 layers at pi0.5's shape (50 suffix tokens, a
968-key prefix cache, 1018 keys) in one persistent CUDA launch (`layer_rs.cu`): step 2 of
docs/step_megakernel.md. Eight phases per layer with a grid barrier after each, as the Triton step
kernel (`flashrt_ros/kernels/expert_step.py`, 36 us per layer: 648-671 us per step); every GEMM's
weights in registers as wgmma's A operand, staged through shared memory by TMA (mlp_rs.py's
`staged` path), the attention as attend.py's. Prints the time per layer (weights from HBM, and
every layer on layer 0's weights: L2-resident, the bound without HBM waits), the error of the final
residual stream and the suffix K / V against torch (fp32 with the kernel's bf16 roundings), and with
--trace a per-phase timeline. GPU only (sm_90a).

Measured (H200, docs/results/README.md, twenty-fourth session): **33.7-34.5 us per layer** with the
copies paced 4:32:56 (31.5-32.0 L2-resident), 35.1 with each block issued after the MMAs before it,
against 36.5 for the Triton step kernel in the same call; final h vs torch cosine 1.000000 (max abs
3.8e-3), suffix K / V max abs 1.6e-2 (one bf16 ulp).

    python bench/cuda/layer_rs.py [--trace] [--runs 4:128:128 4:32:56 ...] [--out DIR]
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

LAYERS, ROWS, WIDTH, FF, HEADS, HD, GRID, NWG, EPS = 18, 50, 1024, 4096, 8, 256, 132, 2, 1e-6
PREFIX, KEYS_PAD, QKV_UNITS, DN_SPLITS = 968, 1024, 40, 8
EVENTS = ("norm1", "norm1 unstaged", "QKV", "QKV MMA done", "QKV epilogue done", "attend", "combine", "O",
          "O MMA done", "O epilogue done", "norm2", "gate|up", "down", "down done", "O arrived", "down arrived",
          "attend arrived")  # fmt: skip

POINTERS = ("w_qkv", "w_o", "w_gu", "w_dn", "h", "part_o", "part_dn", "xn", "q", "k", "v", "attn", "act",
            "po", "pm", "pl", "cos", "sin", "scale1", "shift1", "gate1", "scale2", "shift2", "gate2",
            "counter", "trace")  # fmt: skip


class LayerArgs(ctypes.Structure):
    """layer_rs.cu's LayerArgs."""

    _fields_ = [(name, ctypes.c_void_p) for name in POINTERS] + [
        ("layers", ctypes.c_int), ("rows", ctypes.c_int), ("prefix", ctypes.c_int), ("keys", ctypes.c_int),
        ("eps", ctypes.c_float), ("one_layer", ctypes.c_int), ("dn_at", ctypes.c_int), ("gu_split", ctypes.c_int),
        ("qkv_split", ctypes.c_int)]  # fmt: skip


def tile_fragments(w: torch.Tensor, splits: int = 1) -> torch.Tensor:
    """[tiles, 64 rows, K] -> wgmma's A fragments [tiles, splits, NWG, K / 16 / splits / NWG, 128, 8]:
    M-row 16 warp + 8 half + r of a tile is warp `warp`'s row r (+ 8), as mlp_rs.down_fragments."""
    tiles, _, k = w.shape
    ksteps = k // 16
    v = w.reshape(tiles, 4, 2, 8, ksteps, 2, 4, 2)  # tile, warp, row half, row, k step, col half, q, pair
    v = v.permute(0, 4, 1, 3, 6, 5, 2, 7)  # tile, k step, warp, row, q, col half, row half, pair
    return v.reshape(tiles, splits, NWG, ksteps // splits // NWG, 128, 8).contiguous()


def qkv_rows() -> torch.Tensor:
    """[QKV_UNITS, 64]: the row of the [2560, WIDTH] QKV weight behind each unit's M-row. q units
    (8 heads x 4) and k units (4): M-rows r and r + 8 of warp w are dims d and d + 128 of the head,
    d = 32 (unit % 4) + 8 w + r (the RoPE pair in one thread); v units: 64 consecutive dims."""
    j = torch.arange(64)
    warp, half, r = j // 16, (j % 16) // 8, j % 8
    units = []
    for u in range(QKV_UNITS):
        if u < 36:
            base = (u // 4) * HD if u < 32 else HEADS * HD
            units.append(base + 32 * (u % 4) + 8 * warp + r + 128 * half)
        else:
            units.append(HEADS * HD + HD + 64 * (u - 36) + j)
    return torch.stack(units)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate_half RoPE over the last dim (256): pairs (d, d + 128)."""
    x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def reference(h, kc, vc, w, ada, cos, sin):
    """The layer stack in fp32 with the kernel's bf16 roundings (xn, q / k / v, attention out, act).
    Returns the final h and the suffix K / V per layer."""
    bf = lambda t: t.bfloat16().float()  # noqa: E731
    rms = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS)  # noqa: E731
    h = h.clone()
    ks, vs = [], []
    for i in range(LAYERS):
        xn = bf(rms(h) * ada["scale1"][i] + ada["shift1"][i])
        qkv = xn @ w["qkv"][i].float().T
        q = bf(rope(qkv[:, : HEADS * HD].view(ROWS, HEADS, HD), cos[:, None], sin[:, None]))
        k = bf(rope(qkv[:, HEADS * HD : HEADS * HD + HD], cos, sin))
        v = bf(qkv[:, HEADS * HD + HD :])
        keys, vals = torch.cat([kc[i, :PREFIX].float(), k]), torch.cat([vc[i, :PREFIX].float(), v])
        p = torch.softmax(torch.einsum("thd,kd->htk", q, keys) / HD**0.5, -1)
        attn = bf(torch.einsum("htk,kd->thd", p, vals).reshape(ROWS, HEADS * HD))
        h = h + ada["gate1"][i] * (attn @ w["o"][i].float().T)
        xn = bf(rms(h) * ada["scale2"][i] + ada["shift2"][i])
        act = bf(F.gelu(xn @ w["gate"][i].float().T, approximate="tanh") * (xn @ w["up"][i].float().T))
        h = h + ada["gate2"][i] * (act @ w["down"][i].float().T)
        ks.append(k), vs.append(v)
    return h, torch.stack(ks), torch.stack(vs)


def o_units(o: torch.Tensor) -> torch.Tensor:
    """[WIDTH, HEADS * HD] O weight -> [16 feature tiles x 8 heads, 64, HD]: unit (tile, head) is
    K-slice `head` of feature tile `tile`."""
    return o.view(WIDTH // 64, 64, HEADS, HD).transpose(1, 2).reshape(-1, 64, HD)


def pack(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every layer's weights in the kernel's fragment order."""
    rows = qkv_rows().to(w["qkv"].device)
    return dict(
        w_qkv=torch.stack([tile_fragments(w["qkv"][i][rows]) for i in range(LAYERS)]),
        w_o=torch.stack([tile_fragments(o_units(w["o"][i])) for i in range(LAYERS)]),
        w_gu=torch.stack([fragments(w["gate"][i], w["up"][i], NWG) for i in range(LAYERS)]),
        w_dn=torch.stack([tile_fragments(w["down"][i].view(16, 64, FF), DN_SPLITS) for i in range(LAYERS)]),
    )


def timeline(trace: torch.Tensor) -> dict[str, float]:
    """Median over the busy CTAs and inner layers of each phase + its barrier (CTAs 0-127), and of
    the QKV units' (CTAs 0-39) and O units' own steps, in us."""
    t = trace.double().cpu()
    e = {name: t[:, :, i] for i, name in enumerate(EVENTS)}
    busy, qkv = slice(0, 128), slice(0, QKV_UNITS)
    phases = ("norm1", "QKV", "attend", "combine", "O", "norm2", "gate|up", "down")
    spans = {f"{a} + barrier": (e[b] - e[a])[:, busy] for a, b in zip(phases[:-1], phases[1:], strict=True)}
    spans["down (to its arrival)"] = (e["down done"] - e["down"])[:, busy]
    spans["barrier after down"] = (e["norm1"][1:] - e["down done"][:-1])[:, busy]
    spans["QKV units: norm1 -> weights unstaged"] = (e["norm1 unstaged"] - e["norm1"])[:, qkv]
    spans["QKV units: unstaged -> barrier open"] = (e["QKV"] - e["norm1 unstaged"])[:, qkv]
    spans["QKV units: MMA"] = (e["QKV MMA done"] - e["QKV"])[:, qkv]
    spans["QKV units: sum + epilogue"] = (e["QKV epilogue done"] - e["QKV MMA done"])[:, qkv]
    spans["QKV units: epilogue done -> barrier open"] = (e["attend"] - e["QKV epilogue done"])[:, qkv]
    spans["O units: MMA"] = (e["O MMA done"] - e["O"])[:, busy]
    spans["O units: stage + sum + epilogue"] = (e["O epilogue done"] - e["O MMA done"])[:, busy]
    spans["O units: epilogue done -> barrier open"] = (e["norm2"] - e["O epilogue done"])[:, busy]
    spans["O units: epilogue done -> arrived"] = (e["O arrived"] - e["O epilogue done"])[:, busy]
    spans["down units: done -> arrived"] = (e["down arrived"] - e["down done"])[:, busy]
    spans["attend: arrived -> barrier open"] = (e["combine"] - e["attend arrived"])[:, busy]
    return show_spans(spans, 42)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--runs", nargs="+", default=["4:128:128", "0:32:56"],
                    help="weight-copy pacing per run, DN_AT:GU_SPLIT:QKV_SPLIT (LayerArgs); 4:128:128 issues "
                         "each GEMM's block after the MMAs of the GEMM before")  # fmt: skip
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = build("layer_rs", "layer_rs_launch", [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p])
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape, s=1.0: torch.randn(*shape, device=dev, generator=g) * s  # noqa: E731
    w = dict(qkv=rnd(LAYERS, HEADS * HD + 2 * HD, WIDTH, s=1 / 32), o=rnd(LAYERS, WIDTH, HEADS * HD, s=1 / 45),
             gate=rnd(LAYERS, FF, WIDTH, s=1 / 32), up=rnd(LAYERS, FF, WIDTH, s=1 / 32),
             down=rnd(LAYERS, WIDTH, FF, s=1 / 64))  # fmt: skip
    w = {name: t.bfloat16() for name, t in w.items()}
    ada = {f"{kind}{i}": (1 + 0.1 * rnd(LAYERS, WIDTH)) if kind == "scale" else 0.1 * rnd(LAYERS, WIDTH)
           for kind in ("scale", "shift", "gate") for i in (1, 2)}  # fmt: skip
    pos = (PREFIX + torch.arange(ROWS, device=dev)).float()
    angle = pos[:, None] * 10000.0 ** (-torch.arange(HD // 2, device=dev).float() / (HD // 2))
    cos, sin = angle.cos().contiguous(), angle.sin().contiguous()
    h0 = rnd(ROWS, WIDTH)
    kc = torch.zeros(LAYERS, KEYS_PAD, HD, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    kc[:, :PREFIX], vc[:, :PREFIX] = rnd(LAYERS, PREFIX, HD).bfloat16(), rnd(LAYERS, PREFIX, HD).bfloat16()
    bufs = dict(
        h=h0.clone(), part_o=torch.zeros(HEADS, ROWS, WIDTH, device=dev),
        part_dn=torch.zeros(DN_SPLITS, ROWS, WIDTH, device=dev),
        xn=torch.zeros(64, WIDTH, device=dev, dtype=torch.bfloat16),
        q=torch.zeros(64, HEADS * HD, device=dev, dtype=torch.bfloat16), k=kc, v=vc,
        attn=torch.zeros(64, HEADS * HD, device=dev, dtype=torch.bfloat16),
        act=torch.zeros(64, FF, device=dev, dtype=torch.bfloat16),
        po=torch.zeros(HEADS, 16, 64, HD, device=dev), pm=torch.zeros(HEADS, 16, 64, device=dev),
        pl=torch.zeros(HEADS, 16, 64, device=dev), cos=cos, sin=sin,
        counter=torch.zeros(4, device=dev, dtype=torch.int32),
        **ada,
    )  # fmt: skip
    packed = pack(w)

    def launch(which: str, pace: tuple[int, ...], trace: torch.Tensor | None = None) -> None:
        bufs["h"].copy_(h0)
        bufs["counter"].zero_()
        ptrs = {name: t.data_ptr() for name, t in {**bufs, **packed}.items()}
        ptrs["trace"] = trace.data_ptr() if trace is not None else None
        dn_at, gu_split, qkv_split = pace
        largs = LayerArgs(**ptrs, layers=LAYERS, rows=ROWS, prefix=PREFIX, keys=PREFIX + ROWS, eps=EPS,
                          one_layer=int(which == "first"), dn_at=dn_at, gu_split=gu_split,
                          qkv_split=qkv_split)  # fmt: skip
        rc = lib.layer_rs_launch(ctypes.byref(largs), GRID, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"launch failed: cudaError {rc}")

    modes = {"all": "weights from HBM", "first": "layer 0's weights for all (L2)"}
    first = {name: t[:1].expand(LAYERS, *t.shape[1:]) for name, t in w.items()}
    wants = {which: reference(h0, kc, vc, w if which == "all" else first, ada, cos, sin) for which in modes}
    results = {}
    for run, (which, label) in ((r, m) for r in args.runs for m in modes.items()):
        pace = tuple(int(c) for c in run.split(":"))
        if not (0 <= pace[0] <= 4 and 32 <= pace[1] <= 128 and 56 <= pace[2] <= 128):
            raise SystemExit(f"run {run}: want DN_AT 0-4, GU_SPLIT 32-128, QKV_SPLIT 56-128 (KB)")
        label = f"{label}, copies {run}"
        want_h, want_k, want_v = wants[which]
        launch(which, pace)
        torch.cuda.synchronize()
        h = bufs["h"]
        err = float((h - want_h).abs().max())
        cos_h = float(F.cosine_similarity(h.flatten(), want_h.flatten(), dim=0))
        k_err = float((kc[:, PREFIX : PREFIX + ROWS].float() - want_k).abs().max())
        v_err = float((vc[:, PREFIX : PREFIX + ROWS].float() - want_v).abs().max())
        us = graph_ms(lambda c=which, q=pace: launch(c, q)) * 1e3 / LAYERS
        results[label] = dict(us_per_layer=us, max_abs=err, cosine=cos_h, k_max_abs=k_err, v_max_abs=v_err,
                              ref_abs_max=float(want_h.abs().max()))  # fmt: skip
        print(f"layer x {LAYERS}, {label}: {us:5.2f} us per layer (8 phases, 8 grid barriers); final h vs torch "
              f"max abs {err:.2e} (|h| max {results[label]['ref_abs_max']:.1f}), cosine {cos_h:.6f}; "
              f"suffix K / V max abs {k_err:.2e} / {v_err:.2e}")  # fmt: skip
        if args.trace:
            trace = torch.zeros(LAYERS, GRID, len(EVENTS), device=dev, dtype=torch.int64)
            launch(which, pace, trace)
            results[label]["timeline_us"] = timeline(trace)
    write_result(args.out, "layer_rs", dev, results=results)


if __name__ == "__main__":
    main()
