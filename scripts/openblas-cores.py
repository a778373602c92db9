#!/usr/bin/env python3
"""Every OpenBLAS kernel family this machine can meet, and test suites run under each.

Debian's OpenBLAS is built with DYNAMIC_ARCH: it holds one kernel set per core
type and picks one at load time from the CPU's name, falling back to its generic
Prescott kernels for a CPU it does not recognise (a VM that names itself only
"Intel(R) Xeon(R) Processor", say). What a test asserts must hold whichever set
sums the GEMMs, so the numerics reruns run a suite under every set.

The list is derived from the library the suite loads, not kept by hand:
  * the core types built into it are its exported `gotoblas_<CORE>` tables that
    hold data (the `D` symbols; a `B` one is a placeholder the build left out);
  * a core type this CPU cannot execute is found by running a GEMM under it
    (OPENBLAS_CORETYPE) in a child process: it dies of SIGILL;
  * a core type OpenBLAS does not accept by that name is reported, not run.

  scripts/openblas-cores.py list LIBRARY|BINARY
      the core types this CPU executes, one a line (exit 77 without OpenBLAS)
  scripts/openblas-cores.py run-under CORE BINARY [ARGS...]
      BINARY with OpenBLAS forced to CORE's kernels; exit 77 (skipped) where
      this CPU cannot execute them or BINARY loads no such OpenBLAS

CMake lists the cores at configure time (unittests/CMakeLists.txt) and registers
one `numerics` test a suite and core; each checks the core again when it runs.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

SKIPPED = 77


def openblas_of(binary: str) -> Path | None:
    """The OpenBLAS (or BLAS alternative) shared library `binary` loads."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        match = re.match(r"\s*(lib(?:openblas|blas)[^ ]*) => (\S+)", line)
        if match:
            return Path(match.group(2)).resolve()
    return None


def built_cores(library: Path) -> list[str]:
    """The core types whose kernel tables the library holds."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)],
                         capture_output=True, text=True, check=False).stdout
    cores = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("D", "d") and parts[2].startswith("gotoblas_"):
            cores.append(parts[2][len("gotoblas_"):])
    return sorted(set(cores))


def probe(library: Path) -> None:
    """Child: one small SGEMM on the kernels OpenBLAS picked; prints their name."""
    lib = ctypes.CDLL(str(library))
    lib.openblas_get_corename.restype = ctypes.c_char_p
    n = 96
    matrix = ctypes.c_float * (n * n)
    a = matrix(*[((i * 7) % 13) / 13.0 for i in range(n * n)])
    b = matrix(*[((i * 5) % 11) / 11.0 for i in range(n * n)])
    c = matrix()
    row_major, no_trans = 101, 111
    lib.cblas_sgemm(row_major, no_trans, no_trans, n, n, n, ctypes.c_float(1.0), a, n, b, n,
                    ctypes.c_float(0.0), c, n)
    print(lib.openblas_get_corename().decode())


def normalized(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def library_of(path: str) -> Path | None:
    """`path` itself when it is an OpenBLAS library, else the one it loads."""
    return Path(path).resolve() if built_cores(Path(path)) else openblas_of(path)


def probe_core(library: Path, core: str) -> str | None:
    """None when this CPU runs `core`'s kernels; else why not."""
    env = dict(os.environ, OPENBLAS_CORETYPE=core)
    child = subprocess.run([sys.executable, __file__, "probe", str(library)], env=env,
                           capture_output=True, text=True, check=False)
    if child.returncode == -signal.SIGILL:
        return "this CPU cannot execute its kernels"
    if child.returncode != 0:
        return f"the probe failed ({child.returncode}): {child.stderr.strip()}"
    if normalized(child.stdout.strip()) != normalized(core):
        return f"not selectable by name (OpenBLAS ran {child.stdout.strip()})"
    return None


def executable_cores(path: str, log=sys.stderr) -> list[str] | None:
    """The core types of the OpenBLAS at (or loaded by) `path` that this CPU
    runs; None where there is no OpenBLAS with several kernel sets."""
    library = library_of(path)
    if library is None:
        return None
    cores = built_cores(library)
    if len(cores) < 2:
        return None
    runnable = []
    for core in cores:
        why = probe_core(library, core)
        if why is None:
            runnable.append(core)
        else:
            print(f"openblas: {core}: {why}", file=log)
    return runnable


def run_under(core: str, binary: str, args: list[str]) -> int:
    """`binary` with OpenBLAS's `core` kernels; skipped where this CPU cannot."""
    library = openblas_of(binary)
    if library is None or len(built_cores(library)) < 2:
        print(f"skipped: {binary} loads no OpenBLAS with several kernel sets")
        return SKIPPED
    why = probe_core(library, core)
    if why is not None:
        print(f"skipped: OpenBLAS {core}: {why}")
        return SKIPPED
    print(f"openblas: running {binary} under {core}", flush=True)
    os.execvpe(binary, [binary, *args], dict(os.environ, OPENBLAS_CORETYPE=core))
    return 1


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "probe":
        probe(Path(argv[2]))
        return 0
    if len(argv) == 3 and argv[1] == "list":
        cores = executable_cores(argv[2])
        if cores is None:
            return SKIPPED
        print("\n".join(cores))
        return 0
    if len(argv) >= 4 and argv[1] == "run-under":
        return run_under(argv[2], argv[3], argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
