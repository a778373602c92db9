//===- MemoryLink.h - An in-process link for tests --------------*- C++ -*-===//
//
// Two ends of a Link in one process, for transfer tests that run the sender
// in a thread instead of a child process (no UCX), and for the transfer
// fuzzer, which queues a sender's messages, mutated, for a receiver.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TESTING_MEMORYLINK_H
#define KVC_TESTING_MEMORYLINK_H

#include "kvc/Runtime/Net/Link.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace kvc {

/// One end of an in-process link: it sends into `out` and receives from
/// `in` (the other end's `out`).
class MemoryLink final : public Link {
public:
  struct Queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::string> messages;
    bool closed = false;
  };
  MemoryLink(std::shared_ptr<Queue> in, std::shared_ptr<Queue> out)
      : in_(std::move(in)), out_(std::move(out)) {}

  /// Two ends of one link.
  static std::pair<MemoryLink, MemoryLink> pair() {
    auto a = std::make_shared<Queue>(), b = std::make_shared<Queue>();
    return {MemoryLink(a, b), MemoryLink(b, a)};
  }
  Status send(std::string_view message) override {
    std::lock_guard<std::mutex> lock(out_->mutex);
    out_->messages.emplace_back(message);
    out_->ready.notify_all();
    return Status::ok();
  }
  StatusOr<std::string> receive(Milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(in_->mutex);
    if (!in_->ready.wait_for(lock, timeout, [&] {
          return !in_->messages.empty() || in_->closed;
        }))
      return unavailable("memory link: timed out");
    if (in_->messages.empty())
      return unavailable("memory link: the peer hung up");
    std::string message = std::move(in_->messages.front());
    in_->messages.pop_front();
    return message;
  }
  std::string describe() const override { return "memory"; }
  /// Hangs up: the peer's receives fail once it has read what was sent.
  void close() {
    std::lock_guard<std::mutex> lock(out_->mutex);
    out_->closed = true;
    out_->ready.notify_all();
  }

private:
  std::shared_ptr<Queue> in_, out_;
};

} // namespace kvc

#endif // KVC_TESTING_MEMORYLINK_H
