//===- HostWorkersTest.cpp - Host work split across threads ---------------===//

#include "kvc/Runtime/Base/HostWorkers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <chrono>
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

TEST(HostWorkersTest, EverySizeCopiesEveryByte) {
  for (int workers : {0, 1, 3, 7}) {
    HostWorkers copier(workers);
    EXPECT_EQ(copier.workers(), workers);
    // Small copies, the split threshold and sizes that slice unevenly
    // (the last slice short, or slices past the end empty).
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(4097),
                          HostWorkers::kMinSplit - 1, HostWorkers::kMinSplit,
                          HostWorkers::kMinSplit * 3 + 194,
                          HostWorkers::kMinSplit * 8 + 7}) {
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

TEST(HostWorkersTest, CallersFromManyThreadsCopyAtOnce) {
  HostWorkers copier(3);
  const std::size_t n = HostWorkers::kMinSplit * 2 + 77;
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

TEST(HostWorkersTest, ForEachRunsEveryItemOnce) {
  for (int workers : {0, 1, 3}) {
    HostWorkers pool(workers);
    for (std::size_t count : {0, 1, 2, 5, 64, 1000}) {
      std::vector<std::atomic<int>> runs(count);
      pool.forEach(count, [&](std::size_t i) { runs[i].fetch_add(1); });
      for (std::size_t i = 0; i < count; ++i)
        EXPECT_EQ(runs[i].load(), 1)
            << workers << " workers, item " << i << " of " << count;
    }
  }
}

TEST(HostWorkersTest, TheWorkersTakeItemsBesideTheCaller) {
  // Items that wait for each other finish only when they run at once: the
  // caller alone would hold the first until the timeout.
  HostWorkers pool(1);
  std::atomic<int> started{0};
  std::atomic<bool> together{true};
  pool.forEach(2, [&](std::size_t) {
    started.fetch_add(1);
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2)
      if (std::chrono::steady_clock::now() > until) {
        together = false;
        return;
      }
  });
  EXPECT_TRUE(together.load());
}

TEST(HostWorkersTest, ACallerFindingTheWorkersBusyRunsItsOwnItems) {
  HostWorkers pool(2);
  std::atomic<bool> release{false};
  std::atomic<int> inside{0};
  std::thread holder([&] {
    pool.forEach(3, [&](std::size_t) {
      inside.fetch_add(1);
      while (!release.load())
        std::this_thread::yield();
    });
  });
  while (inside.load() < 3)
    std::this_thread::yield();
  // The workers are all held: this job runs on its caller, and returns.
  std::vector<int> ran(4, 0);
  pool.forEach(4, [&](std::size_t i) { ran[i] = 1; });
  EXPECT_EQ(ran, std::vector<int>(4, 1));
  release = true;
  holder.join();
}

} // namespace
