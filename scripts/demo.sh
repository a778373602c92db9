#!/usr/bin/env bash
# scripts/demo.sh [BUILD_DIR] - kvc's main job, as far as it exists today:
# describe a model and a machine, verify and print the example plans
# (intent, strategy and dataflow levels) against them, plan a restore
# jointly, printing every baseline beside the chosen plan, and then run
# compiled plans for a small generated model: save a context's KV and hidden
# states to a local store, compile recompute, Cake and HCache plans for it,
# restore each into a paged cache and verify it against a full prefill, and
# compare every strategy, planned in-process, at emulated link bandwidths
# around this machine's balance point, and restores from stores saved with
# int8+zstd and int4+deflate against their predictions; finally a trained
# model (stories260K, when KVC_MODELS_DIR or ../shared/models has it):
# restore a prompt with the joint plan and decode after it, beside a full
# prefill, and let a budget in next-token KL decide whether int4 KV loads.
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
# One object per layer and chunk, so a plan reads exactly the layers it loads
# (the store records the layout; its readers read it there).
STORE=(--store "file://$WORK/store")
REQUEST=(--model "$WORK/model" --random-tokens $TOKENS --seed 7)
"$RUN" save "${REQUEST[@]}" "${STORE[@]}" --layer-group 1 --forms kv,hidden

banner "Calibrating this machine (kvc-run calibrate) from $TARGET"
"$RUN" calibrate --model "$WORK/model" --base "$TARGET" --out "$WORK/target.json" \
  --scratch "$WORK"

banner "Compiling recompute, Cake and HCache plans with kvc-opt (kvc-emit-bundle)"
cat > "$WORK/plans.mlir" <<PLANS
#kv = #kvc.source<tier = "disk", form = kv, tokens = 0 to $TOKENS, layers = 0 to 4>
#hid = #kvc.source<tier = "disk", form = hidden, tokens = 0 to $TOKENS, layers = 0 to 4>
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
"$RUN" inspect-bundle --bundle "$WORK/plans.json" | tee "$WORK/plans.txt"

banner "One restore in detail: the compiled Cake plan, with a Chrome trace"
"$RUN" restore "${REQUEST[@]}" "${STORE[@]}" --bundle "$WORK/plans.json" \
  --plan cake --verify --trace "$WORK/cake-trace.json"
echo "(Chrome trace: $WORK/cake-trace.json; open it in chrome://tracing or Perfetto.)"

banner "Cake's dynamic mode: the same plan, its merge point found at run time"
# Compiled for the calibrated disk, the plan computes tokens 0-512 and loads
# the rest; run as Cake's two-sided walk (from both ends, that split the
# prediction it reports beside), the sides meet where this run's link and
# compute put them: earlier on the local store, later on a link throttled to
# 0.01 Gbps.
for LINK in "" "?gbps=0.01"; do
  "$RUN" restore "${REQUEST[@]}" --store "file://$WORK/store$LINK" \
    --bundle "$WORK/plans.json" --plan cake --dynamic --verify
done

# The balance point: the link bandwidth at which loading all of the KV takes
# as long as recomputing it (the compute plan's predicted time).
COMPUTE_US=$(sed -n 's/^plan compute: .*predicted \([0-9]*\) us$/\1/p' "$WORK/plans.txt")
KV_BYTES=$((TOKENS * 4 * 2 * 2 * 32 * 2)) # tokens x layers x K,V x kv heads x head dim x bf16
BALANCE=$(awk -v b="$KV_BYTES" -v us="$COMPUTE_US" 'BEGIN { printf "%.4f", b * 8 / (us * 1e3) }')
for SCALE in 0.5 1 2; do
  GBPS=$(awk -v b="$BALANCE" -v s="$SCALE" 'BEGIN { printf "%.4f", b * s }')
  banner "Every strategy, planned in-process, at $GBPS Gbps (${SCALE}x this machine's balance point of $BALANCE Gbps)"
  # This shared machine's speed drifts over minutes: each comparison is
  # planned for a calibration taken just before it (its fit shown).
  "$RUN" calibrate --model "$WORK/model" --base "$TARGET" \
    --out "$WORK/target-$SCALE.json" --scratch "$WORK" > "$WORK/calibrate-$SCALE.txt"
  sed -n 's/^fit: /calibrated: /p' "$WORK/calibrate-$SCALE.txt"
  "$RUN" compare "${REQUEST[@]}" --store "file://$WORK/store?gbps=$GBPS" \
    --strategy --target "$WORK/target-$SCALE.json" --repeat 5
done

banner "Compressed stores: loading KV saved with int8+zstd and with int4+deflate"
# The calibrated target prices each codec's stages at the rates calibrate
# measured for that data (zstd on int8 bytes, dequantization to int4, ...).
for CODEC in int8+zstd int4+deflate; do
  "$RUN" save "${REQUEST[@]}" --store "file://$WORK/store-$CODEC" --layer-group 1 \
    --forms kv --codec "$CODEC"
  "$RUN" compare "${REQUEST[@]}" --store "file://$WORK/store-$CODEC" \
    --strategy kv --target "$WORK/target-1.json" --repeat 5
done
echo "(predicted times come from the calibrated target; docs/results.md" \
     "explains how close they come and why)"

MODELS=${KVC_MODELS_DIR:-../shared/models}
if [ ! -f "$MODELS/stories260K/stories260K.bin" ]; then
  banner "A trained model: skipped (no $MODELS/stories260K; set KVC_MODELS_DIR)"
  exit 0
fi
banner "A trained model: stories260K restored with the joint plan, then decoding"
"$RUN" import-llama2c --checkpoint "$MODELS/stories260K/stories260K.bin" \
  --tokenizer "$MODELS/stories260K/tok512.bin" --out "$WORK/stories"
PROMPT="Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
STORY=(--model "$WORK/stories" --prompt "$PROMPT")
# The saves' layout: 8-token chunks of one layer (the readers read it from
# the store).
LAYOUT=(--chunk-tokens 8 --layer-group 1)
"$RUN" save "${STORY[@]}" "${LAYOUT[@]}" --store "file://$WORK/stories-store" \
  --forms kv,hidden
# The continuation decoded from the restored paged cache, and whether a full
# prefill's says the same.
"$RUN" generate "${STORY[@]}" --store "file://$WORK/stories-store" \
  --strategy joint --target "$WORK/target.json" --steps 40

banner "A quality budget in next-token KL: int4 KV of the same prompt"
# profile-codecs measures what each codec does to the next token on this
# model; under a budget below int4's KL the plan recomputes, above it loads.
"$RUN" profile-codecs --model "$WORK/stories" --prompt "$PROMPT" \
  --out "$WORK/stories-profile.json" | grep -E '^(codec|int4/g32|int8/g32) '
"$RUN" save "${STORY[@]}" "${LAYOUT[@]}" --store "file://$WORK/stories-int4" \
  --forms kv --codec int4
for KL in 0.0001 0.1; do
  echo "-- --max-kl $KL"
  "$RUN" restore "${STORY[@]}" --store "file://$WORK/stories-int4" \
    --strategy joint --target "$WORK/target.json" --verify \
    --codec-profile "$WORK/stories-profile.json" --max-kl "$KL" |
    grep -E '^(restored|  busy|verify)'
done
echo "-- decoding after the int4 restore (--max-kl 0.1)"
"$RUN" generate "${STORY[@]}" --store "file://$WORK/stories-int4" \
  --strategy joint --target "$WORK/target.json" --steps 40 \
  --codec-profile "$WORK/stories-profile.json" --max-kl 0.1 |
  grep -E '^(  "|after)'
