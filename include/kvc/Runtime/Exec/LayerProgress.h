//===- LayerProgress.h - Layer-wise completion of a restore -----*- C++ -*-===//
//
// Which layers of a restore are in the paged cache. The executor counts
// every chunk it writes (scatters, computed chunks, recomputed fallbacks)
// against it, and a caller waits for layer i while later layers still load:
// what a server needs to overlap a restore with its forward pass (layer i's
// attention may start once layer i's KV is resident). A prefill filling a
// cache that a save reads counts its chunks in one too, and the save's
// gathers wait for their tokens (waitTokens).
//
// A layer is complete once every token of it has been written; plans write
// each (token, layer) exactly once (the executor checks that before it
// starts), and the moment the last of them is counted is kept
// (completedAt: the executor reports it as RestoreMetrics::layerReadySeconds).
// A device's calls may return before their work is done (the CUDA device
// orders its streams by events): a write counted with a `settle` function
// completes a layer only once `settle` has waited for the device, so that a
// layer reported complete (wait, whenReady) is in the cache. Token counts
// (waitTokens) are of writes enqueued, for readers that are ordered after
// them on the device (a save kernel reading a prefill's layers).
// finish() ends the restore: on success every layer is complete,
// on failure every waiter wakes with the restore's error. Thread-safe; it
// outlives the restore it watches.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_EXEC_LAYERPROGRESS_H
#define KVC_RUNTIME_EXEC_LAYERPROGRESS_H

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Status.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace kvc {

class LayerProgress {
public:
  LayerProgress() = default;
  LayerProgress(const LayerProgress &) = delete;
  LayerProgress &operator=(const LayerProgress &) = delete;
  /// Runs the whenReady callbacks still waiting: nothing is left waiting on
  /// a progress that is gone.
  ~LayerProgress();
  /// Expects `tokens` tokens in each of `layers` layers; forgets anything
  /// counted before.
  void reset(int64_t layers, int64_t tokens);

  /// Counts `tokens` tokens of layers [layerBegin, layerEnd) as written.
  void add(int64_t layerBegin, int64_t layerEnd, int64_t tokens);
  /// The same for writes a device may still be doing: when the count
  /// completes a layer, `settle` (Device::settle) runs first, outside the
  /// lock, and the layer completes only if it succeeds (its error is
  /// returned; the restore then fails and finish() wakes the waiters).
  Status add(int64_t layerBegin, int64_t layerEnd, int64_t tokens,
             const std::function<Status()> &settle);

  /// Ends the restore with `status`.
  void finish(const Status &status);

  /// Blocks until `layer` is complete (ok) or the restore failed (its
  /// error); a wait before the restore started waits for it to start.
  /// InvalidArgument for a layer the restore does not have; Unavailable
  /// when `timeout` passes first.
  Status
  wait(int64_t layer,
       std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;

  /// Blocks until `layer` holds `tokens` tokens, as wait() does: for a
  /// writer that writes in token order (a prefill), until its tokens
  /// [0, tokens) are written.
  Status waitTokens(
      int64_t layer, int64_t tokens,
      std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;
  /// Whether `layer` is complete now (holds `tokens` tokens, when not
  /// negative: written, not necessarily settled).
  bool ready(int64_t layer, int64_t tokens = -1) const;

  /// Runs `then` once, when `layer` is complete or the restore has ended
  /// (on error too, and for a layer the restore does not have): at once if
  /// so already, else on the thread whose write or end makes it so. For
  /// what must never be left waiting, such as a device stream a server's
  /// forward pass runs on (Device::streamWait); `then` must be quick and
  /// must not call back into this progress.
  void whenReady(int64_t layer, std::function<void()> then);

  /// When the write that completed `layer` was counted, if one has (not
  /// set by finish()).
  std::optional<Clock::time_point> completedAt(int64_t layer) const;

  /// Per layer, seconds from `begin` to when it completed; `end` (where a
  /// finished restore wakes its waiters) for a layer its writes did not
  /// complete.
  std::vector<double> readySeconds(Clock::time_point begin, double end) const;

private:
  /// `tokens` < 0: all of them.
  bool readyLocked(int64_t layer, int64_t tokens = -1) const;
  /// Takes the whenReady callbacks now due.
  std::vector<std::function<void()>> dueLocked();
  /// Notifies the waiters and runs `due`, outside the lock.
  void changed(std::vector<std::function<void()>> due);

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::vector<int64_t> written_;
  /// Set when a layer completes (settled, where its writes needed it).
  std::vector<std::optional<Clock::time_point>> completed_;
  /// Layers whose completing write is settling.
  std::vector<bool> settling_;
  int64_t tokens_ = 0;
  bool started_ = false;
  std::optional<Status> finished_;
  std::vector<std::pair<int64_t, std::function<void()>>> whenReady_;
};

/// Runs `run(progress)` (a restore or a receive of `layers` x `tokens`)
/// with a progress reset before and finished with its status after, so that
/// waiters wake on success and on error alike: the caller's `progress` when
/// given, else one of its own, so that the run measures when its layers
/// complete either way.
template <typename Run>
auto trackProgress(LayerProgress *progress, int64_t layers, int64_t tokens,
                   Run run) -> decltype(run(*progress)) {
  LayerProgress own;
  LayerProgress &used = progress ? *progress : own;
  used.reset(layers, tokens);
  auto result = run(used);
  used.finish(result.status());
  return result;
}

} // namespace kvc

#endif // KVC_RUNTIME_EXEC_LAYERPROGRESS_H
