# The `run` step of scripts/gpu-check.sh, sourced by it after `prepare`
# (its variables: dir, out, backend): there, the kernels, the CUDA backend's
# tests, the sanitizers, the end-to-end restores and transformers' K and V
# (see gpu-check.sh's usage). Sets status.
status=0
# The CUDA backend's tests, then the kernels against the copy, then the
# sanitizers, each under SANITIZER_S seconds (default 0: no limit; a
# sanitizer stopped by it is reported as exit 124).
export KVC_EXEC_KERNELS="$dir/exec-kernels.json"
export KVC_EXEC_RESTORES="$dir/exec-restores.json"
export KVC_EXEC_SAVES="$dir/exec-saves.json"
# RUN_FROM=e2e resumes a run that ALL_S cut: the tests, the kernel
# benches and the sanitizers are left out, the end-to-end restores run.
if [ "${RUN_FROM:-}" != e2e ]; then
# Which ways of holding a stream on a word this GPU releases (each tried
# in a child killed after 4 s), then the tests within TESTS_S seconds
# (default 120), the stream wait's last and on its own: a test that hangs
# must not spend the steps after, nor the tests after it (the test ends
# its process after 20 s, saying where it was).
"$dir/kvc-stream-wait-probe" 2>&1 | tee "$out/stream-wait-probe.txt" ||
  status=$?
timeout "${TESTS_S:-120}" "$dir/KVCCudaBackendTests" \
  --gtest_filter='-*StreamWait*' 2>&1 |
  tee "$out/cuda-backend-tests.txt" || status=$?
timeout 60 "$dir/KVCCudaBackendTests" --gtest_filter='*StreamWait*' 2>&1 |
  tee "$out/cuda-backend-tests-stream-wait.txt" || status=$?
"$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" \
  --iters "${KERNEL_ITERS:-200}" --out "$out/kernel-bench.json" |
  tee "$out/kernel-bench.txt" || status=$?
"$dir/kvc-kernel-bench" --bundle "$dir/kernel-variants.json" \
  --iters "${KERNEL_ITERS:-200}" --out "$out/kernel-variants.json" |
  tee "$out/kernel-variants.txt" || status=$?
sanitizer=/usr/local/cuda/bin/compute-sanitizer
limit=${SANITIZER_S:-0}
if [ -x "$sanitizer" ]; then
  timeout "$limit" "$sanitizer" --tool memcheck --leak-check full \
    --error-exitcode 3 "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" \
    --iters 1 >"$out/memcheck.txt" 2>&1 || status=$?
  tail -n 3 "$out/memcheck.txt"
  # memcheck over the backend's restores (with calls ordered by events: a
  # buffer freed under a kernel still reading it is its to find) and the
  # tests no sanitizer has run yet (fp16 caches, the stream wait's probe,
  # the server's runner, checkpoint weights, the GPU's spans);
  # racecheck over the kernels that share memory (tiled attention,
  # generated restores).
  for check in "memcheck:*EveryStrategy*:*Concurrent*:*Generated*:*Pipelines*:*OrderedByEvents*:*Fp16*:*StreamWait*:*Runner*:*HostWeights*:*Trace*" \
    "racecheck:*TiledAttention*:*GeneratedKernelsDecode*"; do
    tool=${check%%:*}
    timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 3 \
      "$dir/KVCCudaBackendTests" --gtest_filter="${check#*:}" \
      >"$out/cuda-backend-$tool.txt" 2>&1 || status=$?
    tail -n 2 "$out/cuda-backend-$tool.txt"
  done
fi
fi
# The store was saved here by the CPU model: the GPU restores it with
# fp32 GEMMs (--gemm f32, the CPU model's arithmetic), so that every plan
# is held against the GPU's full prefill and the CPU's cache alike.
e2e="$dir/e2e"
context=(--model "$e2e/model" --random-tokens 1024 --seed 7)
# The saves' layout; readers read it from the store.
layout=(--layer-group 1)
request=("${context[@]}" --store "file://$e2e/store"
  --bundle "$e2e/plans.json")
cuda=(--backend cuda --gemm f32)
for backend in cuda cpu; do
  if [ $backend = cuda ]; then on=("${cuda[@]}"); else on=(--backend cpu); fi
  "$dir/kvc-run" compare "${request[@]}" "${on[@]}" --repeat 3 \
    2>&1 | tee "$out/compare-$backend.txt" || status=$?
  # Generated kernels in the executor: every int4 chunk decoded on the GPU.
  "$dir/kvc-run" compare "${request[@]/plans.json/plans-int4.json}" \
    "${on[@]}" --repeat 3 2>&1 |
    tee "$out/compare-int4-$backend.txt" || status=$?
