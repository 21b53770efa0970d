#!/usr/bin/env bash
# wgspec build and test driver. Every step installs what it needs, idempotently.
#
#   ./build.sh setup   system packages (software Vulkan), Rust components and targets
#   ./build.sh models  fetch the test/demo models and tokenizer vectors into the cache
#   ./build.sh demo    set up, fetch the default model, generate with it
#   ./build.sh test    set up, fetch, rustfmt check, clippy -D warnings, every test
#   ./build.sh bench   plain decode speed of the cached models (figures for BENCHMARKS.md)
#
# The cache lives outside the repo: $WGSPEC_CACHE (default ~/.cache/wgspec).
set -euo pipefail
cd "$(dirname "$0")"

export WGSPEC_CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/wgspec-xdg-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

log() { printf '\n== %s\n' "$*" >&2; }

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

setup() {
  local need=()
  for pkg in mesa-vulkan-drivers libvulkan1; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} (software Vulkan for GPU tests)"
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  rustup target list --installed | grep -q '^wasm32-unknown-unknown$' || rustup target add wasm32-unknown-unknown
}

models() {
  log "models and tokenizer vectors into $WGSPEC_CACHE"
  for m in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
    cargo run -q --bin wgspec -- fetch "$m"
  done
  bash scripts/fetch_vocab.sh
}

case "${1:-}" in
  setup)
    setup
    ;;
  models)
    setup
    models
    ;;
  demo)
    setup
    cargo build --release --bin wgspec
    model=$(./target/release/wgspec fetch "${MODEL:-smollm2-135m}")
    ./target/release/wgspec generate --model "$model" --max-tokens "${MAX_TOKENS:-64}" \
      --prompt "${PROMPT:-The three most useful things to know about speculative decoding are}"
    ;;
  test)
    setup
    log "rustfmt"
    cargo fmt --all -- --check
    log "clippy (native)"
    cargo clippy --all-targets -- -D warnings
    log "clippy (wasm32 library)"
    cargo clippy --lib --target wasm32-unknown-unknown -- -D warnings
    models
    log "tests (lavapipe)"
    cargo test --no-fail-fast
    ;;
  bench)
    setup
    cargo build --release --bin wgspec
    for m in ${MODELS:-smollm2-135m}; do
      path=$(./target/release/wgspec fetch "$m")
      ./target/release/wgspec generate --model "$path" --max-tokens "${MAX_TOKENS:-64}" --json \
        --prompt "${PROMPT:-def fibonacci(n):}"
    done
    ;;
  *)
    sed -n '2,10p' "$0"
    exit 2
    ;;
esac
