//===- BoundedQueue.h - A queue bounded by bytes ----------------*- C++ -*-===//
//
// Work handed from one stage of a pipeline to the threads of the next,
// bounded by the bytes of the items queued and being worked on: a producer
// that runs ahead waits for room (back-pressure) instead of growing memory.
// An item bigger than the whole budget is still taken when nothing else is
// held, so a pipeline never deadlocks on one large item. Items report their
// size with `size_t bytes() const`.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_BOUNDEDQUEUE_H
#define KVC_RUNTIME_BASE_BOUNDEDQUEUE_H

#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>

namespace kvc {

template <typename Item> class BoundedQueue {
public:
  explicit BoundedQueue(size_t budgetBytes) : budget_(budgetBytes) {}

  /// Waits for room, then queues `item`; returns the seconds waited.
  double push(Item item) {
    std::unique_lock<std::mutex> lock(mutex_);
    Clock::time_point start = Clock::now();
    const size_t bytes = item.bytes();
    room_.wait(lock, [&] { return held_ == 0 || held_ + bytes <= budget_; });
    double waited = secondsSince(start);
    held_ += bytes;
    peak_ = std::max(peak_, held_);
    items_.push_back(std::move(item));
    ready_.notify_one();
    return waited;
  }

  /// The next item, or false once closed and drained. The item's bytes
  /// stay held until done().
  bool pop(Item &item) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty() || closed_; });
    if (items_.empty())
      return false;
    item = std::move(items_.front());
    items_.pop_front();
    return true;
  }

  /// A popped item of `bytes` is finished with.
  void done(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    held_ -= bytes;
    room_.notify_all();
  }

  /// No more items: pop() returns false once the queue drains.
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    ready_.notify_all();
  }

  /// The most bytes held at once.
  size_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

private:
  size_t budget_, held_ = 0, peak_ = 0;
  bool closed_ = false;
  std::mutex mutex_;
  std::condition_variable room_, ready_;
  std::deque<Item> items_;
};

} // namespace kvc

#endif // KVC_RUNTIME_BASE_BOUNDEDQUEUE_H
