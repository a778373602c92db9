//===- DynamicCake.cpp - Cake's run-time merge point ----------------------===//

#include "kvc/Runtime/Exec/DynamicCake.h"

#include "PrefillState.h"

#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace kvc {

namespace {

/// The shared state of one walk: which chunks each side has claimed.
class Walk {
public:
  Walk(const RestoreTarget &target, ChunkStore &store,
       std::vector<std::vector<ChunkRef>> chunks,
       std::optional<CodecSpec> codec)
      : target_(target), model_(*target.model), store_(store),
        codec_(std::move(codec)), chunks_(std::move(chunks)),
        prefill_(model_, *target.tokens, *target.cache, *target.table),
        back_(int64_t(chunks_.size()) - 1) {}

  /// The compute side: claims chunks from the front until the sides meet,
  /// then recomputes what the loaders handed back.
  Status compute() {
    Clock::time_point start = Clock::now();
    for (;;) {
      int64_t chunk;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (front_ > back_)
          break;
        chunk = front_++;
      }
      KVC_RETURN_IF_ERROR(computeThrough(chunk));
      std::lock_guard<std::mutex> lock(mutex_);
      ++computed_;
    }
    // Wait for the loaders, then recompute the chunks they could not load.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return activeLoaders_ == 0; });
    std::vector<int64_t> failed = failed_;
    lock.unlock();
    for (int64_t chunk : failed)
      KVC_RETURN_IF_ERROR(computeThrough(chunk));
    addBusy(poolName(Resource::Compute), secondsSince(start));
    return Status::ok();
  }

  /// A loading lane: claims chunks from the back until the sides meet.
  Status load(const std::string &tier) {
    Clock::time_point start = Clock::now();
    Status result;
    std::vector<uint16_t> values;
    for (;;) {
      int64_t chunk;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (back_ < front_)
          break;
        chunk = back_--;
      }
      Status status = loadChunk(chunk, tier, values);
      std::lock_guard<std::mutex> lock(mutex_);
      if (status.isOk()) {
        ++loaded_;
        continue;
      }
      if (!recoverableByRecompute(status)) {
        result = status;
        break;
      }
      failed_.push_back(chunk);
      const ChunkRef &ref = chunks_[chunk].front();
      fallbacks_.push_back("kv tokens " + std::to_string(ref.tokenBegin) +
                           " to " + std::to_string(ref.tokenEnd) +
                           " recomputed: " + status.toString());
    }
    addBusy(poolName(Resource::IO, tier), secondsSince(start));
    std::lock_guard<std::mutex> lock(mutex_);
    if (--activeLoaders_ == 0)
      done_.notify_all();
    return result;
  }

  void startLoaders(int count) { activeLoaders_ = count; }

  void finish(DynamicCakeResult &out) {
    std::lock_guard<std::mutex> lock(mutex_);
    out.mergeToken = front_ == 0 ? 0 : chunks_[front_ - 1].front().tokenEnd;
    out.chunksComputed = computed_;
    out.chunksLoaded = loaded_;
    out.metrics.fallbacks = fallbacks_;
    out.metrics.busySeconds = busy_;
    out.metrics.bytesRead = bytes_;
    out.metrics.flops = prefill_.flops();
    out.metrics.exactContextBytes = prefill_.exactBytes();
  }

private:
  /// Prefills the chunk into the cache: the next from the front over the
  /// tokens computed before it, a chunk loaders handed back exactly.
  Status computeThrough(int64_t chunk) {
    const ChunkRef &ref = chunks_[chunk].front();
    return prefill_.compute(ref.tokenBegin, ref.tokenEnd, 0,
                            model_.config().numLayers);
  }

  /// Reads, checks and decodes (to bf16) every layer group of `chunk`, and
  /// only then scatters it: a chunk is written whole or not at all.
  Status loadChunk(int64_t chunk, const std::string &tier,
                   std::vector<uint16_t> &values) {
    const int64_t kv = model_.kvDim();
    int64_t bytes = 0, size = 0;
    std::string stored;
    for (const ChunkRef &ref : chunks_[chunk])
      size += store_.shape(ref).numel();
    values.resize(size);
    uint16_t *group = values.data();
    for (const ChunkRef &ref : chunks_[chunk]) {
      KVC_RETURN_IF_ERROR(store_.tier().get(ref.name(), stored));
      bytes += int64_t(stored.size());
      KVC_RETURN_IF_ERROR(store_.decode(ref, stored, group, nullptr,
                                        codec_ ? &*codec_ : nullptr));
      group += store_.shape(ref).numel();
    }
    group = values.data();
    for (const ChunkRef &ref : chunks_[chunk]) {
      const int64_t n = ref.tokenEnd - ref.tokenBegin;
      for (int64_t l = ref.layerBegin; l < ref.layerEnd; ++l) {
        const uint16_t *k = group + (l - ref.layerBegin) * 2 * n * kv;
        KVC_RETURN_IF_ERROR(target_.cache->write(*target_.table, l,
                                                 ref.tokenBegin, n, k,
                                                 k + n * kv));
      }
      group += store_.shape(ref).numel();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_[tier] += bytes;
    return Status::ok();
  }

  void addBusy(const std::string &resource, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_[resource] += seconds;
  }

  const RestoreTarget &target_;
  const LlamaModel &model_;
  ChunkStore &store_;
  /// The codec loads must find (DynamicCakeOptions::codec).
  std::optional<CodecSpec> codec_;
  /// Per chunk, its KV objects (one per layer group).
  std::vector<std::vector<ChunkRef>> chunks_;
  exec_detail::PrefillState prefill_;

  std::mutex mutex_;
  std::condition_variable done_;
  int64_t front_ = 0;
  int64_t back_;
  int activeLoaders_ = 0;
  int64_t computed_ = 0, loaded_ = 0;
  std::vector<int64_t> failed_;
  std::vector<std::string> fallbacks_;
  std::map<std::string, double> busy_;
  std::map<std::string, int64_t> bytes_;
};

} // namespace

