"""`flashrt` command line: the decision-latency benchmark, without ROS.

flashrt bench [--policy pi05] [--views 1,2,3] [--modes eager,compile,compile-bf16,fused,fused-fp8,realtime-vla]
              [--realtime-vla PATH] [--out DIR]

Modes: eager (the reference), compile (the reference's stages under torch.compile), compile-bf16
(the same with the reference's SigLIP and projector in bf16 too: LeRobot's bf16 mode, which the
reference follows, keeps them fp32), fused (the
bf16 fused path), fused-fp8 (the same with the prefix LM's MLP GEMMs in FP8), realtime-vla
(Dexmal's realtime-vla v2 pi0 / pi0.5 Triton backends on the same weights, from a checkout given with
--realtime-vla PATH; third-party code, not in this repository).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from .bench.args import out_problem  # stdlib only: the arguments are checked before torch loads

MODES = ("eager", "compile", "compile-bf16", "fused", "fused-fp8", "realtime-vla")
POLICIES = ("pi05", "pi0")
BASELINES = ("eager", "compile", "compile-bf16", "realtime-vla")  # what the fused modes' speed-ups are over


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# what each mode runs in (the fused path is bf16 whatever --dtype says)
FUSED_PRECISION = {
    "fused": "bfloat16",
    "fused-fp8": "bfloat16, prefix LM MLP in FP8",
    "realtime-vla": "bfloat16 (realtime-vla's kernels)",
    "compile-bf16": "bfloat16, SigLIP and projector too",
}
REFERENCE_BF16_NOTE = "SigLIP and projector in fp32, as LeRobot 0.6.1's bf16 mode keeps them"


def _device(name: str | None):
    """The device to benchmark on (made current: CUDA events and graphs use the current one)."""
    import torch

    try:
        device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        raise ValueError(f"--device {name!r}: {exc}") from None
    if device.type not in ("cpu", "cuda"):  # the benchmark's models and timers run on these only
        raise ValueError(f"--device {name!r}: expected cpu, cuda or cuda:N, got device type {device.type}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(f"--device {name!r}: this machine has {count} CUDA device(s)")
        if device.index is not None:  # plain "cuda": the current device
            torch.cuda.set_device(device.index)
        device = torch.device("cuda", torch.cuda.current_device())
    return device


LOG = logging.getLogger("flashrt_ros.cli")  # not __name__: run as `python -m` that is "__main__", outside --verbose's
MIN_ITERS = 10
"""Fewer samples than this make no percentiles: one sample printed as p99 is a single run."""
MAX_ITERS = 100_000
"""More than this is a typo (10**9 ran silently, with no progress bar off a terminal, until killed)."""


def _check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the run's numbers before any model is built (None: nothing)."""
    if not (MIN_ITERS <= args.iters <= MAX_ITERS and 1 <= args.warmup <= MAX_ITERS):
        return (
            f"--iters must be >= {MIN_ITERS} (percentiles need samples) and --warmup >= 1 (the first call "
            f"builds and warms caches), both at most {MAX_ITERS}, got {args.iters} and {args.warmup}"
        )
    if not 0 <= args.seed < 2**63:  # the node's seed parameter's range (an int64); past 2**64 torch failed unnamed
        return f"--seed must be an integer from 0 to 2**63 - 1, got {args.seed}"
    if not args.views or min(args.views) < 1:
        return f"--views must list view counts >= 1, got {','.join(map(str, args.views))}"
    if args.compile_mode not in COMPILE_MODES:
        return f"--compile-mode {args.compile_mode!r}: expected one of {', '.join(COMPILE_MODES)}"
    problem = out_problem(Path(args.out))
    if problem:
        return problem
    policies = [p for p in args.policy.split(",") if p not in POLICIES]
    if policies:
        tiny = " (--tiny picks their small random-weight presets)" if args.tiny else ""
        return f"unknown policy {', '.join(map(repr, policies))}: expected a comma list of {', '.join(POLICIES)}{tiny}"
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        return f"unknown mode(s) {', '.join(map(repr, unknown))}: expected a comma list of {', '.join(MODES)}"
    if "compile-bf16" in modes and args.dtype != "bfloat16":
        return (
            f"--modes compile-bf16 runs the reference in bf16 (SigLIP and projector too), not in --dtype "
            f"{args.dtype}; drop one of them (--modes compile compiles the {args.dtype} reference)"
        )
    if "realtime-vla" in modes:
        if not args.realtime_vla:
            return "mode realtime-vla needs --realtime-vla PATH (a checkout of github.com/dexmal/realtime-vla-v2)"
        from .bench.realtime_vla import check_shapes, server_dir
        from .policies.config import PolicyConfig

        try:
            server_dir(Path(args.realtime_vla))
        except FileNotFoundError as exc:
            return str(exc)
        views = _timed_views("realtime-vla", args)
        for kind in args.policy.split(","):
            preset = kind + ("_tiny" if args.tiny else "")
            try:
                cfg = PolicyConfig.preset(preset, num_steps=args.steps, horizon=args.horizon)
                for n in views:
                    check_shapes(cfg, n)
            except ValueError as exc:
                return f"--modes realtime-vla with {preset}: {exc}"
    return None


