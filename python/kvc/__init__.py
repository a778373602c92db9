"""kvc: KV-cache restores, saves and transfers planned by a compiler, for
LLM servers.

The package binds kvc's C++ host library:

- :class:`Connector` is what a server calls per request: what the stores
  hold, whether to load or recompute, loads into and saves out of the
  server's own paged KV memory (see :mod:`kvc.connector`);
- :func:`compile_restore` compiles the plans of a restore (the compiler in
  this process);
- :func:`run_tool` runs the tools' main jobs (``kvc-run``, ``kvc-opt``);
- :mod:`kvc.transformers` restores into a transformers ``DynamicCache``;
  :mod:`kvc.vllm` is a vLLM KV connector.
"""

from __future__ import annotations

from ._errors import Error
from . import _kvc
from .connector import (
    CacheLayout,
    Connector,
    Decision,
    Finished,
    Held,
    Lookup,
    Model,
    compile_restore,
    target_json,
    targets,
)
from .tools import run_tool, tool_path

__version__ = "0.6.0"

has_compiler: bool = _kvc.has_compiler
"""Whether this build plans in-process (else Connectors take bundles)."""
has_cuda: bool = _kvc.has_cuda
"""Whether this build carries the CUDA backend."""


def set_compute_threads(threads: int) -> None:
    """Threads kvc's CPU model computation uses (default 1)."""
    if threads <= 0:
        raise Error("threads must be positive", "invalid_argument")
    _kvc.set_compute_threads(threads)


__all__ = [
    "CacheLayout",
    "Connector",
    "Decision",
    "Error",
    "Finished",
    "Held",
    "Lookup",
    "Model",
    "compile_restore",
    "has_compiler",
    "has_cuda",
    "run_tool",
    "set_compute_threads",
    "target_json",
    "targets",
    "tool_path",
]
