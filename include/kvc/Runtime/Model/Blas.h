//===- Blas.h - The CPU backend's BLAS: threads and kernels -----*- C++ -*-===//
//
// The CPU backend's GEMMs run on OpenBLAS. Debian's OpenBLAS holds one kernel
// set per CPU family and picks one from the CPU's name when it loads; a CPU it
// does not recognise (a VM that calls itself only "Intel(R) Xeon(R)
// Processor") gets the generic Prescott kernels, SSE3 only, several times
// slower than the AVX2 or AVX-512 kernels the CPU could run. Nothing fails,
// so kvc-run says so (slowBlasWarning) where a timing depends on it.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_BLAS_H
#define KVC_RUNTIME_MODEL_BLAS_H

#include <optional>
#include <string>

namespace kvc {

/// Threads the CPU backend's GEMMs use, process-wide (OpenBLAS's pool).
/// kvc-run sets 1 unless told otherwise: the compute "device" is then one
/// core and the host-side workers (IO lanes, decoding, copies) have the
/// others, as a GPU's host has its CPU. Spread over every core, GEMMs
/// competed with those workers (OpenBLAS's idle threads spin in
/// sched_yield) and their speed swung with a second core's availability on
/// a shared machine: docs/executor.md, "The CPU backend's compute device".
void setComputeThreads(int threads);

/// The kernel set OpenBLAS runs and what this CPU could run instead.
struct BlasKernels {
  /// OpenBLAS's name of the kernel set it picked ("haswell", "prescott").
  std::string core;
  /// Whether that is the generic fallback of an unrecognised CPU.
  bool generic = false;
  /// The widest vector extension this CPU has ("AVX-512", "AVX2"), empty if
  /// neither.
  std::string cpuVectors;
  /// The kernel set to force for it (OPENBLAS_CORETYPE), empty if none.
  std::string better;
};

/// What OpenBLAS runs on this CPU.
BlasKernels blasKernels();

/// The fp32 GEMM rate of the current kernels and threads, GFLOP/s, over a
/// 512-cubed GEMM (a few milliseconds at the generic kernels' rate).
double measureGemmGflops();

/// A sentence for the user when OpenBLAS runs its generic kernels on a CPU
/// with AVX2 or AVX-512: the rate it measured and how to choose a kernel set.
/// Measured and returned once a process; later calls return nothing.
std::optional<std::string> slowBlasWarning();

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_BLAS_H
