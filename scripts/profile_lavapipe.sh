#!/usr/bin/env bash
# Where a shader's time goes on lavapipe, instruction by instruction. llvmpipe compiles each
# shader to x86 code in anonymous executable memory, with no symbols, so `perf report` alone
# shows only addresses. This samples a running wgspec command with `perf record`, copies the JIT
# code out of the live process (/proc/PID/mem), disassembles it with objdump and puts each
# instruction's sample count in front of it. Run from the repository root with a release binary:
#
#   scripts/profile_lavapipe.sh [OUT_DIR] -- wgspec generate --model qwen2.5-coder-1.5b \
#       --prompt "def fib(n):" --max-tokens 300
#
# The script starts the command itself. OUT_DIR (default target/profile) gets jit.asm (annotated
# disassembly), functions.txt (each stretch of JIT code between two `ret`s with over 2% of the
# samples: its address range, instructions and samples; about one compiled shader each, the
# largest in a decode step being the matmuls of the model's main formats) and hot.txt (the
# hottest 256-byte blocks of all samples, JIT code or not). Shares are of all samples. Knobs (environment):
# PROFILE_WAIT (seconds before sampling starts: loading and shader compilation; default 30),
# PROFILE_SECONDS (how long to sample; default 6). Needs perf, objdump and python3, and the
# right to read the child's memory (root, or ptrace_scope 0). Set WGSPEC_BIN to use another
# binary than target/release/wgspec.
set -eu
OUT=target/profile
if [ "${1:-}" != "--" ]; then OUT=${1:?usage: scripts/profile_lavapipe.sh [OUT_DIR] -- wgspec ARGS...}; shift; fi
[ "${1:-}" = "--" ] || { echo "usage: scripts/profile_lavapipe.sh [OUT_DIR] -- wgspec ARGS..." >&2; exit 2; }
shift
case "${1:-}" in wgspec|*/wgspec) shift ;; esac
for tool in perf objdump python3; do
  command -v "$tool" >/dev/null || { echo "profile_lavapipe: $tool is not installed" >&2; exit 2; }
done
BIN=${WGSPEC_BIN:-target/release/wgspec}
mkdir -p "$OUT"
rm -f "$OUT"/jit_*.bin
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/wgspec-xdg-$(id -u)}
mkdir -p "$XDG_RUNTIME_DIR"

"$BIN" "$@" > "$OUT/command.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
sleep "${PROFILE_WAIT:-30}"
kill -0 $PID 2>/dev/null || { echo "profile_lavapipe: the command ended before sampling began (see $OUT/command.log); raise its work or lower PROFILE_WAIT" >&2; exit 1; }
perf record -F 2000 -p $PID -o "$OUT/perf.data" -- sleep "${PROFILE_SECONDS:-6}" > "$OUT/perf.log" 2>&1 ||
  { echo "profile_lavapipe: perf record failed (see $OUT/perf.log)" >&2; exit 1; }
kill -0 $PID 2>/dev/null || { echo "profile_lavapipe: the command ended while sampling, so its JIT code is gone (see $OUT/command.log); give it more work" >&2; exit 1; }
perf script -i "$OUT/perf.data" -F ip 2>/dev/null | awk '{print $1}' > "$OUT/ips.txt"
# llvmpipe's code: the anonymous r-x mappings (the first, largest, holds the shaders)
grep -E " r-xp 00000000 00:00 0 *$" "/proc/$PID/maps" | awk '{print $1}' > "$OUT/jit_ranges.txt" || true
[ -s "$OUT/jit_ranges.txt" ] || { echo "profile_lavapipe: the process has no anonymous executable mappings (is the adapter llvmpipe?)" >&2; exit 1; }
python3 - "$PID" "$OUT" <<'PY'
import sys
pid, out = sys.argv[1], sys.argv[2]
with open(f"/proc/{pid}/mem", "rb") as mem, open(f"{out}/jit_ranges.txt") as ranges:
    for i, line in enumerate(ranges):
        start, end = (int(v, 16) for v in line.split("-"))
        mem.seek(start)
        open(f"{out}/jit_{start:x}.bin", "wb").write(mem.read(end - start))
PY
kill $PID 2>/dev/null || true
for bin in "$OUT"/jit_*.bin; do
  start=$(basename "$bin" .bin); start=0x${start#jit_}
  objdump -D -b binary -m i386:x86-64 --adjust-vma="$start" "$bin"
  echo "end of mapping"
done > "$OUT/jit.raw"
python3 - "$OUT" <<'PY'
import re, sys
from collections import Counter
out = sys.argv[1]
ips = Counter(int(l, 16) for l in open(f"{out}/ips.txt") if l.strip())
total = sum(ips.values()) or 1
rows = []  # (address, samples, instruction); instruction "ret" also ends each mapping
for line in open(f"{out}/jit.raw"):
    m = re.match(r"\s*([0-9a-f]+):\t[^\t]*\t(.*)", line)
    if m:
        rows.append((int(m.group(1), 16), ips.get(int(m.group(1), 16), 0), m.group(2).strip()))
    elif line.startswith("end of mapping") and rows:
        rows.append((rows[-1][0], 0, "ret (end of mapping)"))
with open(f"{out}/jit.asm", "w") as f:
    for a, n, ins in rows:
        if ins != "ret (end of mapping)":
            f.write(f"{n:6d} {a:x}: {ins}\n")
jit = sum(n for _, n, _ in rows)
with open(f"{out}/functions.txt", "w") as f:
    f.write(f"samples: {total}, in JIT code: {jit} ({100 * jit / total:.1f}%)\n")
    start = 0
    for i, (a, n, ins) in enumerate(rows):
        if ins.startswith("ret"):
            s = sum(r[1] for r in rows[start:i + 1])
            if s > 0.02 * total:
                count = sum(1 for r in rows[start:i + 1] if r[2] != "ret (end of mapping)")
                f.write(f"{rows[start][0]:x}-{a:x}: {count} instructions, {s} samples ({100 * s / total:.1f}%)\n")
            start = i + 1
blocks = Counter()
for ip, n in ips.items():
    blocks[ip // 256 * 256] += n
with open(f"{out}/hot.txt", "w") as f:
    for b, n in blocks.most_common(40):
        f.write(f"{b:x}: {n} ({100 * n / total:.1f}%)\n")
PY
cat "$OUT/functions.txt"
echo "annotated code: $OUT/jit.asm (samples, address, instruction); hottest blocks: $OUT/hot.txt"
