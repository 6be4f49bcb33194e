"""`flashrt bench` on the CPU: a tiny eager run writes its JSON (latency + parity), and the
speed-up line prints ratios to two decimals (2.96x must not read as 3.0x)."""

import json

import pytest
import torch

from flashrt_ros.cli import _print_ratios, _write, main


def test_tiny_eager_bench_writes_latency_and_parity(tmp_path, capsys) -> None:
    rc = main(
        ["bench", "--policy", "pi05", "--tiny", "--views", "1,1", "--modes", "eager,fused,eager", "--iters", "10",
         "--warmup", "1", "--steps", "2", "--horizon", "4", "--dtype", "float32", "--device", "cpu",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "skipped on cpu (they need a CUDA GPU): fused" in out  # said, recorded, not replaced by eager
    (path,) = tmp_path.glob("bench_*.json")
    data = json.loads(path.read_text())
    assert data["complete"] is True
    assert (data["settings"]["modes_run"], data["settings"]["modes_skipped"]) == ("eager", "fused")
    (run,) = data["runs"]  # a view count or mode listed twice runs once
    assert (run["policy"], run["views"], run["mode"], run["precision"]) == ("pi05", 1, "eager", "float32")
    full = run["full"]
    assert full["n"] == 10 and full["min_ms"] <= full["median_ms"] <= full["p99_ms"] <= full["max_ms"]
    # the prefix and denoise rows were split inside each timed decision: they add up to it
    assert run["prefix"]["n"] == run["denoise_in_decision"]["n"] == run["denoise"]["n"] == 10
    assert run["prefix"]["mean_ms"] + run["denoise_in_decision"]["mean_ms"] <= full["mean_ms"] * 1.01
    assert run["prefix"]["mean_ms"] + run["denoise_in_decision"]["mean_ms"] >= full["mean_ms"] * 0.9
    # fp32 eager against the fp32 reference: the same maths, so the same bits (a determinism check)
    for key in ("chunk", "chunk_minus_noise"):
        assert run["parity"][key]["max_abs"] == 0.0 and run["parity"][key]["cosine"] > 0.999999
    assert (tmp_path / path.name.replace(".json", ".png")).stat().st_size > 1000  # the plot


def test_bf16_eager_bench_parity_compares_two_precisions(tmp_path, capsys) -> None:
    """--dtype bfloat16: the timed model runs in bf16, the reference stayed fp32, so the parity
    line compares two different paths: a small error, not zero, printed next to the latency."""
    rc = main(
        ["bench", "--policy", "pi05", "--tiny", "--views", "1", "--modes", "eager", "--iters", "10",
         "--warmup", "1", "--steps", "2", "--horizon", "4", "--dtype", "bfloat16", "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0
    (run,) = json.loads(next(tmp_path.glob("bench_*.json")).read_text())["runs"]
    chunk = run["parity"]["chunk"]
    assert 0 < chunk["max_abs"] < 5e-3 and chunk["cosine"] > 0.9999, chunk
    assert (
        f"parity vs fp32 reference (bfloat16): cosine {chunk['cosine']:.6f} (1 - cosine {1 - chunk['cosine']:.1e}), "
        f"max abs {chunk['max_abs']:.3e}" in capsys.readouterr().out
    )


def test_speed_up_ratios_have_two_decimals_and_go_to_the_json(capsys) -> None:
    times = (("eager", 370.485, 300.0), ("fused", 16.015, 6.0), ("compile", 47.45, 24.0), ("fused-fp8", 15.0, 6.25))
    runs = [
        {"policy": "pi05", "views": 3, "mode": mode, "full": {"median_ms": ms}, "denoise": {"median_ms": dn}}
        for mode, ms, dn in times
    ]
    ratios = _print_ratios({"runs": runs}, "pi05")
    assert _print_ratios({"runs": runs[:1]}, "pi05") == []  # no fused run: nothing to compare, no line
    assert capsys.readouterr().out.splitlines() == [
        "pi05 3v speed-up of fused (median full decision): eager/fused = 23.13x, compile/fused = 2.96x",
        "pi05 3v speed-up of fused (median denoise only): eager/fused = 50.00x, compile/fused = 4.00x",
        "pi05 3v speed-up of fused-fp8 (median full decision): eager/fused-fp8 = 24.70x, compile/fused-fp8 = 3.16x",
        "pi05 3v speed-up of fused-fp8 (median denoise only): eager/fused-fp8 = 48.00x, compile/fused-fp8 = 3.84x",
    ]
    assert len(ratios) == 8 and ratios[1] == dict(
        policy="pi05", views=3, stage="full", fast="fused", base="compile", ratio=47.45 / 16.015
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--iters", "1"],
            "--iters must be >= 10 (percentiles need samples) and --warmup >= 1 (the first call "
            "builds and warms caches), both at most 100000, got 1 and 5",
        ),
        (["--warmup", "0"], "--iters must be >= 10 (percentiles need samples) and --warmup >= 1"),
        (["--iters", "1000000000"], "both at most 100000, got 1000000000 and 5"),  # ran silently until killed
        (["--views", "2,0"], "--views must list view counts >= 1, got 2,0"),
        (["--seed", "-1"], "--seed must be an integer from 0 to 2**63 - 1, got -1"),
        (["--seed", str(2**64)], f"--seed must be an integer from 0 to 2**63 - 1, got {2**64}"),
        (["--compile-mode", "fast"], "--compile-mode 'fast': expected one of default, reduce-overhead, max-autotune"),
        (["--device", "tpu9"], "--device 'tpu9': "),
        (["--device", "cuda:7"], "--device 'cuda:7': this machine has "),
        (["--device", "meta"], "--device 'meta': expected cpu, cuda or cuda:N, got device type meta"),
        (["--device", "mps"], "--device 'mps': expected cpu, cuda or cuda:N, got device type mps"),
        (["--device", "xpu"], "--device 'xpu': expected cpu, cuda or cuda:N, got device type xpu"),
    ],
)
def test_bad_numbers_are_refused_before_any_model_is_built(argv, message, capsys) -> None:
    if argv[-1] == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    assert main(["bench", "--policy", "pi05", "--tiny", "--modes", "eager", *argv]) == 2
    assert message in capsys.readouterr().out


def test_an_out_that_cannot_be_a_folder_is_refused_before_the_run(tmp_path, capsys) -> None:
    """Not after minutes of benchmarking, as a FileExistsError with no JSON written: one line, exit 2."""
    taken = tmp_path / "results.json"
    taken.write_text("keep me")
    for out, message in [
        (taken, f"--out {str(taken)!r} is an existing file; expected a folder (existing or new) for the results"),
        (taken / "sub", f"--out {str(taken / 'sub')!r}: {str(taken)!r} is a file, so the folder cannot be made there"),
    ]:
        assert main(["bench", "--policy", "pi05", "--tiny", "--modes", "eager", "--out", str(out)]) == 2
        assert capsys.readouterr().out.splitlines() == [message]
    assert taken.read_text() == "keep me"


def test_an_out_that_cannot_be_made_or_written_is_refused_before_the_run(capsys) -> None:
    """/proc passes the access check as root and refuses the folder: found when the JSON was
    written, after the whole run."""
    assert main(["bench", "--policy", "pi05", "--tiny", "--modes", "eager", "--out", "/proc/flashrt_out"]) == 2
    out = capsys.readouterr().out
    # as root, the access check passes and making the folder fails; as another user, the check
    assert out.startswith("--out '/proc/flashrt_out'") and ("cannot hold the results: " in out or "not writable" in out)


def test_full_size_on_the_cpu_is_refused_pointing_to_tiny(capsys) -> None:
    """Full-size pi0.5 on the CPU ran its fp32 eager reference for hours with no output."""
    assert main(["bench", "--policy", "pi05", "--modes", "eager", "--device", "cpu"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("full-size pi05 on cpu: minutes per decision") and "pass --tiny" in out


def test_views_that_are_not_numbers_are_named_with_the_expected_form(capsys) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse: status 2, its usage line, then ours
        main(["bench", "--policy", "pi05", "--tiny", "--views", "1,,2"])
    assert exited.value.code == 2
    assert "argument --views: expected a comma list of view counts, e.g. 1,2,3, got '1,,2'" in capsys.readouterr().err


def test_unknown_mode_is_refused(capsys) -> None:
    assert main(["bench", "--policy", "pi05", "--tiny", "--modes", "eager,fp8"]) == 2
    assert (
        "unknown mode(s) 'fp8': expected a comma list of eager, compile, compile-bf16, fused, fused-fp8"
        in capsys.readouterr().out
    )
    assert main(["bench", "--policy", "pi05", "--tiny", "--modes", "eager,"]) == 2
    assert "unknown mode(s) '': expected" in capsys.readouterr().out  # the empty name, quoted


def test_compile_bf16_with_an_fp32_reference_is_refused(capsys) -> None:
    """It ran the fp32 model under a bf16 label (parity 0 against the fp32 reference, a speed-up
    of fp32 filed as bf16's)."""
    argv = ["bench", "--policy", "pi05", "--tiny", "--modes", "eager,compile-bf16", "--dtype", "float32"]
    assert main(argv) == 2
    assert capsys.readouterr().out.startswith("--modes compile-bf16 runs the reference in bf16")


def test_realtime_vla_with_bad_numbers_is_one_line_not_a_traceback(tmp_path, capsys) -> None:
    server = tmp_path / "rtv" / "server"
    server.mkdir(parents=True)
    for name in ("pi05_infer.py", "pi0_infer.py"):
        (server / name).write_text("")
    argv = ["bench", "--policy", "pi05", "--tiny", "--modes", "eager,realtime-vla", "--steps", "0"]
    assert main([*argv, "--realtime-vla", str(tmp_path / "rtv")]) == 2
    assert "--modes realtime-vla with pi05_tiny: invalid PolicyConfig: num_steps" in capsys.readouterr().out


def test_unknown_policy_is_refused_without_a_traceback(tmp_path, capsys) -> None:
    """Refused before anything is built, naming the names --policy takes (with --tiny too: its
    presets' own names, pi05_tiny, are not what --policy takes)."""
    for policy in ("pi07", "pi05_tiny"):
        assert main(["bench", "--policy", f"pi0,{policy}", "--tiny", "--modes", "eager", "--out", str(tmp_path)]) == 2
        expected = f"unknown policy '{policy}': expected a comma list of pi05, pi0"
        assert capsys.readouterr().out.splitlines() == [expected + " (--tiny picks their small random-weight presets)"]
    assert not list(tmp_path.iterdir())


def test_environment_names_this_checkout_from_any_folder(tmp_path, monkeypatch) -> None:
    """The commit is read from the package's own checkout, not from wherever the bench runs."""
    import subprocess
    from pathlib import Path

    from flashrt_ros.bench.timing import environment

    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    monkeypatch.delenv("FLASHRT_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert environment(torch.device("cpu"))["commit"] == head.stdout.strip()
    monkeypatch.setenv("FLASHRT_COMMIT", "abc1234")
    env = environment(torch.device("cpu"))
    assert (env["commit"], env["dirty"]) == ("abc1234", None)


def test_the_printed_table_opens_with_what_ran() -> None:
    """A captured log (docs/results/*.log) named its card and commit only through its file name."""
    from flashrt_ros.cli import env_line

    gpu = {"commit": "0123456789abcdef", "dirty": True, "gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"}
    gpu |= {"triton": "3.6.0", "python": "3.12.3", "device": "cuda:0"}
    assert (
        env_line(gpu)
        == "env: commit 01234567 (dirty), NVIDIA H200, torch 2.11.0, cuda 13.0, triton 3.6.0, python 3.12.3"
    )
    cpu = {"commit": None, "dirty": None, "device": "cpu", "cpu": "x86_64", "torch": "2.11.0", "python": "3.12.3"}
    assert env_line(cpu) == "env: commit unknown, cpu (x86_64), torch 2.11.0, python 3.12.3"


def test_write_result_keeps_the_environment_beside_the_payload(tmp_path, capsys) -> None:
    """What every bench script writes: its payload and where it ran (commit, versions, device)."""
    import torch

    from flashrt_ros.bench.timing import write_result

    path = write_result(tmp_path / "new", "probe", torch.device("cpu"), rows=3, results={"a": [1.5]})
    data = json.loads(path.read_text())
    assert path.parent == tmp_path / "new" and path.name.startswith("probe_") and path.suffix == ".json"
    assert data["rows"] == 3 and data["results"] == {"a": [1.5]}
    assert {"commit", "flashrt_ros", "torch", "triton", "device"} <= set(data["env"]) and data["env"]["device"] == "cpu"
    assert f"wrote {path}" in capsys.readouterr().out
    # a second result in the same second gets its own file; NaN is written as null (strict JSON)
    again = write_result(tmp_path / "new", "probe", torch.device("cpu"), cosine=float("nan"))
    assert again != path and json.loads(path.read_text())["rows"] == 3
    assert json.loads(again.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))["cosine"] is None


def test_random_fused_gives_a_loaded_fused_path_that_matches_its_model() -> None:
    """The benchmarks' common start (`bench.stages.random_fused`): the fused path of a random
    tiny policy with the case loaded decides what its reference model decides on that case."""
    import torch

    from flashrt_ros.bench.parity import compare
    from flashrt_ros.bench.stages import random_fused

    model, case, fused = random_fused("pi05_tiny", 1, torch.device("cpu"))
    ref = model.sample_actions(*case.args(), noise=case.noise)[0]
    got = fused.sample_actions()
    assert got.shape == ref.shape
    parity = compare(got, ref)
    assert parity["max_abs"] < 5e-3 and parity["cosine"] > 0.9999, parity


def test_eager_bench_needs_no_triton_and_no_torch_gives_one_line(tmp_path):
    """A robot's pip install brings neither: `flashrt bench --help` and an eager run must not
    import the fused path (Triton), and without torch the command says what is missing."""
    import subprocess
    import sys

    def run(block: str, *argv: str) -> subprocess.CompletedProcess:
        code = f"import sys; sys.modules[{block!r}] = None; from flashrt_ros.cli import main; "
        code += f"sys.exit(main({list(argv)!r}))"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)

    eager = ["bench", "--policy", "pi05", "--tiny", "--views", "1", "--modes", "eager", "--iters", "10",
             "--warmup", "1", "--steps", "2", "--horizon", "4", "--out", str(tmp_path)]  # fmt: skip
    no_triton = run("triton", *eager)
    assert no_triton.returncode == 0, no_triton.stdout + no_triton.stderr
    assert "pi05 1v eager full decision" in no_triton.stdout
    no_torch = run("torch", *eager)
    assert no_torch.returncode == 2 and "flashrt needs PyTorch" in no_torch.stdout, no_torch.stdout + no_torch.stderr
    assert run("torch", "bench", "--help").returncode == 0


def test_a_bench_whose_every_run_fails_says_so_without_a_traceback(tmp_path, capsys, monkeypatch) -> None:
    """Each failed run is reported and the JSON keeps its error; with nothing to plot the plot
    is skipped with a line, and the exit status is 1 after the FAILED summary."""
    import flashrt_ros.bench.reference as reference

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(reference, "measure_reference", broken)
    rc = main(["bench", "--policy", "pi05", "--tiny", "--views", "1", "--modes", "eager", "--iters", "10",
               "--warmup", "1", "--steps", "2", "--horizon", "4", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "pi05 1v eager: FAILED: RuntimeError: no kernel image is available" in out
    assert "no plot: no run succeeded" in out and "1 run(s) FAILED: pi05 1v eager (exit status 1)" in out
    (path,) = tmp_path.glob("bench_*.json")
    assert json.loads(path.read_text())["runs"][0]["error"] == "RuntimeError: no kernel image is available"
    assert not list(tmp_path.glob("*.png"))


def test_verbose_logs_a_failed_modes_traceback_also_when_run_as_a_module(tmp_path, caplog, monkeypatch) -> None:
    """Run as `python -m flashrt_ros.cli` (the README's and gpu_check.sh's way) its logger was
    "__main__", outside the "flashrt_ros" logger --verbose opens: no traceback where it is wanted."""
    import logging
    import runpy
    import sys

    import flashrt_ros.bench.reference as reference

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(reference, "measure_reference", broken)
    monkeypatch.setattr(sys, "argv", ["flashrt_ros.cli", "bench", "--policy", "pi05", "--tiny", "--views", "1",
                                      "--modes", "eager", "--iters", "10", "--warmup", "1", "--steps", "2",
                                      "--horizon", "4", "--out", str(tmp_path), "--verbose"])  # fmt: skip
    package = logging.getLogger("flashrt_ros")
    monkeypatch.setattr(package, "level", package.level)  # --verbose sets it: given back after
    with pytest.raises(SystemExit) as done, pytest.warns(RuntimeWarning, match="found in sys.modules"):
        runpy.run_module("flashrt_ros.cli", run_name="__main__")
    assert done.value.code == 1
    (failed,) = [r for r in caplog.records if r.exc_info and "failed" in r.getMessage()]
    assert failed.name == "flashrt_ros.cli" and "no kernel image is available" in str(failed.exc_info[1])


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_an_interrupted_bench_says_which_rows_it_wrote_and_leaves_no_empty_folder(tmp_path, capsys, monkeypatch, stop):
    """Ctrl-C before any row finished left the folders it had made, empty, and said the rows were
    in them; after one, it names the file that holds them. SIGTERM (timeout, a batch scheduler)
    killed it without a word and left the folders: it is stopped the same way."""
    import os
    import signal

    import flashrt_ros.bench.reference as reference

    measure, calls = reference.measure_reference, []

    def interrupted_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            if stop == "ctrl-c":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # its handler raises in this thread at once
        return measure(*args, **kwargs)

    monkeypatch.setattr(reference, "measure_reference", interrupted_second)
    args = ["bench", "--policy", "pi05", "--tiny", "--modes", "eager", "--iters", "10", "--warmup", "1",
            "--steps", "2", "--horizon", "4", "--baselines-all-views"]  # fmt: skip
    calls.append(0)  # the first call is interrupted
    assert main([*args, "--views", "1", "--out", str(tmp_path / "c" / "d")]) == 130
    assert "interrupted: no row had finished; nothing written" in capsys.readouterr().out
    assert not (tmp_path / "c").exists()
    calls.clear()  # now the second: after the 1-view row
    out = tmp_path / "a" / "b"
    assert main([*args, "--views", "1,2", "--out", str(out)]) == 130
    (path,) = out.glob("bench_*.json")
    partial = json.loads(path.read_text())
    assert len(partial["runs"]) == 1 and partial["complete"] is False  # the file says it is partial
    assert f"interrupted: the 1 finished row(s) are in {path}\n" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the process's own handler back


def test_latency_percentiles_on_known_samples() -> None:
    """1..100 ms: numpy's linear percentiles, and the slowest sample as max beside them."""
    from flashrt_ros.bench.timing import HEADER, Latency

    lat = Latency.from_samples("x", [float(v) for v in range(100, 0, -1)])
    assert (lat.n, lat.median_ms, lat.min_ms, lat.max_ms, lat.mean_ms) == (100, 50.5, 1.0, 100.0, 50.5)
    assert lat.p90_ms == pytest.approx(90.1) and lat.p99_ms == pytest.approx(99.01)
    assert lat.row().split() == ["x", "50.500", "90.100", "99.010", "100.000", "100"]
    assert HEADER.split() == ["what", "median", "p90", "p99", "max", "n", "(ms)"]


def test_chunk_parity_compares_the_chunk_and_the_chunk_minus_the_noise() -> None:
    """The noise both chunks start from gives them a high cosine by itself: chunk - noise shows an
    error that the chunk's cosine hides."""
    from flashrt_ros.bench.parity import chunk_parity

    noise = torch.randn(50, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 10
    ref = noise + 0.01 * torch.arange(50 * 32, dtype=torch.float64).reshape(50, 32) / (50 * 32)
    same = chunk_parity(ref.clone(), ref, noise)
    assert same["chunk"] == {"max_abs": 0.0, "cosine": pytest.approx(1.0), "ref_abs_max": ref.abs().max().item()}
    off = chunk_parity(noise, ref, noise)  # the velocity lost entirely
    assert off["chunk"]["cosine"] > 0.99999 and off["chunk"]["max_abs"] == pytest.approx(0.01, rel=1e-3)
    assert off["chunk_minus_noise"]["max_abs"] == pytest.approx(0.01, rel=1e-3)
    assert off["chunk_minus_noise"]["cosine"] == 0.0  # no velocity at all: nothing in common, not a pass


def test_only_gpu_modes_on_a_cpu_run_nothing_and_say_so(tmp_path, capsys) -> None:
    argv = ["bench", "--policy", "pi05", "--tiny", "--modes", "compile,compile-bf16,fused", "--device", "cpu"]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().out.splitlines() == [
        "skipped on cpu (they need a CUDA GPU): compile, compile-bf16, fused",
        "nothing to run: every mode asked for needs a CUDA GPU (add eager, or run on a GPU)",
    ]
    assert not list(tmp_path.iterdir())


def test_the_bf16_vision_baseline_runs_the_reference_with_siglip_in_bf16_and_gives_it_back() -> None:
    """compile-bf16 times the reference with its SigLIP and projector in bf16 too (LeRobot's bf16
    mode, which the reference follows, keeps them fp32): inside the block they are bf16 and the
    decision runs; after it the model has its own fp32 tensors back, bit for bit."""
    from flashrt_ros.bench.reference import Case, build_random, vision_in
    from flashrt_ros.policies.config import PolicyConfig

    cfg = PolicyConfig.preset("pi05_tiny", dtype="float32", num_steps=2, horizon=4).replace(num_views=1)
    model = build_random(cfg, torch.device("cpu"), seed=0).set_precision(torch.bfloat16)
    case = Case.make(model.cfg, torch.device("cpu"), 1, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    mixed = model.sample_actions(*case.args(), noise=case.noise)
    with vision_in(model, torch.bfloat16):
        assert {p.dtype for p in (*model.vision.parameters(), *model.vision_proj.parameters())} == {torch.bfloat16}
        all_bf16 = model.sample_actions(*case.args(), noise=case.noise)
    assert all(torch.equal(p, before[n]) and p.dtype == before[n].dtype for n, p in model.named_parameters())
    assert torch.isfinite(all_bf16).all() and not torch.equal(all_bf16, mixed)
    assert torch.nn.functional.cosine_similarity(all_bf16.flatten(), mixed.flatten(), dim=0) > 0.999


@pytest.mark.gpu
@pytest.mark.parametrize(("down_from", "precision"), [(None, "gate|up in FP8 (down in bf16)"), (0, "MLP in FP8")])
def test_fused_modes_record_what_they_built_and_their_parity(tmp_path, monkeypatch, down_from, precision) -> None:
    """On a GPU: the fused rows (bf16 and FP8) come with their parity against the fp32 reference,
    the fused path as built, and a precision read from the built weights (an FP8 down that fell
    back to bf16 is said). The tiny LM's only MLP layer is layer 0: FP8 from there."""
    from flashrt_ros.policies import fused as fused_module

    monkeypatch.setattr(fused_module, "PREFIX_MLP_FP8_FROM", 0)
    monkeypatch.setattr(fused_module, "PREFIX_DOWN_FP8_FROM", down_from)
    rc = main(
        ["bench", "--policy", "pi05", "--tiny", "--views", "1,2", "--modes", "fused,fused-fp8", "--iters", "10",
         "--warmup", "1", "--steps", "2", "--horizon", "4", "--out", str(tmp_path)]
    )  # fmt: skip
    runs = json.loads(next(tmp_path.glob("bench_*.json")).read_text())["runs"]
    assert rc == 0 and [(r["mode"], r["views"]) for r in runs] == [
        ("fused", 1), ("fused", 2), ("fused-fp8", 1), ("fused-fp8", 2)
    ], runs  # fmt: skip
    for run in runs:
        assert "denoise x2" in run["fused_path"] and {"full", "prefix", "denoise", "vision", "preprocess"} <= set(run)
        assert run["parity"]["chunk"]["cosine"] > 0.999 and run["parity"]["chunk"]["max_abs"] < 0.05, run["parity"]
        assert run["preprocess"]["name"].endswith(f"preprocess {run['views']}x480x640 from host")
        fp8 = run["mode"] == "fused-fp8"
        assert run["precision"] == (f"bfloat16, prefix LM {precision}" if fp8 else "bfloat16")
        assert ("FP8 (e4m3, row scales)" in run["fused_path"]) == fp8


def test_results_file_is_strict_json_and_never_shared_by_two_runs(tmp_path) -> None:
    """A NaN parity value was written as a bare NaN, which strict JSON readers refuse (the whole
    file lost); two runs started in the same second wrote one file, the second over the first."""
    first = {"env": {}, "runs": [{"parity": {"cosine": float("nan"), "max_abs": float("inf")}}]}
    second, third = {"env": {}, "runs": []}, {"env": {}, "runs": []}
    _write(first, tmp_path)
    _write(second, tmp_path)
    _write(third, tmp_path)  # a third in that second took the second's name (stamp + pid) and overwrote it
    files = sorted(tmp_path.glob("bench_*.json"))
    assert len(files) == 3 and len({first["stamp"], second["stamp"], third["stamp"]}) == 3, files
    written = json.loads((tmp_path / f"bench_{first['stamp']}.json").read_text(), parse_constant=lambda c: 1 / 0)
    assert written["runs"][0]["parity"] == {"cosine": None, "max_abs": None}


def test_a_refused_run_leaves_no_out_folder_behind(tmp_path, capsys) -> None:
    """Refused after the argument checks (nothing to run on a CPU; a set-up that fails): the
    folders it made for --out are gone, a folder that was there before stays."""
    out = tmp_path / "a" / "b"
    assert main(["bench", "--tiny", "--device", "cpu", "--modes", "fused", "--out", str(out)]) == 2
    assert main(["bench", "--tiny", "--device", "cpu", "--modes", "eager", "--steps", "0", "--out", str(out)]) == 2
    assert "cannot set up the benchmark: invalid PolicyConfig: num_steps" in capsys.readouterr().out
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []


def test_the_startup_benchmark_times_each_step(tmp_path) -> None:
    """bench/startup.py's smoke mode (tiny, CPU): a checkpoint written in LeRobot's layout, then
    two start-ups in fresh processes over one Triton cache folder, each step timed."""
    from bench_script import run_bench_script

    stdout, written = run_bench_script("startup", tmp_path, "--tiny", "--views", "1")
    assert "pi05 1 views, tiny, CPU" in stdout
    wanted = {
        "torch + CUDA context s",
        "checkpoint load s",
        "fused build without the capture s",
        "warm-up decision ms",
        "first decision ms",
        "to the first chunk s",
        "later decisions, median ms",
    }
    for case in ("cold", "warm"):
        steps = written["results"][case]
        assert set(steps) >= wanted and all(v >= 0 for v in steps.values()), steps
        assert steps["checkpoint load s"] > 0 and steps["later decisions, median ms"] > 0, steps
    assert f"{'first decision ms':42}" in stdout  # the table


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the refusal it checks is for a machine without a CUDA GPU (with one, it runs)"
)
def test_the_full_size_startup_benchmark_refuses_a_machine_without_a_gpu(tmp_path) -> None:
    """It wrote an 11 GB checkpoint over two minutes, then its child died on the fused path."""
    import subprocess
    import sys

    from bench_script import BENCH

    argv = [sys.executable, str(BENCH / "startup.py"), "--out", str(tmp_path / "o")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "the full-size start-up needs a CUDA GPU (or --tiny" in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()


def test_lerobot_parity_script_says_what_input_is_missing_with_exit_2(tmp_path) -> None:
    """Exit 1 is its parity gate's failure: a missing folder was a traceback with exit 1 and, for
    the checkpoint, a message that the missing folder "holds a LeRobot policy"."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "lerobot_parity.py"

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120)

    done = run("--ref", str(tmp_path / "none"))
    assert done.returncode == 2 and "no io.safetensors there" in done.stderr, done.stderr
    for name in ("io.safetensors", "io.json"):
        (tmp_path / name).write_bytes(b"")
    done = run("--ref", str(tmp_path), "--checkpoint", str(tmp_path / "gone"))
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "gone: no such folder; expected the checkpoint the reference was made from"
    ), done.stderr


def test_bench_scripts_refuse_an_unusable_out_and_too_few_samples_before_the_run(tmp_path) -> None:
    """bench/startup.py ran a minute, then died in FileExistsError on --out /dev/null with its
    results lost; prefix_reuse.py printed a p99 of 2 samples, or an IndexError for --warmup 0."""
    import argparse

    from flashrt_ros.bench.args import at_least, number_at_least, out_folder

    assert out_folder(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    taken = tmp_path / "file"
    taken.write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="is an existing file; expected a folder"):
        out_folder(str(taken))
    assert at_least(3)("3") == 3
    for text, message in (("2", "expected an integer >= 3, got 2"), ("x", "expected an integer, got 'x'")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            at_least(3)(text)
    # a script's default --out ("out" where it runs) is checked too: a file named out there
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "out").write_text("")
    env = os.environ | {"PYTHONPATH": str(repo)}
    for script, *args in (("prefix_reuse.py", "--tiny"), ("idle_gap.py",)):
        argv = [sys.executable, str(repo / "bench" / script), *args]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "--out 'out' is an existing file" in done.stderr, (script, done.stderr)
    # a negative or NaN idle gap built the policy, then died in time.sleep with a traceback
    for gap in ("-5", "nan"):
        argv = [sys.executable, str(repo / "bench" / "prefix_reuse.py"), "--tiny", "--gap-ms", gap, "--out", "o"]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"--gap-ms: expected one number >= 0, got '{gap}'" in done.stderr, done.stderr
    with pytest.raises(argparse.ArgumentTypeError, match="expected one number >= 0, got '1,2'"):
        number_at_least(0.0)("1,2")
    assert number_at_least(0.0)("0") == 0.0


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="checks the refusal on a machine without a CUDA GPU (with one, the benchmark runs)",
)
@pytest.mark.parametrize(
    "script",
    [
        *("prefix_reuse.py", "decide_host.py", "rtc_cost.py", "adopt_hf.py", "decision_overhead.py"),
        *("prefix_overlap.py", "profile_fused.py", "sync_latency.py", "expert_step.py", "fp8_prefix_ab.py"),
        *("gate_up_geglu.py", "row_norms.py", "prefix_mlp.py", "attention.py", "gemm_shapes.py", "fp8_gemms.py"),
        *("fp8_down.py", "frame_kernel.py", "idle_gap.py"),
    ],
)
def test_the_full_size_gpu_benches_refuse_a_machine_without_cuda_in_one_line(tmp_path, script) -> None:
    """An AssertionError "Torch not compiled with CUDA enabled" with a traceback, exit 1: read as
    a benchmark that failed, not as the wrong machine."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    argv = [sys.executable, str(repo / "bench" / script), "--out", str(tmp_path / "o")]
    env = os.environ | {"PYTHONPATH": str(repo)}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU (none here)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_bench_help_shows_defaults_as_typed(capsys) -> None:
    """--views showed "(default: [3])" and --device "(default: cuda when there is one) (default: None)"."""
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "e.g. 1,2,3 (default: 3)" in text and "(default: cuda when there is one, else cpu)" in text, text
    assert "default: None" not in text and "default: [" not in text
