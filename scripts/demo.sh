#!/usr/bin/env bash
# scripts/demo.sh [BUILD_DIR] - kvc's main job, as far as it exists today:
# describe a model and a machine, verify and print the example plans
# (intent, strategy and dataflow levels) against them, and plan a restore
# jointly, printing every baseline beside the chosen plan. Running plans
# arrives with the runtime issues.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OPT="$BUILD/bin/kvc-opt"
MODEL=examples/models/llama-2-7b/config.json
TARGET=targets/cpu-2core.json

banner() { printf '\n== %s\n' "$*"; }

banner "Model $MODEL and target $TARGET as kvc attributes"
echo 'module {}' | "$OPT" --kvc-import-model="$MODEL" --kvc-attach-target="$TARGET"

for plan in examples/plans/*.mlir; do
  banner "$plan: verified against the model and target"
  # The model and target print as the #model and #target aliases above.
  "$OPT" "$plan" --kvc-import-model="$MODEL" --kvc-attach-target="$TARGET" |
    grep -v -e '^#model = ' -e '^#target = '
done

banner "Planning the chat restore jointly on an A100-40GB (kvc-restore-pipeline)"
printf '%s\n' \
  'kvc.restore @chat tokens 0 to 4096 from [' \
  '  #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 4096, layers = 0 to 32>,' \
  '  #kvc.source<tier = "dram", form = kv, codec = <quant = int8, lossless = deflate>,' \
  '              tokens = 0 to 4096, layers = 0 to 32>]' |
  "$OPT" --kvc-import-model="$MODEL" --kvc-attach-target=targets/a100-40gb.json \
    --kvc-restore-pipeline=report=true -o "${TMPDIR:-/tmp}/kvc-demo-plan.mlir"
echo "(scheduled tasks with predicted times: ${TMPDIR:-/tmp}/kvc-demo-plan.mlir," \
     "$(grep -c 'kvc.task' "${TMPDIR:-/tmp}/kvc-demo-plan.mlir") tasks)"

banner "A plan that cannot run is rejected with the offending range"
printf '%s\n' \
  'kvc.plan @broken tokens 0 to 4096 layers 0 to 32 {' \
  '  kvc.segment compute tokens 0 to 2048 layers 0 to 32' \
  '}' | "$OPT" --kvc-import-model="$MODEL" 2>&1 | head -n 1 || true
