#!/usr/bin/env bash
# One command: set up the venv (idempotent), then train Medusa heads on the EAGLE recipe's corpus
# (reused from train_eagle.sh's cached phases when they are there, built otherwise).
#   scripts/train/train_medusa.sh                   # -> ~/.cache/wgspec/heads/smollm2-135m-medusa
#   scripts/train/train_medusa.sh --preset smoke --out /tmp/medusa-smoke
# Any train_medusa.py option may follow.
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" train_medusa.py "$@"