def _timed_views(mode: str, args: argparse.Namespace) -> list[int]:
    """The view counts a mode runs at: every one for the fused modes, the largest for the
    baselines (they take minutes) unless --baselines-all-views."""
    all_views = mode.startswith("fused") or args.baselines_all_views
    return args.views if all_views else [max(args.views)]


def _remove_empty(made: list[Path]) -> None:
    """The folders _make_out made (deepest first), removed while empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # something was written there meanwhile: kept
            return


def _make_out(out: Path) -> str | None:
    """Make the results folder and write to it once, after every other check passed (a refused
    run leaves no folder behind): some folders pass the access check and still refuse (/proc)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        return f"--out {str(out)!r} cannot hold the results: {exc.strerror or exc}"
    return None


def _bench(args: argparse.Namespace) -> int:
    from .bench.timing import environment

    # a name listed twice would run twice, and the later run would replace the earlier in the ratios
    args.views = list(dict.fromkeys(args.views))
    args.policy, args.modes = (",".join(dict.fromkeys(text.split(","))) for text in (args.policy, args.modes))
    problem = _check_args(args)
    if problem is None:
        try:
            device = _device(args.device)
        except ValueError as exc:
            problem = str(exc)
    if problem is None and device.type != "cuda" and not args.tiny:
        problem = (
            f"full-size {args.policy} on {device}: minutes per decision (the benchmark would run for hours); "
            "pass --tiny for a smoke run of the small random-weight presets, or run on a CUDA GPU"
        )
    if problem is not None:
        print(problem)
        return 2
    modes = args.modes.split(",")
    skipped = [m for m in modes if m != "eager"] if device.type != "cuda" else []
    if skipped:  # said and recorded: a run that asked for compile must not pass off eager as it
        print(f"skipped on {device} (they need a CUDA GPU): {', '.join(skipped)}")
        modes = [m for m in modes if m not in skipped]
    if not modes:
        print("nothing to run: every mode asked for needs a CUDA GPU (add eager, or run on a GPU)")
        return 2
    out = Path(args.out)
    made = [folder for folder in (out, *out.parents) if not folder.exists()]  # deepest first
    problem = _make_out(out)
    if problem is not None:
        print(problem)
        return 2
    # the slow baselines last: a cut-short run keeps the rest
    modes = sorted(modes, key=lambda m: m.startswith("compile"))
    settings = vars(args).copy() | {"modes_run": ",".join(modes), "modes_skipped": ",".join(skipped)}
    results: dict = {"env": None, "settings": settings, "runs": []}
    try:
        results["env"] = environment(device)
        return _run(args, modes, results, out, made, device)
    except KeyboardInterrupt:  # each finished row was written to the JSON as it finished
        print(f"interrupted: {_rows_written(results, out, made)}")
        return 130


def _rows_written(results: dict, out: Path, made: list[Path]) -> str:
    """Where the finished rows are, as the file says (written whole: _write), or that there are
    none (and the folders made for them removed)."""
    path = out / f"bench_{results.get('stamp')}.json"
    path.with_suffix(".json.partial").unlink(missing_ok=True)  # a write the interrupt cut short
    if "stamp" not in results or not path.is_file() or path.stat().st_size == 0:  # empty: reserved, not written
        path.unlink(missing_ok=True)
        _remove_empty(made)
        return "no row had finished; nothing written"
    rows = len(json.loads(path.read_text())["runs"])
    return f"the {rows} finished row(s) are in {path}"


def env_line(env: dict) -> str:
    """'env: commit 1a2b3c4d (dirty), NVIDIA H200, torch 2.11.0, triton 3.6.0, python 3.12.3'."""
    commit = str(env.get("commit") or "unknown")[:8] + (" (dirty)" if env.get("dirty") else "")
    where = env.get("gpu") or f"{env.get('device')} ({env.get('cpu')})"
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "cuda", "triton", "python") if env.get(k))
    return f"env: commit {commit}, {where}, {versions}"


