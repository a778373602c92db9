//===- SavePlan.cpp - Running compiled save plans -------------------------===//

#include "kvc/Runtime/Save/SavePlan.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Save/Saver.h"

#include <atomic>
#include <mutex>

namespace kvc {

namespace {

/// One object on its way from the cache to a store.
struct SaveValue {
  ChunkRef ref; ///< Its codec: the encoding the plan stores.
  std::string tier;
  std::vector<float> values; ///< The snapshot, the ref's shape.
  std::string object;        ///< Encoded, once compressed.
  bool encoded = false;
};

class SaveRun {
public:
  SaveRun(const BundlePlan &plan, const SaveTarget &target,
          const SaveRunOptions &options)
      : plan_(plan), target_(target), options_(options),
        backend_(target.backend ? *target.backend : cpuBackend()) {}

  StatusOr<TaskGraph> build() {
    const std::string &name = plan_.name;
    const int64_t n = int64_t(target_.tokens->size());
    // The stores' tier, and the encoding and objects of the plan, checked
    // as any save plan is.
    std::string tier;
    for (const BundleTask &task : plan_.tasks)
      for (const BundleStep &step : task.steps) {
        if (step.kind == StepKind::Gather && step.form != Form::KV)
          return invalidArgument(
              "save: plan " + name + " saves " + kvc::name(step.form) +
              ", which a paged cache does not hold (a prefill's snapshots "
              "do: saveContext)");
        if (step.kind != StepKind::Store)
          continue;
        if (!tier.empty() && step.tier != tier)
          return invalidArgument("save: plan " + name + " stores to tiers \"" +
                                 tier + "\" and \"" + step.tier +
                                 "\"; a save writes one");
        tier = step.tier;
      }
    auto store = target_.stores.find(tier);
    if (store == target_.stores.end() || !store->second)
      return invalidArgument("save: no store for tier \"" + tier + "\"");
    store_ = store->second;
    KVC_ASSIGN_OR_RETURN(what, saveOptionsFor(plan_, *store_, n));
    if (target_.cache->kvDim() !=
            store_->model().numKvHeads * store_->model().headDim ||
        target_.cache->config().layers != store_->model().numLayers)
      return invalidArgument("save: the cache does not hold the KV of the "
                             "store's model");
    if (target_.table->capacity(target_.cache->config().blockSize) < n)
      return invalidArgument("save: the block table holds fewer than " +
                             std::to_string(n) + " tokens");
    const std::vector<ChunkRef> refs =
        store_->refs(target_.tokens->data(), n, Form::KV, what.codec);

    values_.resize(plan_.tasks.size());
    TaskGraph graph;
    for (std::size_t i = 0; i < plan_.tasks.size(); ++i) {
      const BundleTask &task = plan_.tasks[i];
      const BundleStep &first = task.steps.front();
      if (first.kind == StepKind::Gather) {
        const int64_t at =
            store_->position(first.tokens.begin, first.layers.begin);
        if (first.tokens.begin < 0 || first.tokens.begin >= n ||
            first.layers.begin < 0 ||
            first.layers.begin >= store_->model().numLayers)
          return invalidArgument("save: plan " + name + " gathers tokens " +
                                 std::to_string(first.tokens.begin) +
                                 " of layer " +
                                 std::to_string(first.layers.begin) +
                                 ", which the request does not have");
        auto value = std::make_shared<SaveValue>();
        value->ref = refs[at];
        value->tier = tier;
        values_[i] = value;
        ++gathers_;
      } else if (!task.inputs.empty()) {
        values_[i] = values_[task.inputs.front()];
      }
      if (!values_[i])
        return invalidArgument("save: task " + std::to_string(i) +
                               " starts with " + kvc::name(first.kind) +
                               " but reads no chunk");
      const ChunkRef &ref = values_[i]->ref;
      for (const BundleStep &step : task.steps)
        if (step.tokens != BundleRange{ref.tokenBegin, ref.tokenEnd} ||
            step.layers != BundleRange{ref.layerBegin, ref.layerEnd})
          return unimplemented(
              std::string("save: step ") + kvc::name(step.kind) +
              " over tokens " + std::to_string(step.tokens.begin) + " to " +
              std::to_string(step.tokens.end) + " works on part of its object");
      graph.add({std::string(kvc::name(first.kind)) + " " +
                     std::to_string(ref.tokenBegin) + ":" +
                     std::to_string(ref.tokenEnd) + " L" +
                     std::to_string(ref.layerBegin),
                 poolOf(task), task.after,
                 [this, i](int) { return runTask(i); }});
    }
    return graph;
  }

  void fillMetrics(SaveMetrics &metrics) {
    metrics.written = written_;
    metrics.skipped = skipped_;
    metrics.snapshotSeconds = snapshotSeconds_;
    metrics.bytesWritten = bytesWritten_;
  }

  SaveJournal &journal() { return journal_; }
  void start() { start_ = Clock::now(); }

private:
  Status runTask(std::size_t index) {
    SaveValue &value = *values_[index];
    for (const BundleStep &step : plan_.tasks[index].steps)
      KVC_RETURN_IF_ERROR(runStep(step, value));
    return Status::ok();
  }

  Status runStep(const BundleStep &step, SaveValue &value) {
    switch (step.kind) {
    case StepKind::Gather:
      return gather(value);
    case StepKind::Transform:
    case StepKind::Quant:
    case StepKind::TransferToHost:
      return Status::ok(); // The gather's copy and the host's encode.
    case StepKind::Compress:
      return encode(value);
    case StepKind::Store:
      return storeObject(value);
    default:
      return invalidArgument(std::string("save: plan ") + plan_.name +
                             " has a " + kvc::name(step.kind) +
                             ", which no save step is");
    }
  }

