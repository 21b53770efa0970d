#!/usr/bin/env bash
# One command: set up the venv (idempotent), then run every phase at the lowest CPU priority.
#   scripts/train/train_eagle.sh                    # the full ~60 min run -> ~/.cache/wgspec/heads/smollm2-135m-eagle
#   scripts/train/train_eagle.sh --preset smoke --out /tmp/eagle-smoke   # a 3-5 min end-to-end check
# Any train_eagle.py option may follow.
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" train_eagle.py "$@"
