//===- Executor.cpp - Running compiled restore plans ----------------------===//

#include "kvc/Runtime/Exec/Executor.h"

#include "PrefillState.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Half.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

namespace kvc {

namespace {

/// The pool a task runs in: io tasks in their tier's.
std::string poolOf(const BundleTask &task) {
  for (const BundleStep &step : task.steps)
    if (step.kind == StepKind::Fetch)
      return poolName(task.resource, step.tier);
  return poolName(task.resource);
}

/// A staging slot: buffers for one chunk in flight, allocated on first use
/// and reused by every chunk the plan routes through the slot (the plan's
/// staging budget bounds their number). The host side (`objects`, `data`)
/// is held from the fetch to the copy to the device, the device side
/// (`device`, and `projected` for KV projected from hidden states) from
/// that copy to the scatter. Decoded chunks are bf16, as the paged cache
/// is. `busy` and `deviceBusy` turn a plan that would refill either side
/// early into an error instead of a race.
struct StagingSlot {
  std::atomic<bool> busy{false}, deviceBusy{false};
  std::vector<std::pair<ChunkRef, std::string>> objects;
  std::vector<uint16_t> data;
  std::vector<uint16_t> device, projected;
};

/// A chunk on its way through a chain of tasks. Layout of `data`: per
/// layer of `layers`, K then V ([tokens][kvDim] each) for KV, or the layer's
/// input hidden states ([tokens][hidden]), in 16-bit words of the form's
/// element type (Run::dtypeOf): bf16 for KV, as the paged cache holds it;
/// the model's own dtype for hidden states, which the projection reads
/// exactly.
struct ChunkValue {
  Form form = Form::KV;
  BundleRange tokens, layers;
  std::string tier;
  /// The codec the plan loads the stored objects with (its fetch's).
  CodecSpec codec;
  /// The stored objects as read (`objects[0, objectCount)`) and whether
  /// they still await decoding into `data`.
  std::vector<std::pair<ChunkRef, std::string>> objects;
  std::size_t objectCount = 0;
  bool encoded = false;
  std::vector<uint16_t> data;
  /// The staging slot whose host buffers `objects` and `data` are while
  /// held, and the one whose device buffer `data` is after the copy.
  StagingSlot *slot = nullptr;
  StagingSlot *deviceSlot = nullptr;
  /// Why the chunk will be recomputed instead ("" while it is fine).
  std::string fault;
  /// Computed chunks are in the paged cache already: their prefill wrote
  /// each layer's KV there as it went, as a server's attention writes a
  /// prefill chunk's KV into its cache, and their scatter has nothing left
  /// to copy.
  bool inCache = false;
};

/// 16-bit words per element of `dtype`.
int64_t wordsPer(DType dtype) { return dtype == DType::F32 ? 2 : 1; }

/// Decodes `ref`'s stored `bytes`, which the plan loads as `planned`, into
/// `out` as elements of `dtype`.
Status decodeAs(const ChunkStore &store, const ChunkRef &ref,
                std::string_view bytes, const CodecSpec &planned, DType dtype,
                uint16_t *out) {
  if (dtype == DType::BF16)
    return store.decode(ref, bytes, out, nullptr, &planned);
  const int64_t n = store.shape(ref).numel();
  std::vector<float> values(n);
  KVC_RETURN_IF_ERROR(
      store.decode(ref, bytes, values.data(), nullptr, &planned));
  if (dtype == DType::F32)
    std::memcpy(out, values.data(), size_t(n) * sizeof(float));
  else
    for (int64_t i = 0; i < n; ++i)
      out[i] = floatToF16(values[i]);
  return Status::ok();
}

/// `n` elements of `dtype` at `words` as floats.
void toFloats(const uint16_t *words, int64_t n, DType dtype, float *out) {
  if (dtype == DType::F32) {
    std::memcpy(out, words, size_t(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    out[i] =
        dtype == DType::BF16 ? bf16ToFloat(words[i]) : f16ToFloat(words[i]);
}

} // namespace

bool recoverableByRecompute(const Status &status) {
  switch (status.code()) {
  case StatusCode::NotFound:
  case StatusCode::DataLoss:
  case StatusCode::FailedPrecondition:
  case StatusCode::Unavailable:
    return true;
  default:
    return false;
  }
}

namespace {

class Run {
public:
  Run(const BundlePlan &plan, const RestoreTarget &target)
      : plan_(plan), target_(target), model_(*target.model),
        config_(model_.config()),
        prefill_(model_, *target.tokens, *target.cache, *target.table) {}

  StatusOr<TaskGraph> build() {
    const int64_t n = int64_t(target_.tokens->size());
    if (plan_.tokens.begin != 0 || plan_.tokens.end != n)
      return invalidArgument(
          "restore: plan " + plan_.name + " covers tokens " +
          std::to_string(plan_.tokens.begin) + " to " +
          std::to_string(plan_.tokens.end) + ", the request has " +
          std::to_string(n));
    if (plan_.layers.begin != 0 || plan_.layers.end != config_.numLayers)
      return invalidArgument("restore: plan " + plan_.name +
                             " does not cover the model's " +
                             std::to_string(config_.numLayers) + " layers");
    KVC_RETURN_IF_ERROR(checkCoverage(n));
    values_.resize(plan_.tasks.size());
    slots_ = std::make_unique<StagingSlot[]>(plan_.stagingSlots);
    TaskGraph graph;
    for (std::size_t i = 0; i < plan_.tasks.size(); ++i) {
      const BundleTask &task = plan_.tasks[i];
      const BundleStep &first = task.steps.front();
      if (first.kind == StepKind::Fetch ||
          first.kind == StepKind::ChunkCompute) {
        auto value = std::make_shared<ChunkValue>();
        value->form = first.form;
        value->tokens = first.tokens;
        value->layers = first.layers;
        value->tier = first.tier;
        values_[i] = value;
      } else if (!task.inputs.empty()) {
        values_[i] = values_[task.inputs.front()];
      } else {
        return invalidArgument("restore: task " + std::to_string(i) +
                               " starts with " + name(first.kind) +
                               " but reads no chunk");
      }
      for (const BundleStep &step : task.steps) {
        if (step.kind == StepKind::Fetch) {
          auto store = target_.stores.find(step.tier);
          if (store == target_.stores.end())
            return invalidArgument("restore: no store for tier \"" +
                                   step.tier + "\"");
          refs(step.tier, step.form); // Computed once, here.
        }
        if (step.kind == StepKind::ChunkCompute && step.layers.begin != 0)
          return unimplemented("restore: chunk_compute over layers " +
                               std::to_string(step.layers.begin) + " to " +
                               std::to_string(step.layers.end) +
                               " (compute above layer 0, from loaded hidden "
                               "states, is not supported)");
      }
      std::string label =
          task.steps.size() == 1 ? name(first.kind) : task.kernel;
      if (label.empty())
        label = std::string(name(first.kind)) + "+" +
                std::to_string(task.steps.size() - 1);
      label += " " + std::to_string(first.tokens.begin) + ":" +
               std::to_string(first.tokens.end);
      graph.add({label, poolOf(task), task.after,
                 [this, i](int) { return runTask(i); }});
    }
    return graph;
  }

  /// Fails unless the plan's scatters write every (token, layer) of the
  /// request exactly once: a plan that leaves part of the cache unwritten
  /// must not pass for a restore.
  Status checkCoverage(int64_t tokens) const {
    std::vector<std::vector<BundleRange>> perLayer(config_.numLayers);
    for (const BundleTask &task : plan_.tasks)
      for (const BundleStep &step : task.steps)
        if (step.kind == StepKind::Scatter)
          for (int64_t l = step.layers.begin; l < step.layers.end; ++l)
            perLayer[l].push_back(step.tokens);
    for (int64_t l = 0; l < config_.numLayers; ++l) {
      std::vector<BundleRange> &ranges = perLayer[l];
      std::sort(ranges.begin(), ranges.end(),
                [](const BundleRange &a, const BundleRange &b) {
                  return a.begin < b.begin;
                });
      auto gap = [&](int64_t from, int64_t to) {
        return invalidArgument("restore: plan " + plan_.name +
                               " leaves tokens " + std::to_string(from) +
                               " to " + std::to_string(to) + " of layer " +
                               std::to_string(l) + " unwritten");
      };
      int64_t covered = 0;
      for (const BundleRange &r : ranges) {
        if (r.begin < covered)
          return invalidArgument(
              "restore: plan " + plan_.name + " writes tokens " +
              std::to_string(r.begin) + " to " +
              std::to_string(std::min(covered, r.end)) + " of layer " +
              std::to_string(l) + " twice");
        if (r.begin > covered)
          return gap(covered, r.begin);
        covered = r.end;
      }
      if (covered < tokens)
        return gap(covered, tokens);
    }
    return Status::ok();
  }

  /// Recomputes the chunks that could not be loaded.
  Status recoverFallbacks(RestoreMetrics &metrics) {
    std::vector<std::shared_ptr<ChunkValue>> failed;
    for (const auto &value : values_)
      if (value && !value->fault.empty() &&
          std::find(failed.begin(), failed.end(), value) == failed.end())
        failed.push_back(value);
    if (failed.empty())
      return Status::ok();
    Clock::time_point start = Clock::now();
    for (const auto &value : failed) {
      KVC_RETURN_IF_ERROR(prefill_.compute(value->tokens.begin,
                                           value->tokens.end,
                                           value->layers.begin,
                                           value->layers.end));
      metrics.fallbacks.push_back(
          std::string(name(value->form)) + " tokens " +
          std::to_string(value->tokens.begin) + " to " +
          std::to_string(value->tokens.end) + ", layers " +
          std::to_string(value->layers.begin) + " to " +
          std::to_string(value->layers.end) + " recomputed: " + value->fault);
    }
    metrics.fallbackSeconds = secondsSince(start);
    return Status::ok();
  }

  double flops() const { return flops_ + prefill_.flops(); }
  int64_t exactContextBytes() const { return prefill_.exactBytes(); }

  /// Bytes of host staging buffers the slots hold (they only grow, so this
  /// is their peak).
  int64_t stagingBytes() const {
    int64_t bytes = 0;
    for (int64_t s = 0; s < plan_.stagingSlots; ++s) {
      const StagingSlot &slot = slots_[s];
      for (const auto &object : slot.objects)
        bytes += int64_t(object.second.capacity());
      bytes += int64_t((slot.data.capacity() + slot.device.capacity() +
                        slot.projected.capacity()) *
                       sizeof(uint16_t));
    }
    return bytes;
  }
  const std::map<std::string, int64_t> &bytesRead() const {
    return bytesRead_;
  }

private:
  const std::vector<ChunkRef> &refs(const std::string &tier, Form form) {
    auto key = std::make_pair(tier, form);
    auto it = refs_.find(key);
    if (it == refs_.end())
      it = refs_
               .emplace(key, target_.stores.at(tier)->refs(
                                 target_.tokens->data(),
                                 int64_t(target_.tokens->size()), form))
               .first;
    return it->second;
  }

  Status runTask(std::size_t index) {
    const BundleTask &task = plan_.tasks[index];
    ChunkValue &value = *values_[index];
    for (const BundleStep &step : task.steps) {
      if (!value.fault.empty())
        return Status::ok(); // To be recomputed after the graph.
      Status status = runStep(step, value, task.slot);
      if (!status.isOk()) {
        if (!recoverableByRecompute(status))
          return status;
        value.fault = status.toString();
        releaseSlot(value);
        releaseDevice(value);
      }
    }
    return Status::ok();
  }

  Status runStep(const BundleStep &step, ChunkValue &value,
                 std::optional<int64_t> slot) {
    switch (step.kind) {
    case StepKind::Fetch:
      value.codec = step.codec;
      return fetch(value, slot);
    case StepKind::Decompress:
      return decode(value);
    case StepKind::TransferToDevice:
    case StepKind::Project:
    case StepKind::Scatter:
      // Steps after a fetch of a raw chunk may find it not yet decoded (the
      // compiler emits no decompress for raw data): decode it first.
      if (value.encoded)
        KVC_RETURN_IF_ERROR(decode(value));
      break;
    case StepKind::ChunkCompute:
    case StepKind::Dequant:
    case StepKind::Untransform:
      break;
    default:
      return unimplemented(std::string("restore: step ") + name(step.kind) +
                           " has no CPU implementation");
    }
    // The copy to the "device" frees the staging slot, as an H2D copy does.
    if (step.kind == StepKind::TransferToDevice)
      return copyToDevice(value);
    if (!(step.tokens == value.tokens) || !(step.layers == value.layers))
      return unimplemented(std::string("restore: step ") + name(step.kind) +
                           " over tokens " + std::to_string(step.tokens.begin) +
                           " to " + std::to_string(step.tokens.end) +
                           " works on part of its chunk");
    switch (step.kind) {
    case StepKind::Project:
      return project(value);
    case StepKind::ChunkCompute:
      return compute(value);
    case StepKind::Scatter:
      return scatter(value);
    default:
      return Status::ok(); // Dequant, untransform: done by decompress here.
    }
  }

  static bool overlaps(const ChunkRef &ref, const ChunkValue &value) {
    return ref.tokenBegin < value.tokens.end &&
           value.tokens.begin < ref.tokenEnd &&
           ref.layerBegin < value.layers.end &&
           value.layers.begin < ref.layerEnd;
  }

  Status fetch(ChunkValue &value, std::optional<int64_t> slot) {
    if (slot) {
      StagingSlot &staging = slots_[*slot];
      if (staging.busy.exchange(true))
        return Status(StatusCode::Internal,
                      "restore: staging slot " + std::to_string(*slot) +
                          " refilled before its chunk was copied out");
      value.slot = &staging;
      value.objects.swap(staging.objects);
      value.data.swap(staging.data);
    }
    ChunkStore &store = *target_.stores.at(value.tier);
    int64_t bytes = 0;
    value.objectCount = 0;
    for (const ChunkRef &ref : refs(value.tier, value.form)) {
      if (!overlaps(ref, value))
        continue;
      if (value.objectCount == value.objects.size())
        value.objects.emplace_back();
      auto &[stored, buffer] = value.objects[value.objectCount++];
      stored = ref;
      KVC_RETURN_IF_ERROR(store.tier().get(ref.name(), buffer));
      bytes += int64_t(buffer.size());
    }
    if (value.objectCount == 0)
      return notFound("no stored object covers the chunk");
    value.encoded = true;
    std::lock_guard<std::mutex> lock(mutex_);
    bytesRead_[value.tier] += bytes;
    return Status::ok();
  }

  /// Gives a held slot's host buffers back.
  void releaseSlot(ChunkValue &value) {
    if (!value.slot)
      return;
    value.objects.swap(value.slot->objects);
    value.data.swap(value.slot->data);
    value.objects.clear();
    value.objectCount = 0;
    value.data.clear();
    value.slot->busy.store(false);
    value.slot = nullptr;
  }

  /// Gives a held slot's device buffer back.
  void releaseDevice(ChunkValue &value) {
    if (!value.deviceSlot)
      return;
    value.data.swap(value.deviceSlot->device);
    value.data.clear();
    value.deviceSlot->deviceBusy.store(false);
    value.deviceSlot = nullptr;
  }

  /// The CPU backend's host-to-device copy: into the slot's device buffer,
  /// freeing the host side (a chunk staged without a slot keeps its own
  /// buffer).
  Status copyToDevice(ChunkValue &value) {
    if (!value.slot)
      return Status::ok(); // Unstaged: the chunk's buffer is its own.
    StagingSlot &slot = *value.slot;
    if (slot.deviceBusy.exchange(true))
      return Status(StatusCode::Internal,
                    "restore: the device buffer of a staging slot was "
                    "refilled before its chunk was scattered");
    slot.device.assign(value.data.begin(), value.data.end());
    releaseSlot(value);
    value.data.swap(slot.device);
    value.deviceSlot = &slot;
    return Status::ok();
  }

  int64_t width(Form form) const {
    return form == Form::KV ? model_.kvDim() : config_.hiddenSize;
  }

  /// The element type of a chunk of `form` once decoded.
  DType dtypeOf(Form form) const {
    return form == Form::KV ? DType::BF16 : config_.dtype;
  }

  Status decode(ChunkValue &value) {
    ChunkStore &store = *target_.stores.at(value.tier);
    const int64_t w = width(value.form);
    const int64_t mats = value.form == Form::KV ? 2 : 1;
    const int64_t tokens = value.tokens.size();
    const DType dtype = dtypeOf(value.form);
    const int64_t words = wordsPer(dtype);
    value.data.resize(value.layers.size() * mats * tokens * w * words);
    std::vector<uint16_t> object;
    for (std::size_t o = 0; o < value.objectCount; ++o) {
      auto &[ref, bytes] = value.objects[o];
      const int64_t refTokens = ref.tokenEnd - ref.tokenBegin;
      if (ref.tokenBegin == value.tokens.begin && refTokens == tokens &&
          ref.layerBegin >= value.layers.begin &&
          ref.layerEnd <= value.layers.end) {
        // The object holds whole layers of the chunk, laid out as the chunk
        // lays them out: decode in place.
        KVC_RETURN_IF_ERROR(
            decodeAs(store, ref, bytes, value.codec, dtype,
                     value.data.data() + (ref.layerBegin - value.layers.begin) *
                                             mats * tokens * w * words));
      } else {
        object.resize(store.shape(ref).numel() * words);
        KVC_RETURN_IF_ERROR(
            decodeAs(store, ref, bytes, value.codec, dtype, object.data()));
        // Copy the rows of the object inside the value's box.
        const int64_t t0 = std::max(ref.tokenBegin, value.tokens.begin);
        const int64_t t1 = std::min(ref.tokenEnd, value.tokens.end);
        const int64_t l0 = std::max(ref.layerBegin, value.layers.begin);
        const int64_t l1 = std::min(ref.layerEnd, value.layers.end);
        for (int64_t l = l0; l < l1; ++l)
          for (int64_t m = 0; m < mats; ++m)
            std::memcpy(
                value.data.data() +
                    (((l - value.layers.begin) * mats + m) * tokens +
                     (t0 - value.tokens.begin)) * w * words,
                object.data() +
                    (((l - ref.layerBegin) * mats + m) * refTokens +
                     (t0 - ref.tokenBegin)) * w * words,
                size_t((t1 - t0) * w * words) * sizeof(uint16_t));
      }
      if (!value.slot)
        bytes = std::string(); // Unstaged bytes are not kept for reuse.
    }
    value.encoded = false;
    return Status::ok();
  }

  /// K and V of the chunk's hidden states, layer by layer (fp32 in the
  /// projection, bf16 out).
  Status project(ChunkValue &value) {
    const DType dtype = dtypeOf(Form::Hidden);
    const int64_t tokens = value.tokens.size();
    const int64_t h = config_.hiddenSize, kv = model_.kvDim();
    if (value.form != Form::Hidden ||
        int64_t(value.data.size()) !=
            value.layers.size() * tokens * h * wordsPer(dtype))
      return Status(StatusCode::Internal,
                    "restore: project of a chunk that holds no hidden states");
    std::vector<uint16_t> unstaged;
    std::vector<uint16_t> &out =
        value.deviceSlot ? value.deviceSlot->projected : unstaged;
    out.resize(value.layers.size() * 2 * tokens * kv);
    std::vector<float> hidden(tokens * h), k(tokens * kv), v(tokens * kv);
    for (int64_t l = 0; l < value.layers.size(); ++l) {
      toFloats(value.data.data() + l * tokens * h * wordsPer(dtype), tokens * h,
               dtype, hidden.data());
      model_.project(value.layers.begin + l, hidden.data(), tokens,
                     value.tokens.begin, k.data(), v.data());
      uint16_t *kOut = out.data() + (2 * l) * tokens * kv;
      uint16_t *vOut = kOut + tokens * kv;
      for (int64_t i = 0; i < tokens * kv; ++i) {
        kOut[i] = floatToBf16(k[i]);
        vOut[i] = floatToBf16(v[i]);
      }
    }
    value.data.swap(out);
    value.form = Form::KV;
    addFlops(model_.projectFlops(tokens, value.layers.size()));
    return Status::ok();
  }

  /// Prefills the box's tokens through its layers into the paged cache.
  Status compute(ChunkValue &value) {
    KVC_RETURN_IF_ERROR(prefill_.compute(value.tokens.begin, value.tokens.end,
                                         0, value.layers.end));
    value.form = Form::KV;
    value.inCache = true;
    return Status::ok();
  }

  Status scatter(ChunkValue &value) {
    if (value.inCache)
      return Status::ok();
    if (value.form != Form::KV)
      return Status(StatusCode::Internal,
                    "restore: scatter of hidden states (missing project)");
    const int64_t kv = model_.kvDim(), tokens = value.tokens.size();
    if (int64_t(value.data.size()) != value.layers.size() * 2 * tokens * kv)
      return Status(StatusCode::Internal,
                    "restore: scatter of a chunk that holds no KV (a plan "
                    "step is missing before it)");
    for (int64_t l = 0; l < value.layers.size(); ++l)
      KVC_RETURN_IF_ERROR(target_.cache->write(
          *target_.table, value.layers.begin + l, value.tokens.begin, tokens,
          value.data.data() + (2 * l) * tokens * kv,
          value.data.data() + (2 * l + 1) * tokens * kv));
    if (value.deviceSlot)
      releaseDevice(value);
    else if (value.slot)
      releaseSlot(value);
    else
      value.data = {};
    return Status::ok();
  }

  void addFlops(double flops) {
    std::lock_guard<std::mutex> lock(mutex_);
    flops_ += flops;
  }

  const BundlePlan &plan_;
  const RestoreTarget &target_;
  const LlamaModel &model_;
  const ModelConfig &config_;
  std::vector<std::shared_ptr<ChunkValue>> values_;
  std::unique_ptr<StagingSlot[]> slots_;
  std::map<std::pair<std::string, Form>, std::vector<ChunkRef>> refs_;
  exec_detail::PrefillState prefill_;
  std::mutex mutex_; ///< Guards the counters below.
  double flops_ = 0;
  std::map<std::string, int64_t> bytesRead_;
};

} // namespace

std::map<std::string, int> planResources(const BundlePlan &plan) {
  std::map<std::string, int> lanes;
  for (const BundleTask &task : plan.tasks) {
    int &count = lanes[poolOf(task)];
    count = std::max(count, int(task.lane) + 1);
  }
  return lanes;
}

namespace {

/// The plan's side of the metrics: predicted busy time and bytes where the
/// compiler estimated them, and the FLOPs its steps take, counted as the
/// run counts them (projections and MLPs; attention left out).
void addPredictions(const BundlePlan &plan, const LlamaModel &model,
                    RestoreMetrics &metrics) {
  for (const BundleTask &task : plan.tasks) {
    if (task.predictedNs)
      metrics.predictedBusySeconds[poolOf(task)] +=
          double(task.predictedNs->second - task.predictedNs->first) * 1e-9;
    for (const BundleStep &step : task.steps) {
      if (step.kind == StepKind::Fetch && step.predictedBytes)
        metrics.predictedBytesRead[step.tier] += *step.predictedBytes;
      else if (step.kind == StepKind::ChunkCompute) // Layers [0, end).
        metrics.plannedFlops +=
            model.prefillFlops(step.tokens.size(), step.layers.end);
      else if (step.kind == StepKind::Project)
        metrics.plannedFlops +=
            model.projectFlops(step.tokens.size(), step.layers.size());
    }
  }
}

} // namespace

StatusOr<RestoreMetrics> restore(ResourcePools &pools, const BundlePlan &plan,
                                 const RestoreTarget &target,
                                 const RestoreOptions &options) {
  if (!target.model || !target.tokens || !target.cache || !target.table)
    return invalidArgument("restore: model, tokens, cache and block table are "
                           "required");
  Run run(plan, target);
  StatusOr<TaskGraph> graph = run.build();
  if (!graph)
    return graph.status();
  RunResult result = runGraph(pools, *graph);
  if (!result.status.isOk())
    return result.status;
  RestoreMetrics metrics;
  KVC_RETURN_IF_ERROR(run.recoverFallbacks(metrics));
  metrics.makespanSeconds = result.makespan + metrics.fallbackSeconds;
  metrics.busySeconds = result.busy;
  metrics.bytesRead = run.bytesRead();
  metrics.flops = run.flops();
  metrics.stagingBytes = run.stagingBytes();
  metrics.exactContextBytes = run.exactContextBytes();
  if (plan.predictedUs)
    metrics.predictedSeconds = double(*plan.predictedUs) * 1e-6;
  addPredictions(plan, *target.model, metrics);
  if (!options.tracePath.empty())
    KVC_RETURN_IF_ERROR(writeChromeTrace(*graph, result, options.tracePath));
  return metrics;
}

StatusOr<RestoreError> restoreError(const LlamaModel &model,
                                    const std::vector<int32_t> &tokens,
                                    const PagedKVCache &cache,
                                    const BlockTable &table) {
  LlamaModel::Cache reference = model.newCache();
  const int64_t n = int64_t(tokens.size());
  KVC_RETURN_IF_ERROR(model.prefill(reference, tokens.data(), n));
  return restoreError(model, reference, n, cache, table);
}

StatusOr<RestoreError> restoreError(const LlamaModel &model,
                                    const LlamaModel::Cache &reference,
                                    int64_t n, const PagedKVCache &cache,
                                    const BlockTable &table) {
  if (reference.tokens < n)
    return invalidArgument("restoreError: the reference holds " +
                           std::to_string(reference.tokens) + " tokens, not " +
                           std::to_string(n));
  const int64_t kv = model.kvDim();
  std::vector<float> k(n * kv), v(n * kv);
  double maxError = 0, maxValue = 0;
  RestoreError out;
  for (int64_t l = 0; l < model.config().numLayers; ++l) {
    KVC_RETURN_IF_ERROR(cache.read(table, l, 0, n, k.data(), v.data()));
    for (auto [restored, exact] : {std::pair{&k, &reference.k[l]},
                                   std::pair{&v, &reference.v[l]}}) {
      double squaredError = 0, squaredValue = 0;
      for (int64_t i = 0; i < n * kv; ++i) {
        double error = double((*restored)[i]) - double((*exact)[i]);
        double value = (*exact)[i];
        maxError = std::max(maxError, std::abs(error));
        maxValue = std::max(maxValue, std::abs(value));
        squaredError += error * error;
        squaredValue += value * value;
      }
      double relative = squaredValue > 0
                            ? std::sqrt(squaredError / squaredValue)
                            : std::sqrt(squaredError);
      out.relativeL2 = std::max(out.relativeL2, relative);
    }
  }
  out.max = maxValue > 0 ? maxError / maxValue : maxError;
  return out;
}

} // namespace kvc
