#!/usr/bin/env bash
# The GPU checks (generated kernels, the CUDA backend, the model import) in
# two steps, for a GPU machine with CUDA and PyTorch but no LLVM/MLIR
# (docs/kernels.md and docs/runtime.md, "On a GPU"). The `pack` and `run`
# steps live in scripts/gpu-check/, which this script sources.
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
#                                     DIR beside it: probes which stream
#                                     waits the GPU releases
#                                     (kvc-stream-wait-probe), checks every kernel bit
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
#                                     RUN_FROM=e2e starts at the restores
#                                     (a run that ALL_S cut, resumed);
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
  # scripts/gpu-check/pack.sh: this step, on its own.
  source "$root/scripts/gpu-check/pack.sh"
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
  source "$root/scripts/gpu-check/run.sh"
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
