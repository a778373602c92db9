//===- HostWorkers.h - Host work split across a few threads -----*- C++ -*-===//
//
// One thread moves host memory at a fraction of what the memory system
// does: an upload that stages a pageable chunk into pinned memory before
// its DMA, or a restore that checks and decodes a raw chunk's objects on
// its upload lane, is held to that thread's rate. HostWorkers runs such
// work on its threads and the caller at once: `forEach` hands out the
// items of one job, `copy` is a memcpy in slices.
//
// One job holds the workers at a time. A caller that finds them busy with
// another's job runs its own items alone rather than wait: never slower
// than without the workers, and no caller waits on another's work.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_HOSTWORKERS_H
#define KVC_RUNTIME_BASE_HOSTWORKERS_H

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc {

class HostWorkers {
public:
  /// Copies smaller than this are not split.
  static constexpr std::size_t kMinSplit = std::size_t(1) << 20;

  /// `workers` threads beside the caller (0: the caller works alone); a
  /// thread the system cannot start leaves fewer.
  explicit HostWorkers(int workers);
  ~HostWorkers();
  HostWorkers(const HostWorkers &) = delete;
  HostWorkers &operator=(const HostWorkers &) = delete;

  /// `item(i)` for every i in [0, count), each once, on the workers and
  /// the caller; returns when all have run. `item` must be safe to run
  /// for distinct i at once and must not throw.
  void forEach(std::size_t count, const std::function<void(std::size_t)> &item);

  /// memcpy(dst, src, bytes), in slices.
  void copy(void *dst, const void *src, std::size_t bytes);

  int workers() const { return int(threads_.size()); }

private:
  void run();
  /// Runs the current job's items until none is left.
  void work();

  std::mutex turn_; ///< Held by the caller whose job the workers run.
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(std::size_t)> *job_ = nullptr;
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

/// The process's workers for a restore's host work (a chunk's objects
/// checked and decoded at once): one thread per core beyond the first, at
/// most 7. Made on first use and never destroyed.
HostWorkers &hostWorkers();

} // namespace kvc

#endif // KVC_RUNTIME_BASE_HOSTWORKERS_H
