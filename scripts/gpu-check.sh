#!/usr/bin/env bash
# The GPU checks of the generated kernels in two steps, for a GPU machine
# that has CUDA and PyTorch but no LLVM/MLIR (docs/kernels.md, "On a GPU").
#
#   scripts/gpu-check.sh pack [DIR]   here: builds kvc-kernel-bench and the
#                                     kernel bundle (build/), copies them,
#                                     the libraries the GPU machine lacks and
#                                     the PyTorch baseline into DIR (.gpu);
#   scripts/gpu-check.sh run [DIR]    there, from the repository root with
#                                     DIR beside it: checks every kernel bit
#                                     for bit and times it against the copy,
#                                     reruns the checks under
#                                     compute-sanitizer's memcheck, times the
#                                     PyTorch baseline, and writes the
#                                     outputs to $OUT (else DIR/results).
#
# Exits non-zero when a kernel differs from the runtime or memcheck finds
# an error; 77 when the machine has no GPU.
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
  exit "$status"
  ;;
*)
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