def _run(args: argparse.Namespace, modes: list[str], results: dict, out: Path, made: list[Path], device) -> int:
    """The policies set up, each mode timed, the ratios: rows written to the JSON as they finish."""
    from .bench.timing import HEADER

    try:
        setups = {kind: _setup(kind, args, device) for kind in args.policy.split(",")}
    except Exception as exc:  # a bad size, out of memory building a policy: said, not a traceback
        _remove_empty(made)  # a refused run leaves no folder behind
        print(f"cannot set up the benchmark: {exc if isinstance(exc, ValueError) else f'{type(exc).__name__}: {exc}'}")
        LOG.debug("set-up failed", exc_info=True)
        return 2 if isinstance(exc, ValueError) else 1
    print(env_line(results["env"]))  # a captured log names what ran, as the JSON does
    print(HEADER)
    if not any(m in BASELINES for m in modes):
        print(f"note: no baseline among --modes ({', '.join(BASELINES)}): no speed-ups in this run")
    for mode in modes:
        for kind, (model, base, cases, refs) in setups.items():
            views_list = _timed_views(mode, args)
            if len(views_list) < len(args.views) and kind == next(iter(setups)):
                print(f"note: {mode} at {max(args.views)} views only (--baselines-all-views for all)")
            for views in views_list:
                model.cfg = base.replace(num_views=views, dtype=args.dtype)
                run = _bench_one(mode, model, cases[views], refs[views], args, f"{kind} {views}v {mode}", device)
                results["runs"].append({"policy": kind, "views": views, "mode": mode, **run})
                _write(results, out)  # complete: false until the last row (an interrupt keeps these)
    results["speedups"] = [r for kind in setups for r in _print_ratios(results, kind)]
    results["complete"] = True
    _write(results, out, plot=True)
    failed = [f"{r['policy']} {r['views']}v {r['mode']}" for r in results["runs"] if "error" in r]
    if failed:
        print(f"{len(failed)} run(s) FAILED: {', '.join(failed)} (exit status 1)")
    return 1 if failed else 0


def _setup(kind: str, args: argparse.Namespace, device):
    """Random weights, one Case per view count, and the fp32 reference chunks (parity baseline)."""
    import torch

    from .bench.reference import Case, build_random, true_fp32
    from .policies.config import PolicyConfig

    preset = kind + ("_tiny" if args.tiny else "")
    base = PolicyConfig.preset(preset, dtype="float32", num_steps=args.steps, horizon=args.horizon)
    model = build_random(base, device, args.seed)
    cases, refs = {}, {}
    with true_fp32():  # the fp32 reference (cuDNN's convolutions default to TF32)
        for views in args.views:
            model.cfg = base.replace(num_views=views)
            cases[views] = Case.make(model.cfg, device, views, seed=args.seed)
            refs[views] = model.sample_actions(*cases[views].args(), noise=cases[views].noise)
    model.set_precision(getattr(torch, args.dtype))
    return model, base, cases, refs


