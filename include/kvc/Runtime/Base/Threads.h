//===- Threads.h - Starting the runtime's worker threads --------*- C++ -*-===//
//
// Worker counts come from callers (a save's writers, a receiver's decoders,
// a plan's lanes) and threads come from the system: a count no machine
// needs is refused before any thread starts, and a thread the system cannot
// start is an error, not std::thread's exception.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_THREADS_H
#define KVC_RUNTIME_BASE_THREADS_H

#include "kvc/Runtime/Base/Status.h"

#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace kvc {

/// The most workers one pool, a save's writers or a receiver's decoders may
/// have.
constexpr int64_t kMaxWorkers = 1024;

/// InvalidArgument unless 1 <= `count` <= kMaxWorkers; `what` names whose
/// workers they are ("resource \"decode\"", "save").
inline Status checkWorkers(const std::string &what, int64_t count) {
  if (count >= 1 && count <= kMaxWorkers)
    return Status::ok();
  return invalidArgument(what + ": " + std::to_string(count) +
                         " workers (expected 1 to " +
                         std::to_string(kMaxWorkers) + ")");
}

/// A thread running `fn(args...)`; Unavailable when the system cannot
/// start one.
template <typename Fn, typename... Args>
StatusOr<std::thread> startThread(Fn &&fn, Args &&...args) {
  try {
    return std::thread(std::forward<Fn>(fn), std::forward<Args>(args)...);
  } catch (const std::system_error &e) {
    return unavailable(std::string("cannot start a thread: ") + e.what());
  }
}

/// The same, appended to `threads`.
template <typename Fn, typename... Args>
Status startThread(std::vector<std::thread> &threads, Fn &&fn, Args &&...args) {
  KVC_ASSIGN_OR_RETURN(
      thread, startThread(std::forward<Fn>(fn), std::forward<Args>(args)...));
  threads.push_back(std::move(thread));
  return Status::ok();
}

/// Starts `count` threads running `fn` (a queue's consumers) into
/// `threads`; when one cannot start, calls `stop` (which must make the
/// started ones return, as closing their queue does), joins them and
/// returns why.
template <typename Fn, typename Stop>
Status startWorkers(std::vector<std::thread> &threads, int64_t count,
                    const Fn &fn, Stop &&stop) {
  for (int64_t i = 0; i < count; ++i) {
    Status started = startThread(threads, fn);
    if (!started.isOk()) {
      stop();
      for (std::thread &thread : threads)
        thread.join();
      threads.clear();
      return started;
    }
  }
  return Status::ok();
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_THREADS_H
