#!/usr/bin/env bash
# The GPU checks (generated kernels, the CUDA backend, the model import) in
# two steps, for a GPU machine with CUDA and PyTorch but no LLVM/MLIR
# (docs/kernels.md and docs/runtime.md, "On a GPU").
#
#   scripts/gpu-check.sh pack [DIR]   here: builds kvc-kernel-bench and the
#                                     kernel bundle and its variants
#                                     (build/; their 16-token kernels
#                                     checked first by that
#                                     kvc-kernel-bench on the emulated
#                                     driver), the runtime
#                                     alone (build-gpu/: kvc-run and the
#                                     CUDA backend's tests, no LLVM), copies
#                                     them, the libraries the GPU machine
#                                     lacks and the PyTorch baseline into
#                                     DIR (.gpu); saves a generated model's
#                                     context and compiles every strategy's
#                                     plan for it (DIR/e2e); imports
#                                     stories260K (KVC_MODELS_DIR, default
#                                     ../shared/models) with the tokens kvc
#                                     decodes from BOS;
#   scripts/gpu-check.sh run [DIR]    there, from the repository root with
#                                     DIR beside it: checks every kernel bit
#                                     for bit and times it against the copy
#                                     (the variants too),
#                                     reruns the checks under
#                                     compute-sanitizer's memcheck, runs the
#                                     CUDA backend's tests (and once under
#                                     memcheck and racecheck), restores
#                                     every plan of DIR/e2e on the GPU and
#                                     the CPU (compare --verify; the int4
#                                     plans through generated kernels on the
#                                     GPU), calibrates
#                                     the GPU, times the PyTorch baseline,
#                                     decodes stories260K
#                                     with transformers against kvc's tokens
#                                     and holds every strategy's restored
#                                     K and V (generated model and
#                                     stories260K) against transformers'
#                                     (scripts/hf-reference.py), and writes
#                                     the outputs to $OUT (else DIR/results);
#   scripts/gpu-check.sh profile [DIR]
#                                     there: Nsight Compute (ncu) over one
#                                     launch of each kernel of the bundle
#                                     whose name PROFILE_KERNELS matches
#                                     (default: the 1024-token ones), the
#                                     raw metrics of each in $OUT/ncu/ and
#                                     a line per kernel (throughputs, issue
#                                     slots, occupancy, stalls) in
#                                     $OUT/ncu-summary.txt; exits 77 without
#                                     ncu.
#
# The main job (docs/cuda-backend.md, "The main job"), a Llama-3.1-8B-shaped
# model with random weights, in three steps:
#
#   scripts/gpu-check.sh main-calibrate [DIR]
#                                     there: the model's weights
#                                     (gen-weights.py, in MAIN_WORK,
#                                     default /tmp/kvc-main), the GPU
#                                     calibrated with it: $OUT/h100-8b.json;
#                                     kvc-gpu-bench (uploads against pinned
#                                     copies, prefill's MFU, projection
#                                     against prefill) at BENCH_TOKENS
#                                     (8192), and the server's recompute
#                                     (transformers' SDPA prefill) at
#                                     MAIN_TOKENS;
#   scripts/gpu-check.sh main-plan TARGET [DIR]
#                                     here or there (the pack's kvc-opt
#                                     links its compiler statically and
#                                     needs no LLVM): every strategy's plan for each
#                                     context (MAIN_TOKENS, default
#                                     "8192 32768") and link (MAIN_LINKS,
#                                     Gbps, default "7 32 100") compiled
#                                     for TARGET: DIR/main;
#   scripts/gpu-check.sh main [DIR]   there: each context saved through the
#                                     GPU's prefill, every plan compared on
#                                     the GPU over the store throttled to
#                                     each link (MAIN_REPEAT runs, default
#                                     2), a trace of a joint restore.
#
#   scripts/gpu-check.sh main-grid [DIR]
#                                     there: transformers' SDPA prefill of
#                                     each context (the server's
#                                     recompute), the main job in one
#                                     process (kvc-run grid: calibrate,
#                                     save, plan every strategy with the
#                                     compiler the pack carries, compare
#                                     each link), every plan beside SDPA
#                                     ($OUT/main-vs-sdpa.md), then
#                                     kvc-gpu-bench;
#   scripts/gpu-check.sh toy [DIR]   here (make check): pack, the pack and
#                                     the tracked files held to 64 MiB,
#                                     then all on the CPU backend with a
#                                     toy model;
#   scripts/gpu-check.sh connector [DIR]
#                                     there: a server's request through the
#                                     Connector (kvc-run serve) on the
#                                     backend, partial prefix, the server's
#                                     own tokens, a slow store; verified;
#   scripts/gpu-check.sh python [DIR]
#                                     there: kvc's Python package built for
#                                     that machine's Python from the pack's
#                                     kit (python/kit), then vLLM's worker
#                                     calls on the GPU's caches
#                                     (scripts/vllm-worker-harness.py);
#   scripts/gpu-check.sh host [DIR]  there: what the host gives a restore's
#                                     host side (CPU, memory and its
#                                     limits, the store's filesystem; one
#                                     thread's read of the main job's
#                                     stored objects, twice, and its copy
#                                     of memory): $OUT/host.txt;
#   scripts/gpu-check.sh all [DIR]   there: the one command to run first on
#                                     a GPU: main-grid, connector, python,
#                                     then run; each
#                                     step's time in $OUT/all.txt, every
#                                     output in $OUT/results.tgz (repacked
#                                     as each step ends).
#                                     MAIN_LAYERS=N keeps N of the model's
#                                     layers (default 8; MAIN_LAYERS= all),
#                                     MAIN_REPEAT runs of each plan (3);
#                                     GRID_S (default 330), SDPA_S (120),
#                                     PYTHON_S (90), TESTS_S (120),
#                                     BENCH_S (30),
#                                     SANITIZER_S (30) and ALL_S (540)
#                                     bound the grid, SDPA's prefills, the
#                                     worker harness, the CUDA backend's
#                                     tests, each hardware bench,
#                                     each sanitizer run and the whole
#                                     (seconds);
#                                     KERNEL_ITERS (50) times each kernel.
#
# Exits non-zero when a kernel differs from the runtime, memcheck finds an
# error or transformers decodes other tokens; 77 when the machine has no
# GPU.
set -euo pipefail

