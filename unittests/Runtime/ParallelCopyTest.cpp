//===- ParallelCopyTest.cpp - Host copies split across threads ------------===//

#include "kvc/Runtime/Base/ParallelCopy.h"

#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

using namespace kvc;

namespace {

std::vector<uint8_t> bytesOf(std::size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = uint8_t(i * 131 + seed + (i >> 12));
  return out;
}

TEST(ParallelCopyTest, EverySizeCopiesEveryByte) {
  for (int workers : {0, 1, 3, 7}) {
    CopyWorkers copier(workers);
    EXPECT_EQ(copier.workers(), workers);
    // Small copies, the split threshold and sizes that slice unevenly
    // (the last slice short, or slices past the end empty).
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(4097),
                          CopyWorkers::kMinSplit - 1, CopyWorkers::kMinSplit,
                          CopyWorkers::kMinSplit * 3 + 194,
                          CopyWorkers::kMinSplit * 8 + 7}) {
      const std::vector<uint8_t> src = bytesOf(n, uint8_t(n));
      std::vector<uint8_t> dst(n + 64, 0xee);
      copier.copy(dst.data(), src.data(), n);
      EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin()))
          << workers << " workers, " << n << " bytes";
      EXPECT_TRUE(std::all_of(dst.begin() + n, dst.end(),
                              [](uint8_t b) { return b == 0xee; }))
          << "wrote past " << n << " bytes";
    }
  }
}

TEST(ParallelCopyTest, CallersFromManyThreadsTakeTurns) {
  CopyWorkers copier(3);
  const std::size_t n = CopyWorkers::kMinSplit * 2 + 77;
  std::vector<std::vector<uint8_t>> sources, targets(6);
  for (int t = 0; t < 6; ++t)
    sources.push_back(bytesOf(n, uint8_t(t * 29)));
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      targets[t].assign(n, 0);
      for (int round = 0; round < 5; ++round)
        copier.copy(targets[t].data(), sources[t].data(), n);
    });
  for (std::thread &thread : threads)
    thread.join();
  for (int t = 0; t < 6; ++t)
    EXPECT_EQ(targets[t], sources[t]) << "caller " << t;
}

} // namespace
