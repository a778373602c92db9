#!/usr/bin/env bash
# bench/restore-memory.sh [BUILD_DIR] - peak resident memory of restores at
# 4K and 32K tokens (issue 5's memory bound): for each context length, save
# KV and hidden states of a small generated model to a file store, then
# restore with the kv, hidden and cake plans planned in-process for
# targets/cpu-2core.json under a staging budget of STAGING_MIB (default 4),
# and print what kvc-run restore reports: the staging buffers, resident
# memory before the restore (model, request, the empty paged cache) and the
# peak during it. The growth during the restore must not depend on the
# context length. Results: docs/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
RUN="$BUILD/bin/kvc-run"
STAGING_MIB=${STAGING_MIB:-4}
WORK="${TMPDIR:-/tmp}/kvc-restore-memory"
rm -rf "$WORK" && mkdir -p "$WORK"
"$RUN" gen-model --out "$WORK/model" --layers 2 --hidden 128 --heads 4 \
  --kv-heads 2 --ffn 256 --vocab 1024 --max-positions 32768 --seed 1 > /dev/null
for TOKENS in 4096 32768; do
  REQUEST=(--model "$WORK/model" --random-tokens $TOKENS --seed 7
           --store "file://$WORK/store-$TOKENS")
  "$RUN" save "${REQUEST[@]}" --layer-group 1 --forms kv,hidden > /dev/null
  for STRATEGY in kv hidden cake; do
    printf '%6d tokens, %-7s' $TOKENS $STRATEGY
    "$RUN" restore "${REQUEST[@]}" --strategy $STRATEGY \
      --target targets/cpu-2core.json --staging-mib "$STAGING_MIB" |
      sed -n -e 's/^  memory   /  /p' -e 's/^  staging  \(.*\)/  staging \1/p' |
      tr -d '\n'
    echo
  done
done
