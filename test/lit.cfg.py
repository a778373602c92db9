# -*- Python -*-
# lit configuration of the kvc regression tests.

import os
import shutil

import lit.formats
from lit.llvm import llvm_config

config.name = "KVC"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.kvc_obj_root, "test")

llvm_config.with_system_environment(["HOME", "TMP", "TEMP"])
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.use_default_substitutions()

config.substitutions.append(("%kvc_src", config.kvc_src_root))
config.substitutions.append(("%kvc_obj", config.kvc_obj_root))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
config.substitutions.append(("%python", config.python_executable))

llvm_config.add_tool_substitutions(
    ["kvc-opt", "kvc-run", "kvc-kernel-count", "kvc-embed-example", "not"], [config.kvc_tools_dir, config.llvm_tools_dir])

# util-linux's `script` runs a command on a pseudo-terminal.
if shutil.which("script"):
    config.available_features.add("script")

if config.ptxas and os.path.exists(config.ptxas):
    config.available_features.add("ptxas")
    config.substitutions.append(("%ptxas", config.ptxas))

# kvc-kernel-bench and a libcuda.so.1 whose kernels run in the PTX
# interpreter (lib/Testing/EmulatedCuda.cpp).
emulated_cuda = os.path.join(config.kvc_obj_root, "lib", "emulated-cuda")
kernel_bench = os.path.join(config.kvc_obj_root, "bench", "kvc-kernel-bench")
if os.path.exists(os.path.join(emulated_cuda, "libcuda.so.1")) and os.path.exists(kernel_bench):
    config.available_features.add("emulated-cuda")
    config.substitutions.append(("%emulated_cuda", emulated_cuda))
    config.substitutions.append(("%kernel_bench", kernel_bench))

# The trained stories260K checkpoint (KVC_MODELS_DIR), read where it is.
stories = os.path.join(config.kvc_models, "stories260K")
if os.path.exists(os.path.join(stories, "stories260K.bin")):
    config.available_features.add("stories260k")
    config.substitutions.append(("%stories", stories))

# A CPU with AVX2 (and FMA): OpenBLAS's generic kernels then run below what
# the CPU could, which kvc-run says (test/Runtime/slow-blas.test).
try:
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next((l.split(":", 1)[1].split() for l in cpuinfo
                      if l.startswith("flags")), [])
    if "avx2" in flags and "fma" in flags:
        config.available_features.add("avx2")
except OSError:
    pass
