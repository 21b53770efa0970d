#!/usr/bin/env bash
# wgspec build and test driver. Every step installs what it needs, idempotently.
#
#   ./build.sh setup   system packages (software Vulkan, Chromium + ChromeDriver, nginx, python3-venv),
#                      Rust components and targets, wasm-bindgen-cli, npm tools (binaryen's wasm-opt,
#                      playwright-core), a virtualenv with the openai client (target/venv)
#   ./build.sh models  fetch the test/demo models and tokenizer vectors into the cache
#   ./build.sh wasm    build the npm package into pkg/ (wasm32 release, wasm-bindgen, wasm-opt, www/lib glue)
#   ./build.sh demo    set up, fetch the default models, build pkg/, serve the browser demo on 127.0.0.1
#   ./build.sh test    set up, fetch, rustfmt check, clippy -D warnings, every test (native, wasm in
#                      headless Chromium, the demo page end to end, the server through the openai
#                      Python client and two replicas behind nginx), and the GPU run's dry run
#   ./build.sh bench   plain decode speed of the cached models (figures for BENCHMARKS.md)
#   ./build.sh gpu-pack     pack the first real-GPU run (scripts/gpu_pack.sh -> target/gpu-pack)
#   ./build.sh gpu-dry-run  pack it and run it here on small shapes (scripts/gpu_bench.sh --dry-run)
#
# The cache lives outside the repo: $WGSPEC_CACHE (default ~/.cache/wgspec).
set -euo pipefail
cd "$(dirname "$0")"

export WGSPEC_CACHE="${WGSPEC_CACHE:-$HOME/.cache/wgspec}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/wgspec-xdg-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
OPENAI_PY=3.57.0

log() { printf '\n== %s\n' "$*" >&2; }

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

setup() {
  local need=()
  for pkg in mesa-vulkan-drivers libvulkan1 chromium chromium-driver nginx python3-venv; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} (software Vulkan for GPU tests, Chromium for browser tests, nginx and a Python virtualenv for server tests)"
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  rustup target list --installed | grep -q '^wasm32-unknown-unknown$' || rustup target add wasm32-unknown-unknown
  # The wasm-bindgen CLI must be the exact version of the wasm-bindgen crate in Cargo.lock.
  local wb
  wb=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
  if ! wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $wb"; then
    log "installing wasm-bindgen-cli $wb (several minutes, once)"
    cargo install wasm-bindgen-cli --version "$wb"
  fi
  if [ ! -x node_modules/.bin/wasm-opt ] || [ ! -d node_modules/playwright-core ]; then
    log "npm tools (binaryen, playwright-core)"
    npm install --no-audit --no-fund
  fi
  # The official OpenAI Python client, pinned, for the server tests.
  if ! target/venv/bin/python -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_PY')" 2>/dev/null; then
    log "virtualenv target/venv with openai $OPENAI_PY"
    rm -rf target/venv
    /usr/bin/python3 -m venv target/venv
    target/venv/bin/pip install -q "openai==$OPENAI_PY"
  fi
}

# The server as applications use it: the openai Python client, then two replicas behind nginx.
server_clients() {
  log "server: openai Python client, two replicas behind nginx"
  cargo build --release --bin wgspec
  target/venv/bin/python tests/e2e/server_clients.py --bin target/release/wgspec \
    --model "$(./target/release/wgspec fetch smollm2-135m)"
  log "server under load: concurrent clients, every reply its solo run's (batched n-gram greedy and sampled, and sampled EAGLE)"
  local load=(--bin target/release/wgspec --model smollm2-135m --max-tokens 8)
  target/venv/bin/python scripts/load_test.py "${load[@]}" --concurrency 1,8 --requests 8 --draft ngram \
    --out target/load-greedy.json
  target/venv/bin/python scripts/load_test.py "${load[@]}" --concurrency 1,8 --requests 8 --draft ngram \
    --temperature 0.8 --seed 7 --out target/load-sampled-batched.json
  target/venv/bin/python scripts/load_test.py "${load[@]}" --concurrency 1,3 --requests 3 \
    --draft eagle:smollm2-135m-eagle --temperature 0.8 --seed 7 --out target/load-sampled.json
}

