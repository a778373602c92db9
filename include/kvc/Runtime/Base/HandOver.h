//===- HandOver.h - Values handed from producers to takers ------*- C++ -*-===//
//
// A bounded hand-over between threads where the taker names what it wants:
// a prefill hands a save plan's gathers the objects it computes
// (PrefillSnapshots, SavePlan.h), a transfer's link hands a receive plan's
// recvs the objects that arrive (Transfer.cpp). Producers wait for room
// while the held values exceed the budget, unless a taker waits for a key
// still to come: then holding more is the way forward, so takers that take
// in another order than producers produce never deadlock; they only hold
// more. Once finished, puts are dropped and takers of keys never handed
// over are told why. Thread-safe.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_HANDOVER_H
#define KVC_RUNTIME_BASE_HANDOVER_H

#include "kvc/Runtime/Base/Status.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace kvc {

template <typename Key, typename Value> class HandOver {
public:
  explicit HandOver(size_t budgetBytes) : budget_(budgetBytes) {}

  /// Keeps `value`, of `bytes`, under `key` until taken, once there is
  /// room; replaces a value not yet taken. Dropped after finish().
  void put(const Key &key, Value value, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    room_.wait(lock, [&] {
      return held_ == 0 || held_ + bytes <= budget_ || waiting_ > 0 ||
             finished_;
    });
    if (finished_)
      return; // No taker will take it.
    auto [it, inserted] = kept_.try_emplace(key);
    if (!inserted)
      held_ -= it->second.second;
    it->second = {std::move(value), bytes};
    held_ += bytes;
    changed_.notify_all();
  }

  /// `key` will not be handed over: its taker gets `why`.
  void fail(const Key &key, Status why) {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_.insert_or_assign(key, std::move(why));
    changed_.notify_all();
  }

  /// Waits for `key` and moves its value to `out`. Returns the key's
  /// failure (fail), or, when the hand-over finished without it, the
  /// finish's error, or `missing` when it finished well.
  Status take(const Key &key, Value &out, const Status &missing) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting_;
    room_.notify_all();
    changed_.wait(lock, [&] {
      return kept_.count(key) || failed_.count(key) || finished_;
    });
    --waiting_;
    auto kept = kept_.find(key);
    if (kept == kept_.end()) {
      auto failed = failed_.find(key);
      if (failed != failed_.end())
        return failed->second;
      return finished_->isOk() ? missing : *finished_;
    }
    out = std::move(kept->second.first);
    held_ -= kept->second.second;
    kept_.erase(kept);
    room_.notify_all();
    return Status::ok();
  }

  /// No more values: later puts are dropped, and takers of keys not handed
  /// over are told (values held stay to be taken). The first finish counts.
  void finish(const Status &status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!finished_)
      finished_ = status;
    changed_.notify_all();
    room_.notify_all();
  }

private:
  std::mutex mutex_;
  std::condition_variable changed_, room_;
  std::map<Key, std::pair<Value, size_t>> kept_;
  std::map<Key, Status> failed_;
  size_t held_ = 0;
  const size_t budget_;
  int waiting_ = 0;
  std::optional<Status> finished_;
};

} // namespace kvc

#endif // KVC_RUNTIME_BASE_HANDOVER_H
