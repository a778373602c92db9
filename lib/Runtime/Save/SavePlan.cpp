//===- SavePlan.cpp - Running compiled save plans -------------------------===//

#include "kvc/Runtime/Save/SavePlan.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Save/Saver.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

namespace kvc {

SaveSource::~SaveSource() = default;

Status PagedCacheSource::check(const ChunkObjects &objects,
                               int64_t tokens) const {
  if (cache_.kvDim() != objects.model().numKvHeads * objects.model().headDim ||
      cache_.config().layers != objects.model().numLayers)
    return invalidArgument("save: the cache does not hold the KV of the "
                           "store's model");
  if (table_.capacity(cache_.config().blockSize) < tokens)
    return invalidArgument("save: the block table holds fewer than " +
                           std::to_string(tokens) + " tokens");
  return Status::ok();
}

Status PagedCacheSource::waitFor(const ChunkRef &ref) const {
  if (ref.form != Form::KV)
    return invalidArgument("save: a paged cache holds no hidden states");
  if (filling_)
    for (int64_t l = ref.layerBegin; l < ref.layerEnd; ++l)
      KVC_RETURN_IF_ERROR(filling_->waitTokens(l, ref.tokenEnd));
  return Status::ok();
}

Status PagedCacheSource::gather(const ChunkObjects &, const ChunkRef &ref,
                                std::vector<float> &out) {
  KVC_RETURN_IF_ERROR(waitFor(ref));
  const int64_t rows = ref.tokenEnd - ref.tokenBegin;
  const int64_t kvDim = cache_.kvDim();
  out.resize(size_t((ref.layerEnd - ref.layerBegin) * 2 * rows * kvDim));
  for (int64_t l = ref.layerBegin; l < ref.layerEnd; ++l) {
    float *k = out.data() + (l - ref.layerBegin) * 2 * rows * kvDim;
    KVC_RETURN_IF_ERROR(device_.readBack(cache_, table_, l, ref.tokenBegin,
                                         rows, k, k + rows * kvDim));
  }
  return Status::ok();
}

Status PagedCacheSource::canGatherPayload(const BundleKernel &kernel) const {
  return device_.canLaunchSave(kernel, cache_);
}

bool PagedCacheSource::holds(const ChunkRef &ref) const {
  if (filling_)
    for (int64_t l = ref.layerBegin; l < ref.layerEnd; ++l)
      if (!filling_->ready(l, ref.tokenEnd))
        return false;
  return true;
}

StatusOr<int64_t> PagedCacheSource::gatherPayloads(
    const BundleKernel &kernel, const ChunkObjects &,
    const std::vector<ChunkRef> &refs, std::vector<std::string> &payloads) {
  payloads.assign(refs.size(), {});
  // Waits only for the next object not yet there; those already there join
  // its launch.
  int64_t launches = 0;
  for (std::size_t next = 0; next < refs.size(); ++launches) {
    std::vector<ChunkBox> boxes;
    std::size_t end = next;
    do {
      const ChunkRef &ref = refs[end];
      KVC_RETURN_IF_ERROR(waitFor(ref));
      boxes.push_back(
          {ref.tokenBegin, ref.tokenEnd, ref.layerBegin, ref.layerEnd});
    } while (++end < refs.size() && holds(refs[end]));
    std::vector<std::string> out;
    KVC_RETURN_IF_ERROR(device_.launchSave(kernel, cache_, table_, boxes, out));
    if (out.size() != boxes.size())
      return internalError(
          "save: a launch returned another number of payloads");
    for (std::size_t i = 0; i < out.size(); ++i)
      payloads[next + i] = std::move(out[i]);
    next = end;
  }
  return launches;
}

void PrefillSnapshots::put(const ChunkRef &ref, const float *values,
                           size_t count) {
  kept_.put({ref.form, ref.tokenBegin, ref.layerBegin},
            std::vector<float>(values, values + count), count * sizeof(float));
}

void PrefillSnapshots::finish(const Status &status) { kept_.finish(status); }

Status PrefillSnapshots::gather(const ChunkObjects &objects,
                                const ChunkRef &ref, std::vector<float> &out) {
  KVC_RETURN_IF_ERROR(kept_.take(
      {ref.form, ref.tokenBegin, ref.layerBegin}, out,
      failedPrecondition("save: the prefill computed no " +
                         std::string(name(ref.form)) + " of tokens " +
                         std::to_string(ref.tokenBegin) + " of layer " +
                         std::to_string(ref.layerBegin))));
  if (out.size() != size_t(objects.shape(ref).numel()))
    return invalidArgument("save: the prefill handed over an object of " +
                           std::to_string(out.size()) + " values");
  return Status::ok();
}

namespace {

/// One object on its way from the source to a store.
struct SaveValue {
  ChunkRef ref; ///< Its codec: the encoding the plan stores.
  std::string tier;
  std::vector<float> values; ///< The snapshot, the ref's shape.
  /// The generated save kernel that encodes it where the values are, when
  /// the source launches it; then `payload` holds what it wrote.
  const BundleKernel *kernel = nullptr;
  std::string payload;
  std::string object; ///< Encoded, once compressed.
  bool encoded = false;
  double encodeSeconds = 0;
};

class SaveRun {
public:
  SaveRun(const BundlePlan &plan, const SaveTarget &target,
          const SaveRunOptions &options)
      : plan_(plan), target_(target), options_(options) {}

