//===- MachinePhases.cpp - Does this machine's speed hold still? ----------===//
//
// kvc-machine-phases [SECONDS]: times three fixed workloads back to back for
// SECONDS (default 60) on one thread — the CPU backend's GEMM (OpenBLAS,
// one thread, the demo model's 256 x 256 x 688 MLP shape, 20 calls), a
// scalar integer loop and a 64 MiB memcpy — and prints, per workload, the
// fastest, median and slowest timing and the share of timings more than
// 20% over the fastest. On the development VM the GEMM alone runs in slow
// phases of a second to minutes (docs/results.md): a shared host's load
// that cost model, calibration and comparisons have to live with.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn> double millis(Fn fn) {
  Clock::time_point start = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
      .count();
}

void summarize(const char *name, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  double fastest = ms.front();
  std::size_t slow = std::count_if(ms.begin(), ms.end(), [&](double t) {
    return t > 1.2 * fastest;
  });
  std::printf("%-8s %8.2f %8.2f %8.2f %10.0f%%\n", name, fastest,
              ms[ms.size() / 2], ms.back(), 100.0 * slow / ms.size());
}

} // namespace

int main(int argc, char **argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 60;
  kvc::setComputeThreads(1);
  const int m = 256, k = 256, n = 688;
  std::vector<float> a(m * k, 0.5f), b(n * k, 0.25f), c(m * n);
  std::vector<char> from(size_t(64) << 20, 1), to(from.size());
  std::vector<double> gemm, scalar, copy;
  Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(seconds));
  volatile unsigned sink = 0;
  while (Clock::now() < end) {
    gemm.push_back(millis([&] {
      for (int i = 0; i < 20; ++i)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f,
                    a.data(), k, b.data(), k, 0.0f, c.data(), n);
    }));
    scalar.push_back(millis([&] {
      unsigned x = sink;
      for (int i = 0; i < 4000000; ++i)
        x = x * 1664525u + 1013904223u;
      sink = x;
    }));
    copy.push_back(
        millis([&] { std::memcpy(to.data(), from.data(), from.size()); }));
  }
  std::printf("%zu rounds in %.0f s, milliseconds per timing:\n", gemm.size(),
              seconds);
  std::printf("%-8s %8s %8s %8s %11s\n", "workload", "fastest", "median",
              "slowest", ">1.2x fast");
  summarize("gemm", gemm);
  summarize("scalar", scalar);
  summarize("memcpy", copy);
  return 0;
}