def _bench_one(mode, model, case, ref, args, label, device) -> dict:
    """One (policy, views, mode) run: latency rows, peak memory, parity (or the error)."""
    import torch

    from .bench.parity import chunk_parity
    from .bench.reference import measure_reference
    from .bench.timing import LABEL_WIDTH

    gc.collect()  # anything the previous run left in reference cycles: not counted as resident
    on_gpu = device.type == "cuda"
    resident = None  # GiB allocated before this mode: the run's models (every policy of the run)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
        resident = torch.cuda.memory_allocated(device) / 2**30
    extra: dict = {"precision": FUSED_PRECISION.get(mode, args.dtype)}
    if mode.startswith("compile"):  # the prefix (large GEMMs) always in inductor's default mode; the step as asked
        extra["compile_mode"] = {"prefix": "default", "denoise_step": args.compile_mode}
    if mode in ("eager", "compile") and args.dtype == "bfloat16":
        extra["notes"] = [REFERENCE_BF16_NOTE]
    if mode == "realtime-vla":
        from .bench.realtime_vla import revision

        extra["realtime_vla_revision"] = revision(Path(args.realtime_vla))
        extra["notes"] = [
            "vision row: its vision_encoder, without the final LayerNorm and projector that ours includes",
            "parity: it is fed the noise rounded to bf16; chunk - noise subtracts the fp32 noise",
        ]
    try:
        if mode == "eager":
            lat = measure_reference(model, case, args.iters, args.warmup, label)
            chunk = model.sample_actions(*case.args(), noise=case.noise)
            extra["parity"] = chunk_parity(chunk[0], ref[0], case.noise[0])
        elif mode in ("fused", "fused-fp8"):
            from .bench.stages import measure_fused  # Triton: imported only when a fused mode runs

            lat, extra["parity"], extra["build_capture_s"], built = measure_fused(
                model, case, args.iters, args.warmup, label, ref, prefix_mlp_fp8=mode == "fused-fp8"
            )
            extra["fused_path"] = built.describe  # what ran: a kernel that fell back shows here
            extra["precision"] = built.precision
        elif mode.startswith("compile"):
            from .bench.reference import vision_in
            from .bench.stages import measure_compiled

            with vision_in(model, getattr(torch, args.dtype) if mode == "compile-bf16" else None):
                lat, extra["parity"], extra["compile_s"] = measure_compiled(
                    model, case, args.iters, args.warmup, label, args.compile_mode, ref
                )
        elif mode == "realtime-vla":
            from .bench.realtime_vla import measure_realtime_vla

            lat, extra["parity"], extra["build_capture_s"] = measure_realtime_vla(
                Path(args.realtime_vla), model, case, args.iters, args.warmup, label, ref
            )
        else:
            raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
    except Exception as exc:  # a baseline that fails is reported, not fatal
        print(f"{label}: FAILED: {type(exc).__name__}: {exc}")
        LOG.debug("%s failed", label, exc_info=True)  # the traceback, with --verbose
        return {"error": f"{type(exc).__name__}: {exc}", **extra}
    for row in lat.values():
        print(row.row(), flush=True)
    p, pn = extra["parity"]["chunk"], extra["parity"]["chunk_minus_noise"]
    print(
        f"{'':<{LABEL_WIDTH}} parity vs fp32 reference ({extra['precision']}): cosine {p['cosine']:.6f} "
        f"(1 - cosine {1 - p['cosine']:.1e}), max abs {p['max_abs']:.3e}; chunk - noise: cosine {pn['cosine']:.6f}",
        flush=True,
    )
    if "compile_s" in extra:
        mode_text = ", ".join(f"{k} {v}" for k, v in extra["compile_mode"].items())
        print(f"{'':<{LABEL_WIDTH}} compile ({mode_text}): {extra['compile_s']:.1f} s", flush=True)
    peak = added = None
    if on_gpu:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        added = peak - resident
        what = f"peak GPU memory {peak:.1f} GiB: this mode +{added:.1f} over {resident:.1f} GiB resident"
        print(f"{'':<{LABEL_WIDTH}} {what}")
    memory = {"peak_gib": peak, "resident_gib": resident, "added_gib": added}  # resident: every policy of the run
    return {**memory, **{k: v.to_dict() for k, v in lat.items()}, **extra}


def _print_ratios(results: dict, kind: str) -> list[dict]:
    """Each fused mode's speed-up over the baselines (eager, compile, realtime-vla) of the same run, for the
    full decision and the denoise alone (medians); printed, and returned for the JSON."""
    runs = [r for r in results["runs"] if r["policy"] == kind and "full" in r]
    out = []
    for views in sorted({r["views"] for r in runs}):
        at = {r["mode"]: r for r in runs if r["views"] == views}
        for fast in ("fused", "fused-fp8"):
            for stage, what in (("full", "full decision"), ("denoise", "denoise only")):
                ms_fast = at[fast][stage]["median_ms"] if fast in at and stage in at[fast] else None
                base = [m for m in BASELINES if ms_fast and m in at and stage in at[m]]
                ratios = {m: at[m][stage]["median_ms"] / ms_fast for m in base}
                if not ratios:
                    continue
                row = dict(policy=kind, views=views, stage=stage, fast=fast)
                out += [dict(row, base=m, ratio=x) for m, x in ratios.items()]
                parts = [f"{m}/{fast} = {x:.2f}x" for m, x in ratios.items()]
                # two decimals: 2.96x must not read as the 3.0x a target asks for
                print(f"{kind} {views}v speed-up of {fast} (median {what}): " + ", ".join(parts))
    return out


def _write(results: dict, out: Path | None, plot: bool = False) -> None:
    if out is None:
        return
    from .bench.timing import finite_or_null

    out.mkdir(parents=True, exist_ok=True)
    if "stamp" not in results:  # runs started in one second must not share (and overwrite) a file
        results["stamp"] = _reserve(out, time.strftime("%Y%m%d_%H%M%S"))
    results.setdefault("complete", False)
    stamp = results["stamp"]
    path = out / f"bench_{stamp}.json"
    partial = path.with_suffix(".json.partial")  # whole or not at all: an interrupt can come mid-write
    partial.write_text(json.dumps(finite_or_null(results), indent=2, allow_nan=False))
    os.replace(partial, path)
    if plot:
        print(f"wrote {path}")
        _plot(results, out / f"bench_{stamp}.png")


