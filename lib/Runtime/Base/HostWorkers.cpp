//===- HostWorkers.cpp - Host work split across a few threads -------------===//

#include "kvc/Runtime/Base/HostWorkers.h"

#include <algorithm>
#include <cstring>
#include <system_error>

namespace kvc {

HostWorkers::HostWorkers(int workers) {
  for (int i = 0; i < workers; ++i) {
    try {
      threads_.emplace_back([this] { run(); });
    } catch (const std::system_error &) {
      break; // Fewer workers: the jobs still run, on fewer threads.
    }
  }
}

HostWorkers::~HostWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread &thread : threads_)
    thread.join();
}

void HostWorkers::work() {
  for (std::size_t i; (i = next_.fetch_add(1)) < count_;)
    (*job_)(i);
}

void HostWorkers::run() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_)
        return;
      seen = generation_;
    }
    work();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0)
      done_.notify_one();
  }
}

void HostWorkers::forEach(std::size_t count,
                          const std::function<void(std::size_t)> &item) {
  std::unique_lock<std::mutex> turn(turn_, std::defer_lock);
  if (threads_.empty() || count < 2 || !turn.try_lock()) {
    for (std::size_t i = 0; i < count; ++i)
      item(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &item;
    count_ = count;
    next_.store(0);
    pending_ = workers();
    ++generation_;
  }
  start_.notify_all();
  work();
  // Every worker has left the job before it goes out of scope.
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

void HostWorkers::copy(void *dst, const void *src, std::size_t bytes) {
  if (bytes == 0)
    return; // memcpy's pointers must be valid even then; an empty one's not.
  const std::size_t parts = bytes < kMinSplit ? 1 : std::size_t(workers()) + 1;
  // Slices on 64-byte boundaries.
  const std::size_t per = ((bytes + parts - 1) / parts + 63) & ~std::size_t(63);
  forEach(parts, [&](std::size_t part) {
    const std::size_t begin = std::min(bytes, per * part),
                      end = std::min(bytes, begin + per);
    if (end > begin)
      std::memcpy(static_cast<char *>(dst) + begin,
                  static_cast<const char *>(src) + begin, end - begin);
  });
}

HostWorkers &hostWorkers() {
  static HostWorkers &workers = *new HostWorkers(
      int(std::min(7u, std::max(1u, std::thread::hardware_concurrency()) - 1)));
  return workers;
}

} // namespace kvc
