#!/usr/bin/env bash
# Everything that needs the GPU, in one command for the device machine (H200; Python 3.12,
# torch 2.11 + CUDA 13, triton 3.6; no network). CI has no GPU, so these never run there.
#
#   bash scripts/gpu_check.sh [parts...]     parts: kernels kernels-all fused parity latency bench headline headline-pi0 step compile
#                                            prefix-reuse adopt rtc host startup frame-kernel baseline-bf16 idle-gap
#                                            profile micro experiments vision ncu
#                                            (default: kernels fused parity latency bench step)
#
# Carry the parity wheels (`bash scripts/fetch_parity_wheels.sh` -> .whl) for `parity`.
# Results (logs + JSON) go to $OUT (the device tool brings them back) or ./out.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
# FLASHRT_COMMIT: pass the commit in the command (the device copy has no .git)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -n "${FLASHRT_COMMIT:-}" ] || [ -d .git ] \
  || echo "warning: no .git here and FLASHRT_COMMIT unset: result files will say commit \"unknown\""
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(kernels fused parity latency bench step)
# every part named before any runs: a typo found after an hour of benchmarks costs the device time
known=" $(sed -n 's/^    \([a-z0-9|-]*\))$/\1/p' scripts/gpu_check.sh | tr '|\n' '  ')"
for part in "${parts[@]}"; do
  case "$known" in
    *" $part "*) ;;
    *) echo "gpu_check.sh: unknown part '$part'; expected one of:$known" >&2; exit 2 ;;
  esac
