//===- Saver.cpp - Saving a context's KV and hidden states ----------------===//

#include "kvc/Runtime/Save/Saver.h"

#include "kvc/Runtime/Base/Clock.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace kvc {

namespace {

struct Job {
  ChunkRef ref;
  std::vector<float> values;
  size_t bytes() const { return values.size() * sizeof(float); }
};

/// A queue bounded by the bytes of the jobs in it and being written.
class JobQueue {
public:
  explicit JobQueue(size_t budget) : budget_(budget) {}

  /// Waits for room, then queues; returns the seconds waited.
  double push(Job job) {
    std::unique_lock<std::mutex> lock(mutex_);
    Clock::time_point start = Clock::now();
    room_.wait(lock, [&] {
      return held_ == 0 || held_ + job.bytes() <= budget_;
    });
    double waited = secondsSince(start);
    held_ += job.bytes();
    peak_ = std::max(peak_, held_);
    jobs_.push_back(std::move(job));
    ready_.notify_one();
    return waited;
  }

  /// Next job, or false once closed and drained.
  bool pop(Job &job) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !jobs_.empty() || closed_; });
    if (jobs_.empty())
      return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
    return true;
  }

  /// A popped job's buffers are free again.
  void done(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    held_ -= bytes;
    room_.notify_all();
  }

  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    ready_.notify_all();
  }

  size_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

private:
  size_t budget_, held_ = 0, peak_ = 0;
  bool closed_ = false;
  std::mutex mutex_;
  std::condition_variable room_, ready_;
  std::deque<Job> jobs_;
};

} // namespace

StatusOr<SaveStats> saveContext(const LlamaModel &model, ChunkStore &store,
                                const std::vector<int32_t> &tokens,
                                const SaveOptions &options) {
  const ModelConfig &c = model.config();
  const StoreLayout &layout = store.layout();
  const int64_t n = int64_t(tokens.size());
  SaveStats stats;
  JobQueue queue(options.bufferBytes);
  std::mutex statsMutex;
  Status firstError;

  std::vector<std::thread> writers;
  if (!options.dryRun)
    for (int w = 0; w < std::max(1, options.writers); ++w)
      writers.emplace_back([&] {
        Job job;
        while (queue.pop(job)) {
          bool written = false;
          Status status = store.put(job.ref, job.values.data(), &written);
          size_t bytes = job.bytes();
          job.values = {};
          queue.done(bytes);
          std::lock_guard<std::mutex> lock(statsMutex);
          if (!status.isOk() && firstError.isOk())
            firstError = status;
          (written ? stats.written : stats.skipped) += 1;
        }
      });

  Clock::time_point start = Clock::now();
  LlamaModel::Cache cache = model.newCache();
  Status prefill;
  for (int64_t t0 = 0; t0 < n && prefill.isOk(); t0 += layout.chunkTokens) {
    int64_t t1 = std::min(n, t0 + layout.chunkTokens);
    int64_t count = t1 - t0;
    // The chunk's keys: the prefix up to and including this chunk.
    Digest key = store.keys().keys(tokens.data(), t1).back();
    // Per form, the layer group being filled.
    std::vector<Job> filling(options.forms.size());
    prefill = model.prefill(cache, tokens.data() + t0, count,
                            [&](const LayerSnapshot &s) {
      if (options.dryRun)
        return;
      int64_t group0 = s.layer / layout.layerGroup * layout.layerGroup;
      int64_t group1 = std::min(c.numLayers, group0 + layout.layerGroup);
      for (size_t f = 0; f < options.forms.size(); ++f) {
        Form form = options.forms[f];
        Job &job = filling[f];
        if (s.layer == group0) {
          job.ref = {key, form, t0, t1, group0, group1, options.codec};
          job.values.clear();
          job.values.reserve(store.shape(job.ref).numel());
        }
        int64_t width = form == Form::KV ? model.kvDim() : c.hiddenSize;
        if (form == Form::KV) {
          job.values.insert(job.values.end(), s.k, s.k + count * width);
          job.values.insert(job.values.end(), s.v, s.v + count * width);
        } else {
          job.values.insert(job.values.end(), s.hidden,
                            s.hidden + count * width);
        }
        if (s.layer + 1 == group1)
          stats.stallSeconds += queue.push(std::move(job));
      }
    });
    if (options.progress && prefill.isOk())
      options.progress(t1, n);
  }
  stats.prefillSeconds = secondsSince(start);
  queue.close();
  for (std::thread &t : writers)
    t.join();
  stats.totalSeconds = secondsSince(start);
  stats.peakBufferedBytes = queue.peak();
  KVC_RETURN_IF_ERROR(prefill);
  KVC_RETURN_IF_ERROR(firstError);
  return stats;
}

} // namespace kvc
