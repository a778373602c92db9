//===- ParallelCopy.cpp - Host copies split across a few threads ----------===//

#include "kvc/Runtime/Base/ParallelCopy.h"

#include <algorithm>
#include <cstring>
#include <system_error>

namespace kvc {

namespace {

/// Slice `index` of `parts` of [0, bytes), on 64-byte boundaries.
std::pair<std::size_t, std::size_t> slice(std::size_t bytes, int parts,
                                          int index) {
  const std::size_t per =
      ((bytes + std::size_t(parts) - 1) / std::size_t(parts) + 63) &
      ~std::size_t(63);
  const std::size_t begin = std::min(bytes, per * std::size_t(index));
  return {begin, std::min(bytes, begin + per)};
}

} // namespace

CopyWorkers::CopyWorkers(int workers) {
  for (int i = 0; i < workers; ++i) {
    try {
      threads_.emplace_back([this, i] { run(i); });
    } catch (const std::system_error &) {
      break; // Fewer workers: the copies still run, on fewer threads.
    }
  }
}

CopyWorkers::~CopyWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread &thread : threads_)
    thread.join();
}

void CopyWorkers::run(int index) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_)
      return;
    seen = generation_;
    char *dst = dst_;
    const char *src = src_;
    const auto [begin, end] = slice(bytes_, workers() + 1, index + 1);
    lock.unlock();
    if (end > begin)
      std::memcpy(dst + begin, src + begin, end - begin);
    lock.lock();
    if (--pending_ == 0)
      done_.notify_one();
  }
}

void CopyWorkers::copy(void *dst, const void *src, std::size_t bytes) {
  if (bytes == 0)
    return; // memcpy's pointers must be valid even then; an empty one's not.
  if (threads_.empty() || bytes < kMinSplit) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::lock_guard<std::mutex> turn(turn_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dst_ = static_cast<char *>(dst);
    src_ = static_cast<const char *>(src);
    bytes_ = bytes;
    pending_ = workers();
    ++generation_;
  }
  start_.notify_all();
  const auto [begin, end] = slice(bytes, workers() + 1, 0);
  std::memcpy(static_cast<char *>(dst) + begin,
              static_cast<const char *>(src) + begin, end - begin);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

} // namespace kvc