done
status=0
step() { echo; echo "=== $* ($(date +%T))"; }
# progress bars out of a log: a bar that ends in "\r" (tqdm's leave=False) shares its line with
# the next output line, so split at "\r" first or that line goes with the bar
no_bars() { tr '\r' '\n' | grep -v "it/s"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# no usable GPU (a CPU torch, a driver mismatch): every GPU test would skip and the check pass
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' \
  || { echo "gpu_check.sh: torch finds no usable CUDA GPU here: nothing checked" >&2; exit 2; }

for part in "${parts[@]}"; do
  case "$part" in
    kernels)
      step "GPU kernel tests at real shapes"
      python3 -m pytest -q -m gpu -p no:cacheprovider test/test_kernels_*.py 2>&1 | tee "$OUT/kernels.log" | tail -25 || status=1
      ;;
    kernels-all)
      step "Every kernel test compiled on the GPU: the real shapes and the small / ragged ones CI interprets (slower: one build per shape)"
      python3 -m pytest -q -p no:cacheprovider test/test_kernels_*.py 2>&1 | tee "$OUT/kernels_all.log" | tail -25 || status=1
      ;;
    fused)
      step "Fused path vs reference on the GPU (CUDA graphs captured), and its fall-back to the reference"
      python3 -m pytest -q -p no:cacheprovider test/test_fused.py test/test_capsule.py test/test_fallback.py \
        test/test_prefix_cache.py test/test_real_time_chunking.py test/test_frame_pool.py 2>&1 | tee "$OUT/fused.log" | tail -15 || status=1
      # the benchmark's fused rows (tiny, bf16 and FP8): what `flashrt bench` records beside its times
      python3 -m pytest -q -m gpu -p no:cacheprovider test/test_bench_cli.py 2>&1 | tee "$OUT/bench_cli.log" | tail -5 \
        || status=1
      ;;
    rtc)
      step "real-time chunking: a guided decision's cost and parity on the fused path (bench/rtc_cost.py)"
      python3 bench/rtc_cost.py --rounds 5 --iters 20 --out "$OUT" 2>&1 | no_bars | tee "$OUT/rtc_cost.log" || status=1
      ;;
    adopt)
      # the device machine's own transformers (5.17 when last looked) serves: nothing to carry
      step "adopt: its tests on compiled kernels, then HF SigLIP + Gemma at pi0.5's prefix shapes (eager, compile, adopted)"
      python3 -m pytest -q -p no:cacheprovider -s test/test_adopt.py 2>&1 | tee "$OUT/adopt_tests.log" | tail -25 || status=1
      python3 bench/adopt_hf.py --iters 50 --out "$OUT" 2>&1 | no_bars | tee "$OUT/adopt_hf.log" || status=1
      ;;
    bench)
      # more than one 10-minute device call (both policies at three view counts): run it where
      # the time allows, or the headline parts one policy at a time
      step "flashrt bench: eager, fused (bf16 and FP8 prefix MLP), torch.compile (pi0.5 and pi0, batch 1)"
      python3 -m flashrt_ros.cli bench --policy pi05,pi0 --views 1,2,3 --modes eager,fused,fused-fp8,compile --iters 50 \
        --warmup 5 --out "$OUT" 2>&1 | tee "$OUT/bench.log" || status=1
      ;;
    headline|headline-pi0)
      # 100 decisions per row (with 30, p99 is an interpolation between the two slowest samples);
      # one policy per part: each takes 4-5 min on the H200, both together more than one 10-min call.
      # With a realtime-vla checkout (scripts/fetch_realtime_vla.sh; carry .ext) its row joins the run.
      pol=pi05; [ "$part" = headline-pi0 ] && pol=pi0
      modes=eager,fused,fused-fp8,compile; extra=()
      rtvla="${REALTIME_VLA:-.ext/realtime-vla-v2}"
      if [ -f "$rtvla/server/pi05_infer.py" ]; then modes=eager,fused,fused-fp8,realtime-vla,compile; extra=(--realtime-vla "$rtvla"); fi
      step "The issue's headline: $pol at 3 views, $modes in one run (~5 min)"
      python3 -m flashrt_ros.cli bench --policy "$pol" --views 3 --modes "$modes" "${extra[@]}" --iters 100 \
        --warmup 3 --out "$OUT" 2>&1 | no_bars | tee "$OUT/$part.log" || status=1
      ;;
    host)
      step "the node's decide(): host work serial vs overlapped with vision (bench/decide_host.py, ~3 min)"
      python3 bench/decide_host.py --rounds 5 --iters 20 --out "$OUT" 2>&1 | no_bars | tee "$OUT/decide_host.log" || status=1
      ;;
    baseline-bf16)
      step "pi0.5 3 views: fused against torch.compile of the reference as LeRobot runs bf16 (SigLIP fp32) and with SigLIP in bf16 too"
      python3 -m flashrt_ros.cli bench --policy pi05 --views 3 --modes fused,compile,compile-bf16 --iters 50 \
        --out "$OUT" 2>&1 | no_bars | tee "$OUT/bench_baseline_bf16.log" || status=1
      ;;
    frame-kernel)
      step "the frame kernel: one geometry-free compile against one per camera kind (bench/frame_kernel.py)"
      python3 bench/frame_kernel.py --rounds 5 --out "$OUT" 2>&1 | tee "$OUT/frame_kernel.log" || status=1
      ;;
    startup)
      step "the node's start-up to its first chunk, Triton's cache empty then filled (bench/startup.py, ~4 min)"
      python3 bench/startup.py --policy pi05 --views 3 --profile --out "$OUT" 2>&1 | no_bars | tee "$OUT/startup.log" || status=1
      ;;
    idle-gap)
      step "A decision's latency against the idle time before it (bench/idle_gap.py, ~2 min)"
      python3 bench/idle_gap.py --policy pi05 --views 3 --out "$OUT" 2>&1 | no_bars | tee "$OUT/idle_gap.log" || status=1
      ;;
    prefix-reuse)
      step "The node's decide() with the prefix run and re-used (fused, eager, compile; pi0.5 then pi0, 3 views; ~4 min)"
      for pol in pi05 pi0; do
        python3 bench/prefix_reuse.py --policy "$pol" --views 3 --iters 100 --eager-iters 10 --out "$OUT" 2>&1 \
          | no_bars | tee "$OUT/prefix_reuse_$pol.log" || status=1
      done
      ;;
    parity)
      step "LeRobot 0.6.1 parity, full size"
      if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || status=1
      fi
      for pol in pi05 pi0; do
        ref=/tmp/lr/$pol
        PYTHONPATH=/tmp/site:$PYTHONPATH python3 scripts/lerobot_reference.py --policy "$pol" --size full \
          --dtype float32 --device cuda --out "$ref/float32" --checkpoint "$ref/ckpt" 2>&1 | tail -3 || status=1
        PYTHONPATH=/tmp/site:$PYTHONPATH python3 scripts/lerobot_reference.py --policy "$pol" --size full \
          --dtype bfloat16 --device cuda --out "$ref/bfloat16" --no-checkpoint 2>&1 | tail -2 || status=1
        for dt in float32 bfloat16; do
          python3 scripts/lerobot_parity.py --ref "$ref/$dt" --checkpoint "$ref/ckpt" --dtype "$dt" \
            --json "$OUT/parity_${pol}_$dt.json" || status=1
        done
        rm -rf "$ref/ckpt"
      done
      ;;
    latency)
      step "Reference eager latency, full size, bf16, batch 1"
      python3 -m flashrt_ros.cli bench --policy pi05 --views 3 --modes eager --iters 50 --warmup 3 --out "$OUT" \
        2>&1 | no_bars | tee "$OUT/latency.log" || status=1
      ;;
    step)
      step "Expert step kernel (18 layers in one persistent launch): default tiles and variants"
      python3 bench/expert_step.py --out "$OUT" 2>&1 | tee "$OUT/expert_step.log" || status=1
      ;;
    compile)
      step "Step kernel built offline for sm_90 and sm_110 (Thor)"
      python3 scripts/compile_check.py 90 110 2>&1 | tee "$OUT/compile_check.log" || status=1
      ;;
    profile)
      step "Fused pi0.5 decision, kernel by kernel"
      python3 bench/profile_fused.py --policy pi05 --views 3 --out "$OUT" 2>&1 | tee "$OUT/profile.log" || status=1
      ;;
    micro)
      step "Pipeline pieces at their shapes: row norms per warps, prefix MLP whole vs in chunks, gate|up + GeGLU fused vs cuBLAS"
      python3 bench/row_norms.py --out "$OUT" 2>&1 | tee "$OUT/row_norms.log" || status=1
      python3 bench/prefix_mlp.py --out "$OUT" 2>&1 | tee "$OUT/prefix_mlp.log" || status=1
      python3 bench/gate_up_geglu.py --out "$OUT" 2>&1 | tee "$OUT/gate_up_geglu.log" || status=1
      python3 bench/fp8_gemms.py --out "$OUT" 2>&1 | tee "$OUT/fp8_gemms.log" || status=1
      ;;
    experiments)
      step "Candidates: step kernel attention tiles, GEMM layouts at the prefix shapes, prefix attention tiles in place"
      python3 bench/expert_step.py --out "$OUT" 2>&1 | tee "$OUT/expert_step.log" || status=1
      python3 bench/gemm_shapes.py --out "$OUT" 2>&1 | tee "$OUT/gemm_shapes.log" || status=1
      python3 bench/fused_ab.py "PREFIX_ATTENTION_TILES=none;64x32,w4,s3,k1;128x32,w8,s3,k2" --rounds 5 \
        --out "$OUT" 2>&1 | tee "$OUT/fused_ab.log" || status=1
      ;;
    ncu)
      step "Nsight Compute: where the step kernel's warps wait (stall samples per source line)"
      NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
      (cd bench && "$NCU" --kernel-name _expert_step_kernel --launch-skip 3 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --section SpeedOfLight --import-source yes \
        -o "$OUT/step" -f python3 step_ncu.py) 2>&1 | tail -3 || status=1
      "$NCU" --import "$OUT/step.ncu-rep" --page details --print-details all --section WarpStateStats \
        > "$OUT/step_ncu_warp_state.txt" 2>&1 || status=1
      "$NCU" --import "$OUT/step.ncu-rep" --page source --print-source cuda,sass --csv > "$OUT/step_source.csv" \
        2>&1 || status=1
      python3 bench/step_ncu.py --summarize "$OUT/step_source.csv" > "$OUT/step_ncu_stall_lines.txt" || status=1
      head -25 "$OUT/step_ncu_stall_lines.txt"
      ;;
    vision)
      step "SigLIP attention: SDPA backends vs the packed Triton kernel, alone and in the captured stages"
      python3 bench/attention.py --parts vision --out "$OUT" 2>&1 | tee "$OUT/attention.log" || status=1
      python3 bench/fused_ab.py "VISION_ATTENTION=triton;sdpa" --rounds 5 --out "$OUT" 2>&1 \
        | tee "$OUT/fused_ab_vision.log" || status=1
      ;;
  esac
done
exit $status
