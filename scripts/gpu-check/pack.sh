# The `pack` step of scripts/gpu-check.sh, sourced by it (its variables:
# root, dir): here, the GPU machine's pack in DIR (see gpu-check.sh's usage).
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
  KVCCudaRegister kvc-stream-wait-probe
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
  "$root/build-gpu/bench/kvc-stream-wait-probe" "$dir/"
cp "$root/build-static/bin/kvc-run" "$root/build-static/bin/kvc-opt" "$dir/"
# The device tool carries at most 64 MiB: no symbols.
strip "$dir/kvc-run" "$dir/kvc-opt" "$dir/KVCCudaBackendTests" \
  "$dir/kvc-kernel-bench" "$dir/kvc-gpu-bench" "$dir/kvc-stream-wait-probe"
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