# The npm package: the library for wasm32 (release), its JS bindings, wasm-opt, and the glue of
# www/lib (main-thread API, Web Worker, TypeScript declarations, README, package.json).
wasm() {
  log "wasm32 library (release)"
  cargo build --lib --release --target wasm32-unknown-unknown
  rm -rf pkg && mkdir -p pkg
  wasm-bindgen --target web --out-dir pkg --out-name wgspec_core \
    target/wasm32-unknown-unknown/release/wgspec.wasm
  node_modules/.bin/wasm-opt -O2 --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue \
    pkg/wgspec_core_bg.wasm -o pkg/wgspec_core_bg.wasm
  cp www/lib/* pkg/
  (cd pkg && npm pack --dry-run --json >/dev/null)
  log "pkg/: $(du -sh pkg | cut -f1) ($(du -h pkg/wgspec_core_bg.wasm | cut -f1) wasm)"
}

# Browser tests: wasm-bindgen-test in headless Chromium (page and dedicated worker), then the
# demo page end to end with playwright-core against the native server and CLI.
browser_tests() {
  log "wasm tests in headless Chromium (WebGPU on SwiftShader)"
  CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=1200 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test --target wasm32-unknown-unknown --test web_page --test web_worker
  log "demo page end to end (playwright-core, Chromium)"
  cargo build --release --bin wgspec
  WGSPEC_BIN=target/release/wgspec E2E_OUT=target/e2e node tests/e2e/demo.mjs
  # The bundlers of the consumer-app test, pinned by its lock file (installed for tests only).
  if ! cmp -s tests/bundlers/package-lock.json tests/bundlers/node_modules/.installed-lock.json; then
    log "bundlers for the npm package's test (Vite 8 and 7, webpack, Parcel, esbuild, Rollup, tsc)"
    (cd tests/bundlers && npm ci --no-audit --no-fund && cp package-lock.json node_modules/.installed-lock.json)
  fi
  log "the npm package in a consumer app: Vite, webpack, Parcel, esbuild, Rollup builds and tsc --strict"
  WGSPEC_BIN=target/release/wgspec node tests/bundlers/run.mjs
}

models() {
  log "models and tokenizer vectors into $WGSPEC_CACHE"
  for m in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b gemma-3-270m; do
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
  wasm)
    setup
    wasm
    ;;
  demo)
    DEMO_PROMPT=$'Rewrite this list as a Markdown table with the columns Name, Age and City.\n\nName: Alice Martin, Age: 34, City: Paris\nName: Bruno Costa, Age: 27, City: Lisbon\nName: Chen Wei, Age: 41, City: Shanghai\nName: Dana Novak, Age: 29, City: Prague\n'
    setup
    cargo build --release --bin wgspec
    for m in smollm2-135m ${DEMO_MODELS:-}; do ./target/release/wgspec fetch "$m" >/dev/null; done
    # (a prompt whose answer copies from it: where prompt-lookup drafts hold)
    log "native: SmolLM2-135M target-only, then with n-gram drafts (the same text; the speedup and tau)"
    ./target/release/wgspec generate --model smollm2-135m --draft ngram --compare --chat \
      --max-tokens "${MAX_TOKENS:-64}" --prompt "${PROMPT:-$DEMO_PROMPT}"
    wasm
    log "demo: open http://127.0.0.1:${PORT:-8080} in a browser with WebGPU (Ctrl-C stops)"
    ./target/release/wgspec web --port "${PORT:-8080}"
    ;;
  test)
    setup
    log "rustfmt"
    cargo fmt --all -- --check
    log "clippy (native)"
    cargo clippy --all-targets -- -D warnings
    log "clippy (wasm32: library and browser tests)"
    cargo clippy --target wasm32-unknown-unknown --lib --test web_page --test web_worker -- -D warnings
    models
    log "tests (lavapipe)"
    cargo test --no-fail-fast
    wasm
    browser_tests
    server_clients
    log "the first GPU run, dry: packed and run here on small shapes (scripts/gpu_bench.sh)"
    bash scripts/gpu_pack.sh
    bash scripts/gpu_bench.sh --dry-run target/gpu-dry-run
    ;;
  gpu-pack)
    setup
    bash scripts/gpu_pack.sh
    ;;
  gpu-dry-run)
    setup
    bash scripts/gpu_pack.sh
    bash scripts/gpu_bench.sh --dry-run target/gpu-dry-run
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
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
