"""The tools' main jobs from Python: ``kvc-run`` (save, restore, compare,
grid, serve, calibrate, ...) and ``kvc-opt``, as installed with the package
(or found through ``$KVC_BIN`` or ``$PATH``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal, Sequence

from ._errors import Error

Tool = Literal["kvc-run", "kvc-opt"]


def tool_path(tool: Tool = "kvc-run") -> str:
    """Where ``tool`` is: ``$KVC_BIN``, then beside this Python (a virtual
    environment's scripts, where ``pip install`` put it), then ``$PATH``."""
    candidates = []
    if os.environ.get("KVC_BIN"):
        candidates.append(Path(os.environ["KVC_BIN"]) / tool)
    candidates.append(Path(sys.executable).parent / tool)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(tool)
    if found is None:
        raise Error(f"{tool} not found (set KVC_BIN, or pip install kvc)",
                    "not_found")
    return found


def run_tool(args: Sequence[str], tool: Tool = "kvc-run", *,
             check: bool = True,
             timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``tool args...`` and returns what it printed. With ``check``, a
    non-zero exit raises :class:`kvc.Error` carrying the tool's message."""
    done = subprocess.run([tool_path(tool), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        message = done.stderr.strip() or done.stdout.strip()
        raise Error(f"{tool} {' '.join(map(str, args[:1]))}: exit "
                    f"{done.returncode}: {message}", "internal")
    return done
