//===- ParallelCopy.h - Host copies split across a few threads --*- C++ -*-===//
//
// One thread copies host memory at a fraction of what the memory system
// moves: an upload that stages a pageable chunk into pinned memory before
// its DMA is held to that thread's rate. CopyWorkers splits a large copy
// into slices copied at once by its workers and the caller. Callers take
// turns (the workers serve one copy at a time, which has the memory system
// to itself anyway); a copy below kMinSplit bytes runs on the caller alone.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_PARALLELCOPY_H
#define KVC_RUNTIME_BASE_PARALLELCOPY_H

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc {

class CopyWorkers {
public:
  /// Copies smaller than this are not split.
  static constexpr std::size_t kMinSplit = std::size_t(1) << 20;

  /// `workers` threads beside the caller (0: the caller copies alone); a
  /// thread the system cannot start leaves fewer.
  explicit CopyWorkers(int workers);
  ~CopyWorkers();
  CopyWorkers(const CopyWorkers &) = delete;
  CopyWorkers &operator=(const CopyWorkers &) = delete;

  /// memcpy(dst, src, bytes), in slices on the workers and the caller.
  void copy(void *dst, const void *src, std::size_t bytes);

  int workers() const { return int(threads_.size()); }

private:
  void run(int index);

  std::mutex turn_; ///< One copy at a time.
  std::mutex mutex_;
  std::condition_variable start_, done_;
  char *dst_ = nullptr;
  const char *src_ = nullptr;
  std::size_t bytes_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

} // namespace kvc

#endif // KVC_RUNTIME_BASE_PARALLELCOPY_H
