"""scripts/vllm-worker-harness.py, which a GPU machine without vLLM runs
(scripts/gpu-check.sh python): here on the CPU with vLLM stood in for, so
that the harness and its stand-ins cannot break unseen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

HARNESS = Path(__file__).resolve().parents[2] / "scripts" / \
    "vllm-worker-harness.py"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_harness_saves_loads_continues_and_reports_a_corrupt_object(
        dtype: str) -> None:
    done = subprocess.run(
        [sys.executable, str(HARNESS), "--cpu", "--stub-vllm",
         "--dtype", dtype],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    lines = [line for line in done.stdout.splitlines()
             if line.startswith("harness:")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vLLM stood in for" in lines[0]
    assert f"cpu {dtype} caches" in lines[0]
    # Loaded exactly: the bits request a's cache held, through bf16.
    assert any("request b loaded 192 of 200 tokens" in line and
               "largest error 0 of" in line and
               line.endswith("ok") for line in lines), lines
    # What the GPU run reads: whether generated kernels loaded, and how long
    # the host spent in the layer waits (on the CPU: the host's own waits).
    assert any(line.startswith("harness: request b's load: 0 chunks by "
                               "generated kernels") for line in lines), lines
    assert any(line.endswith("in wait_for_layer_load (waits on the host)")
               for line in lines), lines
    assert any("transformers continued from 192 restored tokens" in line and
               line.endswith("ok") for line in lines), lines
    assert any("corrupt object" in line and line.endswith("ok")
               for line in lines), lines
    assert lines[-1] == "harness: ok"
