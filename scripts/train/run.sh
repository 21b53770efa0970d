#!/usr/bin/env bash
# Shared by train_eagle.sh and train_medusa.sh: set up the venv (idempotent), then run the training
# script named first at the lowest CPU priority with 2 threads; the log is tee'd to
# $WGSPEC_CACHE/train-work/<script>-<date>.log.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
VENV="${TRAIN_VENV:-$CACHE/train-venv}"
SCRIPT="$1"
shift
bash "$HERE/setup.sh"
mkdir -p "$CACHE/train-work"
export PYTHONHASHSEED=0 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
# (Keeping freed buffers in the heap with GLIBC_TUNABLES mmap_max=0 made training steps ~1.4x
# faster in short runs, but the full run's heap grew past the machine's 24 GB and was killed: the
# allocator keeps its defaults.)
nice -n 19 "$VENV/bin/python" -u "$HERE/$SCRIPT" "$@" 2>&1 | tee "$CACHE/train-work/${SCRIPT%.py}-$(date +%Y%m%d-%H%M%S).log"
