#!/usr/bin/env bash
# scripts/sanitizers.sh [MAIN_BUILD] [SANITIZER_BUILD] - the runtime alone
# (no LLVM/MLIR), built with AddressSanitizer and UndefinedBehaviorSanitizer,
# running what handles untrusted bytes and threads: the executor's, store's
# and transfer's tests, the Connector's (over a plan MAIN_BUILD compiled),
# and the chunk, plan bundle and transfer fuzzers (the bundle fuzzer's seeds
# are compiled by MAIN_BUILD's kvc-opt, default build/). Any report fails
# it. .ci/run runs it after `make check`.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=${1:-build}
OUT=${2:-build-asan}
FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1"

if [ ! -f "$OUT/build.ninja" ]; then
  cmake -S . -B "$OUT" -G Ninja -DKVC_BUILD_COMPILER=OFF \
    -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
fi
cmake --build "$OUT" -j "$(nproc)" --target KVCRuntimeExecTests \
  KVCRuntimeStoreTests KVCRuntimeNetTests KVCHostTests kvc-chunk-fuzz \
  kvc-bundle-fuzz kvc-transfer-fuzz

# Leaks are reported too; UBSan stops at its first report.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
run() {
  local started=$SECONDS
  if "$@" > "$OUT/sanitizers.log" 2>&1; then
    echo "sanitizers: ok ($((SECONDS - started)) s): $*"
  else
    echo "sanitizers: FAILED ($((SECONDS - started)) s): $*"
    tail -n 80 "$OUT/sanitizers.log"
    failed=1
  fi
}
for suite in KVCRuntimeExecTests KVCRuntimeStoreTests KVCRuntimeNetTests; do
  run "$OUT/unittests/$suite"
done
# host::Connector, over the plan the main build compiled (it has the
# compiler; this build does not).
if [ -f "$MAIN/unittests/connector-plans.json" ]; then
  KVC_CONNECTOR_PLANS="$MAIN/unittests/connector-plans.json" \
    run "$OUT/unittests/KVCHostTests"
else
  echo "sanitizers: the Connector's plan is not built in $MAIN; skipped"
fi
run "$OUT/fuzz/kvc-chunk-fuzz" 20000
run "$OUT/fuzz/kvc-transfer-fuzz" 2000
if [ -f "$MAIN/fuzz/seed-plans.json" ] && [ -f "$MAIN/fuzz/seed-saves.json" ]; then
  run "$OUT/fuzz/kvc-bundle-fuzz" 3000 "$MAIN/fuzz/seed-plans.json" \
    "$MAIN/fuzz/seed-saves.json"
else
  echo "sanitizers: the bundle fuzzer's seeds are not built in $MAIN; skipped"
fi
exit $failed
