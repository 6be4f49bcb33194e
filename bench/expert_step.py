"""The expert step kernel alone (one denoise step: 18 layers at 50 tokens, 623 MB of weights),
captured in a CUDA graph, for its default tiles and a few variants. GPU only.

    python bench/expert_step.py [--rounds 5] [--only prefetch,att_two_pass] [--out DIR]

--only keeps the variants whose label contains one of the given words (the default is always run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from flashrt_ros.bench.args import out_folder, require_cuda
from flashrt_ros.bench.timing import environment, graph_ms
from flashrt_ros.kernels.denoise_update import DenoiseUpdate, denoise_update
from flashrt_ros.kernels.expert_step import ExpertStepPlan, ExpertWeights, rope_table
from flashrt_ros.kernels.rope import rope_inv_freq

M, W, F_MLP, H, D, LAYERS, PREFIX = 50, 1024, 4096, 8, 256, 18, 968


PHASE_NAMES = ["0 residual+norm", "1 qkv+rope", "2 attn scores|split", "3 attn pv|combine", "4 o-proj",
               "5 residual+norm", "6 gate_up+geglu", "7 down"]  # fmt: skip


def phase_table(plan: ExpertStepPlan, step) -> list[dict]:
    """One traced launch (outside a graph): median over layers of each phase's work and barrier."""
    plan.enable_trace(LAYERS)
    step()
    torch.cuda.synchronize()
    rows = plan.phase_times()
    plan.trace = None
    table = []
    print(f"{'phase':<22} {'work us':>8} {'barrier us':>10}   (median over {LAYERS} layers)")
    for p, name in enumerate(PHASE_NAMES):
        work = sorted(r["work"] for r in rows if r["phase"] == p and r["layer"] < LAYERS)
        bar = sorted(r["barrier"] for r in rows if r["phase"] == p and r["layer"] < LAYERS)
        table.append(dict(phase=name, work_us=statistics.median(work), barrier_us=statistics.median(bar)))
        print(f"{name:<22} {table[-1]['work_us']:8.2f} {table[-1]['barrier_us']:10.2f}")
    last = rows[-1]  # after the last layer: the final norm (and, in a launch with it, the update tail)
    table.append(dict(phase="final norm (+ update tail)", work_us=last["work"], barrier_us=0.0))
    print(f"{table[-1]['phase']:<26} {last['work']:4.2f}   (once per launch)")
    total = sum(r["work"] + r["barrier"] for r in rows)
    print(f"traced launch: {total:.1f} us ({total / LAYERS:.2f} us/layer)")
    return table