mode=${1:-}
dir=${2:-.gpu}
# The main job's contexts and links (gigabits per second, Cake's grid).
MAIN_TOKENS=${MAIN_TOKENS:-8192 32768}
MAIN_LINKS=${MAIN_LINKS:-7 32 100}
# MAIN_LAYERS keeps only the first N layers of the main job's model (the
# same shape otherwise), where a device call's minutes cannot hold all 32;
# MAIN_GPU_CHIP (default none) has its plans launch generated kernels.
# GPU_CHECK_BACKEND=cpu runs the main job's steps on the CPU backend, a
# toy model standing in for the 8B one (`toy` does, in `make check`).
backend=${GPU_CHECK_BACKEND:-cuda}
# Whether MAIN_LAYERS was given at all (`all` keeps 8 layers unless it was;
# MAIN_LAYERS= keeps every layer).
main_layers_given=${MAIN_LAYERS+yes}
MAIN_LAYERS=${MAIN_LAYERS:-}
root=$(cd "$(dirname "$0")/.." && pwd)

# The main job's config.json in DIR/main, with MAIN_LAYERS layers when set;
# prints its layer count.
main_config() {
  python3 - "$1/config.json" "$MAIN_LAYERS" <<'PY'
import json, sys
path, layers = sys.argv[1], sys.argv[2]
config = json.load(open(path))
config.setdefault("kvc_full_layers", config["num_hidden_layers"])
config["num_hidden_layers"] = int(layers) if layers else config["kvc_full_layers"]
json.dump(config, open(path, "w"), indent=1)
print(config["num_hidden_layers"])
PY
}