StatusOr<DynamicCakeOptions> dynamicCakeOptions(const BundlePlan &plan) {
  auto notCake = [&](const std::string &why) {
    return invalidArgument("plan " + plan.name +
                           " has no dynamic Cake mode: " + why);
  };
  DynamicCakeOptions options;
  int64_t computedEnd = plan.tokens.begin, loadedBegin = plan.tokens.end;
  bool loads = false;
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps) {
      if (step.kind == StepKind::ChunkCompute) {
        if (step.layers != plan.layers)
          return notCake("it computes layers " +
                         std::to_string(step.layers.begin) + " to " +
                         std::to_string(step.layers.end) + " only");
        computedEnd = std::max(computedEnd, step.tokens.end);
      } else if (step.kind == StepKind::Fetch) {
        if (step.form != Form::KV)
          return notCake("it loads hidden states");
        if (loads && step.tier != options.tier)
          return notCake("it loads from tiers " + options.tier + " and " +
                         step.tier);
        if (loads && !(step.codec == *options.codec))
          return notCake("it loads codecs " + options.codec->str() + " and " +
                         step.codec.str());
        options.tier = step.tier;
        options.codec = step.codec;
        loads = true;
        loadedBegin = std::min(loadedBegin, step.tokens.begin);
      }
    }
  if (!loads)
    return notCake("it loads nothing");
  if (computedEnd != loadedBegin)
    return notCake("it computes tokens up to " + std::to_string(computedEnd) +
                   " and loads from " + std::to_string(loadedBegin));
  options.predictedMergeToken = loadedBegin;
  return options;
}

StatusOr<DynamicCakeResult>
restoreDynamicCake(ResourcePools &pools, const RestoreTarget &target,
                   const DynamicCakeOptions &options) {
  if (!target.model || !target.tokens || !target.cache || !target.table)
    return invalidArgument("restore: model, tokens, cache and block table are "
                           "required");
  auto store = target.stores.find(options.tier);
  if (store == target.stores.end())
    return invalidArgument("restore: no store for tier \"" + options.tier +
                           "\"");
  const std::string io = poolName(Resource::IO, options.tier);
  const std::string compute = poolName(Resource::Compute);
  if (!pools.has(compute) || !pools.has(io))
    return invalidArgument("restore: dynamic Cake needs \"compute\" and \"" +
                           io + "\" workers");
  if (target.tokens->empty())
    return invalidArgument("restore: no tokens");

  // The store's KV objects, grouped by token chunk.
  std::vector<std::vector<ChunkRef>> chunks;
  for (const ChunkRef &ref : store->second->refs(
           target.tokens->data(), int64_t(target.tokens->size()), Form::KV)) {
    if (chunks.empty() || chunks.back().front().tokenBegin != ref.tokenBegin)
      chunks.emplace_back();
    chunks.back().push_back(ref);
  }

  Clock::time_point start = Clock::now();
  Walk walk(target, *store->second, std::move(chunks), options.codec);
  const int lanes = pools.lanes(io);
  walk.startLoaders(lanes);
  // Shared with the jobs: a worker may still hold it for an instant after
  // the caller has been woken.
  struct Sync {
    std::mutex mutex;
    std::condition_variable finished;
    int running = 0;
    Status first;
  };
  auto sync = std::make_shared<Sync>();
  sync->running = lanes + 1;
  auto report = [sync](Status status) {
    std::lock_guard<std::mutex> lock(sync->mutex);
    if (!status.isOk() && sync->first.isOk())
      sync->first = status;
    if (--sync->running == 0)
      sync->finished.notify_all();
  };
  for (int lane = 0; lane < lanes; ++lane)
    pools.submit(io, [&walk, &options, report](int) {
      report(walk.load(options.tier));
    });
  pools.submit(compute, [&walk, report](int) { report(walk.compute()); });
  Status first;
  {
    std::unique_lock<std::mutex> lock(sync->mutex);
    sync->finished.wait(lock, [&] { return sync->running == 0; });
    first = sync->first;
  }
  KVC_RETURN_IF_ERROR(first);

  DynamicCakeResult result;
  walk.finish(result);
  result.predictedMergeToken = options.predictedMergeToken;
  result.metrics.makespanSeconds = secondsSince(start);
  return result;
}

} // namespace kvc
