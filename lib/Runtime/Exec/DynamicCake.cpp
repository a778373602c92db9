//===- DynamicCake.cpp - Cake's run-time merge point ----------------------===//

#include "kvc/Runtime/Exec/DynamicCake.h"

#include "ChunkSteps.h"

#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>

namespace kvc {

namespace {

/// The shared state of one walk: which chunks each side has claimed.
class Walk {
public:
  Walk(exec_detail::ChunkSteps &steps, std::vector<ChunkBox> chunks,
       const DynamicCakeOptions &options)
      : steps_(steps), options_(options), chunks_(std::move(chunks)),
        back_(int64_t(chunks_.size()) - 1) {}

  /// The compute side: prefills chunks from the front, each over the ones
  /// before it, until the sides meet.
  Status computeFront() {
    for (;;) {
      int64_t chunk;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (front_ > back_)
          return Status::ok();
        chunk = front_++;
      }
      KVC_RETURN_IF_ERROR(steps_.computeBox(chunks_[chunk]));
      // The sides meet where both have finished: the front claims its next
      // chunk once this one is computed, not once it is enqueued.
      KVC_RETURN_IF_ERROR(steps_.settle());
      std::lock_guard<std::mutex> lock(mutex_);
      ++computed_;
    }
  }

  /// A loading lane: claims chunks from the back until the sides meet.
  /// A chunk is fetched and decoded whole (every layer group) before it is
  /// scattered, so it is written whole or not at all; one that cannot be
  /// loaded is handed back to the compute side.
  Status load() {
    for (;;) {
      int64_t chunk;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (back_ < front_)
          return Status::ok();
        chunk = back_--;
      }
      exec_detail::ChunkValue value;
      value.form = Form::KV;
      value.tokens = {chunks_[chunk].tokenBegin, chunks_[chunk].tokenEnd};
      value.layers = {chunks_[chunk].layerBegin, chunks_[chunk].layerEnd};
      value.tier = options_.tier;
      value.codec = options_.codec;
      value.step = StepKind::Fetch;
      Status status = steps_.fetch(value, nullptr);
      if (status.isOk()) {
        value.step = StepKind::Decompress;
        status = steps_.decode(value);
      }
      if (status.isOk()) {
        value.step = StepKind::Scatter;
        status = steps_.scatter(value);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (status.isOk()) {
        ++loaded_;
        continue;
      }
      if (!recoverableByRecompute(status))
        return status;
      steps_.release(value);
      failed_.push_back(chunk);
      faults_.push_back(status.toString());
    }
  }

  /// After both sides: recomputes what the loaders handed back.
  Status recomputeFailed() {
    for (std::size_t i = 0; i < failed_.size(); ++i) {
      const ChunkBox &box = chunks_[failed_[i]];
      KVC_RETURN_IF_ERROR(steps_.computeBox(box));
      fallbacks_.push_back("kv tokens " + std::to_string(box.tokenBegin) +
                           " to " + std::to_string(box.tokenEnd) +
                           " recomputed: " + faults_[i]);
    }
    return Status::ok();
  }

  void finish(RestoreMetrics &out) {
    std::lock_guard<std::mutex> lock(mutex_);
    CakeWalk &met = out.walk.emplace();
    met.mergeToken = front_ == 0 ? 0 : chunks_[front_ - 1].tokenEnd;
    met.chunksComputed = computed_;
    met.chunksLoaded = loaded_;
    out.fallbacks = fallbacks_;
    out.bytesRead = steps_.bytesRead();
    out.hostTraffic = steps_.traffic();
    for (const auto &[kind, traffic] : steps_.trafficByStep())
      out.hostTrafficByStep[name(kind)] = traffic;
    out.flops = steps_.flops();
    out.exactContextBytes = steps_.exactContextBytes();
  }

private:
  exec_detail::ChunkSteps &steps_;
  const DynamicCakeOptions &options_;
  /// Per chunk, its box: its tokens, every layer the store holds of them.
  std::vector<ChunkBox> chunks_;

  std::mutex mutex_;
  int64_t front_ = 0;
  int64_t back_;
  int64_t computed_ = 0, loaded_ = 0;
  std::vector<int64_t> failed_;
  std::vector<std::string> faults_, fallbacks_;
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
        if (loads && step.codec != options.codec)
          return notCake("it loads codecs " + options.codec.str() + " and " +
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

namespace {

StatusOr<RestoreMetrics> runWalk(ResourcePools &pools,
                                 const RestoreTarget &target,
                                 const DynamicCakeOptions &options,
                                 const RestoreOptions &run) {
  KVC_RETURN_IF_ERROR(exec_detail::checkTarget(target));
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

  exec_detail::ChunkSteps steps(deviceOr(target.device), *target.model,
                                target.runner, target.stores, *target.tokens,
                                *target.cache, *target.table, run.progress);
  // The store's KV objects, grouped by token chunk.
  std::vector<ChunkBox> chunks;
  for (const ChunkRef &ref :
       steps.refs(options.tier, Form::KV, options.codec)) {
    if (chunks.empty() || chunks.back().tokenBegin != ref.tokenBegin)
      chunks.push_back(
          {ref.tokenBegin, ref.tokenEnd, ref.layerBegin, ref.layerEnd});
    chunks.back().layerEnd = ref.layerEnd;
  }
  Walk walk(steps, std::move(chunks), options);

  // Both sides as tasks on the pools: the front on the compute worker, one
  // loader per io lane, and the recompute of what the loaders handed back
  // once all of them are done.
  TaskGraph graph;
  std::vector<int64_t> sides = {
      graph.add({"compute front", compute, {}, [&](int) {
                   return walk.computeFront();
                 }})};
  for (int lane = 0; lane < pools.lanes(io); ++lane)
    sides.push_back(graph.add(
        {"load from the back", io, {}, [&](int) { return walk.load(); }}));
  graph.add({"recompute handed back", compute, sides,
             [&](int) { return walk.recomputeFailed(); }});
  KeptSpans spans(deviceOr(target.device), !run.tracePath.empty());
  RunResult result = runGraph(pools, graph);
  KVC_RETURN_IF_ERROR(result.status);
  KVC_RETURN_IF_ERROR(steps.settle()); // The loaders' last scatters.

  RestoreMetrics out;
  walk.finish(out);
  out.walk->predictedMergeToken = options.predictedMergeToken;
  out.makespanSeconds = secondsSince(result.begin);
  out.layerReadySeconds =
      run.progress->readySeconds(result.begin, out.makespanSeconds);
  out.busySeconds = result.busy;
  if (!run.tracePath.empty())
    KVC_RETURN_IF_ERROR(
        writeChromeTrace(graph, result, run.tracePath, spans.take()));
  return out;
}

} // namespace

StatusOr<RestoreMetrics> restoreDynamicCake(ResourcePools &pools,
                                            const RestoreTarget &target,
                                            const DynamicCakeOptions &options,
                                            const RestoreOptions &run) {
  return exec_detail::trackProgress(
      run.progress, target, [&](LayerProgress &progress) {
        RestoreOptions tracked = run;
        tracked.progress = &progress;
        return runWalk(pools, target, options, tracked);
      });
}

} // namespace kvc
