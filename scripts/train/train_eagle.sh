#!/usr/bin/env bash
# One command: set up the venv (idempotent), then run every phase at the lowest CPU priority.
#   scripts/train/train_eagle.sh                    # the full ~60 min run -> ~/.cache/wgspec/heads/smollm2-135m-eagle
#   scripts/train/train_eagle.sh --preset smoke --out /tmp/eagle-smoke   # a 3-5 min end-to-end check
# Any train_eagle.py option may follow. The log is tee'd to $WGSPEC_CACHE/train-work/train-<date>.log.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
VENV="${TRAIN_VENV:-$CACHE/train-venv}"
bash "$HERE/setup.sh"
mkdir -p "$CACHE/train-work"
export PYTHONHASHSEED=0 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
# (Keeping freed buffers in the heap with GLIBC_TUNABLES mmap_max=0 made training steps ~1.4x
# faster in short runs, but the full run's heap grew past the machine's 24 GB and was killed: the
# allocator keeps its defaults.)
nice -n 19 "$VENV/bin/python" -u "$HERE/train_eagle.py" "$@" 2>&1 | tee "$CACHE/train-work/train-$(date +%Y%m%d-%H%M%S).log"
