#!/usr/bin/env bash
# bench/host-path.sh [BUILD_DIR] - a restore's host path against the host's
# own reads of the same bytes (docs/results.md, "One copy on the host"): the
# 8-layer model of the CPU grid (hidden 1024, 8 KV heads of 128), TOKENS
# (default "2048 8192") random tokens' KV saved raw to a file:// store, an
# object a layer and chunk. Warm (the files in the page cache), the fastest
# of REPEAT (default 5) runs each:
#   kvc-run compare --strategy kv   the KV load planned in-process for the
#                                   target and restored into the CPU
#                                   backend's paged cache: read, check,
#                                   scatter
#   cat                             the same files read by one process (GNU
#                                   cat's 128 KiB read()s into one buffer:
#                                   one copy out of the page cache)
#   dd                              the same bytes as one file, 1 MiB blocks
# From memory (the store copied into a `mem://?from=` tier at open):
#   kvc-run compare --strategy kv   as above, from the memory tier
#   memcpy                          the same bytes copied from one buffer
#                                   to another on one thread (glibc's
#                                   memmove through ctypes)
# Cold (the files dropped from the page cache before each run with
# posix_fadvise DONTNEED, no root needed):
#   kvc-run restore --strategy kv   as above, a process a run
#   dd iflag=direct                 each file past the page cache: the disk
# Prints the rates, kvc-run's share of each, and its host traffic (bytes
# moved on the host per byte loaded into the cache).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
RUN="$BUILD/bin/kvc-run"
REPEAT=${REPEAT:-5}
TOKENS_LIST=${TOKENS:-"2048 8192"}
WORK="${TMPDIR:-/tmp}/kvc-host-path"
rm -rf "$WORK" && mkdir -p "$WORK"
"$RUN" gen-model --out "$WORK/model" --layers 8 --hidden 1024 --heads 8 \
  --kv-heads 8 --ffn 1024 --vocab 1024 --max-positions 8192 --seed 1 \
  > /dev/null

fastest() { # the fastest of REPEAT runs of "$@", in ns
  local best="" start ns
  for _ in $(seq "$REPEAT"); do
    start=$(date +%s%N)
    "$@"
    ns=$(( $(date +%s%N) - start ))
    if [ -z "$best" ] || [ "$ns" -lt "$best" ]; then best=$ns; fi
  done
  echo "$best"
}
readall() { cat "${FILES[@]}" > /dev/null; }
direct() {
  local f
  for f in "${FILES[@]}"; do
    dd if="$f" of=/dev/null bs=1M iflag=direct status=none
  done
}
drop() { # the store's files out of the page cache (written back first:
  # the kernel drops no dirty page, and a save's pages are dirty for a while)
  python3 -c 'import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "${FILES[@]}"
}

WARM=() COLD=() MEMORY=()
for TOKENS in $TOKENS_LIST; do
  STORE="$WORK/store-$TOKENS"
  REQUEST=(--model "$WORK/model" --random-tokens "$TOKENS" --seed 7
           --store "file://$STORE")
  "$RUN" save "${REQUEST[@]}" --layer-group 1 --forms kv > /dev/null
  mapfile -t FILES < <(find "$STORE" -type f -path '*/kv/*' | sort)
  BYTES=$(cat "${FILES[@]}" | wc -c) # And the page cache holds them.
  "$RUN" compare "${REQUEST[@]}" --strategy kv \
    --target targets/cpu-2core.json --repeat "$REPEAT" \
    --json "$WORK/compare-$TOKENS.json" > "$WORK/compare-$TOKENS.txt"
  cat "${FILES[@]}" > "$WORK/all-$TOKENS"
  CAT=$(fastest readall)
  DD=$(fastest dd if="$WORK/all-$TOKENS" of=/dev/null bs=1M status=none)
  rm -f "$WORK/all-$TOKENS"
  WARM+=("$TOKENS $BYTES $WORK/compare-$TOKENS.json $CAT $DD")

  "$RUN" compare --model "$WORK/model" --random-tokens "$TOKENS" --seed 7 \
    --store "mem://?capacity_mb=4096&from=$STORE" --strategy kv \
    --target targets/cpu-2core.json --repeat "$REPEAT" \
    --json "$WORK/compare-mem-$TOKENS.json" > "$WORK/compare-mem-$TOKENS.txt"
  MEMCPY=$(python3 - "$REPEAT" "${FILES[@]}" <<'PY'
import ctypes
import sys
import time

repeat, paths = int(sys.argv[1]), sys.argv[2:]
source = b"".join(open(path, "rb").read() for path in paths)
size = len(source)
target = (ctypes.c_char * size)()
ctypes.memmove(target, source, size)  # Its pages touched, as a cache's are.
best = None
for _ in range(repeat):
    start = time.perf_counter_ns()
    ctypes.memmove(target, source, size)
    ns = time.perf_counter_ns() - start
    best = ns if best is None else min(best, ns)
print(best)
PY
)
  MEMORY+=("$TOKENS $BYTES $WORK/compare-mem-$TOKENS.json $MEMCPY")

  KVC_MS=()
  for _ in $(seq "$REPEAT"); do
    drop
    KVC_MS+=("$("$RUN" restore "${REQUEST[@]}" --strategy kv \
      --target targets/cpu-2core.json |
      sed -n 's/^restored .*: \([0-9.]*\) ms measured.*/\1/p')")
  done
  drop
  DIRECT=$(fastest direct)
  COLD+=("$TOKENS $BYTES $DIRECT ${KVC_MS[*]}")