  Status gather(SaveValue &value) {
    const ChunkRef &ref = value.ref;
    const int64_t rows = ref.tokenEnd - ref.tokenBegin;
    const int64_t kvDim = target_.cache->kvDim();
    value.values.resize(
        size_t((ref.layerEnd - ref.layerBegin) * 2 * rows * kvDim));
    for (int64_t l = ref.layerBegin; l < ref.layerEnd; ++l) {
      if (target_.filling)
        KVC_RETURN_IF_ERROR(target_.filling->waitTokens(l, ref.tokenEnd));
      float *k = value.values.data() + (l - ref.layerBegin) * 2 * rows * kvDim;
      KVC_RETURN_IF_ERROR(backend_.readBack(*target_.cache, *target_.table, l,
                                            ref.tokenBegin, rows, k,
                                            k + rows * kvDim));
    }
    if (gathers_.fetch_sub(1) == 1) {
      snapshotSeconds_ = secondsSince(start_);
      if (options_.snapshotted)
        options_.snapshotted();
    }
    return Status::ok();
  }

  Status encode(SaveValue &value) {
    if (value.encoded)
      return Status::ok();
    KVC_ASSIGN_OR_RETURN(object,
                         store_->encode(value.ref, value.values.data()));
    value.object = std::move(object);
    value.values = {};
    value.encoded = true;
    return Status::ok();
  }

  Status storeObject(SaveValue &value) {
    KVC_RETURN_IF_ERROR(encode(value));
    bool written = false;
    KVC_RETURN_IF_ERROR(store_->putEncoded(value.ref, value.object, &written));
    std::lock_guard<std::mutex> lock(mutex_);
    if (written) {
      journal_.wrote(*store_, value.ref);
      bytesWritten_[value.tier] += int64_t(value.object.size());
    }
    ++(written ? written_ : skipped_);
    value.object = {};
    return Status::ok();
  }

  const BundlePlan &plan_;
  const SaveTarget &target_;
  const SaveRunOptions &options_;
  Backend &backend_;
  ChunkStore *store_ = nullptr;
  std::vector<std::shared_ptr<SaveValue>> values_;
  std::atomic<int64_t> gathers_{0};
  Clock::time_point start_ = Clock::now();
  double snapshotSeconds_ = 0;
  std::mutex mutex_;
  int64_t written_ = 0, skipped_ = 0;
  std::map<std::string, int64_t> bytesWritten_;
  SaveJournal journal_;
};

} // namespace

StatusOr<SaveMetrics> save(ResourcePools &pools, const BundlePlan &plan,
                           const SaveTarget &target,
                           const SaveRunOptions &options) {
  if (!target.tokens || !target.cache || !target.table)
    return invalidArgument("save: tokens, cache and block table are required");
  SaveRun run(plan, target, options);
  KVC_ASSIGN_OR_RETURN(graph, run.build());
  run.start();
  RunResult result = runGraph(pools, graph);
  if (!result.status.isOk())
    return run.journal().rollback(result.status);
  SaveMetrics metrics;
  run.fillMetrics(metrics);
  metrics.makespanSeconds = result.makespan;
  metrics.busySeconds = result.busy;
  if (plan.predictedUs)
    metrics.predictedSeconds = double(*plan.predictedUs) * 1e-6;
  if (!options.tracePath.empty())
    KVC_RETURN_IF_ERROR(writeChromeTrace(graph, result, options.tracePath));
  return metrics;
}

BundlePlan savePlanFor(const ChunkObjects &objects, int64_t tokens,
                       const std::vector<Form> &forms, const CodecSpec &codec,
                       const std::string &tier) {
  const int64_t layers = objects.model().numLayers;
  const StoreLayout &layout = objects.layout();
  BundlePlan plan;
  plan.name = "save";
  plan.tokens = {0, tokens};
  plan.layers = {0, layers};
  auto add = [&](Resource resource, StepKind kind, const BundleStep &box,
                 std::optional<int64_t> input) {
    BundleTask task;
    task.id = int64_t(plan.tasks.size());
    task.resource = resource;
    if (input) {
      task.after = {*input};
      task.inputs = {*input};
    }
    BundleStep step = box;
    step.kind = kind;
    if (kind == StepKind::Store)
      step.tier = tier;
    task.steps.push_back(step);
    plan.tasks.push_back(std::move(task));
    return plan.tasks.back().id;
  };
  for (int64_t t = 0; t < tokens; t += layout.chunkTokens)
    for (int64_t l = 0; l < layers; l += layout.layerGroup)
      for (Form form : forms) {
        BundleStep box;
        box.form = form;
        box.tokens = {t, std::min(tokens, t + layout.chunkTokens)};
        box.layers = {l, std::min(layers, l + layout.layerGroup)};
        int64_t last = add(Resource::Compute, StepKind::Gather, box, {});
        if (!codec.isRaw()) {
          box.codec = codec; // A compress consumes its quantized input.
          box.codec.lossless = CodecSpec::Lossless::None;
          last = add(Resource::Decode, StepKind::Compress, box, last);
        }
        box.codec = codec;
        add(Resource::IO, StepKind::Store, box, last);
      }
  return plan;
}

} // namespace kvc
