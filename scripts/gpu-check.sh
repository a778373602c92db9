#!/usr/bin/env bash
# The GPU checks (generated kernels, the model import) in two steps, for a GPU
# machine with CUDA and PyTorch but no LLVM/MLIR (docs/kernels.md, "On a GPU").
#
#   scripts/gpu-check.sh pack [DIR]   here: builds kvc-kernel-bench and the
#                                     kernel bundle (build/), copies them,
#                                     the libraries the GPU machine lacks and
#                                     the PyTorch baseline into DIR (.gpu);
#                                     imports stories260K (KVC_MODELS_DIR,
#                                     default ../shared/models) with the
#                                     tokens kvc decodes from BOS;
#   scripts/gpu-check.sh run [DIR]    there, from the repository root with
#                                     DIR beside it: checks every kernel bit
#                                     for bit and times it against the copy,
#                                     reruns the checks under
#                                     compute-sanitizer's memcheck, times the
#                                     PyTorch baseline, decodes stories260K
#                                     with transformers against kvc's tokens
#                                     (scripts/hf-reference.py), and writes
#                                     the outputs to $OUT (else DIR/results).
#
# Exits non-zero when a kernel differs from the runtime, memcheck finds an
# error or transformers decodes other tokens; 77 when the machine has no
# GPU.
set -euo pipefail

mode=${1:-}
dir=${2:-.gpu}
root=$(cd "$(dirname "$0")/.." && pwd)

case "$mode" in
pack)
  ninja -C "$root/build" kvc-kernel-bench bench/kernels.json
  mkdir -p "$dir"
  cp "$root/build/bench/kvc-kernel-bench" "$root/build/bench/kernels.json" \
    "$root/bench/kernels/torch-baseline.py" "$dir/"
  # Libraries outside the C/C++ runtime: a GPU machine's image may lack them.
  ldd "$root/build/bench/kvc-kernel-bench" |
    awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
    xargs -r cp -L -t "$dir/"
  models=${KVC_MODELS_DIR:-$root/../shared/models}
  if [ -f "$models/stories260K/stories260K.bin" ]; then
    ninja -C "$root/build" kvc-run
    rm -rf "$dir/stories260K"
    "$root/build/bin/kvc-run" import-llama2c \
      --checkpoint "$models/stories260K/stories260K.bin" \
      --tokenizer "$models/stories260K/tok512.bin" --out "$dir/stories260K"
    echo 1 >"$dir/stories260K/prompt.txt"
    "$root/build/bin/kvc-run" generate --model "$dir/stories260K" \
      --tokens "$dir/stories260K/prompt.txt" --strategy compute \
      --target "$root/targets/cpu-2core.json" --store mem:// --steps 60 |
      sed -n 's/^after the restore: //p' >"$dir/stories260K/expected.txt"
  fi
  cp "$root/scripts/hf-reference.py" "$dir/"
  du -sh "$dir"
  ;;
run)
  out=${OUT:-$dir/results}
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv |
    tee "$out/device.txt" || exit 77
  status=0
  "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" \
    --out "$out/kernel-bench.json" | tee "$out/kernel-bench.txt" ||
    status=$?
  [ "$status" = 77 ] && exit 77
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
  if [ -x "$sanitizer" ]; then
    "$sanitizer" --tool memcheck --leak-check full --error-exitcode 3 \
      "$dir/kvc-kernel-bench" --bundle "$dir/kernels.json" --iters 1 \
      >"$out/memcheck.txt" 2>&1 || status=$?
    tail -n 3 "$out/memcheck.txt"
  fi
  if python3 -c 'import torch' 2>/dev/null; then
    python3 "$dir/torch-baseline.py" | tee "$out/torch-baseline.txt" ||
      status=$?
  fi
  if [ -f "$dir/stories260K/expected.txt" ]; then
    python3 "$dir/hf-reference.py" --model "$dir/stories260K" \
      --prompt-ids "$(cat "$dir/stories260K/prompt.txt")" \
      --expect "$(cat "$dir/stories260K/expected.txt")" |
      tee "$out/hf-reference.txt" || status=$?
  fi
  exit "$status"
  ;;
*)
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
