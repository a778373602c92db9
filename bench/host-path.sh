#!/usr/bin/env bash
# bench/host-path.sh [BUILD_DIR] - a restore's host path against the host's
# own reads of the same bytes (docs/results.md, "One copy"): the 8-layer
# model of the CPU grid (hidden 1024, 8 KV heads of 128), TOKENS (default
# 2048 and 8192) random tokens' KV saved raw to a file:// store, an object a
# layer and chunk; then, page cache warm, each REPEAT (default 5) times:
#   kvc-run compare --strategy kv   the KV load planned in-process for the
#                                   target, restored into the CPU backend's
#                                   paged cache (read, check, scatter),
#                                   fastest run
#   dd                              the same files read with 1 MiB blocks
#                                   into one buffer (one copy out of the
#                                   page cache), fastest run
# and prints both rates and their ratio, with kvc-run's host traffic (bytes
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
printf '%7s %10s %12s %12s %12s %8s %s\n' tokens MB "kvc-run ms" "kvc GB/s" \
  "dd GB/s" "kvc/dd" "host traffic"
for TOKENS in $TOKENS_LIST; do
  STORE="$WORK/store-$TOKENS"
  REQUEST=(--model "$WORK/model" --random-tokens "$TOKENS" --seed 7
           --store "file://$STORE")
  "$RUN" save "${REQUEST[@]}" --layer-group 1 --forms kv > /dev/null
  mapfile -t FILES < <(find "$STORE" -type f -path '*/kv/*' | sort)
  BYTES=$(cat "${FILES[@]}" | wc -c) # Also warms the page cache.
  "$RUN" compare "${REQUEST[@]}" --strategy kv \
    --target targets/cpu-2core.json --repeat "$REPEAT" \
    --json "$WORK/compare-$TOKENS.json" > "$WORK/compare-$TOKENS.txt"
  best=""
  for _ in $(seq "$REPEAT"); do
    start=$(date +%s%N)
    for f in "${FILES[@]}"; do dd if="$f" of=/dev/null bs=1M status=none; done
    ns=$(( $(date +%s%N) - start ))
    if [ -z "$best" ] || [ "$ns" -lt "$best" ]; then best=$ns; fi
  done
  python3 - "$WORK/compare-$TOKENS.json" "$BYTES" "$best" "$TOKENS" <<'EOF'
import json, sys
rows, size, dd_ns, tokens = (json.load(open(sys.argv[1])), int(sys.argv[2]),
                             int(sys.argv[3]), sys.argv[4])
rows = rows["plans"] if isinstance(rows, dict) else rows
kv = next(r for r in rows if r["plan"] == "kv")
ms, traffic = kv["fastest_ms"], kv["host_traffic"]
kvc, dd = size / (ms * 1e-3) / 1e9, size / (dd_ns * 1e-9) / 1e9
print(f"{tokens:>7} {size / 1e6:10.1f} {ms:12.2f} {kvc:12.2f} {dd:12.2f} "
      f"{kvc / dd:8.2f} {traffic['host_bytes_per_byte']:.2f} host bytes a "
      f"byte (read {traffic['read_bytes'] / 1e6:.1f} MB, copied "
      f"{traffic['copied_bytes'] / 1e6:.1f} MB, decoded "
      f"{traffic['decoded_bytes'] / 1e6:.1f} MB)")
EOF
done
