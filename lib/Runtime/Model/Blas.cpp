//===- Blas.cpp - The CPU backend's BLAS: threads and kernels -------------===//

#include "kvc/Runtime/Model/Blas.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

namespace kvc {

void setComputeThreads(int threads) {
  openblas_set_num_threads(std::max(threads, 1));
}

BlasKernels blasKernels() {
  BlasKernels kernels;
  if (const char *name = openblas_get_corename())
    kernels.core = name;
  std::string lower = kernels.core;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  kernels.generic = lower == "prescott";
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    kernels.cpuVectors = "AVX-512";
    kernels.better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    kernels.cpuVectors = "AVX2";
    kernels.better = __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  }
#endif
  return kernels;
}

double measureGemmGflops() {
  constexpr int n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  gemm(); // Warm: the thread pool and the pages.
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    auto start = std::chrono::steady_clock::now();
    gemm();
    std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - start;
    best = std::max(best, 2.0 * n * n * n / took.count() / 1e9);
  }
  return best;
}

std::optional<std::string> slowBlasWarning() {
  static std::once_flag once;
  std::optional<std::string> warning;
  std::call_once(once, [&] {
    BlasKernels kernels = blasKernels();
    if (!kernels.generic || kernels.cpuVectors.empty())
      return;
    char text[512];
    std::snprintf(
        text, sizeof(text),
        "OpenBLAS runs its generic %s kernels (SSE3; it picks them for a "
        "CPU it does not recognise) although this CPU has %s: GEMMs at "
        "%.1f GFLOP/s here. "
        "Set OPENBLAS_CORETYPE=%s to use its %s kernels (docs/executor.md, "
        "\"OpenBLAS's kernels\").",
        kernels.core.c_str(), kernels.cpuVectors.c_str(), measureGemmGflops(),
        kernels.better.c_str(), kernels.cpuVectors.c_str());
    warning = text;
  });
  return warning;
}

} // namespace kvc
