#!/usr/bin/env bash
# scripts/demo.sh [BUILD_DIR] - kvc's main job, as far as it exists today:
# describe a model and a machine, verify and print the example plans
# (intent, strategy and dataflow levels) against them, plan a restore
# jointly, printing every baseline beside the chosen plan, and then run
# compiled plans for a small generated model: save a context's KV and hidden
# states to a local store, compile recompute, Cake and HCache plans for it,
# restore each into a paged cache and verify it against a full prefill.
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

RUN="$BUILD/bin/kvc-run"
WORK="${TMPDIR:-/tmp}/kvc-demo"
TOKENS=2048
rm -rf "$WORK" && mkdir -p "$WORK"

banner "Generating a small model and saving a $TOKENS-token context (KV and hidden states)"
"$RUN" gen-model --out "$WORK/model" --layers 4 --hidden 256 --heads 8 \
  --kv-heads 2 --ffn 512 --vocab 1024 --seed 1
"$RUN" save --model "$WORK/model" --store "file://$WORK/store" \
  --random-tokens $TOKENS --seed 7 --forms kv,hidden

banner "Calibrating this machine (kvc-run calibrate) from $TARGET"
"$RUN" calibrate --model "$WORK/model" --base "$TARGET" --out "$WORK/target.json" \
  --scratch "$WORK"

banner "Compiling recompute, Cake and HCache plans for it (kvc-emit-bundle)"
cat > "$WORK/plans.mlir" <<PLANS
#kv = #kvc.source<tier = "dram", form = kv, tokens = 0 to $TOKENS, layers = 0 to 4>
#hid = #kvc.source<tier = "dram", form = hidden, tokens = 0 to $TOKENS, layers = 0 to 4>
kvc.plan @compute tokens 0 to $TOKENS layers 0 to 4 {
  kvc.segment compute tokens 0 to $TOKENS layers 0 to 4
}
kvc.plan @cake tokens 0 to $TOKENS layers 0 to 4 {
  kvc.segment compute tokens 0 to 512 layers 0 to 4
  kvc.segment load_kv tokens 512 to $TOKENS layers 0 to 4 from #kv
}
kvc.plan @hcache tokens 0 to $TOKENS layers 0 to 4 {
  kvc.segment load_hidden tokens 0 to $TOKENS layers 0 to 3 from #hid
  kvc.segment load_kv tokens 0 to $TOKENS layers 3 to 4 from #kv
}
PLANS
"$OPT" "$WORK/plans.mlir" --kvc-import-model="$WORK/model/config.json" \
  --kvc-attach-target="$WORK/target.json" --kvc-expand=chunk-tokens=256 --kvc-fuse \
  --kvc-schedule --kvc-estimate --kvc-emit-bundle=file="$WORK/plans.json" \
  -o /dev/null
"$RUN" inspect-bundle --bundle "$WORK/plans.json"

banner "Restoring with every plan, verifying each against a full prefill (kvc-run compare)"
"$RUN" compare --model "$WORK/model" --store "file://$WORK/store" \
  --random-tokens $TOKENS --seed 7 --bundle "$WORK/plans.json"

banner "One restore in detail: the Cake plan, with a Chrome trace"
"$RUN" restore --model "$WORK/model" --store "file://$WORK/store" \
  --random-tokens $TOKENS --seed 7 --bundle "$WORK/plans.json" \
  --plan cake --verify --trace "$WORK/cake-trace.json"
echo "(Chrome trace: $WORK/cake-trace.json. Predictions come from the" \
     "calibrated target; how close they come is in docs/results.md.)"