done

python3 - "${WARM[@]}" -- "${COLD[@]}" -- "${MEMORY[@]}" <<'EOF'
import json
import sys

args = sys.argv[1:]
bar = args.index("--")
bar2 = args.index("--", bar + 1)


def kv_load(path):
    """The KV plan's fastest time in ms and host traffic line of a compare."""
    kv = next(r for r in json.load(open(path))["plans"] if r["plan"] == "kv")
    traffic = kv["host_traffic"]
    return kv["fastest_ms"], (
        f"{traffic['host_bytes_per_byte']:.2f} host bytes a byte (read "
        f"{traffic['read_bytes'] / 1e6:.1f} MB, copied "
        f"{traffic['copied_bytes'] / 1e6:.1f} MB, decoded "
        f"{traffic['decoded_bytes'] / 1e6:.1f} MB)")


print(f"warm, the fastest of each; GB/s")
print(f"{'tokens':>7} {'MB':>7} {'kvc ms':>8} {'kvc':>6} {'cat':>6} "
      f"{'dd':>6} {'kvc/cat':>7} {'kvc/dd':>6}  host traffic")
for row in args[:bar]:
    tokens, size, path, cat_ns, dd_ns = row.split()
    size = int(size)
    ms, traffic = kv_load(path)
    kvc, cat, dd = size / ms / 1e6, size / int(cat_ns), size / int(dd_ns)
    print(f"{tokens:>7} {size / 1e6:7.1f} {ms:8.2f} {kvc:6.2f} {cat:6.2f} "
          f"{dd:6.2f} {kvc / cat:7.2f} {kvc / dd:6.2f}  {traffic}")
print("from a mem:// tier, against memcpy of the same bytes; the fastest of "
      "each; GB/s")
print(f"{'tokens':>7} {'MB':>7} {'kvc ms':>8} {'kvc':>6} {'memcpy':>6} "
      f"{'kvc/memcpy':>10}  host traffic")
for row in args[bar2 + 1:]:
    tokens, size, path, memcpy_ns = row.split()
    size = int(size)
    ms, traffic = kv_load(path)
    kvc, memcpy = size / ms / 1e6, size / int(memcpy_ns)
    print(f"{tokens:>7} {size / 1e6:7.1f} {ms:8.2f} {kvc:6.2f} {memcpy:6.2f} "
          f"{kvc / memcpy:10.2f}  {traffic}")
print("cold, the page cache dropped before each run; the fastest of each; GB/s")
print(f"{'tokens':>7} {'MB':>7} {'kvc ms':>8} {'kvc':>6} {'direct':>6} "
      f"{'kvc/direct':>10}")
for row in args[bar + 1:bar2]:
    tokens, size, direct_ns, *kvc_ms = row.split()
    size, ms = int(size), min(float(x) for x in kvc_ms)
    kvc, direct = size / ms / 1e6, size / int(direct_ns)
    print(f"{tokens:>7} {size / 1e6:7.1f} {ms:8.2f} {kvc:6.2f} {direct:6.2f} "
          f"{kvc / direct:10.2f}")
EOF