def _reserve(out: Path, now: str) -> str:
    """A stamp whose file no other run has: created empty here at once (exclusively, so that two
    processes cannot both take it), written whole by the caller."""
    stamp, n = now, 1
    while True:
        try:
            (out / f"bench_{stamp}.json").open("x").close()
            return stamp
        except FileExistsError:
            n += 1
            stamp = f"{now}_{n}"


def _plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot: matplotlib is not installed (pip install matplotlib); {path.name} not written")
        return
    runs = [r for r in results["runs"] if "full" in r]
    if not runs:
        print(f"no plot: no run succeeded; {path.name} not written")
        return
    labels = [f"{r['policy']} {r['views']}v {r['mode']}" for r in runs]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(runs) + 1.5))
    medians = [r["full"]["median_ms"] for r in runs]
    bars = ax.barh(labels, medians, color="tab:blue")
    ax.bar_label(bars, labels=[f"{ms:.2f} ms" for ms in medians], padding=3)  # a log axis hides ratios
    ax.set_xscale("log")
    # bars from a decade below the fastest, not from the axis' automatic start just below it
    # (which drew 38 vs 44 ms as 1 to 30); room on the right for the labels
    ax.set_xlim(10 ** (math.floor(math.log10(min(medians))) - 1), max(medians) * 3)
    ax.set_xlabel("full decision, median ms (log scale: read the labels)")
    commit = results["env"]["commit"]
    short = commit[:8] if all(c in "0123456789abcdef" for c in commit) else commit  # "unverified: HEAD" whole
    dirty = " (dirty tree)" if results["env"].get("dirty") else ""
    ax.set_title(f"{results['env'].get('gpu', results['env']['device'])} @ {short}{dirty}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


class _DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults as they are typed: a list as its comma list; none where the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        if isinstance(action.default, list):
            return f"{action.help} (default: {','.join(map(str, action.default))})"
        return super()._get_help_string(action)


def _views(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of view counts, e.g. 1,2,3, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashrt", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "bench",
        help="decision latency of the policies (reference eager, compile, fused)",
        formatter_class=_DefaultsShown,
    )
    b.add_argument("--policy", default="pi05", help=f"comma list of {', '.join(POLICIES)}")
    b.add_argument("--views", type=_views, default=[3], help="comma list of view counts, e.g. 1,2,3")
    b.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the reference's (the fused path: bf16)"
    )
    b.add_argument("--steps", type=int, default=10, help="denoise steps per decision")
    b.add_argument("--horizon", type=int, default=50, help="actions per chunk")
    b.add_argument("--iters", type=int, default=50, help=f"timed decisions per row ({MIN_ITERS}..{MAX_ITERS})")
    b.add_argument("--warmup", type=int, default=5, help="untimed decisions before them")
    b.add_argument("--seed", type=int, default=0, help="weights, inputs and noise (0 to 2**63 - 1)")
    b.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when there is one, else cpu)")
    b.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke runs)")
    b.add_argument(
        "--modes",
        default="eager,fused,fused-fp8,compile",
        help=f"comma list of {', '.join(MODES)} (compile always runs last)",
    )
    b.add_argument(
        "--compile-mode", default="reduce-overhead", help="torch.compile mode of the baseline's denoise step"
    )
    b.add_argument(
        "--baselines-all-views", action="store_true", help="eager/compile at every view count, not only the largest"
    )
    b.add_argument(
        "--realtime-vla",
        default=None,
        metavar="PATH",
        help="checkout of github.com/dexmal/realtime-vla-v2 (holding server/pi05_infer.py) for mode realtime-vla",
    )
    b.add_argument("--out", default="bench_results", help="folder for the JSON result and the plot")
    b.add_argument("--verbose", action="store_true", help="debug logs, with the traceback of a mode that fails")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("flashrt needs PyTorch: install the build that fits this machine (on a Jetson, NVIDIA's)")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if getattr(args, "verbose", False):
        logging.getLogger("flashrt_ros").setLevel(logging.DEBUG)
    if args.command == "bench":
        # SIGTERM (timeout, a batch scheduler) as Ctrl-C: finished rows kept, empty folders removed
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return _bench(args)
        except KeyboardInterrupt:  # before any row ran (_bench says where finished rows went)
            print("interrupted: nothing written")
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
    return 2


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
