//===- Executor.cpp - Running compiled restore plans ----------------------===//

#include "kvc/Runtime/Exec/Executor.h"

#include "ChunkSteps.h"

#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>

namespace kvc {

std::string poolOf(const BundleTask &task) {
  for (const BundleStep &step : task.steps)
    if (step.kind == StepKind::Fetch || step.kind == StepKind::Store)
      return poolName(task.resource, step.tier);
  return poolName(task.resource);
}

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
  Run(const BundlePlan &plan, const RestoreTarget &target,
      const RestoreOptions &options)
      : plan_(plan), target_(target), options_(options),
        config_(target.model->config()), device_(deviceOr(target.device)),
        kernels_(options.kernels),
        steps_(device_, *target.model, target.runner, target.stores,
               *target.tokens, *target.cache, *target.table, options.progress,
               options.resident) {}

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
    KVC_RETURN_IF_ERROR(checkResident());
    values_.resize(plan_.tasks.size());
    taskTraffic_.assign(plan_.tasks.size(), {});
    slots_.clear();
    for (int64_t s = 0; s < plan_.stagingSlots; ++s)
      slots_.emplace_back(device_.hostMemory());
    TaskGraph graph;
    for (std::size_t i = 0; i < plan_.tasks.size(); ++i) {
      const BundleTask &task = plan_.tasks[i];
      const BundleStep &first = task.steps.front();
      if (first.kind == StepKind::Fetch || first.kind == StepKind::Recv ||
          first.kind == StepKind::ChunkCompute) {
        auto value = std::make_shared<exec_detail::ChunkValue>();
        value->form = first.form;
        value->tokens = first.tokens;
        value->layers = first.layers;
        value->tier = sourceOf(first);
        value->codec = first.codec;
        values_[i] = value;
      } else if (!task.inputs.empty()) {
        values_[i] = values_[task.inputs.front()];
      } else {
        return invalidArgument("restore: task " + std::to_string(i) +
                               " starts with " + name(first.kind) +
                               " but reads no chunk");
      }
      for (const BundleStep &step : task.steps) {
        if (step.kind == StepKind::Fetch || step.kind == StepKind::Recv) {
          const std::string &source = sourceOf(step);
          auto store = target_.stores.find(source);
          if (store == target_.stores.end() || !store->second)
            return invalidArgument(
                step.kind == StepKind::Fetch
                    ? "restore: no store for tier \"" + source + "\""
                    : "restore: nothing receives from node \"" + source + "\"");
          steps_.refs(source, step.form, step.codec); // Keyed once, here.
        }
        if (step.kind == StepKind::ChunkCompute && step.layers.begin != 0)
          return unimplemented("restore: chunk_compute over layers " +
                               std::to_string(step.layers.begin) + " to " +
                               std::to_string(step.layers.end) +
                               " (compute above layer 0, from loaded hidden "
                               "states, is not supported)");
      }
      if (!task.entry.empty())
        KVC_RETURN_IF_ERROR(useKernel(i, *values_[i]));
      std::string label =
          task.steps.size() == 1 ? name(first.kind) : task.kernel;
      if (label.empty())
        label = std::string(name(first.kind)) + "+" +
                std::to_string(task.steps.size() - 1);
      label += " " + std::to_string(first.tokens.begin) + ":" +
               std::to_string(first.tokens.end);
      // Chunks of one restore kernel that are ready together share a
      // launch.
      std::string batch;
      if (values_[i]->kernel && task.steps.back().kind == StepKind::Scatter) {
        batch = values_[i]->kernel->name;
        graph.batches.try_emplace(
            batch, [this](int, const std::vector<int64_t> &tasks) {
              return runBatch(tasks);
            });
      }
      graph.add({label, poolOf(task), task.after,
                 [this, i](int) {
                   if (cancelled())
                     return restoreCancelled();
                   return belowResident(i) ? Status::ok() : runTask(i);
                 }},
                batch);
    }
    return graph;
  }

  /// Lets the generated kernel task `index` names decode and scatter its
  /// chunk (a restore kernel) or project it (useProjection), when the
  /// device launches it into the cache.
  Status useKernel(std::size_t index, exec_detail::ChunkValue &value) {
    // A chunk across the resident prefix is written in part: by the
    // runtime's scatter, which takes its rows above it.
    if (!kernels_ || !device_.launchesKernels() || acrossResident(index))
      return Status::ok();
    const BundleTask &task = plan_.tasks[index];
    const BundleKernel *found = findKernel(*kernels_, task.entry);
    if (!found)
      return invalidArgument("restore: task " + std::to_string(index) +
                             " names kernel \"" + task.entry +
                             "\", which the kernel table lacks");
    const BundleKernel &kernel = *found;
    if (kernel.kind == BundleKernel::Kind::RopeScatter)
      return useProjection(index, kernel, value);
    if (kernel.kind != BundleKernel::Kind::Restore)
      return Status::ok();
    CodecSpec stored = value.codec;
    stored.lossless = CodecSpec::Lossless::None;
    const bool unquantized = stored.quant == CodecSpec::Quant::None;
    if (value.form != Form::KV || kernel.codec != stored ||
        (unquantized && kernel.storage != dtypeName(config_.dtype)))
      return invalidArgument(
          "restore: kernel \"" + kernel.name + "\" decodes " +
          kernel.codec.str() + " over " + kernel.storage + "; task " +
          std::to_string(index) + " scatters " + name(value.form) +
          " stored as " + value.codec.str() + " over " +
          dtypeName(config_.dtype));
    Status launchable = device_.canLaunch(kernel, *target_.cache);
    if (!launchable.isOk()) {
      steps_.kernelNotLaunched(kernel.name + ": " + launchable.message());
      return Status::ok();
    }
    value.kernel = &kernel;
    return Status::ok();
  }

  /// Lets the generated projection task `index` names (its RmsNorm
  /// prologue, the runner's GEMM, `epilogue`) write its chunk's K and V,
  /// when the runner launches it into the cache.
  Status useProjection(std::size_t index, const BundleKernel &epilogue,
                       exec_detail::ChunkValue &value) {
    const BundleTask &task = plan_.tasks[index];
    const BundleKernel *prologue = findKernel(*kernels_, task.prologue);
    if (!prologue)
      return invalidArgument("restore: task " + std::to_string(index) +
                             " names prologue \"" + task.prologue +
                             "\", which the kernel table lacks");
    if (value.form != Form::Hidden ||
        prologue->storage != dtypeName(config_.dtype))
      return invalidArgument(
          "restore: kernel \"" + prologue->name +
          "\" normalizes hidden states stored as " + prologue->storage +
          "; task " + std::to_string(index) + " projects " + name(value.form) +
          " stored as " + dtypeName(config_.dtype));
    Status launchable =
        steps_.runner().canLaunchProject(*prologue, epilogue, *target_.cache);
    if (!launchable.isOk()) {
      steps_.kernelNotLaunched(epilogue.name + ": " + launchable.message());
      return Status::ok();
    }
    value.prologue = prologue;
    value.epilogue = &epilogue;
    return Status::ok();
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

  /// Fails unless every chunk that computes, or loads hidden states, lies
  /// wholly above or below the resident prefix, and no chunk above it is
  /// computed. A loaded chunk of K and V may lie across it: only its rows
  /// above it are written.
  Status checkResident() const {
    const int64_t resident = options_.resident;
    if (resident < 0 || resident > int64_t(target_.tokens->size()))
      return invalidArgument("restore: " + std::to_string(resident) +
                             " resident tokens of a request of " +
                             std::to_string(target_.tokens->size()));
    if (resident == 0)
      return Status::ok();
    for (const BundleTask &task : plan_.tasks)
      for (const BundleStep &step : task.steps) {
        const bool across =
            step.tokens.begin < resident && resident < step.tokens.end;
        if (across && (step.kind == StepKind::ChunkCompute ||
                       step.kind == StepKind::Project ||
                       step.form == Form::Hidden))
          return invalidArgument(
              "restore: plan " + plan_.name + " has a chunk of tokens " +
              std::to_string(step.tokens.begin) + " to " +
              std::to_string(step.tokens.end) + " across the " +
              std::to_string(resident) +
              " resident tokens that it computes or projects");
        if (step.kind == StepKind::ChunkCompute && step.tokens.begin >= resident)
          return unimplemented(
              "restore: plan " + plan_.name + " computes tokens " +
              std::to_string(step.tokens.begin) + " to " +
              std::to_string(step.tokens.end) +
              " above resident tokens (only loads may follow them)");
      }
    return Status::ok();
  }

  /// Whether task `index` loads a chunk across the resident prefix.
  bool acrossResident(std::size_t index) const {
    const BundleRange &tokens = plan_.tasks[index].steps.front().tokens;
    return tokens.begin < options_.resident && options_.resident < tokens.end;
  }

  /// Whether task `index` works on a chunk of the resident prefix.
  bool belowResident(std::size_t index) const {
    return plan_.tasks[index].steps.front().tokens.end <= options_.resident;
  }

  bool cancelled() const { return options_.cancel && options_.cancel->load(); }

  /// Recomputes the chunks that could not be loaded (or, without
  /// RestoreOptions::recomputeFallbacks, lists them).
  Status recoverFallbacks(RestoreMetrics &metrics) {
    std::vector<std::shared_ptr<exec_detail::ChunkValue>> failed;
    for (const auto &value : values_)
      if (value && !value->fault.empty() &&
          std::find(failed.begin(), failed.end(), value) == failed.end())
        failed.push_back(value);
    if (failed.empty())
      return Status::ok();
    Clock::time_point start = Clock::now();
    for (const auto &value : failed) {
      // Never rows of the server's resident prefix.
      value->tokens.begin = std::max(value->tokens.begin, options_.resident);
      if (options_.recomputeFallbacks)
        KVC_RETURN_IF_ERROR(steps_.computeBox(value->box()));
      metrics.fallbacks.push_back(
          std::string(name(value->form)) + " tokens " +
          std::to_string(value->tokens.begin) + " to " +
          std::to_string(value->tokens.end) + ", layers " +
          std::to_string(value->layers.begin) + " to " +
          std::to_string(value->layers.end) +
          (options_.recomputeFallbacks ? " recomputed: "
                                       : " left unwritten: ") +
          value->fault);
      metrics.fallbackTokens.push_back(value->tokens);
      metrics.fallbackFaults.push_back(value->faultKind);
    }
    metrics.fallbackSeconds = secondsSince(start);
    return Status::ok();
  }

  const exec_detail::ChunkSteps &steps() const { return steps_; }
  /// Each task's host traffic, for its trace event.
  TaskCounters taskCounters() const {
    TaskCounters counters;
    for (const HostTraffic &traffic : taskTraffic_) {
      counters.emplace_back();
      for (const auto &[name, bytes] : traffic.counters())
        counters.back().emplace_back(name + "_bytes", bytes);
    }
    return counters;
  }

  /// Bytes of staging the slots hold for their chunks, host and device:
  /// the last chunk's on the host, the largest's on the device (device
  /// buffers only grow). Host buffers kept from earlier restores may have
  /// room for more.
  int64_t stagingBytes() const {
    int64_t bytes = 0;
    for (int64_t s = 0; s < plan_.stagingSlots; ++s) {
      const exec_detail::StagingSlot &slot = slots_[s];
      for (const auto &object : slot.objects)
        bytes += int64_t(object.second.size());
      bytes += int64_t(slot.data.size() * sizeof(uint16_t));
      for (const auto *device : {&slot.device, &slot.projected})
        if (*device)
          bytes += (*device)->bytes();
    }
    return bytes;
  }

private:
  /// Records a failure of `value`'s chunk that a recompute recovers (after
  /// the graph), returning ok; returns any other status as it is.
  Status recover(exec_detail::ChunkValue &value, Status status) {
    if (status.isOk() || !recoverableByRecompute(status))
      return status;
    value.fault = status.toString();
    value.faultKind = chunkFault(status);
    if (options_.removeDamaged)
      value.fault += steps_.removeDamaged(value);
    steps_.release(value);
    return Status::ok();
  }

  /// Runs the first `count` steps of task `index`, until its chunk faults.
  Status runSteps(std::size_t index, std::size_t count) {
    const BundleTask &task = plan_.tasks[index];
    exec_detail::ChunkValue &value = *values_[index];
    const HostTraffic before = value.traffic;
    for (std::size_t i = 0; i < count && value.fault.empty(); ++i)
      KVC_RETURN_IF_ERROR(
          recover(value, runStep(task.steps[i], value, task.slot)));
    taskTraffic_[index] += value.traffic - before;
    return Status::ok();
  }

  Status runTask(std::size_t index) {
    return runSteps(index, plan_.tasks[index].steps.size());
  }

  /// Runs tasks whose last step scatters a chunk one restore kernel
  /// decodes: each task's other steps and its chunk's upload, then one
  /// launch for the chunks that did not fault.
  Status runBatch(const std::vector<int64_t> &tasks) {
    if (cancelled())
      return restoreCancelled();
    std::vector<exec_detail::ChunkValue *> launch;
    std::vector<int64_t> launchedTasks;
    for (int64_t index : tasks) {
      if (belowResident(index))
        continue;
      const BundleTask &task = plan_.tasks[index];
      exec_detail::ChunkValue &value = *values_[index];
      KVC_RETURN_IF_ERROR(runSteps(index, task.steps.size() - 1));
      // The last step's upload and its share of the launch.
      value.step = task.steps.back().kind;
      const HostTraffic before = value.traffic;
      if (value.fault.empty())
        KVC_RETURN_IF_ERROR(wholeChunk(task.steps.back(), value));
      if (value.fault.empty())
        KVC_RETURN_IF_ERROR(recover(value, steps_.toDevice(value)));
      if (value.fault.empty()) {
        launch.push_back(&value);
        launchedTasks.push_back(index);
      }
      taskTraffic_[index] += value.traffic - before;
    }
    if (launch.empty())
      return Status::ok();
    std::vector<HostTraffic> before;
    for (exec_detail::ChunkValue *value : launch)
      before.push_back(value->traffic);
    Status status = steps_.scatter(launch);
    for (std::size_t i = 0; i < launch.size(); ++i)
      taskTraffic_[launchedTasks[i]] += launch[i]->traffic - before[i];
    for (exec_detail::ChunkValue *value : launch)
      KVC_RETURN_IF_ERROR(recover(*value, status));
    return Status::ok();
  }

  /// Where a fetch or recv reads: the store of its tier, or the one of
  /// the node it receives from.
  static const std::string &sourceOf(const BundleStep &step) {
    return step.kind == StepKind::Recv ? step.node : step.tier;
  }

  /// Unimplemented unless `step` works on the whole of its chunk (of a
  /// chunk across the resident prefix, the rows above it).
  Status wholeChunk(const BundleStep &step,
                    const exec_detail::ChunkValue &value) const {
    const int64_t begin =
        step.tokens.begin < options_.resident &&
                options_.resident < step.tokens.end
            ? std::max(step.tokens.begin, value.tokens.begin)
            : step.tokens.begin;
    if (begin != value.tokens.begin || step.tokens.end != value.tokens.end ||
        !(step.layers == value.layers))
      return unimplemented(std::string("restore: step ") + name(step.kind) +
                           " over tokens " + std::to_string(step.tokens.begin) +
                           " to " + std::to_string(step.tokens.end) +
                           " works on part of its chunk");
    return Status::ok();
  }

  Status runStep(const BundleStep &step, exec_detail::ChunkValue &value,
                 std::optional<int64_t> slot) {
    value.step = step.kind;
    switch (step.kind) {
    case StepKind::Fetch:
    case StepKind::Recv:
      return steps_.fetch(value, slot ? &slots_[*slot] : nullptr);
    case StepKind::Decompress:
      return steps_.decode(value);
    case StepKind::TransferToDevice:
      return steps_.toDevice(value);
    case StepKind::Dequant:
    case StepKind::Untransform:
      return Status::ok(); // Done by the host's decode.
    case StepKind::Project:
    case StepKind::ChunkCompute:
    case StepKind::Scatter:
      break;
    default:
      return unimplemented(std::string("restore: step ") + name(step.kind) +
                           " has no implementation in the executor");
    }
    KVC_RETURN_IF_ERROR(wholeChunk(step, value));
    switch (step.kind) {
    case StepKind::Project:
      return steps_.project(value);
    case StepKind::ChunkCompute:
      return steps_.compute(value);
    default:
      return steps_.scatter(value);
    }
  }

  const BundlePlan &plan_;
  const RestoreTarget &target_;
  const RestoreOptions &options_;
  const ModelConfig &config_;
  Device &device_;
  const std::vector<BundleKernel> *kernels_;
  std::vector<std::shared_ptr<exec_detail::ChunkValue>> values_;
  /// By task (as the graph's), the host traffic of the steps it ran.
  std::vector<HostTraffic> taskTraffic_;
  std::deque<exec_detail::StagingSlot> slots_;
  exec_detail::ChunkSteps steps_;
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
void addPredictions(const BundlePlan &plan, const ModelCompute &model,
                    RestoreMetrics &metrics) {
  for (const BundleTask &task : plan.tasks) {
    if (task.predictedNs)
      metrics.predictedBusySeconds[poolOf(task)] +=
          double(task.predictedNs->second - task.predictedNs->first) * 1e-9;
    for (const BundleStep &step : task.steps) {
      if (step.kind == StepKind::Scatter && task.predictedNs) {
        std::vector<double> &ready = metrics.predictedLayerReadySeconds;
        ready.resize(std::max<size_t>(ready.size(), step.layers.end));
        for (int64_t l = step.layers.begin; l < step.layers.end; ++l)
          ready[l] =
              std::max(ready[l], double(task.predictedNs->second) * 1e-9);
      }
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

namespace {

StatusOr<RestoreMetrics> runRestore(ResourcePools &pools,
                                    const BundlePlan &plan,
                                    const RestoreTarget &target,
                                    const RestoreOptions &options) {
  KVC_RETURN_IF_ERROR(exec_detail::checkTarget(target));
  Run run(plan, target, options);
  StatusOr<TaskGraph> graph = run.build();
  if (!graph)
    return graph.status();
  if (options.resident > 0) // Written before the restore: count them.
    options.progress->add(0, target.model->config().numLayers,
                          options.resident);
  KeptSpans spans(deviceOr(target.device), !options.tracePath.empty());
  RunResult result = runGraph(pools, *graph);
  if (!result.status.isOk())
    return result.status;
  RestoreMetrics metrics;
  KVC_RETURN_IF_ERROR(run.recoverFallbacks(metrics));
  // The host's one wait for the device (besides the layers'): the cache
  // holds what the calls enqueued when the restore returns.
  KVC_RETURN_IF_ERROR(run.steps().settle());
  metrics.makespanSeconds = secondsSince(result.begin);
  metrics.layerReadySeconds =
      options.progress->readySeconds(result.begin, metrics.makespanSeconds);
  metrics.busySeconds = result.busy;
  metrics.bytesRead = run.steps().bytesRead();
  metrics.hostTraffic = run.steps().traffic();
  for (const auto &[kind, traffic] : run.steps().trafficByStep())
    metrics.hostTrafficByStep[name(kind)] = traffic;
  metrics.flops = run.steps().flops();
  metrics.kernelLaunches = run.steps().kernelLaunches();
  metrics.kernelChunks = run.steps().kernelChunks();
  metrics.kernelsNotLaunched = run.steps().kernelsNotLaunched();
  metrics.stagingBytes = run.stagingBytes();
  metrics.exactContextBytes = run.steps().exactContextBytes();
  if (plan.predictedUs)
    metrics.predictedSeconds = double(*plan.predictedUs) * 1e-6;
  addPredictions(plan, *target.model, metrics);
  if (!options.tracePath.empty())
    KVC_RETURN_IF_ERROR(writeChromeTrace(*graph, result, options.tracePath,
                                         spans.take(), run.taskCounters()));
  return metrics;
}

} // namespace

Status restoreCancelled() { return unavailable("the restore was cancelled"); }

StatusOr<RestoreMetrics> restore(ResourcePools &pools, const BundlePlan &plan,
                                 const RestoreTarget &target,
                                 const RestoreOptions &options) {
  return exec_detail::trackProgress(
      options.progress, target, [&](LayerProgress &progress) {
        RestoreOptions run = options;
        run.progress = &progress;
        return runRestore(pools, plan, target, run);
      });
}

StatusOr<RestoreError> restoreError(const ModelCompute &model,
                                    const std::vector<int32_t> &tokens,
                                    const PagedKVCache &cache,
                                    const BlockTable &table, Device &device) {
  std::unique_ptr<ModelRunner> runner = device.createRunner(model);
  KVC_ASSIGN_OR_RETURN(reference, fullPrefill(*runner, tokens));
  return restoreError(model, reference, int64_t(tokens.size()), cache, table,
                      device);
}

StatusOr<RestoreError> restoreError(const ModelCompute &model,
                                    const ModelCompute::Cache &reference,
                                    int64_t n, const PagedKVCache &cache,
                                    const BlockTable &table, Device &device) {
  if (reference.tokens < n)
    return invalidArgument("restoreError: the reference holds " +
                           std::to_string(reference.tokens) + " tokens, not " +
                           std::to_string(n));
  const int64_t kv = model.kvDim();
  std::vector<float> k(n * kv), v(n * kv);
  double maxError = 0, maxValue = 0;
  RestoreError out;
  for (int64_t l = 0; l < model.config().numLayers; ++l) {
    KVC_RETURN_IF_ERROR(
        device.readBack(cache, table, l, 0, n, k.data(), v.data()));
    for (auto [restored, exact] : {std::pair{&k, &reference.k[l]},
                                   std::pair{&v, &reference.v[l]}}) {
      double squaredError = 0, squaredValue = 0;
      for (int64_t i = 0; i < n * kv; ++i) {
        if (!std::isfinite((*restored)[i]) || !std::isfinite((*exact)[i])) {
          out.nonFiniteRestored += !std::isfinite((*restored)[i]);
          out.nonFiniteReference += !std::isfinite((*exact)[i]);
          continue;
        }
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
  if (out.nonFiniteRestored + out.nonFiniteReference > 0)
    out.max = out.relativeL2 = std::numeric_limits<double>::infinity();
  return out;
}

} // namespace kvc
