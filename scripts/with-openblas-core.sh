#!/usr/bin/env bash
# Runs a command with OpenBLAS forced to one kernel family
# (OPENBLAS_CORETYPE; Debian's OpenBLAS picks its kernels at run time),
# as a CI machine of another CPU would pick it. Exits 77 (skipped) where
# this CPU cannot run that family's instructions.
#
#   scripts/with-openblas-core.sh Haswell|SkylakeX|Zen COMMAND [ARGS...]
set -euo pipefail
core=$1
shift
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
need() {
  for flag; do
    if [[ "$flags" != *" $flag "* ]]; then
      echo "skipped: this CPU lacks $flag, which OpenBLAS's $core kernels use"
      exit 77
    fi
  done
}
case "$core" in
Haswell | Zen) need avx2 fma ;;
SkylakeX) need avx512f avx512bw avx512dq avx512vl ;;
*)
  echo "unknown OpenBLAS core $core (expected Haswell, SkylakeX or Zen)" >&2
  exit 2
  ;;
esac
OPENBLAS_CORETYPE=$core exec "$@"
