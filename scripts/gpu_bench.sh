#!/usr/bin/env bash
# The first real-GPU run, as one command on a lent GPU machine (no network there, 15 minutes of
# device time in all, one command at most 10). Pack here first (scripts/gpu_pack.sh: the release
# binary and test binaries, stripped, and the Vulkan loader, in target/gpu-pack), then:
#
#   device run:  command "bash scripts/gpu_bench.sh", carry ["target/gpu-pack"], timeout_s 570
#   dry run on lavapipe, the same steps on small shapes:  ./build.sh gpu-dry-run
#
# First it checks that the binaries run there and the adapter is the GPU (else it stops at once).
# Then, in order, each step under its own time limit (so that one slow step costs only itself, and a
# lease cut short still has the first), 8¾ minutes at most in all:
#   1. correctness on the real adapter: every kernel against the CPU, batch invariance across
#      pipelines and row counts, tiny models against the reference, speculative == plain;
#   2. the roofline of qwen2-1.5b (Q4_K_M's mix) and the Qwen pair's shapes, target-only against
#      speculative (K = 4), the target as its own draft (tau = K + 1), SmolLM2's shape with its
#      EAGLE head (the real head beside random target weights: the head's costs per depth, not its
#      acceptance), continuous batching of qwen2-1.5b's shape at 1, 4, 8 and 16 requests at once
#      (bench --concurrency: the batch's throughput on a GPU, issue 36), plain and sampled with
#      the target as its own draft model (what the batch drafts where drafts are cheap), the
#      batch's costs on SmolLM2's shape with its EAGLE head (every level prints the costs its
#      plans took, `costs: --batch-costs ...`: given to `bench --batch-costs` on the real
#      SmolLM2 and head elsewhere, they replay this GPU's plans with real acceptance),
#      llama-8b's roofline, the
#      qwen2-7b / qwen2-0.5b pair, sampled decoding;
#   3. the peer in the same run: Hugging Face transformers on the machine's PyTorch, random
#      weights of the same configs (scripts/hf_peer.py).
# What comes back ($OUT, or OUT_DIR given; at most 8 files): summary.txt (the table to read
# first), log.txt (everything), results.tar.gz (every JSON). Record the figures in BENCHMARKS.md
# with the adapter line and the date.
set -u
DRY=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY=1
    shift
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-${1:-target/gpu-bench}}
mkdir -p "$OUT"
RESULTS=$(mktemp -d /tmp/wgspec-results.XXXXXX)
LOG="$OUT/log.txt"
SUMMARY="$OUT/summary.txt"
: >"$LOG"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY" "$LOG"; }
T0=$SECONDS