  StatusOr<TaskGraph> build() {
    const std::string &name = plan_.name;
    const int64_t n = int64_t(target_.tokens->size());
    // The stores' tier (or the peer a send plan sends to), and the encoding
    // and objects of the plan, checked as any save plan is.
    std::string tier;
    StepKind endpoint = StepKind::Store;
    for (const BundleTask &task : plan_.tasks)
      for (const BundleStep &step : task.steps) {
        if (step.kind == StepKind::Gather && !target_.source->holds(step.form))
          return invalidArgument(
              "save: plan " + name + " saves " + kvc::name(step.form) +
              ", which a paged cache does not hold (a prefill's hand-over "
              "does: saveDuringPrefill)");
        if (step.kind != StepKind::Store && step.kind != StepKind::Send)
          continue;
        const std::string &to =
            step.kind == StepKind::Send ? step.node : step.tier;
        if (!tier.empty() && (to != tier || step.kind != endpoint))
          return invalidArgument("save: plan " + name + " " +
                                 endpointName(endpoint) + " \"" + tier +
                                 "\" and " + endpointName(step.kind) + " \"" +
                                 to + "\"; a save writes one");
        tier = to;
        endpoint = step.kind;
      }
    if (endpoint == StepKind::Send) {
      if (!target_.send || !target_.objects)
        return invalidArgument("save: plan " + name + " sends to \"" + tier +
                               "\", and the save has no sender");
      objects_ = target_.objects;
    } else {
      auto store = target_.stores.find(tier);
      if (store == target_.stores.end() || !store->second)
        return invalidArgument("save: no store for tier \"" + tier + "\"");
      store_ = store->second;
      objects_ = store_;
    }
    KVC_ASSIGN_OR_RETURN(what, planObjects(plan_, *objects_, n, endpoint));
    KVC_RETURN_IF_ERROR(target_.source->check(*objects_, n));
    std::map<Form, std::vector<ChunkRef>> refs;
    for (Form form : what.forms)
      refs[form] = objects_->refs(target_.tokens->data(), n, form, what.codec);

    values_.resize(plan_.tasks.size());
    TaskGraph graph;
    for (std::size_t i = 0; i < plan_.tasks.size(); ++i) {
      const BundleTask &task = plan_.tasks[i];
      const BundleStep &first = task.steps.front();
      if (first.kind == StepKind::Gather) {
        const int64_t at =
            objects_->position(first.tokens.begin, first.layers.begin);
        if (first.tokens.begin < 0 || first.tokens.begin >= n ||
            first.layers.begin < 0 ||
            first.layers.begin >= objects_->model().numLayers)
          return invalidArgument("save: plan " + name + " gathers tokens " +
                                 std::to_string(first.tokens.begin) +
                                 " of layer " +
                                 std::to_string(first.layers.begin) +
                                 ", which the request does not have");
        auto value = std::make_shared<SaveValue>();
        value->ref = refs[first.form][at];
        value->tier = tier;
        values_[i] = value;
        ++gathers_;
        if (!task.entry.empty() && options_.kernels) {
          if (options_.chooser)
            return invalidArgument(
                "save: plan " + name + "'s task " + std::to_string(i) +
                " names a save kernel, which encodes as it was generated; "
                "the save's codec chooser cannot choose for it");
          KVC_RETURN_IF_ERROR(useKernel(i, *value));
        }
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
      // Gathers of one save kernel that are ready together share a launch.
      std::string batch;
      if (values_[i]->kernel && first.kind == StepKind::Gather) {
        batch = values_[i]->kernel->name;
        graph.batches.try_emplace(
            batch, [this](int, const std::vector<int64_t> &tasks) {
              return runBatch(tasks);
            });
      }
      graph.add({std::string(kvc::name(first.kind)) + " " +
                     std::to_string(ref.tokenBegin) + ":" +
                     std::to_string(ref.tokenEnd) + " L" +
                     std::to_string(ref.layerBegin),
                 poolOf(task), task.after,
                 [this, i](int) { return runTask(i); }},
                batch);
    }
    return graph;
  }

  void fillMetrics(SaveMetrics &metrics) {
    metrics.kernelLaunches = kernelLaunches_;
    metrics.kernelChunks = kernelChunks_;
    metrics.kernelsNotLaunched = kernelsNotLaunched_;
    metrics.written = written_;
    metrics.skipped = skipped_;
    metrics.snapshotSeconds = snapshotSeconds_;
    metrics.bytesWritten = bytesWritten_;
  }

  SaveJournal &journal() { return journal_; }
  void start() { start_ = Clock::now(); }

private:
  /// Lets the generated save kernel gather task `index` names encode its
  /// object, when the source launches it.
  Status useKernel(std::size_t index, SaveValue &value) {
    const BundleTask &task = plan_.tasks[index];
    const BundleKernel *kernel = findKernel(*options_.kernels, task.entry);
    if (!kernel)
      return invalidArgument("save: task " + std::to_string(index) +
                             " names kernel \"" + task.entry +
                             "\", which the kernel table lacks");
    if (kernel->kind != BundleKernel::Kind::Save)
      return Status::ok();
    CodecSpec stored = value.ref.codec;
    stored.lossless = CodecSpec::Lossless::None;
    const bool unquantized = stored.quant == CodecSpec::Quant::None;
    if (kernel->codec != stored ||
        (unquantized &&
         kernel->storage != dtypeName(objects_->model().dtype)) ||
        kernel->tokens != value.ref.tokenEnd - value.ref.tokenBegin ||
        kernel->layers != value.ref.layerEnd - value.ref.layerBegin)
      return invalidArgument(
          "save: kernel \"" + kernel->name + "\" encodes " +
          std::to_string(kernel->tokens) + " tokens x " +
          std::to_string(kernel->layers) + " layers as " + kernel->codec.str() +
          " over " + kernel->storage + "; task " + std::to_string(index) +
          " saves " +
          std::to_string(value.ref.tokenEnd - value.ref.tokenBegin) +
          " tokens x " +
          std::to_string(value.ref.layerEnd - value.ref.layerBegin) +
          " layers as " + value.ref.codec.str());
    Status launchable = target_.source->canGatherPayload(*kernel);
    if (!launchable.isOk()) {
      std::string why = kernel->name + ": " + launchable.message();
      std::lock_guard<std::mutex> lock(mutex_);
      if (std::find(kernelsNotLaunched_.begin(), kernelsNotLaunched_.end(),
                    why) == kernelsNotLaunched_.end())
        kernelsNotLaunched_.push_back(why);
      return Status::ok();
    }
    value.kernel = kernel;
    return Status::ok();
  }

  Status runTask(std::size_t index) {
    if (options_.cancel && options_.cancel->load())
      return saveInterrupted();
    SaveValue &value = *values_[index];
    for (const BundleStep &step : plan_.tasks[index].steps)
      KVC_RETURN_IF_ERROR(runStep(step, value));
    return Status::ok();
  }

  /// Runs gather tasks whose objects one save kernel encodes: their
  /// gathers through the source at once, then each task's other steps.
  Status runBatch(const std::vector<int64_t> &tasks) {
    std::vector<ChunkRef> refs;
    for (int64_t index : tasks)
      refs.push_back(values_[index]->ref);
    std::vector<std::string> payloads;
    KVC_ASSIGN_OR_RETURN(launches, target_.source->gatherPayloads(
                                       *values_[tasks.front()]->kernel,
                                       *objects_, refs, payloads));
    kernelLaunches_ += launches;
    kernelChunks_ += int64_t(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      SaveValue &value = *values_[tasks[i]];
      value.payload = std::move(payloads[i]);
      gathered();
      const std::vector<BundleStep> &steps = plan_.tasks[tasks[i]].steps;
      for (std::size_t s = 1; s < steps.size(); ++s)
        KVC_RETURN_IF_ERROR(runStep(steps[s], value));
    }
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
    case StepKind::Send:
      return sendObject(value);
    default:
      return invalidArgument(std::string("save: plan ") + plan_.name +
                             " has a " + kvc::name(step.kind) +
                             ", which no save step is");
    }
  }