def make_problem(dev: torch.device):
    """pi0.5's expert at its real shape with random weights: (plan, weights, h0, h, (k, v,
    key_blocks, query_blocks, rope), step), where step() runs one launch on h from h0 and
    weights() returns the weights laid out for the plan's current tiles."""
    dt = torch.bfloat16
    torch.manual_seed(0)
    rnd = lambda *shape, s=1.0: (torch.randn(*shape, device=dev) * s).to(dt)  # noqa: E731
    vec = lambda: (1 + 0.1 * torch.randn(1, LAYERS, W, device=dev)).contiguous()  # noqa: E731
    fin = (1 + 0.1 * torch.randn(1, W, device=dev)).contiguous()
    w = ExpertWeights(
        rnd(LAYERS, (H + 2) * D, W, s=1 / 32), rnd(LAYERS, W, H * D, s=1 / 45),
        rnd(LAYERS, 2 * F_MLP, W, s=1 / 32), rnd(LAYERS, W, F_MLP, s=1 / 64),
        vec(), vec() - 1, vec(), vec(), vec() - 1, vec(), fin, fin - 1,
    )  # fmt: skip
    k, v = rnd(LAYERS, PREFIX + M, D), rnd(LAYERS, PREFIX + M, D)
    kb = torch.full((PREFIX + M,), -(2**30), dtype=torch.int32, device=dev)
    kb[PREFIX:] = 1
    qb = torch.ones(M, dtype=torch.int32, device=dev)
    pos = torch.arange(PREFIX, PREFIX + M, device=dev)
    rope = rope_table(pos, rope_inv_freq(D, 10000.0, dev))
    plan = ExpertStepPlan(M, W, F_MLP, H, D, 1, dev, dt)
    laid: dict[tuple, ExpertWeights] = {}

    def weights() -> ExpertWeights:
        """`w` laid out for the plan's current tiles (a variant may change them), once per
        layout: `graph_ms` calls its function once before capturing, so no copy is captured."""
        key = (getattr(plan, "bn_qkv", 0), plan.bn_gu)
        if key not in laid:
            laid[key] = plan.lay_out(w)
        return laid[key]

    h0 = rnd(M, W)
    h = h0.clone()

    def step():
        plan.barriers.zero_()
        h.copy_(h0)
        plan.step(h, weights(), 0, k, v, kb, qb, rope, PREFIX, 0, 1e-6)

    return plan, weights, h0, h, (k, v, kb, qb, rope), step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated words: run only the variants naming one")
    ap.add_argument("--out", type=out_folder, default="out")
    args = ap.parse_args()
    require_cuda(ap, "expert_step.py")
    dev = torch.device("cuda")
    plan, weights, h0, h, (k, v, kb, qb, rope), step = make_problem(dev)
    w = weights()

    results = {}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"expert_step_{time.strftime('%Y%m%d_%H%M%S')}.json"
    env = environment(dev)

    def save() -> None:  # after every part: a hang or crash in a later one keeps the rest
        path.write_text(json.dumps(dict(env=env, results=results), indent=1))

    mb = sum(t.numel() * 2 for t in (w.qkv, w.o, w.gate_up, w.down)) / 1e6

    def show(label, ms):
        results[label] = ms
        print(f"{label:<44} {ms * 1e3:8.1f} us/step {ms * 1e3 / LAYERS:7.2f} us/layer {mb / ms / 1e3:5.2f} TB/s")

    print(plan.describe())
    show("default", graph_ms(step))
    ref = h.clone()
    # the denoise update (pi0.5: velocity, Euler step, next input into h): its own launch after
    # the step, against the step kernel's tail
    f32 = lambda *shape: 0.05 * torch.randn(*shape, device=dev)  # noqa: E731
    x0, upd_w = f32(M, 32), (f32(32, W), f32(32), -0.1, f32(W, 32), f32(W))
    x = x0.clone()

    def step_only():  # the same set-up work as the two below (x restored), without the update
        step()
        x.copy_(x0)

    def step_then_update():
        step()
        x.copy_(x0)
        denoise_update(plan.x_attn, x, *upd_w, h_next=h)

    def step_with_update():
        plan.barriers.zero_()
        h.copy_(h0)
        x.copy_(x0)
        plan.step(h, weights(), 0, k, v, kb, qb, rope, PREFIX, 0, 1e-6, update=DenoiseUpdate(x, *upd_w, h_next=h))

    # the three alternating over rounds (a machine drifts by ~2% between minutes), each with the
    # same set-up copies; the tail's extra code may change how the layers themselves compile, so
    # both builds get a phase table
    arrangements = {
        "step only (no update)": step_only,
        "step, then denoise_update (2 launches)": step_then_update,
        "step ending with the update (1 launch)": step_with_update,
    }
    laps: dict[str, list[float]] = {label: [] for label in arrangements}
    for _ in range(args.rounds):
        for label, fn in arrangements.items():
            laps[label].append(graph_ms(fn))
    results["update rounds ms"] = laps
    print(f"alternating over {args.rounds} rounds (median):")
    for label in arrangements:
        show(label, statistics.median(laps[label]))
    step_then_update()
    two = (h.clone(), x.clone())
    step_with_update()
    diff = [float((a.float() - b.float()).abs().max()) for a, b in zip((h, x), two, strict=True)]
    results["update tail max abs diff (h, x)"] = diff
    print("update tail vs separate launch, max abs diff (h, x):", diff)
    print("phases of the step alone:")
    results["phases"] = phase_table(plan, step)
    print("phases of the step ending with the update:")
    results["phases with update tail"] = phase_table(plan, step_with_update)
    save()
    variants = (
        # measured at bfbed9d / b2a78ff / 8afbc3d / a72e069 / de65c20 (docs/results/expert_step_*.log):
        # 32 x 32 attention tiles beat 32 x 64 by 16-59 us and 32 x 16 by 46; bk=64 (16 K steps)
        # 912 us, bk=256 876 (3 stages) / 1013 (2); 4 key splits 856; 3 stages 849; two programs per
        # SM (grid 264) 1129-1444; L2 prefetch of weights and cache rows (afd3b99) 925-964;
        # dd826ad: the last key split merging its tile (no combine phase) 932 vs 767, 5 stages 772,
        # 10 splits 770; b0181f6: 64-row attention tiles 910-923 vs 782 (every phase slower); c07fec0
        # (5 alternating rounds): 16-row tiles x 5 splits 748 vs 778 for 32 x 8 (now the default),
        # 16 x 4 splits 777, 16 x 8 830, 16 x 64-key tiles x 4 853; 91469ec / 906928f: 742 / 737 us,
        # 32 x 8 splits 773 / 766, 16 x 6 splits 786. (The other variants of those two runs inherited
        # the previous variant's settings, a bench bug fixed since: their numbers are not valid.)
        # 342a78d (5 rounds): default 734.2, 32 x 8 splits 761.0, 3 stages 774.1, bk=64 806.4,
        # ks_o=256 763.9; 55cf05e: QKV and gate|up on FP8 operands 826.8 vs 742.1 (dropped).
        # 192ed51 (no spills since the RoPE table; 5 rounds): default 727.4; q k^T as 2 / 4
        # independent dots over head-dim slices 738.6 / 736.1 (attention phase 8.6 -> 9.9 us;
        # reverted), 3 stages 774.6, bk=64 809.6. 4e739ec (7 rounds): each GEMM unit starting its K
        # loop at its own tile (k_rotate) 733.1 vs 734.7: a tie, reverted. dc725ec (7 rounds): the
        # GEMM phases' tiles through TMA tensor descriptors 740.7 vs 733.3 (reverted). f1372d4 (7
        # rounds): attention -> combine through per-query-tile counters instead of a grid barrier
        # 729.0 vs 731.4, within the noise (traced 800.4 vs 808.0); reverted.
        # (variants below named by settings since removed: the code is in git at their commits)
        # 27d1630 / ebab950 (7 rounds): thread 0 alone polling the barrier 712.0 / 711.9 vs 732.4 for
        # every thread (now the only GPU barrier); per-program flags polled by every thread 822.8, by
        # warp 0 908.3, thread 0 polling relaxed + one fence 743.5; L2 prefetch of the next tile
        # issued before arriving 707.0 (phase 5 +1.3 us: the issue delays the arrival)
        # 770710f (7 rounds): default 710.7; L2 prefetch of the next GEMM tile after arriving at
        # the barrier before its phase (prefetch=1) 691.8, one barrier earlier (2) 708.4; the prefix
        # K / V rows (prefetch_kv) 705.1, with prefetch=1 696.6
        # 2695fe5 (7 rounds): default 717.5, prefetch=1 700.2; as bulk (TMA) requests per row segment
        # 717.6, one barrier earlier 745.4, with the K / V rows 751.2 (issuing them stalls ~1.4 us)
        # 117b81c (9 rounds): default 713.3, prefetch after arriving 695.9 (now the default), before
        # arriving by the programs without a unit in the phase 699.2
        # e8ae43a (7 rounds): default 696.2, without the prefetch 717.3; with it, 3 stages 707.9,
        # 5 stages 702.6, bk=64 715.3
        dict(prefetch=False),  # without any of the L2 weight prefetches, for scale
        # cab3adc (9 rounds, docs/results/expert_step_rope_early_cab3adc.log): QKV's RoPE cos / sin
        # tiles loaded before its dot (rope_early) 650.8 vs 650.3 us per step: a tie (QKV 5.31 vs
        # 5.41 us traced); reverted
        # e62da5e (7 rounds, docs/results/expert_step_bar_split_e62da5e.log): the grid barrier's
        # arrivals and polls spread over 2 / 4 / 8 counters, each in its own L2 line (threads
        # 0 .. n-1 polling one each): 651.9 / 651.0 / 651.0 vs 648.4 us per step, the same bits; the
        # barrier is not contention on its counter's line (reverted)
        # 3102f46 (branch exp/fold-norms, 5 rounds): the row norms folded into the QKV / gate|up GEMMs
        # (sum of squares in their K loops, rsqrt in the epilogue, the shift as shift @ W.T) and the
        # residuals closed by whole-K O / down column tiles, 6 phases per layer: 1044.9 vs 663.7 us
        # (QKV 4.4 -> 13.9, gate|up 6.7 -> 14.4: the A tiles through registers; O 2.8 -> 5.6, down
        # 4.5 -> 9.1 on 64 whole-K units); 32-column O / down tiles 1129, 128-wide normed K 1225
        # 882406b (7 rounds): default 681.0, the attention phase's tiles through TMA descriptors
        # 671.2 (every round lower; now the default on sm_90+)
        dict(att_two_pass=False),  # the attention as key splits + combine, tiles through TMA
        dict(att_two_pass=False, att_tma=False),  # the same through pointer loads
        # the two-pass attention (scores per (query tile, key tile), then P @ V with every tile's
        # rescale known first; no combine phase), now the default on Hopper; its tiles that lost:
        # 341e249 / 79c4c06 / b2b477c / 2ce24e7 (5 rounds each, docs/results/expert_step_two_pass_*.log):
        # split path 662-665 us, two-pass with 64-key score and 16 x 64 PV tiles 701-704 (scores
        # 4.9 us, PV 7.3, against attention 8.2-8.4 + combine 1.8-1.9); PV loop with 8 / 12 stages
        # 782 / 879 (PV 10.2 / 15.4 us, spills); 128 x 32 score tiles 754-852 (scores 3.2, PV
        # 10.8-18.2 over 32 key tiles); 32 x 32 PV tiles (64-key score tiles) 703-768;
        # each query tile's units walking their key tiles from another start (kv_rotate: no two
        # units asking L2 for the same rows at once) 681.8 for the split path (attention 8.2 -> 9.1
        # us), 725.2 for two-pass (PV 7.3 -> 8.9): the units' common reads help; dropped
        # a874103 (5 rounds): default 663.8, two-pass 703.2; 128-key score tiles 748.3, with 3 PV
        # stages 677.4 (scores 4.5 us, PV 6.7; 4 stages spill there), with 128-column PV tiles 933.8
        # 81bc84d (5 rounds): default (split) 664.0; two-pass with 64-key score tiles and 16 x 64 PV
        # tiles in 3 / 2 stages 703.1 / 769.3; 128-key score tiles, 2 stages 691.1; with 32 x 32 PV
        # tiles in 3 stages 650.5 (every round lower; scores 4.0 us, PV 6.1): now the default
        # 6b33f7c + a scratch `fold_combine` (7 rounds, docs/results/expert_step_fold_combine_6b33f7c.log):
        # each query tile's last key split (an acq_rel counter per tile) merging the splits, no
        # combine phase or its barrier: 744.9 vs 672.1 us (attention phase 8.3 -> 15.2 us against
        # the 1.9 + 1.3 saved), as at dd826ad; not kept
        # 741db5d (5 rounds): default 661.3, att_splits=4 674.4, cb_dc=128 671.6, cb_m=32 + cb_dc=32
        # 666.3. Every layer reading layer 0's weights (35 MB, L2-resident; a scratch copy of the
        # kernel): 626.7 vs 666.7, only QKV faster (5.44 -> 3.78 us). dfc25f2 (7 rounds): the QKV
        # weights into L2 earlier, by the row phases' free programs: this layer's in phase 0 672.8,
        # the next layer's in phase 5 699.2, vs 673.0 (reverted)
        # 4370c3f (7 rounds): wider QKV / gate|up units (fewer re-reads of the shared activation
        # tile, half of the bytes these phases move from L2, on fewer programs): default 682.4,
        # bn_gu=64 746.0 (gate|up 5.3 -> 9.3 us), bn_qkv=32 691.4, both 755.3
        # 6146caf (7 rounds): default 698.7, the MLP weights prefetched during QKV by the programs
        # without a unit: gate|up 686.7 (QKV 4.8 -> 5.9 us, gate|up 6.7 -> 6.1), + down 710.4.
        # (524bc1e's numbers for the variants are void: a wrong condition dropped the down tile's
        # prefetch.) 4dd7823 (9 rounds): default 696.3, gate|up during QKV 681.6 (now the
        # default), the same as bulk requests 682.3
    )
    default_tiles = {name: getattr(plan, name) for tiles in variants for name in tiles}
    # alternate the variants over rounds (one machine drifts by ~2% between minutes); each variant
    # is its own settings on top of the defaults
    labelled = [("default", {})] + [(",".join(f"{k}={v}" for k, v in t.items()), t) for t in variants]
    words = [w for w in args.only.split(",") if w]
    labelled = [(label, t) for label, t in labelled if not t or not words or any(w in label for w in words)]
    times: dict[str, list[float]] = {label: [] for label, _ in labelled}
    failed: set[str] = set()
    for _ in range(args.rounds):
        for label, tiles in labelled:
            if label in failed:
                continue
            plan.set_tiles(**{**default_tiles, **tiles})
            try:
                times[label].append(graph_ms(step))
            except Exception as exc:
                print(f"{label}: {type(exc).__name__}: {str(exc)[:100]}")
                failed.add(label)
        results["rounds ms"] = times
        save()
    print(f"\nalternating over {args.rounds} rounds (median):")
    for label, tiles in labelled:
        if label in failed or not times[label]:
            continue
        plan.set_tiles(**{**default_tiles, **tiles})
        show(f"{label} (rounds)", statistics.median(times[label]))
        try:
            graph_ms(step)
            results[f"{label} max abs diff vs default"] = float((h.float() - ref.float()).abs().max())
            if label != "default":
                results[f"{label} phases"] = phase_table(plan, step)
        except Exception as exc:
            print(f"{label}: {type(exc).__name__}: {str(exc)[:100]}")
        save()
    plan.set_tiles(**default_tiles)
    print("wrote", path)


if __name__ == "__main__":
    main()
