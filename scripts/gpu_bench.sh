#!/usr/bin/env bash
# The real-GPU figures, in one run that fits a short lease of a GPU machine (at most 13 minutes):
# the adapter's ceilings and every kernel of a decode step against them (`bench --roofline`),
# then target-only against speculative decoding, on random weights of real shapes (no model
# files needed), and kernel shapes compared (matmul lanes; split or one-pass attention). Run from
# the repository root with a release binary built beforehand:
#
#   cargo build --release && scripts/gpu_bench.sh [OUT_DIR]
#
# (on a lent machine: carry `target/release/wgspec`, and give OUT_DIR = $OUT). Each step has its
# own time limit, so one slow step does not cost the others; the JSON files and the log go to
# OUT_DIR (default target/gpu-bench). Record the figures in BENCHMARKS.md with the adapter line
# and the date.
set -u
BIN=${WGSPEC_BIN:-target/release/wgspec}
OUT=${1:-target/gpu-bench}
mkdir -p "$OUT"
LOG="$OUT/gpu-bench.log"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/wgspec-xdg-$(id -u)}
mkdir -p "$XDG_RUNTIME_DIR"

step() { # step SECONDS NAME ARGS...: one bench, its JSON in OUT/NAME.json
    local limit=$1 name=$2
    shift 2
    echo "== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$limit" "$BIN" bench "$@" --out "$OUT/$name.json" >>"$LOG" 2>&1
    echo "== $name: exit $? in $((SECONDS - t0)) s" | tee -a "$LOG"
}

[ -x "$BIN" ] || { echo "no $BIN: build it first (cargo build --release)" >&2; exit 1; }
{ date -u; command -v nvidia-smi >/dev/null && nvidia-smi -L; } >>"$LOG" 2>&1
# most telling first, so that a lease cut short still has them:
# ceilings and kernels: Qwen2.5-1.5B's shapes, a 1-row step and a 5-row verify pass (the adapter's
# default kernel shapes: 16 matmul lanes, attention split over the cache)
step 120 roofline-qwen2-1.5b --roofline --synthetic qwen2-1.5b --past 512
# the Qwen pair's shapes: target-only and speculative alternating, K = 4
step 150 pair-qwen2-1.5b-k4 --synthetic qwen2-1.5b --draft qwen2-0.5b --draft-k 4 --limit 4 --max-tokens 64
# sampled decoding drawn on the GPU (temperature 1: target-only steps and draft-model cycles
# each read back a few words)
step 100 pair-qwen2-1.5b-k4-sampled --synthetic qwen2-1.5b --draft qwen2-0.5b --draft-k 4 --limit 3 --max-tokens 64 --temperature 1 --seed 1
# kernel shapes against each other: 64 matmul lanes (4x the workgroups of a skinny matmul); the
# one-pass attention against the split one over a long cache
step 90 roofline-qwen2-1.5b-lanes64 --roofline --synthetic qwen2-1.5b --past 512 --matmul-lanes 64
step 90 roofline-qwen2-1.5b-past4000 --roofline --synthetic qwen2-1.5b --past 4000 --context 4608
step 90 roofline-qwen2-1.5b-past4000-one-pass --roofline --synthetic qwen2-1.5b --past 4000 --context 4608 --attention one-pass
step 60 roofline-llama-1b --roofline --synthetic llama-1b --past 512
step 80 pair-qwen2-1.5b-adaptive --synthetic qwen2-1.5b --draft qwen2-0.5b --limit 4 --max-tokens 64
grep -E "tok/s|verify_cost|roofline|ceiling|all:" "$LOG" | tail -40