done
grep -q "generated kernels wrote" "$out/compare-int4-cuda.txt" ||
  { echo "gpu-check: no generated kernel ran in the executor"; status=1; }
# A server's precision end to end: the context saved through the GPU's
# prefill with bf16 GEMMs, every plan restored and verified the same way.
"$dir/kvc-run" save "${context[@]}" "${layout[@]}" \
  --store "file://$e2e/store-gpu" --backend cuda --forms kv,hidden 2>&1 | tee "$out/save-gpu.txt" ||
  status=$?
"$dir/kvc-run" compare "${context[@]}" --store "file://$e2e/store-gpu" \
  --bundle "$e2e/plans.json" --backend cuda --repeat 3 2>&1 |
  tee "$out/compare-cuda-bf16.txt" || status=$?
# A compiled save of KV whose generated save kernels encode each object
# in the cache the GPU's prefill fills, against the same plan without
# kernels (the GPU's prefill hands the objects over to the host's
# encoder); the stores must hold the same bytes.
for bundle in save-kv-sm_90 save-kv; do
  rm -rf "$e2e/store-$bundle"
  "$dir/kvc-run" save "${context[@]}" "${layout[@]}" --backend cuda \
    --store "file://$e2e/store-$bundle" --bundle "$e2e/$bundle.json" \
    2>&1 | tee "$out/$bundle.txt" || status=$?
done
grep -q "generated kernels encoded" "$out/save-kv-sm_90.txt" ||
  { echo "gpu-check: no generated save kernel ran beside the prefill"; status=1; }
diff -r "$e2e/store-save-kv-sm_90" "$e2e/store-save-kv" >/dev/null ||
  { echo "gpu-check: the save kernels stored other bytes than the host"; status=1; }
"$dir/kvc-run" restore "${request[@]}" "${cuda[@]}" --plan joint \
  --verify --trace "$out/joint-trace.json" | tee "$out/restore-joint.txt" ||
  status=$?
"$dir/kvc-run" calibrate --backend cuda --model "$e2e/model" \
  --base "$e2e/h100-sxm.json" --out "$out/h100-calibrated.json" \
  --scratch "$dir" 2>&1 | tee "$out/calibrate.txt" || status=$?
if python3 -c 'import torch' 2>/dev/null; then
  python3 "$dir/torch-baseline.py" | tee "$out/torch-baseline.txt" ||
    status=$?
fi
# Every strategy's restore on the GPU against transformers' own K and V,
# for the generated model and the trained one.
dumps=()
for plan in compute kv hidden cake hcache joint; do
  "$dir/kvc-run" restore "${request[@]}" "${cuda[@]}" --plan $plan \
    --dump-kv "$out/kv-e2e-$plan.safetensors" >/dev/null || status=$?
  dumps+=("$out/kv-e2e-$plan.safetensors")
done
python3 "$dir/hf-reference.py" --model "$e2e/model" --kv "${dumps[@]}" |
  tee "$out/hf-kv-e2e.txt" || status=$?
if [ -f "$dir/stories260K/plans.json" ]; then
  dumps=()
  for plan in compute kv hidden cake hcache joint; do
    "$dir/kvc-run" restore --model "$dir/stories260K" --random-tokens 512 \
      --seed 7 --store "file://$dir/stories260K/store" \
      --bundle "$dir/stories260K/plans.json" --plan $plan \
      --backend cuda --verify \
      --dump-kv "$out/kv-stories-$plan.safetensors" >/dev/null || status=$?
    dumps+=("$out/kv-stories-$plan.safetensors")
  done
  python3 "$dir/hf-reference.py" --model "$dir/stories260K" \
    --kv "${dumps[@]}" | tee "$out/hf-kv-stories260K.txt" || status=$?
fi
if [ -f "$dir/stories260K/expected.txt" ]; then
  python3 "$dir/hf-reference.py" --model "$dir/stories260K" \
    --prompt-ids "$(cat "$dir/stories260K/prompt.txt")" \
    --expect "$(cat "$dir/stories260K/expected.txt")" |
    tee "$out/hf-reference.txt" || status=$?
fi
