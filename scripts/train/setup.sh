#!/usr/bin/env bash
# Creates (or reuses) the training virtualenv at $WGSPEC_CACHE/train-venv (default ~/.cache/wgspec/train-venv)
# with exact pins (accelerate: transformers refuses to load a GGUF file without it).
# torch from PyPI is the CUDA build (a multi-GB download with its nvidia-* wheels); it runs fine on CPU.
set -euo pipefail
CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
VENV="${TRAIN_VENV:-$CACHE/train-venv}"
PY="${PYTHON:-python3}"
PINS=(
  "torch==2.9.1"
  "transformers==4.57.1"
  "gguf==0.17.1"
  "safetensors==0.6.2"
  "numpy==2.2.6"
  "accelerate==1.11.0"
)
STAMP="$VENV/.wgspec-pins"
want="$(printf '%s\n' "${PINS[@]}")"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup.sh: reusing $VENV"
  exit 0
fi
mkdir -p "$CACHE"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade "pip==25.3"
nice -n 19 "$VENV/bin/python" -m pip install --disable-pip-version-check "${PINS[@]}"
"$VENV/bin/python" - <<'PY'
import torch, transformers, gguf, safetensors, numpy
print("setup.sh: torch", torch.__version__, "transformers", transformers.__version__,
      "numpy", numpy.__version__, "safetensors", safetensors.__version__)
PY
printf '%s\n' "$want" > "$STAMP"
echo "setup.sh: ready at $VENV"
