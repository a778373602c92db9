#!/usr/bin/env bash
# Temporary driver for this session's device calls: steps with timeouts.
dir=$(cd .gpu && pwd); out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -f "$dir/libopenblas.so.0.xz" ] && [ ! -f "$dir/libopenblas.so.0" ]; then
  python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$dir/libopenblas.so.0.xz" "$dir/libopenblas.so.0"
fi
export KVC_EXEC_KERNELS="$dir/exec-kernels.json"
export KVC_EXEC_RESTORES="$dir/exec-restores.json"
export KVC_EXEC_SAVES="$dir/exec-saves.json"
step() { # NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s.%N)
  timeout "$secs" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(python3 -c "import sys;print(round($(date +%s.%N)-$t0,1))")s"
  tail -n "${TAILN:-4}" "$out/$name.txt"
}
case "$1" in
1)
  { nvidia-smi; nvcc --version; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)';
    command -v ncu; ls /usr/local/cuda/bin/ | tr '\n' ' '; nproc; free -g; df -h /tmp; } >"$out/device.txt" 2>&1
  head -n 12 "$out/device.txt"
  TAILN=70 step kernel-bench 150 "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --out "$out/kernel-bench.json"
  TAILN=25 step kernel-variants 90 "$dir/kvc-kernel-bench" --bundle "$dir/kernel-variants.json" --out "$out/kernel-variants.json"
  TAILN=30 step cuda-backend-tests 150 "$dir/KVCCudaBackendTests"
  TAILN=25 step torch-baseline-1024 ${TORCH_SECS:-200} python3 -u "$dir/torch-baseline.py" --tokens 1024
  ;;
2)
  TAILN=70 step kernel-bench 380 stdbuf -oL "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --out "$out/kernel-bench.json"
  TAILN=25 step torch-baseline-256 160 python3 -u "$dir/torch-baseline.py" --tokens 256
  ;;
3)
  TAILN=25 step kernel-bench-1024 280 stdbuf -oL "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --only '_t1024_' --out "$out/kernel-bench-1024.json"
  PROFILE_KERNELS='^kvc_save_int8_kc_vt_g32_t1024|^kvc_save_int4_kc_vt_g32_had_t1024|^kvc_restore_int2_kc_vt_g32_had_t1024|^kvc_save_int4_kt_vt_g64_t1024' TAILN=8 step profile 170 scripts/gpu-check.sh profile .gpu
  e2e="$dir/e2e"
  req=(--model "$e2e/model" --random-tokens 1024 --seed 7 --layer-group 1 --store "file://$e2e/store")
  TAILN=14 step compare-cuda 60 "$dir/kvc-run" compare "${req[@]}" --bundle "$e2e/plans.json" --backend cuda --gemm f32 --repeat 2
  TAILN=8 step compare-int4-cuda 50 "$dir/kvc-run" compare "${req[@]}" --bundle "$e2e/plans-int4.json" --backend cuda --gemm f32 --repeat 2
  ;;
4)
  TAILN=22 step cuda-backend-tests 40 "$dir/KVCCudaBackendTests"
  TAILN=22 step kernel-bench-1024-saves 60 stdbuf -oL "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --only '^kvc_(save|rms|rope).*_t1024_' --out "$out/kernel-bench-1024-saves.json"
  e2e="$dir/e2e"
  ctx=(--model "$e2e/model" --random-tokens 1024 --seed 7 --layer-group 1)
  req=("${ctx[@]}" --store "file://$e2e/store" --bundle "$e2e/plans.json")
  dumps=()
  for plan in compute kv hidden cake hcache joint; do
    "$dir/kvc-run" restore "${req[@]}" --backend cuda --gemm f32 --plan $plan --dump-kv "$out/kv-e2e-$plan.safetensors" >/dev/null 2>&1
    dumps+=("$out/kv-e2e-$plan.safetensors")
  done
  TAILN=10 step hf-kv-e2e 50 python3 "$dir/hf-reference.py" --model "$e2e/model" --kv "${dumps[@]}"
  rm -f "${dumps[@]}"
  for bundle in save-kv-sm_90 save-kv; do
    rm -rf "$e2e/store-$bundle"
    TAILN=3 step $bundle 30 "$dir/kvc-run" save "${ctx[@]}" --backend cuda --store "file://$e2e/store-$bundle" --bundle "$e2e/$bundle.json"
  done
  diff -r "$e2e/store-save-kv-sm_90" "$e2e/store-save-kv" >/dev/null && echo "save stores: same bytes" || echo "save stores differ"
  TAILN=6 step memcheck-backend 70 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/KVCCudaBackendTests" --gtest_filter='*EveryStrategy*:*Concurrent*:*Generated*:*Pipelines*'
  TAILN=22 step kernel-bench-1024-restores 110 stdbuf -oL "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --only '^kvc_restore_(int4_kt|int8|raw).*_t1024_' --out "$out/kernel-bench-1024-restores.json"
  ;;
5)
  st="$dir/stories260K"
  dumps=()
  for plan in compute kv hidden cake hcache joint; do
    "$dir/kvc-run" restore --model "$st" --random-tokens 512 --seed 7 --store "file://$st/store" --chunk-tokens 128 --layer-group 1 --bundle "$st/plans.json" --plan $plan --backend cuda --verify --dump-kv "$out/kv-st-$plan.safetensors" >/dev/null 2>&1
    dumps+=("$out/kv-st-$plan.safetensors")
  done
  TAILN=8 step hf-kv-stories 40 python3 "$dir/hf-reference.py" --model "$st" --kv "${dumps[@]}"
  rm -f "${dumps[@]}"
  TAILN=4 step hf-reference 40 python3 "$dir/hf-reference.py" --model "$st" --prompt-ids "$(cat "$st/prompt.txt")" --expect "$(cat "$st/expected.txt")"
  TAILN=4 step racecheck-backend 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --error-exitcode 3 "$dir/KVCCudaBackendTests" --gtest_filter='*EveryStrategy*:*Concurrent*:*Generated*:*Pipelines*'
  TAILN=4 step kernel-bench-1024-int8 70 stdbuf -oL "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --only '^kvc_restore_int8_kc_vt_g32_t1024_' --out "$out/kernel-bench-1024-int8.json"
  ;;
esac