PACK=target/gpu-pack/wgspec-gpu.tar.gz
[ -f "$PACK" ] || { say "no $PACK: run scripts/gpu_pack.sh first"; exit 1; }
WORK=$(mktemp -d /tmp/wgspec-gpu.XXXXXX)
tar -xzf "$PACK" -C "$WORK"
BIN="$WORK/bin/wgspec"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/wgspec-xdg-$(id -u)}
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
# The Vulkan loader, where the machine has none (the NVIDIA driver brings its ICD): unpacked
# beside the binaries, not over the system.
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
    for f in "$WORK"/debs/*.deb; do dpkg-deb -x "$f" "$WORK/root" 2>/dev/null || dpkg -x "$f" "$WORK/root"; done
    export LD_LIBRARY_PATH="$WORK/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
say "wgspec GPU run of $(cat "$WORK/commit"), $(date -u +%Y-%m-%dT%H:%MZ)$([ $DRY = 1 ] && echo ', dry run')"
{ command -v nvidia-smi >/dev/null && nvidia-smi -L; } >>"$SUMMARY" 2>&1
# The binaries run here (the C library they were built against), and find a GPU: else the
# lease is given back at once, not spent on llvmpipe.
if ! "$BIN" --version >>"$LOG" 2>&1; then
    say "FAILED: $BIN does not run here ($(ldd --version 2>&1 | head -1)); see log.txt"
    exit 1
fi
probe() {
    "$BIN" bench --roofline --shape-only --synthetic smollm2-135m --out "$RESULTS/probe.json" 2>&1 \
        | grep -m1 '^adapter:' || echo "adapter: none"
}
ADAPTER=$(probe)
if [ $DRY = 0 ] && echo "$ADAPTER" | grep -qiE 'llvmpipe|lavapipe|swiftshader|adapter: none'; then
    # the NVIDIA ICD where the driver's library is there but no manifest names it
    lib=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libGLX_nvidia.so.0' | head -1)
    for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
        [ -f "$f" ] && { export VK_DRIVER_FILES=$f; break; }
    done
    if [ -z "${VK_DRIVER_FILES:-}" ] && [ -n "$lib" ]; then
        printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' "$lib" >"$WORK/nvidia_icd.json"
        export VK_DRIVER_FILES="$WORK/nvidia_icd.json"
    fi
    ADAPTER=$(probe)
fi
say "$ADAPTER"
if [ $DRY = 0 ] && echo "$ADAPTER" | grep -qiE 'llvmpipe|lavapipe|swiftshader|adapter: none'; then
    say "FAILED: no GPU adapter (VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset}); see log.txt"
    exit 1
fi

# step SECONDS NAME COMMAND...: its output to the log, its exit and time to the summary
step() {
    local limit=$1 name=$2
    shift 2
    echo "== $name: $*" >>"$LOG"
    local t=$SECONDS
    timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "$(printf '%-34s exit %-3s %4s s' "$name" "$rc" $((SECONDS - t)))"
    return $rc
}
bench() { # bench SECONDS NAME ARGS...: a `wgspec bench`, its JSON into the results
    local limit=$1 name=$2
    shift 2
    step "$limit" "$name" "$BIN" bench "$@" --out "$RESULTS/$name.json"
}

# 1. Correctness first, the three test binaries at once (one GPU, many cores).
if [ $DRY = 1 ]; then
    filters=(kernels:argmax model:argmax_on_the_gpu spec:greedy_speculative_output_equals_greedy_output)
else
    filters=(kernels: model: spec:)
fi
pids=()
for f in "${filters[@]}"; do
    t=${f%%:*}
    filter=${f#*:}
    step 100 "test $t${filter:+ ($filter)}" "$WORK/bin/test-$t" --test-threads 8 $filter &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
grep -E '^test result|FAILED|panicked' "$LOG" | sort | uniq -c >>"$SUMMARY"

# 2. wgspec's figures, most telling first.
if [ $DRY = 1 ]; then
    T=smollm2-135m
    D=smollm2-135m
    BIG=smollm2-135m
    few=(--limit 1 --max-tokens 12)
    reps=(--reps 2)
    load=(--concurrency 1,2 --requests 2 --max-tokens 4)
    load_eagle=(--concurrency 1,2 --requests 2 --max-tokens 4)
else
    T=qwen2-1.5b
    D=qwen2-0.5b
    BIG=llama-8b
    few=(--limit 3 --max-tokens 64)
    reps=()
    load=(--concurrency 1,4,8,16 --requests 16 --max-tokens 32)
    load_eagle=(--concurrency 1,4,8 --requests 8 --max-tokens 32)
fi
bench 55 "roofline-$T" --roofline --synthetic "$T" --past 512 "${reps[@]}"
bench 45 "pair-$T-$D-k4" --synthetic "$T" --draft "$D" --draft-k 4 "${few[@]}"
bench 30 "self-$T-k4" --synthetic "$T" --draft self --draft-k 4 "${few[@]}"
bench 30 "eagle-smollm2-135m-k4" --synthetic smollm2-135m --draft eagle:smollm2-135m-eagle --draft-k 4 "${few[@]}"
bench 35 "batch-$T" --synthetic "$T" "${load[@]}"
# (sampled with llama.cpp's default top-k of 40, the target as its own draft model: every draft
# kept, what the batch's cost model drafts where draft passes are cheap)
bench 25 "batch-$T-self-sampled" --synthetic "$T" --draft self "${load[@]}" --temperature 1 --top-k 40 --seed 1
# (a fixed K of 3: the head follows and steps every pass, so all six costs are measured)
bench 25 "batch-eagle-smollm2-135m" --synthetic smollm2-135m --draft eagle:smollm2-135m-eagle --draft-k 3 "${load_eagle[@]}"

# 3. The peer: transformers on the same GPU (where there is PyTorch).
if python3 -c 'import torch, transformers' 2>/dev/null; then
    peer=(--out "$RESULTS/hf-peer.json")
    [ $DRY = 1 ] && peer+=(--shapes smollm2-135m --tokens 8 --device cpu)
    step 60 "hf-peer" python3 scripts/hf_peer.py "${peer[@]}"
else
    say "hf-peer: no torch and transformers here (skipped)"
    python3 -m py_compile scripts/hf_peer.py && say "hf-peer: scripts/hf_peer.py compiles"
fi

bench 50 "roofline-$BIG" --roofline --synthetic "$BIG" --past 512 "${reps[@]}"
if [ $DRY = 0 ]; then
    bench 45 "pair-qwen2-7b-$D-k4" --synthetic qwen2-7b --draft "$D" --draft-k 4 "${few[@]}"
fi
bench 25 "pair-$T-$D-k4-sampled" --synthetic "$T" --draft "$D" --draft-k 4 "${few[@]}" --temperature 1 --seed 1

# The figures to read first (the summary's end), then the files.
{
    echo
    grep -E '^adapter:' "$LOG" | sort -u
    grep -E '^== (roofline|pair|self|eagle|batch)|^all:|^N=|costs: --batch-costs|^verify_cost\(|-row pass:|^ceilings|^hf ' "$LOG"
} | tee -a "$SUMMARY"
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" .
say "done in $((SECONDS - T0)) s: $OUT/summary.txt, log.txt, results.tar.gz"
# (a step that failed or ran out of time fails the run, after every other step has run)
if grep -qE ' exit +[1-9]' "$SUMMARY"; then
    say "FAILED: $(grep -cE ' exit +[1-9]' "$SUMMARY") step(s); see log.txt"
    exit 1
fi