  /// A gather that names no save kernel (those run in batches, runBatch).
  Status gather(SaveValue &value) {
    if (value.kernel)
      return internalError("save: a save kernel's gather outside its batch");
    KVC_RETURN_IF_ERROR(
        target_.source->gather(*objects_, value.ref, value.values));
    gathered();
    return Status::ok();
  }

  /// Counts a gather done; the last one ends the snapshot.
  void gathered() {
    if (gathers_.fetch_sub(1) == 1) {
      snapshotSeconds_ = secondsSince(start_);
      if (options_.snapshotted)
        options_.snapshotted();
    }
  }

  Status encode(SaveValue &value) {
    if (value.encoded)
      return Status::ok();
    if (options_.chooser && !value.kernel)
      value.ref.codec =
          options_.chooser->choose(*objects_, value.ref, value.values.data());
    Clock::time_point start = Clock::now();
    StatusOr<std::string> object =
        value.kernel ? objects_->encodePayload(value.ref, value.payload)
                     : objects_->encode(value.ref, value.values.data());
    if (!object.isOk())
      return object.status();
    value.encodeSeconds = secondsSince(start);
    value.object = std::move(*object);
    value.values = {};
    value.payload = {};
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

  /// Hands the object to the target's sender.
  Status sendObject(SaveValue &value) {
    KVC_RETURN_IF_ERROR(encode(value));
    const int64_t bytes = int64_t(value.object.size());
    KVC_RETURN_IF_ERROR(
        target_.send(value.ref, std::move(value.object), value.encodeSeconds));
    value.object = {};
    std::lock_guard<std::mutex> lock(mutex_);
    bytesWritten_[value.tier] += bytes;
    ++written_;
    return Status::ok();
  }

  static const char *endpointName(StepKind kind) {
    return kind == StepKind::Send ? "sends to" : "stores to";
  }

  const BundlePlan &plan_;
  const SaveTarget &target_;
  const SaveRunOptions &options_;
  /// The objects' layout and encoder: the store's, or the target's for a
  /// plan that sends (then store_ is null).
  const ChunkObjects *objects_ = nullptr;
  ChunkStore *store_ = nullptr;
  std::vector<std::shared_ptr<SaveValue>> values_;
  std::atomic<int64_t> gathers_{0}, kernelLaunches_{0}, kernelChunks_{0};
  std::vector<std::string> kernelsNotLaunched_; ///< Guarded by mutex_.
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
  if (!target.tokens || !target.source)
    return invalidArgument("save: tokens and a source are required");
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

namespace {

/// Whether a save beside a prefill reads the paged cache the prefill fills
/// rather than the prefill's host hand-over: a plan of KV only, a kernel
/// table with save kernels, and a device that launches kernels, so that
/// the plan's save kernels encode each object where the prefill wrote it.
bool savesFromTheCache(const Device &device, const PlanObjects &what,
                       const SaveOptions &stream, const SaveRunOptions &run) {
  return run.kernels &&
         std::any_of(run.kernels->begin(), run.kernels->end(),
                     [](const BundleKernel &kernel) {
                       return kernel.kind == BundleKernel::Kind::Save;
                     }) &&
         device.launchesKernels() && !stream.computed &&
         what.forms == std::vector<Form>{Form::KV};
}

/// Prefills `tokens` with `model` into `cache` through `table`, `span`
/// tokens a step through every layer, counting each layer of each step in
/// `filling` as the device writes it; stops early once `stop` is set. Its
/// seconds.
StatusOr<double> prefillCounting(Device &device, const LlamaModel &model,
                                 const std::vector<int32_t> &tokens,
                                 int64_t span, PagedKVCache &cache,
                                 const BlockTable &table,
                                 LayerProgress &filling,
                                 const SaveOptions &stream,
                                 const std::atomic<bool> &stop) {
  const int64_t n = int64_t(tokens.size()), layers = model.config().numLayers;
  std::unique_ptr<ModelRunner> runner = device.createRunner(model);
  Clock::time_point start = Clock::now();
  for (int64_t s0 = 0; s0 < n; s0 += span) {
    if (stop)
      return failedPrecondition("the save failed");
    if (stream.cancel && stream.cancel->load())
      return saveInterrupted();
    const int64_t s1 = std::min(n, s0 + span);
    KVC_RETURN_IF_ERROR(runner->prefillInto(
        cache, table, tokens.data() + s0, s0, s1 - s0, layers,
        [&](int64_t layer) { filling.add(layer, layer + 1, s1 - s0); }));
    if (stream.progress)
      stream.progress(s1, n);
  }
  return secondsSince(start);
}

/// Runs `plan` into `target` (its stores or sender; the source and tokens
/// are set here) beside a prefill of `tokens` with `model` on `device`
/// that computes the objects of `objects`' layout: the plan's gathers read
/// the device's paged cache as the prefill fills it (savesFromTheCache),
/// or take each object as the prefill hands it over on the host.
StatusOr<SaveMetrics> runDuringPrefill(Device &device, const LlamaModel &model,
                                       const ChunkObjects &objects,
                                       const std::vector<int32_t> &tokens,
                                       const BundlePlan &plan,
                                       SaveTarget target, StepKind endpoint,
                                       const SaveOptions &stream,
                                       const SaveRunOptions &run) {
  const int64_t n = int64_t(tokens.size());
  KVC_ASSIGN_OR_RETURN(what, planObjects(plan, objects, n, endpoint));
  KVC_ASSIGN_OR_RETURN(pools, device.createPools(planResources(plan)));
  target.tokens = &tokens;
  // The save ends before the prefill only when it fails: then nothing is
  // left to prefill for, and `failed` frees a prefill waiting on the save.
  std::atomic<bool> saveEnded{false};
  StatusOr<SaveMetrics> saved = internalError("the save has not ended");
  auto startSave = [&](std::function<void(const Status &)> failed) {
    return startThread([&, failed] {
      saved = save(*pools, plan, target, run);
      saveEnded = true;
      if (!saved.isOk())
        failed(saved.status());
    });
  };
  StatusOr<double> prefilled = 0.0;
  SaveStats handOver; // Of a prefill handing its objects over on the host.
  // Whose error to report: the save's when it failed first (the prefill
  // then stops), else the prefill's (the save's gathers then fail with it).
  bool saveFailedFirst = false;
  if (savesFromTheCache(device, what, stream, run)) {
    KVC_ASSIGN_OR_RETURN(span, prefillSpan(stream, objects.layout()));
    KVC_ASSIGN_OR_RETURN(cache, device.cacheFor(model.config(), n));
    auto &[paged, table] = cache;
    LayerProgress filling;
    filling.reset(model.config().numLayers, n);
    PagedCacheSource source(device, *paged, table, &filling);
    target.source = &source;
    KVC_ASSIGN_OR_RETURN(saver, startSave([](const Status &) {}));
    prefilled = prefillCounting(device, model, tokens, span, *paged, table,
                                filling, stream, saveEnded);
    saveFailedFirst = saveEnded;
    filling.finish(prefilled.status());
    saver.join();
    paged->release(table);
  } else {
    PrefillSnapshots snapshots(stream.bufferBytes);
    target.source = &snapshots;
    auto release = [&](const Status &status) { snapshots.finish(status); };
    KVC_ASSIGN_OR_RETURN(saver, startSave(release));
    SaveOptions prefill = stream;
    prefill.forms = what.forms;
    prefill.codec = what.codec;
    prefill.dryRun = false;
    prefill.device = &device;
    StatusOr<SaveStats> streamed = streamContext(
        model, objects, tokens, prefill,
        [&](const ChunkRef &ref, const float *values) -> StatusOr<bool> {
          if (saveEnded)
            return failedPrecondition("the save failed");
          snapshots.put(ref, values, size_t(objects.shape(ref).numel()));
          return true;
        });
    saveFailedFirst = saveEnded;
    snapshots.finish(streamed.status());
    saver.join();
    prefilled = streamed.isOk() ? StatusOr<double>(streamed->prefillSeconds)
                                : StatusOr<double>(streamed.status());
    if (streamed.isOk())
      handOver = *streamed;
  }
  if (!prefilled.isOk() && !saveFailedFirst)
    return prefilled.status();
  if (!saved.isOk())
    return saved;
  if (!prefilled.isOk())
    return prefilled.status();
  saved->prefillSeconds = *prefilled;
  saved->stallSeconds = handOver.stallSeconds;
  saved->peakBufferedBytes = handOver.peakBufferedBytes;
  return saved;
}

} // namespace

StatusOr<SaveMetrics>
saveDuringPrefill(Device &device, const LlamaModel &model,
                  const std::vector<int32_t> &tokens, const BundlePlan &plan,
                  const std::map<std::string, ChunkStore *> &stores,
                  const SaveOptions &stream, const SaveRunOptions &run) {
  if (stores.empty() || !stores.begin()->second)
    return invalidArgument("save: no store");
  SaveTarget target;
  target.stores = stores;
  return runDuringPrefill(device, model, *stores.begin()->second, tokens, plan,
                          std::move(target), StepKind::Store, stream, run);
}

StatusOr<SaveMetrics> sendDuringPrefill(
    Device &device, const LlamaModel &model, const ChunkObjects &objects,
    const std::vector<int32_t> &tokens, const BundlePlan &plan,
    ObjectSender send, const SaveOptions &stream, const SaveRunOptions &run) {
  SaveTarget target;
  target.send = std::move(send);
  target.objects = &objects;
  return runDuringPrefill(device, model, objects, tokens, plan,
                          std::move(target), StepKind::Send, stream, run);
}

StatusOr<SaveStats> saveContext(const LlamaModel &model, ChunkStore &store,
                                const std::vector<int32_t> &tokens,
                                const SaveOptions &options) {
  if (options.dryRun) // The prefill alone: nothing to plan.
    return streamContext(model, store, tokens, options,
                         [](const ChunkRef &, const float *) {
                           return StatusOr<bool>(false);
                         });
  // One engine: the plan a compiler would write for the store's layout,
  // its encodes and writes on the options' writers, at most the buffers'
  // worth of objects between a gather and its store. Options the prefill
  // refuses are refused before it starts.
  KVC_RETURN_IF_ERROR(prefillSpan(options, store.layout()).status());
  BundlePlan plan = savePlanFor(
      store, int64_t(tokens.size()), options.forms, options.codec, "store",
      savePlanShape(model.config(), store.layout(), options.writers,
                    options.bufferBytes));
  SaveRunOptions run;
  run.cancel = options.cancel;
  StatusOr<SaveMetrics> metrics =
      saveDuringPrefill(deviceOr(options.device), model, tokens, plan,
                        {{"store", &store}}, options, run);
  if (!metrics.isOk() && options.cancel && options.cancel->load())
    return saveInterrupted(); // Whichever task saw it, the save was stopped.
  KVC_RETURN_IF_ERROR(metrics.status());
  return saveStats(*metrics);
}

SaveStats saveStats(const SaveMetrics &metrics) {
  SaveStats stats;
  stats.prefillSeconds = metrics.prefillSeconds;
  // The save starts just after the prefill: the later end of the two.
  stats.totalSeconds =
      std::max(metrics.prefillSeconds, metrics.makespanSeconds);
  stats.stallSeconds = metrics.stallSeconds;
  stats.peakBufferedBytes = metrics.peakBufferedBytes;
  stats.written = metrics.written;
  stats.skipped = metrics.skipped;
  return stats;
}

SavePlanShape savePlanShape(const ModelConfig &model, const StoreLayout &layout,
                            int writers, size_t bufferBytes) {
  const int64_t widest =
      std::max(2 * model.numKvHeads * model.headDim, model.hiddenSize);
  const int64_t objectBytes = std::max<int64_t>(
      layout.chunkTokens * layout.layerGroup * widest * int64_t(sizeof(float)),
      1);
  SavePlanShape shape;
  shape.lanes = std::max(writers, 1);
  shape.window =
      std::max<int64_t>(int64_t(bufferBytes) / objectBytes, shape.lanes);
  return shape;
}

BundlePlan savePlanFor(const ChunkObjects &objects, int64_t tokens,
                       const std::vector<Form> &forms, const CodecSpec &codec,
                       const std::string &tier, const SavePlanShape &shape) {
  const int64_t layers = objects.model().numLayers;
  const StoreLayout &layout = objects.layout();
  BundlePlan plan;
  plan.name = "save";
  plan.tokens = {0, tokens};
  plan.layers = {0, layers};
  std::vector<int64_t> stores; // Each object's store task, in order.
  auto add = [&](Resource resource, StepKind kind, const BundleStep &box,
                 std::optional<int64_t> input) {
    BundleTask task;
    task.id = int64_t(plan.tasks.size());
    task.resource = resource;
    if (resource != Resource::Compute)
      task.lane = int64_t(stores.size()) % std::max<int64_t>(shape.lanes, 1);
    if (input) {
      task.after = {*input};
      task.inputs = {*input};
    } else if (shape.window > 0 &&
               int64_t(stores.size()) >= shape.window) {
      task.after = {stores[stores.size() - size_t(shape.window)]};
    }
    BundleStep step = box;
    step.kind = kind;
    if (kind == StepKind::Store)
      step.tier = tier;
    else if (kind == StepKind::Send)
      step.node = tier;
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
        if (!codec.isRaw() || shape.encodeOnLanes) {
          box.codec = codec; // A compress consumes its quantized input.
          box.codec.lossless = CodecSpec::Lossless::None;
          last = add(Resource::Decode, StepKind::Compress, box, last);
        }
        box.codec = codec;
        const bool sends = shape.to == StepKind::Send;
        stores.push_back(add(sends ? Resource::Net : Resource::IO,
                             sends ? StepKind::Send : StepKind::Store, box,
                             last));
      }
  return plan;
}

} // namespace kvc
