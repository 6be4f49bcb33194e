#!/usr/bin/env bash
# Download the wheels the GPU machine (no network; Python 3.12, torch 2.11+cu130) needs to
# import and run LeRobot 0.6.1's PI05Policy / PI0Policy for the parity gate of issue 2.
#
#   bash scripts/fetch_parity_wheels.sh          # -> .whl/*.whl (ignored by git, 15.6 MiB)
#
# The list is the import closure of
#   lerobot.policies.pi05.modeling_pi05.PI05Policy and lerobot.policies.pi0.modeling_pi0.PI0Policy
# (checked by importing and running them in a clean Python 3.12 venv holding only what the
# GPU machine has) minus what that machine already has: torch 2.11, torchvision 0.26,
# numpy, safetensors, huggingface_hub 1.x, pyyaml, regex, typer, typing-inspect,
# mypy_extensions, cloudpickle, fsspec, einops, pillow, opencv, requests, tqdm, packaging,
# sentencepiece, scipy. It does have transformers 5.17 and tokenizers 0.23, which LeRobot
# 0.6.1 does not accept (transformers<5.6), so we carry 5.5.4 + tokenizers 0.22.2; they
# shadow the installed ones when put first on PYTHONPATH.
#
# On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
#   python3 scripts/lerobot_reference.py --policy pi05 --size full --dtype float32 --device cuda \
#       --out /tmp/lr/pi05_fp32 --checkpoint /tmp/lr/pi05_fp32_ckpt
# (run tool: carry [".whl"]). See docs/lerobot_facts.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${WHEEL_DIR:-$here/.whl}"
mkdir -p "$dest"

# name==version, one per line. Pure-python wheels unless marked.
wheels=(
  lerobot==0.6.1               # the reference itself (pure, 1.7 MB)
  transformers==5.5.4          # lerobot 0.6.1 wants transformers>=5.4,<5.6; the GPU has 5.17 (pure, 10 MB)
  tokenizers==0.22.2           # binary abi3; transformers 5.5.4 checks tokenizers<=0.23.0 at import (GPU: 0.23.2)
  draccus==0.11.6              # lerobot.configs: PreTrainedConfig is a draccus.ChoiceRegistry
  mergedeep==1.3.4             # draccus.argparsing imports it
  toml==0.10.2                 # draccus (lazily, for .toml configs); tiny, kept for completeness
  gymnasium==1.2.3             # lerobot.policies.pretrained -> configs.train -> envs.configs imports it
  farama-notifications==0.0.6  # gymnasium imports it
  termcolor==3.3.0             # lerobot scripts / wandb utils (not on the policy import path); tiny
)
# Needed and already on the GPU machine (so not carried): torchvision 0.26 (lerobot.transforms,
# imported by lerobot.configs.default), opencv (lerobot.policies.groot.processor_groot is imported
# by lerobot.policies.factory), typing-inspect + mypy_extensions + pyyaml (draccus), regex + typer
# + pyyaml (transformers), cloudpickle (gymnasium), huggingface_hub, safetensors, numpy, einops.
# lerobot's metadata pins numpy<2.3, packaging<26, opencv<4.14: the GPU's newer ones import fine
# (checked: both policies build and run there in float32 and bfloat16).

pip_args=(download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  -d "$dest")

failed=()
for spec in "${wheels[@]}"; do
  python3 -m pip "${pip_args[@]}" "$spec" > "$dest/.pip.log" 2>&1 || failed+=("$spec")
  grep -vE '^(WARNING|Looking in|Collecting|Using cached)' "$dest/.pip.log" || true  # only pip's noise filtered
done
rm -f "$dest/.pip.log"
if [ ${#failed[@]} -gt 0 ]; then  # found here, not as import errors on the GPU machine
  echo "fetch_parity_wheels.sh: ${#failed[@]} wheel(s) not downloaded: ${failed[*]}" >&2
  exit 1
fi

echo
echo "wheels in $dest:"
ls -l "$dest"/*.whl
total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
echo "total: $total bytes ($((total / 1048576)) MiB)"
if [ "$total" -gt $((30 * 1048576)) ]; then
  echo "warning: more than 30 MiB of wheels; the device copy limit is 64 MiB in all" >&2
fi
