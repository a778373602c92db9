#!/usr/bin/env bash
# scripts/install-deps.sh - installs the Debian 12 packages kvc needs to build and test.
#
# Idempotent: packages already installed are skipped, and nothing is done (no apt-get update)
# when everything is present. Uses sudo only when not running as root.
set -euo pipefail

PACKAGES=(
  # Build.
  build-essential cmake ninja-build ccache python3
  # The Python package: a project-local environment (scripts/python-env.sh)
  # and the headers its extension module builds against.
  python3-venv python3-dev
  # Compiler: LLVM/MLIR 19 (all four are needed, see toolchain.md).
  llvm-19-dev llvm-19-tools libmlir-19-dev mlir-19-tools
  # Tests and benchmarks.
  libgtest-dev libbenchmark-dev
  # Runtime libraries: JSON, BLAS, hashing, codecs, the Redis tier.
  nlohmann-json3-dev libopenblas-dev libssl-dev
  libdeflate-dev libzstd-dev liblz4-dev
  # The data-plane benchmark (bench/DataPlaneBench.cpp) times libdeflate's
  # deflate against zlib's and ISA-L's; the runtime links neither.
  zlib1g-dev libisal-dev
  libhiredis-dev redis-server
  # Transfers between nodes.
  libucx-dev pkg-config
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