# There: what the pack carries compressed (OpenBLAS, kvc-run and kvc-opt
# with their compiler) unpacked once, with python's lzma (the GPU machine
# may have no xz).
unpack() {
  local packed
  if [ -f "$dir/compiler.tar.xz" ] && [ ! -f "$dir/kvc-run" ]; then
    python3 -c 'import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$dir/compiler.tar.xz" "$dir"
  fi
  for packed in "$dir"/*.xz; do
    [ -f "$packed" ] && [ "${packed%.tar.xz}" = "$packed" ] &&
      [ ! -f "${packed%.xz}" ] || continue
    python3 -c 'import lzma, os, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))
os.chmod(sys.argv[2], 0o755)' "$packed" "${packed%.xz}"
  done
}

# There: the main job's model ($model: MAIN_LAYERS of its layers, drawn on
# the GPU once; MAIN_WORK keeps it, and the saved contexts, for a warm
# machine) and its folders ($main, $work).
main_model() {
  main="$dir/main"
  work=${MAIN_WORK:-/tmp/kvc-main}
  layers=$(main_config "$main")
  model="$work/model-$layers-layers"
  mkdir -p "$work"
  echo "main job: $layers layers of $main/config.json's model" |
    tee "$out/main-model.txt"
  [ -f "$model/model.safetensors" ] || if [ "$backend" = cpu ]; then
    # A toy of the same kind, small enough for the CPU.
    "$dir/kvc-run" gen-model --out "$model" --layers "$layers" --hidden 256 \
      --heads 8 --kv-heads 2 --ffn 512 --vocab 1024 --seed 1 >/dev/null
  else
    python3 "$dir/gen-weights.py" "$main/config.json" "$model" --seed 1
  fi
}

# There: the backend against the hardware (uploads against pinned copies,
# prefill's MFU, projection against prefill), the main job's model, at
# BENCH_TOKENS (default 8192); a failure sets $status.
hardware_bench() {
  local tokens
  if [ "$backend" = cpu ]; then
    echo "hardware bench: skipped on the CPU backend" | tee "$out/gpu-bench.txt"
    return
  fi
  for tokens in ${BENCH_TOKENS:-8192}; do
    timeout "${BENCH_S:-0}" \
      "$dir/kvc-gpu-bench" --model "$model" --tokens $tokens \
      --out "$out/gpu-bench-$tokens.json" 2>&1 |
      tee "$out/gpu-bench-$tokens.txt" || status=$?
  done
}

# There: the server's recompute of each context of MAIN_TOKENS, timed on
# the same GPU with the main job's model: transformers' SDPA prefill
# (bench/prefill-torch.py, SDPA_REPEAT runs a context, default 5, within
# SDPA_S seconds, default 120), $OUT/sdpa.json; exit 77 (no GPU, no
# PyTorch) is no failure.
sdpa_recompute() {
  local code=0
  timeout "${SDPA_S:-120}" python3 "$dir/prefill-torch.py" --model "$model" \
    --tokens "${MAIN_TOKENS// /,}" --repeat "${SDPA_REPEAT:-5}" \
    --json "$out/sdpa.json" 2>&1 | tee "$out/sdpa.txt" || code=$?
  [ "$code" = 0 ] || [ "$code" = 77 ] || status=$code
}

# There: DIR absolute, the outputs' folder, the packed libraries found (and
# unpacked), the device recorded; exits 77 without a GPU.
prepare() {
  dir=$(cd "$dir" && pwd)
  out=${OUT:-$dir/results}
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  unpack

  if [ "$backend" = cpu ]; then
    echo "no GPU: the CPU backend stands in" | tee "$out/device.txt"
    return
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv |
    tee "$out/device.txt" || exit 77
  # The H100 machine's CPU is one Debian's OpenBLAS does not recognise: it
  # falls back to its generic SSE3 kernels (18-29 GFLOP/s there, kvc-run
  # warns), which every CPU-side prefill (verification, the CPU's compare)
  # then runs on. Its AVX-512 kernels, where the CPU has AVX-512.
  if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
    echo "OPENBLAS_CORETYPE=SkylakeX (the CPU has AVX-512)" | tee -a "$out/device.txt"
  fi
  # What a Python build of kvc for this machine must match (issue 56's GPU
  # point: the package's extension module is built for one Python).
  python3 -c 'import sys, sysconfig
try:
    import torch
    t = "torch " + torch.__version__
except ImportError:
    t = "no torch"
print("python", sys.version.split()[0], sysconfig.get_platform(), t)' 2>&1 |
    tee -a "$out/device.txt" || true
}

case "$mode" in
pack)
  ninja -C "$root/build" kvc-kernel-bench bench/kernels.json kvc-opt kvc-run \
    kvc-exec-kernels kvc-emulated-cuda
  # The bundle's 16-token kernels through the kvc-kernel-bench the GPU will
  # run, on the emulated driver (lib/Testing/EmulatedCuda.cpp: the PTX
  # interpreter), bit-exact before any device time goes to them (the larger
  # ones take minutes there).
  LD_LIBRARY_PATH="$root/build/lib/emulated-cuda" \
    "$root/build/bench/kvc-kernel-bench" \
    --bundle "$root/build/bench/kernels.json" --only _t16_ --iters 1 |
    tail -n 1
  # Variants the counts cannot decide between (docs/kernels.md, "Cost per
  # value"), K read once at more registers: unrotated per-channel saves
  # whose groups' tokens 4 lanes hold, and Hadamard saves whose lanes hold
  # 16 tokens, transformed once; unrotated per-channel saves whose lanes
  # issue 4 tokens' loads at a time (50-58 registers against 75-80); and
  # int2 restores at their former 8 items a thread (106 and 127 registers,
  # against 4 items' 56 and 48); one bundle, checked the same way.
  variants() { # KIND CODECS OPTIONS BUNDLE
    python3 "$root/bench/kernels/gen-kernels.py" "$1" --codecs "$2" \
      --shapes 16x1,256x32,1024x32 >"$root/build/bench/kernel-variants.mlir"
    "$root/build/bin/kvc-opt" "$root/build/bench/kernel-variants.mlir" \
      --kvc-import-model="$root/examples/models/llama-3.1-8b/config.json" \
      --kvc-lower-kernels="$3" --kvc-kernels-to-ptx \
      --kvc-emit-bundle=file="$4" -o /dev/null
  }
  variants --saves '^quant = int[248]$' group-lanes=4 \
    "$root/build/bench/kernel-variants.json"
  variants --saves '^transform = hadamard, quant = int[248]$' held-tokens=16 \
    "$root/build/bench/kernel-variants-held.json"
  variants --saves '^quant = int[248]$' scan-loads=4 \
    "$root/build/bench/kernel-variants-scan.json"
  variants --restores 'quant = int2$' restore-items=8 \
    "$root/build/bench/kernel-variants-items.json"
  python3 - "$root/build/bench/kernel-variants.json" \
    "$root/build/bench/kernel-variants-held.json" \
    "$root/build/bench/kernel-variants-scan.json" \
    "$root/build/bench/kernel-variants-items.json" <<'EOF'
import json, sys
bundle = json.load(open(sys.argv[1]))
for more in sys.argv[2:]:
    bundle["kernels"] += json.load(open(more))["kernels"]
json.dump(bundle, open(sys.argv[1], "w"))
EOF
  LD_LIBRARY_PATH="$root/build/lib/emulated-cuda" \
    "$root/build/bench/kvc-kernel-bench" \
    --bundle "$root/build/bench/kernel-variants.json" --only _t16_ \
    --iters 1 | tail -n 1
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVC_BUILD_COMPILER=OFF >/dev/null
  ninja -C "$root/build-gpu" KVCCudaBackendTests kvc-gpu-bench KVCHost \
    KVCCudaRegister
  # kvc-run and kvc-opt with the compiler linked from MLIR's and LLVM's
  # archives (cmake/StaticCompiler.cmake): they plan there, where there is
  # no LLVM, so calibrate -> plan -> run is one call.
  cmake -S "$root" -B "$root/build-static" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVC_STATIC_COMPILER=ON -DKVC_BUILD_TESTS=OFF >/dev/null
  ninja -C "$root/build-static" kvc-run kvc-opt
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd) # file:// stores need absolute paths.
  cp "$root/build/bench/kvc-kernel-bench" "$root/build/bench/kernels.json" \
    "$root/build/bench/kernel-variants.json" \
    "$root/build/unittests/exec-kernels.json" \
    "$root/build/unittests/exec-restores.json" \
    "$root/build/unittests/exec-saves.json" \
    "$root/bench/kernels/torch-baseline.py" \
    "$root/bench/kernels/ncu-summary.py" \
    "$root/build-gpu/unittests/KVCCudaBackendTests" \
    "$root/build-gpu/bench/kvc-gpu-bench" "$root/bench/prefill-torch.py" \
    "$dir/"
  cp "$root/build-static/bin/kvc-run" "$root/build-static/bin/kvc-opt" "$dir/"
  # The device tool carries at most 64 MiB: no symbols.
  strip "$dir/kvc-run" "$dir/kvc-opt" "$dir/KVCCudaBackendTests" \
    "$dir/kvc-kernel-bench" "$dir/kvc-gpu-bench"
  # Libraries outside the C/C++ runtime and CUDA: a GPU machine's image may
  # lack them.
  for binary in "$dir/kvc-kernel-bench" "$dir/kvc-run" \
    "$dir/KVCCudaBackendTests" "$dir/kvc-gpu-bench"; do
    ldd "$binary" | awk '/=> \// {print $3}'
  done | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
    grep -v '/cuda' | xargs -r cp -L -t "$dir/"
  # The Python package's kit (python/kit/CMakeLists.txt builds the module
  # there, for that machine's Python): the runtime's archives without debug
  # information, the CUDA driver's registration, and nanobind's sources.
  mkdir -p "$dir/python-kit/lib"
  for archive in KVCHost KVCPlanning KVCRuntime KVCRuntimeBase KVCSupport \
    KVCCudaBackend KVCCudaDriver; do
    find "$root/build-gpu/lib" -name "lib$archive.a" -exec cp -t \
      "$dir/python-kit/lib/" {} +
  done
  find "$root/build-gpu/lib" -path '*KVCCudaRegister.dir*' -name '*.o' \
    -exec cp {} "$dir/python-kit/lib/register.o" \;
  strip --strip-debug "$dir/python-kit/lib/"*
  nanobind=$("$root/.venv/bin/python" -c \
    'import nanobind, os; print(os.path.dirname(nanobind.__file__))')
  cp -r "$nanobind" "$dir/python-kit/nanobind"
  rm -rf "$dir/python-kit/nanobind/__pycache__"
  # The harness's model and its loads' plans (192 tokens of raw KV, chunks
  # of 64, the restore kernels for sm_90): that module has no compiler.
  "$root/.venv/bin/python" "$root/scripts/vllm-worker-harness.py" \
    --write-model "$dir/python-kit/model" >/dev/null
  printf '%s\n' 'kvc.restore @kv tokens 0 to 192 from [' \
    '  #kvc.source<tier = "ssd", form = kv, tokens = 0 to 192, layers = 0 to 2>]' \
    >"$dir/python-kit/loads.mlir"
  "$root/build/bin/kvc-opt" "$dir/python-kit/loads.mlir" \
    --kvc-import-model="$dir/python-kit/model/config.json" \
    --kvc-attach-target="$root/targets/h100-sxm.json" \
    "--kvc-restore-pipeline=strategy=kv chunk-tokens=64 gpu-chip=sm_90" \
    --kvc-emit-bundle=file="$dir/python-kit/plans.json" -o /dev/null
  tar -C "$dir" -cf - python-kit | xz -9 -T2 >"$dir/python-kit.tar.xz"
  rm -rf "$dir/python-kit"
  # The libraries and the compiler are most of it: xz brings OpenBLAS from
  # 36 to 4 MB (the libraries from 53 to 8), and kvc-run and kvc-opt (59
  # and 49 MB, mostly the same MLIR and LLVM code) to 18 MB in one stream;
  # prepare unpacks them there.
  find "$dir" -maxdepth 1 -name 'lib*.so*' ! -name '*.xz' -exec xz -f -T2 {} +
  tar -C "$dir" -cf - kvc-run kvc-opt | xz -9e -T1 >"$dir/compiler.tar.xz"
  rm "$dir/kvc-run" "$dir/kvc-opt"
  # The end-to-end restores: a generated model's context saved in every
  # form, and a plan per strategy compiled for an H100 (the CUDA backend
  # runs any plan; calibrating on the GPU makes the predictions its own).
  e2e="$dir/e2e" run="$root/build/bin/kvc-run" tokens=1024
  rm -rf "$e2e" && mkdir -p "$e2e"
  "$run" gen-model --out "$e2e/model" --layers 4 --hidden 256 --heads 8 \
    --kv-heads 2 --ffn 512 --vocab 1024 --seed 1 >/dev/null
  "$run" save --model "$e2e/model" --random-tokens $tokens --seed 7 \
    --store "file://$e2e/store" --layer-group 1 --forms kv,hidden >/dev/null
  # plans TOKENS LAYERS: one plan per strategy over a request of TOKENS
  # tokens of a LAYERS-layer model, loading from tier ssd.
  plans() {
    local n=$1 L=$2 q=$(($1 / 4)) h=$(($2 - 1)) j=$(($2 / 2))
    local kv="#kvc.source<tier = \"ssd\", form = kv, tokens = 0 to $n, layers = 0 to $L>"
    local hid="#kvc.source<tier = \"ssd\", form = hidden, tokens = 0 to $n, layers = 0 to $L>"
    printf '%s\n' "#kv = $kv" "#hid = $hid" \
      "kvc.plan @compute tokens 0 to $n layers 0 to $L {" \
      "  kvc.segment compute tokens 0 to $n layers 0 to $L" "}" \
      "kvc.plan @kv tokens 0 to $n layers 0 to $L {" \
      "  kvc.segment load_kv tokens 0 to $n layers 0 to $L from #kv" "}" \
      "kvc.plan @hidden tokens 0 to $n layers 0 to $L {" \
      "  kvc.segment load_hidden tokens 0 to $n layers 0 to $L from #hid" "}" \
      "kvc.plan @cake tokens 0 to $n layers 0 to $L {" \
      "  kvc.segment compute tokens 0 to $q layers 0 to $L" \
      "  kvc.segment load_kv tokens $q to $n layers 0 to $L from #kv" "}" \
      "kvc.plan @hcache tokens 0 to $n layers 0 to $L {" \
      "  kvc.segment load_hidden tokens 0 to $n layers 0 to $h from #hid" \
      "  kvc.segment load_kv tokens 0 to $n layers $h to $L from #kv" "}" \
      "kvc.plan @joint tokens 0 to $n layers 0 to $L {" \
      "  kvc.segment compute tokens 0 to $q layers 0 to $L" \
      "  kvc.segment load_hidden tokens $q to $n layers 0 to $j from #hid" \
      "  kvc.segment load_kv tokens $q to $n layers $j to $L from #kv" "}"
  }
  plans $tokens 4 >"$e2e/plans.mlir"
  "$root/build/bin/kvc-opt" "$e2e/plans.mlir" \
    --kvc-import-model="$e2e/model/config.json" \
    --kvc-attach-target="$root/targets/h100-sxm.json" \
    --kvc-expand=chunk-tokens=256 --kvc-fuse --kvc-schedule --kvc-estimate \
    --kvc-emit-bundle=file="$e2e/plans.json" -o /dev/null
  # The same request stored as Hadamard+int4+zstd, and plans that load it
  # with generated restore kernels: the CUDA backend decodes those chunks on
  # the GPU from their stored payload.
  "$run" save --model "$e2e/model" --random-tokens $tokens --seed 7 \
    --store "file://$e2e/store" --layer-group 1 --forms kv \
    --codec hadamard+int4+zstd >/dev/null
  q_source="#kvc.source<tier = \"ssd\", form = kv, codec = <transform = hadamard, quant = int4, lossless = zstd>, tokens = 0 to $tokens, layers = 0 to 4>"
  printf '%s\n' "#q = $q_source" \
    "kvc.plan @kv_int4 tokens 0 to $tokens layers 0 to 4 {" \
    "  kvc.segment load_kv tokens 0 to $tokens layers 0 to 4 from #q" "}" \
    "kvc.plan @cake_int4 tokens 0 to $tokens layers 0 to 4 {" \
    "  kvc.segment compute tokens 0 to 256 layers 0 to 4" \
    "  kvc.segment load_kv tokens 256 to $tokens layers 0 to 4 from #q" "}" \
    >"$e2e/plans-int4.mlir"
  "$root/build/bin/kvc-opt" "$e2e/plans-int4.mlir" \
    --kvc-import-model="$e2e/model/config.json" \
    --kvc-attach-target="$root/targets/h100-sxm.json" \
    --kvc-expand=chunk-tokens=256 --kvc-fuse --kvc-schedule --kvc-estimate \
    --kvc-lower-kernels --kvc-kernels-to-ptx \
    --kvc-emit-bundle=file="$e2e/plans-int4.json" -o /dev/null
  # A save plan of KV with its generated save kernels (on the GPU the
  # prefill fills the backend's cache and the kernels encode each object
  # there) and without (the prefill hands the objects to the host).
  printf '%s\n' 'kvc.save @kv tokens 0 to '$tokens' kv to "ssd" {max_error = 0.05, layer_group = 1 : i64}' \
    >"$e2e/save-kv.mlir"
  for chip in sm_90 ""; do
    "$root/build/bin/kvc-opt" "$e2e/save-kv.mlir" \
      --kvc-import-model="$e2e/model/config.json" \
      --kvc-attach-target="$root/targets/h100-sxm.json" \
      --kvc-save-pipeline=gpu-chip=$chip \
      --kvc-emit-bundle=file="$e2e/save-kv${chip:+-$chip}.json" -o /dev/null
  done
  cp "$root/targets/h100-sxm.json" "$e2e/"
  models=${KVC_MODELS_DIR:-$root/../shared/models}
  if [ -f "$models/stories260K/stories260K.bin" ]; then
    ninja -C "$root/build" kvc-run
    rm -rf "$dir/stories260K"
    "$root/build/bin/kvc-run" import-llama2c \
      --checkpoint "$models/stories260K/stories260K.bin" \
      --tokenizer "$models/stories260K/tok512.bin" --out "$dir/stories260K"
    echo 1 >"$dir/stories260K/prompt.txt"
    # Its context saved, and every strategy's plan, for the restored K and
    # V against transformers' past_key_values.
    "$run" save --model "$dir/stories260K" --random-tokens 512 --seed 7 \
      --store "file://$dir/stories260K/store" --chunk-tokens 128 \
      --layer-group 1 --forms kv,hidden >/dev/null
    plans 512 5 >"$dir/stories260K/plans.mlir"
    "$root/build/bin/kvc-opt" "$dir/stories260K/plans.mlir" \
      --kvc-import-model="$dir/stories260K/config.json" \
      --kvc-attach-target="$root/targets/h100-sxm.json" \
      --kvc-expand=chunk-tokens=128 --kvc-fuse --kvc-schedule --kvc-estimate \
      --kvc-emit-bundle=file="$dir/stories260K/plans.json" -o /dev/null
    "$root/build/bin/kvc-run" generate --model "$dir/stories260K" \
      --tokens "$dir/stories260K/prompt.txt" --strategy compute \
      --target "$root/targets/cpu-2core.json" --store mem:// --steps 60 |
      sed -n 's/^after the restore: //p' >"$dir/stories260K/expected.txt"
  fi
  cp "$root/scripts/hf-reference.py" "$root/scripts/gen-weights.py" \
    "$root/bench/main-vs-sdpa.py" "$dir/"
  # The main job's model (main-plan adds its plans).
  mkdir -p "$dir/main"
  cp "$root/examples/models/llama-3.1-8b/config.json" "$dir/main/"
  du -sh "$dir"
  ;;
main-plan)
  # The main job's plans, here: every strategy for a Llama-3.1-8B-shaped
  # model (random weights, generated there) at each context and link,
  # planned for TARGET (a GPU calibration, main-calibrate's) with its ssd
  # tier read at the link's rate, one bundle per context and link.
  target=${2:?usage: gpu-check.sh main-plan TARGET [DIR]}
  dir=${3:-.gpu}
  main="$dir/main"
  mkdir -p "$main"
  # Here the build's kvc-opt; there the pack's, which needs no LLVM.
  if [ -f "$dir/compiler.tar.xz" ] || [ -x "$dir/kvc-opt" ]; then
    unpack
    opt="$dir/kvc-opt"
  else
    ninja -C "$root/build" kvc-opt
    opt="$root/build/bin/kvc-opt"
  fi
  cp "$root/examples/models/llama-3.1-8b/config.json" "$main/config.json"
  layers=$(main_config "$main")
  cp "$target" "$main/target.json"
  for tokens in $MAIN_TOKENS; do
    for gbps in $MAIN_LINKS; do
      python3 - "$target" "$gbps" "$main/target-$gbps.json" <<'PY'
import json, sys
target = json.load(open(sys.argv[1]))
for tier in target["tiers"]:
    if tier["name"] == "ssd":
        tier["read_gbs"] = min(tier["read_gbs"], float(sys.argv[2]) / 8)
json.dump(target, open(sys.argv[3], "w"), indent=1)
PY
      bundles=()
      for strategy in compute kv hidden cake hcache joint; do
        printf '%s\n' "kvc.restore @$strategy tokens 0 to $tokens from [" \
          "  #kvc.source<tier = \"ssd\", form = hidden, tokens = 0 to $tokens, layers = 0 to $layers>," \
          "  #kvc.source<tier = \"ssd\", form = kv, tokens = 0 to $tokens, layers = 0 to $layers>]" |
          "$opt" --kvc-import-model="$main/config.json" \
            --kvc-attach-target="$main/target-$gbps.json" \
            "--kvc-restore-pipeline=strategy=$strategy chunk-tokens=256 gpu-chip=${MAIN_GPU_CHIP:-none}" \
            --kvc-emit-bundle=file="$main/$strategy.json" -o /dev/null
        bundles+=("$main/$strategy.json")
      done
      # One bundle of the six plans.
      python3 - "$main/plans-$tokens-$gbps.json" "${bundles[@]}" <<'PY'
import json, sys
merged = None
for path in sys.argv[2:]:
    bundle = json.load(open(path))
    if merged is None:
        merged = bundle
    else:
        merged["plans"] += bundle["plans"]
        merged["kernels"] += bundle["kernels"]
json.dump(merged, open(sys.argv[1], "w"))
PY
      rm -f "${bundles[@]}"
      echo "main-plan: $main/plans-$tokens-$gbps.json"
    done
  done
  ;;
main-calibrate | main)
  # There: the Llama-3.1-8B-shaped model's weights (gen-weights.py, on the
  # GPU), then main-calibrate calibrates the GPU with it
  # ($OUT/h100-8b.json, for main-plan), and main saves each context of
  # MAIN_TOKENS through the GPU's prefill and compares every plan main-plan
  # compiled, the store throttled to each link of MAIN_LINKS, with a trace
  # of one joint restore per context.
  prepare
  main_model
  status=0
  if [ "$mode" = main-calibrate ]; then
    "$dir/kvc-run" calibrate --backend cuda --model "$model" \
      --base "$dir/e2e/h100-sxm.json" --out "$out/h100-8b.json" \
      --scratch "$work" 2>&1 | tee "$out/main-calibrate.txt" || status=$?
    hardware_bench
    sdpa_recompute
    exit "$status"
  fi
  for tokens in $MAIN_TOKENS; do
    request=(--model "$model" --random-tokens "$tokens" --seed 7)
    store="file://$work/store-$layers-$tokens"
    [ -d "$work/store-$layers-$tokens" ] ||
      "$dir/kvc-run" save "${request[@]}" --backend cuda --store "$store" \
        --forms kv,hidden --prefill-tokens 2048 --writers 8 --buffer-mb 4096 2>&1 |
        tee "$out/main-save-$tokens.txt" || status=$?
    for gbps in $MAIN_LINKS; do
      "$dir/kvc-run" compare "${request[@]}" --backend cuda \
        --store "$store?gbps=$gbps" --bundle "$main/plans-$tokens-$gbps.json" \
        --repeat "${MAIN_REPEAT:-2}" 2>&1 |
        tee "$out/main-$tokens-$gbps.txt" || status=$?
    done
    gbps=${MAIN_LINKS##* }
    "$dir/kvc-run" restore "${request[@]}" --backend cuda \
      --store "$store?gbps=$gbps" --bundle "$main/plans-$tokens-$gbps.json" \
      --plan joint --trace "$out/main-joint-trace-$tokens.json" 2>&1 |
      tee "$out/main-joint-$tokens.txt" || status=$?
  done
  exit "$status"
  ;;
profile)
  # There: one launch of each selected kernel under Nsight Compute (the
  # first, kvc-kernel-bench's checked launch), its raw metrics imported to
  # CSV, then the summary of them all.
  prepare
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu \
    /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
  if [ -z "$ncu" ]; then
    echo "gpu-check: no Nsight Compute (ncu) on this machine; skipped"
    exit 77
  fi
  mkdir -p "$out/ncu"
  status=0
  names=$(python3 -c 'import json, re, sys
for k in json.load(open(sys.argv[1]))["kernels"]:
    if re.search(sys.argv[2], k["name"]):
        print(k["name"], k["function"])' "$dir/kernels.json" \
    "${PROFILE_KERNELS:-_t1024_}")
  while read -r name function; do
    "$ncu" --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats \
      --kernel-name "$function" --launch-count 1 \
      -f -o "$out/ncu/$name" \
      "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" \
      --only "^$name\$" --iters 1 >"$out/ncu/$name.log" 2>&1 || status=$?
    "$ncu" --import "$out/ncu/$name.ncu-rep" --csv --page raw \
      >"$out/ncu/$name.csv" 2>>"$out/ncu/$name.log" || status=$?
    rm -f "$out/ncu/$name.ncu-rep"
  done <<<"$names"
  python3 "$dir/ncu-summary.py" "$out"/ncu/*.csv |
    tee "$out/ncu-summary.txt" || status=$?
  exit "$status"
  ;;
run)
  prepare
  status=0
  # The CUDA backend's tests, then the kernels against the copy, then the
  # sanitizers, each under SANITIZER_S seconds (default 0: no limit; a
  # sanitizer stopped by it is reported as exit 124).
  export KVC_EXEC_KERNELS="$dir/exec-kernels.json"
  export KVC_EXEC_RESTORES="$dir/exec-restores.json"
  export KVC_EXEC_SAVES="$dir/exec-saves.json"
  # Within TESTS_S seconds (default 120): a test that hangs (a stream wait
  # the GPU never passed, on the H200) must not spend the steps after.
  timeout "${TESTS_S:-120}" "$dir/KVCCudaBackendTests" 2>&1 |
    tee "$out/cuda-backend-tests.txt" ||
    status=$?
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
  exit "$status"
  ;;
host)
  # There: the host side of a restore, measured with what the machine has
  # (no kvc code): whether the stored objects a restore reads are in the
  # page cache, and how fast one thread reads them and copies memory.
  prepare
  work=${MAIN_WORK:-/tmp/kvc-main}
  {
    grep -m1 'model name' /proc/cpuinfo || true
    echo "cpus: $(nproc)"
    free -g | sed -n 1,2p
    for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory.current \
      /sys/fs/cgroup/memory.stat; do
      [ -f "$f" ] && echo "$f: $(head -c 300 "$f" | tr '\n' ' ')"
    done
    df -hT "$work" 2>/dev/null | tail -n 1
    python3 - "$work" <<'PY'
import glob, os, sys, time
files = [f for f in glob.glob(sys.argv[1] + "/store-*/**/kv/**", recursive=True)
         if os.path.isfile(f)][:256]
if not files:
    print("no stored kv objects under", sys.argv[1])
size = max((os.path.getsize(f) for f in files), default=0)
buffer = bytearray(size)
for attempt in ("first", "second"):
    total, start = 0, time.perf_counter()
    for name in files:
        with open(name, "rb", buffering=0) as f:
            total += f.readinto(buffer)
    seconds = time.perf_counter() - start
    print(f"read {len(files)} stored kv objects ({total / 1e6:.0f} MB, "
          f"{attempt} pass) on one thread: {total / seconds / 1e9:.2f} GB/s")
try:
    import numpy
    a = numpy.ones(1 << 28, numpy.uint8)
    b = numpy.empty_like(a)
    start = time.perf_counter()
    for _ in range(4):
        numpy.copyto(b, a)
    print(f"copy of 256 MiB on one thread: "
          f"{4 * a.nbytes / (time.perf_counter() - start) / 1e9:.2f} GB/s")
except ImportError:
    print("no numpy: no copy timed")
PY
  } 2>&1 | tee "$out/host.txt"
  ;;
connector)
  # There: a server's request through host::Connector on the backend
  # (kvc-run serve): the pack's 1024-token context (saved by the CPU model,
  # restored with fp32 GEMMs, as `run` does) is the prefix of a 1100-token
  # request; its KV loaded (--policy always: the H100 target prices this
  # small model's recompute at the GPU's peak) and the rest prefilled into
  # a cache of the backend's, also with the server holding its first 256
  # tokens; and over a store too slow to load from, recomputed; every cache
  # verified against a full prefill.
  prepare
  status=0
  e2e="$dir/e2e"
  serve=("$dir/kvc-run" serve --model "$e2e/model" --random-tokens 1100
    --seed 7 --target "$e2e/h100-sxm.json" --backend "$backend" --verify)
  [ "$backend" = cuda ] && serve+=(--gemm f32)
  serve+=(--strategy kv)
  "${serve[@]}" --store "file://$e2e/store" --policy always 2>&1 |
    tee "$out/connector.txt" || status=$?
  "${serve[@]}" --store "file://$e2e/store" --policy always --on-device 256 \
    2>&1 | tee "$out/connector-on-device.txt" || status=$?
  "${serve[@]}" --store "file://$e2e/store?gbps=0.000001" 2>&1 |
    tee "$out/connector-slow.txt" || status=$?
  grep -q "decision: restores 1024 of 1100" "$out/connector.txt" ||
    { echo "gpu-check: the Connector did not restore the stored prefix"; status=1; }
  grep -q "decision: recomputes" "$out/connector-slow.txt" ||
    { echo "gpu-check: the Connector loaded from a store too slow"; status=1; }
  exit "$status"
  ;;
python)
  # There: kvc's Python package built for that machine's Python (the
  # module from python/src/module.cpp over the pack's kit:
  # python/kit/CMakeLists.txt), then vLLM's worker calls on the device's
  # caches (scripts/vllm-worker-harness.py: save, load, a corrupt object).
  prepare
  [ -d "$dir/python-kit" ] || python3 -c 'import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$dir/python-kit.tar.xz" "$dir"
  build="$dir/python-build"
  shared=$(find "$dir" -maxdepth 1 -name 'lib*.so*' ! -name '*.xz' |
    sort | paste -sd ';')
  python=${KVC_PYTHON:-$(command -v python3)}
  if ! { cmake -S "$root/python/kit" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DKVC_SOURCE_DIR="$root" \
    -DKVC_KIT="$dir/python-kit" -DKVC_KIT_SHARED="$shared" \
    -DPython_EXECUTABLE="$python" && ninja -C "$build"; } \
    >"$out/python-build.txt" 2>&1; then
    tail -n 20 "$out/python-build.txt"
    echo "python: the module did not build for $("$python" --version)"
    exit 1
  fi
  echo "python: the module built for $("$python" --version)"
  device_flag=
  [ "$backend" = cpu ] && device_flag=--cpu
  # Caches of a bf16 model, then of an fp16 one (the runtime's kernels
  # write f16; the generated ones are left out). Both within PYTHON_S
  # (default 90 s): a layer wait on the stream that is never let go must
  # not spend the call's time for the steps after.
  status=0 started=$SECONDS
  : >"$out/python-harness.txt"
  for dtype in bfloat16 float16; do
    left=$((${PYTHON_S:-90} - (SECONDS - started)))
    if [ "$left" -le 0 ]; then
      echo "harness: $dtype not run (PYTHON_S spent)" |
        tee -a "$out/python-harness.txt"
      status=1
      continue
    fi
    PYTHONPATH="$build" timeout "$left" \
      "$python" "$root/scripts/vllm-worker-harness.py" \
      $device_flag --model "$dir/python-kit/model" --dtype "$dtype" \
      --bundle "$dir/python-kit/plans.json" 2>&1 | grep -v '%|' |
      tee -a "$out/python-harness.txt" || status=1
  done
  # The kit's module holds the CUDA driver (its registration linked in).
  grep -q 'the cuda driver: True' "$out/python-harness.txt" || status=1
  exit "$status"
  ;;
main-grid)
  # There: the server's recompute of each context (transformers' SDPA
  # prefill, $OUT/sdpa.json), then the main job in one process (kvc-run
  # grid: the model read once, the GPU calibrated, each context saved
  # through its prefill, every strategy planned in-process for each link
  # and compared MAIN_REPEAT times, every run verified; $OUT/main.md and
  # .json as each cell ends), every plan beside SDPA
  # ($OUT/main-vs-sdpa.md, cells not reached listed as not run), then the
  # backend against the hardware with the same model.
  prepare
  main_model
  status=0
  sdpa_recompute
  timeout "${GRID_S:-0}" \
    "$dir/kvc-run" grid --backend "$backend" --model "$model" --calibrate \
    --target "$dir/e2e/h100-sxm.json" --tokens "${MAIN_TOKENS// /,}" \
    --links "${MAIN_LINKS// /,}" --repeat "${MAIN_REPEAT:-3}" \
    --prefill-tokens 2048 --work "$work" --out "$out/main" || status=$?
  python3 "$dir/main-vs-sdpa.py" --grid "$out/main.json" \
    --sdpa "$out/sdpa.json" --tokens "${MAIN_TOKENS// /,}" \
    --links "${MAIN_LINKS// /,}" --out "$out/main-vs-sdpa.md" || status=$?
  hardware_bench
  exit "$status"
  ;;
all)
  # There: everything a GPU must show, in order of value, each step's
  # results in $OUT as it ends and its time in $OUT/all.txt: the main job
  # in one process (main-grid), a server's request (connector), the Python
  # package's worker side (python), then `run` (kernels, the backend's
  # tests, sanitizers, transformers).
  prepare
  # The device tool brings back at most 8 files of its $OUT: there the
  # steps write into DIR/results, and each step's end packs them into
  # $OUT/results.tgz (the K and V dumps left out), all.txt beside it.
  back=
  if [ -n "${OUT:-}" ] && [ "$(cd "$out" && pwd)" != "$dir/results" ]; then
    back=$out out="$dir/results"
    mkdir -p "$out"
  fi
  export OUT="$out"
  # Each step's limits (seconds), so that the whole stays inside a device
  # call with room for a rerun: the grid, each hardware bench, each
  # sanitizer run, and the whole (ALL_S: a step still running then is
  # stopped, what it wrote kept). The main job's model keeps 8 of its 32
  # layers and each plan runs once unless told otherwise: all of it does
  # not fit a device call (docs/cuda-backend.md, "The main job"). Each
  # plan runs 3 times: a median and a spread.
  [ -n "$main_layers_given" ] || MAIN_LAYERS=8
  export GRID_S=${GRID_S:-330} BENCH_S=${BENCH_S:-30} \
    SANITIZER_S=${SANITIZER_S:-30} KERNEL_ITERS=${KERNEL_ITERS:-50} \
    MAIN_LAYERS MAIN_REPEAT=${MAIN_REPEAT:-3}
  local_limit=${ALL_S:-540}
  status=0
  step() {
    local started=$SECONDS code=0 left=$((local_limit - SECONDS))
    if [ "$left" -le 0 ]; then
      echo "$1: not run (ALL_S=$local_limit s spent)" | tee -a "$out/all.txt"
      return
    fi
    timeout "$left" bash "$0" "$@" || code=$?
    echo "$1: exit $code after $((SECONDS - started)) s" | tee -a "$out/all.txt"
    [ "$code" = 0 ] || status=$code
    pack_back
  }
  pack_back() {
    [ -z "$back" ] && return
    tar -C "$out" --exclude='*.safetensors' -czf "$back/results.tgz.part" . &&
      mv "$back/results.tgz.part" "$back/results.tgz"
    cp "$out/all.txt" "$back/"
  }
  echo "all: MAIN_TOKENS=$MAIN_TOKENS MAIN_LINKS=$MAIN_LINKS" \
    "MAIN_LAYERS=${MAIN_LAYERS:-all} MAIN_REPEAT=$MAIN_REPEAT GRID_S=$GRID_S" \
    "BENCH_S=$BENCH_S SANITIZER_S=$SANITIZER_S KERNEL_ITERS=$KERNEL_ITERS" \
    "ALL_S=$local_limit" | tee "$out/all.txt"
  step main-grid "$dir"
  step connector "$dir"
  step python "$dir"
  if [ "$backend" = cpu ]; then
    echo "run: skipped on the CPU backend (GPU kernels and tests)" |
      tee -a "$out/all.txt"
  else
    step run "$dir"
  fi
  pack_back
  exit "$status"
  ;;
toy)
  # Here, in `make check`: the pack built and held to what the device tool
  # carries, then `all` end to end on the CPU backend with a toy model (two
  # contexts, two links), so that the script, the pack and kvc-run grid
  # cannot break unseen before a GPU runs them.
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "toy: skipped: no CUDA toolkit to build the pack with"
    exit 0
  fi
  rm -rf "$dir"
  bash "$0" pack "$dir" >"$root/build/gpu-toy-pack.log" 2>&1 || {
    tail -n 40 "$root/build/gpu-toy-pack.log"
    exit 1
  }
  # The device tool carries the pack and the repository's tracked files.
  size=$(du -sb "$dir" | cut -f1)
  tree=$(cd "$root" && git ls-files -z 2>/dev/null | xargs -0 -r du -cb |
    tail -n 1 | cut -f1)
  limit=$((64 << 20))
  echo "toy: the pack ($size bytes) and the tracked files (${tree:-0}) of" \
    "the $limit bytes the device tool carries"
  [ $((size + ${tree:-0})) -le "$limit" ] || {
    echo "toy: the pack and the tree exceed what the device tool carries"
    exit 1
  }
  OUT="$dir/results" GPU_CHECK_BACKEND=cpu KVC_PYTHON="$root/.venv/bin/python" \
    MAIN_LAYERS=2 MAIN_TOKENS="256 512" \
    MAIN_LINKS="7 100" MAIN_REPEAT=2 MAIN_WORK="$dir/work" \
    bash "$0" all "$dir"
  python3 - "$dir/results/main.json" "$dir/results/main-vs-sdpa.md" <<'PY'
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
table = open(sys.argv[2]).read()
failed = [c for c in cells if c["status"] != "ok"]
steps = [c["step"] for c in cells]
assert steps.count("compare") == 4 and "calibrate" in steps, steps
assert not failed, failed
assert all(len(c["plans"]) == 6 for c in cells if c["step"] == "compare"), cells
# Every plan's two runs reach the table beside SDPA's (not run here: no GPU).
assert all(len(p["runs_ms"]) == 2 for c in cells if c["step"] == "compare"
           for p in c["plans"]), cells
assert table.count("2 runs) | not run |") == 24, table
print(f"toy: the grid ran {len(cells)} steps, all ok; every plan beside SDPA")
PY
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
