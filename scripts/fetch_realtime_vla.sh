#!/usr/bin/env bash
# Third-party baseline for `flashrt bench --modes realtime-vla`: a checkout of Dexmal's
# realtime-vla v2 (MIT; its pi0 / pi0.5 Triton backends) in .ext/realtime-vla-v2, which git
# ignores (its code is not part of this repository). Needs network; carry .ext to a GPU machine
# that has none (the device tool: carry [".ext"]).
#
#   bash scripts/fetch_realtime_vla.sh [COMMIT]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=.ext/realtime-vla-v2
[ -d "$dest/.git" ] || git clone -q https://github.com/dexmal/realtime-vla-v2 "$dest"
[ -z "${1:-}" ] || git -C "$dest" checkout -q "$1"
git -C "$dest" rev-parse HEAD > "$dest/REVISION"
echo "realtime-vla-v2 at $(cat "$dest/REVISION") in $dest (timed here at a36d02a7b241de1129af2048e749de58f95ead9c)"
