#!/usr/bin/env bash
# Packs what `scripts/gpu_bench.sh` runs on a lent GPU machine, which has no network and takes at
# most 64 MiB of working tree: the release `wgspec` and the kernel, model and speculation test
# binaries, stripped, and Debian's Vulkan loader (`libvulkan1`: the NVIDIA driver there brings
# its ICD, not always the loader), in one tarball, target/gpu-pack/wgspec-gpu.tar.gz. Run here,
# from anywhere; then carry `target/gpu-pack` in the device call (README: "The first GPU run").
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=target/gpu-pack
STAGE=$PACK/stage
# The test binaries that need no model file and no path of this checkout: every kernel against
# the CPU, batch invariance in every pipeline, tiny models against the reference, spec == plain.
TESTS=(kernels model spec)
rm -rf "$PACK" && mkdir -p "$STAGE/bin" "$STAGE/debs"

cargo build --release --bin wgspec
cp target/release/wgspec "$STAGE/bin/"
args=()
for t in "${TESTS[@]}"; do args+=(--test "$t"); done
cargo test --release --no-run "${args[@]}" --message-format=json >"$PACK/build.json"
python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' "$PACK/build.json" | while read -r name exe; do cp "$exe" "$STAGE/bin/test-$name"; done
rm "$PACK/build.json"
for t in "${TESTS[@]}"; do
    [ -x "$STAGE/bin/test-$t" ] || { echo "gpu_pack: no test binary for $t" >&2; exit 1; }
done
strip --strip-all "$STAGE"/bin/*

(cd "$STAGE/debs" && { apt-get download libvulkan1 2>/dev/null || { apt-get update -qq && apt-get download libvulkan1; }; })
git describe --always --dirty >"$STAGE/commit" 2>/dev/null || echo unknown >"$STAGE/commit"

# (gzip: every machine unpacks it; xz is not everywhere)
tar -czf "$PACK/wgspec-gpu.tar.gz" -C "$STAGE" .
rm -rf "$STAGE"
bytes=$(stat -c %s "$PACK/wgspec-gpu.tar.gz")
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
echo "gpu_pack: $PACK/wgspec-gpu.tar.gz $((bytes >> 20)) MiB; with the tracked tree $(((bytes + tree) >> 20)) MiB (the device takes 64)"
[ $((bytes + tree)) -lt $((60 << 20)) ] || { echo "gpu_pack: over 60 MiB with the tree" >&2; exit 1; }
