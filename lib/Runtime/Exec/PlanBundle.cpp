//===- PlanBundle.cpp - Reading and validating plan bundles ---------------===//

#include "kvc/Runtime/Exec/PlanBundle.h"

#include "../Device/GraphOrder.h"

#include "../Desc/Json.h"

#include "kvc/Support/EnumNames.h"
#include "kvc/Support/KernelChips.h"

#include <algorithm>
#include <cstdint>

namespace kvc {

using namespace json_detail;

bool BundlePlan::sameSchedule(const BundlePlan &other) const {
  auto sameStep = [](const BundleStep &a, const BundleStep &b) {
    return a.kind == b.kind && a.form == b.form && a.tokens == b.tokens &&
           a.layers == b.layers && a.codec == b.codec && a.tier == b.tier &&
           a.node == b.node;
  };
  auto sameTask = [&](const BundleTask &a, const BundleTask &b) {
    return a.id == b.id && a.resource == b.resource && a.lane == b.lane &&
           a.after == b.after && a.inputs == b.inputs && a.slot == b.slot &&
           a.kernel == b.kernel && a.entry == b.entry &&
           a.prologue == b.prologue &&
           std::equal(a.steps.begin(), a.steps.end(), b.steps.begin(),
                      b.steps.end(), sameStep);
  };
  return tokens == other.tokens && layers == other.layers &&
         prefillStep == other.prefillStep &&
         stagingSlots == other.stagingSlots &&
         std::equal(tasks.begin(), tasks.end(), other.tasks.begin(),
                    other.tasks.end(), sameTask);
}

const BundleKernel *PlanBundle::findKernel(std::string_view name) const {
  return kvc::findKernel(kernels, name);
}

const BundlePlan *PlanBundle::findPlan(std::string_view name) const {
  for (const BundlePlan &plan : plans)
    if (plan.name == name)
      return &plan;
  return nullptr;
}

namespace {

std::string indexPath(const std::string &path, std::size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

Status readIntArray(const Json &obj, const std::string &path,
                    std::string_view key, std::vector<int64_t> &out,
                    Presence presence) {
  const Json *array;
  KVC_RETURN_IF_ERROR(readArray(obj, path, key, array, presence));
  for (std::size_t i = 0; i < array->size(); ++i) {
    const Json &value = (*array)[i];
    if (!value.is_number_integer())
      return invalidArgument(indexPath(fieldPath(path, key), i) +
                             ": expected an integer");
    out.push_back(value.get<int64_t>());
  }
  return Status::ok();
}

/// Reads `[begin, end]` with 0 <= begin < end.
Status readRange(const Json &obj, const std::string &path,
                 std::string_view key, BundleRange &out) {
  std::vector<int64_t> bounds;
  KVC_RETURN_IF_ERROR(
      readIntArray(obj, path, key, bounds, Presence::Required));
  if (bounds.size() != 2 || bounds[0] < 0 || bounds[1] <= bounds[0])
    return invalidArgument(fieldPath(path, key) +
                           ": expected [begin, end] with 0 <= begin < end");
  out = {bounds[0], bounds[1]};
  return Status::ok();
}

Status parseStep(const Json &obj, const std::string &path, BundleStep &step) {
  KVC_RETURN_IF_ERROR(expectObject(obj, path));
  KVC_RETURN_IF_ERROR(
      readName<StepKind>(obj, path, "op", name, kNumStepKinds, step.kind));
  KVC_RETURN_IF_ERROR(
      readName<Form>(obj, path, "form", name, kNumForms, step.form));
  KVC_RETURN_IF_ERROR(readRange(obj, path, "tokens", step.tokens));
  KVC_RETURN_IF_ERROR(readRange(obj, path, "layers", step.layers));
  std::string codec = "raw";
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "codec", codec, Presence::Optional));
  StatusOr<CodecSpec> spec = parseCodecSpec(codec);
  if (!spec)
    return spec.status().withContext(fieldPath(path, "codec"));
  step.codec = *spec;
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "tier", step.tier, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "node", step.node, Presence::Optional));
  int64_t bytes = -1;
  KVC_RETURN_IF_ERROR(
      readInt(obj, path, "predicted_bytes", bytes, Presence::Optional));
  if (obj.contains("predicted_bytes"))
    step.predictedBytes = bytes;
  return Status::ok();
}

Status parseTask(const Json &obj, const std::string &path, BundleTask &task) {
  KVC_RETURN_IF_ERROR(expectObject(obj, path));
  KVC_RETURN_IF_ERROR(readInt(obj, path, "id", task.id, Presence::Required));
  KVC_RETURN_IF_ERROR(readName<Resource>(obj, path, "resource", name,
                                         kNumResources, task.resource));
  KVC_RETURN_IF_ERROR(
      readInt(obj, path, "lane", task.lane, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readIntArray(obj, path, "after", task.after, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readIntArray(obj, path, "inputs", task.inputs, Presence::Optional));
  int64_t slot = INT64_MIN; // Absent.
  KVC_RETURN_IF_ERROR(readInt(obj, path, "slot", slot, Presence::Optional));
  if (slot != INT64_MIN)
    task.slot = slot;
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "kernel", task.kernel, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "entry", task.entry, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "prologue", task.prologue, Presence::Optional));
  std::vector<int64_t> predicted;
  KVC_RETURN_IF_ERROR(readIntArray(obj, path, "predicted_ns", predicted,
                                   Presence::Optional));
  if (!predicted.empty()) {
    if (predicted.size() != 2)
      return invalidArgument(fieldPath(path, "predicted_ns") +
                             ": expected [start, finish] with start <= finish");
    task.predictedNs = std::make_pair(predicted[0], predicted[1]);
  }
  const Json *steps;
  KVC_RETURN_IF_ERROR(readArray(obj, path, "steps", steps, Presence::Required));
  for (std::size_t i = 0; i < steps->size(); ++i) {
    task.steps.emplace_back();
    KVC_RETURN_IF_ERROR(parseStep((*steps)[i],
                                  indexPath(fieldPath(path, "steps"), i),
                                  task.steps.back()));
  }
  return Status::ok();
}

Status parsePlan(const Json &obj, const std::string &path, BundlePlan &plan) {
  KVC_RETURN_IF_ERROR(expectObject(obj, path));
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "name", plan.name, Presence::Required));
  KVC_RETURN_IF_ERROR(readRange(obj, path, "tokens", plan.tokens));
  KVC_RETURN_IF_ERROR(readRange(obj, path, "layers", plan.layers));
  int64_t predicted = -1;
  KVC_RETURN_IF_ERROR(
      readInt(obj, path, "predicted_us", predicted, Presence::Optional));
  if (predicted >= 0)
    plan.predictedUs = predicted;
  int64_t prefillStep = INT64_MIN; // Absent.
  KVC_RETURN_IF_ERROR(
      readInt(obj, path, "prefill_step", prefillStep, Presence::Optional));
  if (prefillStep != INT64_MIN)
    plan.prefillStep = prefillStep;
  KVC_RETURN_IF_ERROR(readInt(obj, path, "staging_slots", plan.stagingSlots,
                              Presence::Required));
  const Json *tasks;
  KVC_RETURN_IF_ERROR(readArray(obj, path, "tasks", tasks, Presence::Required));
  for (std::size_t i = 0; i < tasks->size(); ++i) {
    plan.tasks.emplace_back();
    KVC_RETURN_IF_ERROR(parseTask((*tasks)[i],
                                  indexPath(fieldPath(path, "tasks"), i),
                                  plan.tasks.back()));
  }
  return Status::ok();
}

/// Bit sets of the transitive dependencies of every task.
class Ancestors {
public:
  explicit Ancestors(std::size_t n) : words_((n + 63) / 64), bits_(n * words_) {}
  bool has(int64_t task, int64_t ancestor) const {
    return bits_[task * words_ + ancestor / 64] >> (ancestor % 64) & 1;
  }
  /// Adds `dep` and its ancestors to `task`'s.
  void addDependency(int64_t task, int64_t dep) {
    for (std::size_t w = 0; w < words_; ++w)
      bits_[task * words_ + w] |= bits_[dep * words_ + w];
    bits_[task * words_ + dep / 64] |= uint64_t(1) << (dep % 64);
  }

private:
  std::size_t words_;
  std::vector<uint64_t> bits_;
};

/// What a step names besides its chunk: a fetch's or a store's tier, a
/// send's or a recv's node, a fetch's predicted bytes.
Status validateStep(const BundleStep &step, const std::string &path) {
  if ((step.kind == StepKind::Fetch || step.kind == StepKind::Store) &&
      step.tier.empty())
    return invalidArgument(fieldPath(path, "tier") + ": a " + name(step.kind) +
                           " must name its tier");
  if ((step.kind == StepKind::Send || step.kind == StepKind::Recv) &&
      step.node.empty())
    return invalidArgument(fieldPath(path, "node") + ": a " + name(step.kind) +
                           " must name its node");
  if (step.predictedBytes &&
      (*step.predictedBytes < 0 || step.kind != StepKind::Fetch))
    return invalidArgument(fieldPath(path, "predicted_bytes") +
                           ": expected a fetch's bytes, >= 0");
  return Status::ok();
}

Status validatePlan(const BundlePlan &plan, const std::string &path) {
  if (plan.name.empty())
    return invalidArgument(fieldPath(path, "name") + ": must not be empty");
  const std::size_t n = plan.tasks.size();
  // Each slot is some task's (kvc-emit-bundle writes the largest slot + 1);
  // the validator and the executor keep state per slot.
  if (plan.stagingSlots < 0 || plan.stagingSlots > int64_t(n))
    return invalidArgument(fieldPath(path, "staging_slots") + ": " +
                           std::to_string(plan.stagingSlots) + " slots for " +
                           std::to_string(n) +
                           " tasks (expected 0 to the number of tasks)");
  const std::string tasksPath = fieldPath(path, "tasks");
  if (plan.prefillStep) {
    if (*plan.prefillStep <= 0)
      return invalidArgument(fieldPath(path, "prefill_step") + ": " +
                             std::to_string(*plan.prefillStep) +
                             " tokens a step (expected 1 or more)");
    bool gathers = false;
    for (const BundleTask &task : plan.tasks)
      for (const BundleStep &step : task.steps)
        gathers |= step.kind == StepKind::Gather;
    if (!gathers)
      return invalidArgument(fieldPath(path, "prefill_step") +
                             ": the plan gathers nothing; only a save or a "
                             "sender runs beside a prefill");
  }

  // Ids, references, ranges and slots of each task on its own.
  for (std::size_t i = 0; i < n; ++i) {
    const BundleTask &task = plan.tasks[i];
    std::string taskPath = indexPath(tasksPath, i);
    if (task.id != int64_t(i))
      return invalidArgument(fieldPath(taskPath, "id") + ": expected " +
                             std::to_string(i) + " (ids number the tasks in "
                             "order), got " + std::to_string(task.id));
    auto checkRefs = [&](const std::vector<int64_t> &refs,
                         const char *key) -> Status {
      for (std::size_t r = 0; r < refs.size(); ++r)
        if (refs[r] < 0 || refs[r] >= int64_t(n) || refs[r] == int64_t(i))
          return invalidArgument(
              indexPath(fieldPath(taskPath, key), r) + ": task " +
              std::to_string(refs[r]) +
              (refs[r] == int64_t(i) ? " is the task itself"
                                     : " does not exist"));
      return Status::ok();
    };
    if (task.lane < 0)
      return invalidArgument(fieldPath(taskPath, "lane") + ": must be >= 0");
    KVC_RETURN_IF_ERROR(checkRefs(task.after, "after"));
    KVC_RETURN_IF_ERROR(checkRefs(task.inputs, "inputs"));
    if (task.predictedNs &&
        (task.predictedNs->first < 0 ||
         task.predictedNs->second < task.predictedNs->first))
      return invalidArgument(fieldPath(taskPath, "predicted_ns") +
                             ": expected [start, finish] with start <= finish");
    if (task.steps.empty())
      return invalidArgument(fieldPath(taskPath, "steps") +
                             ": a task runs steps");
    if (task.slot && (*task.slot < 0 || *task.slot >= plan.stagingSlots))
      return invalidArgument(fieldPath(taskPath, "slot") + ": slot " +
                             std::to_string(*task.slot) +
                             " is outside the plan's " +
                             std::to_string(plan.stagingSlots) +
                             " staging slots");
    for (std::size_t s = 0; s < task.steps.size(); ++s) {
      const BundleStep &step = task.steps[s];
      std::string stepPath = indexPath(fieldPath(taskPath, "steps"), s);
      KVC_RETURN_IF_ERROR(validateStep(step, stepPath));
      if (step.tokens.begin < plan.tokens.begin ||
          step.tokens.end > plan.tokens.end)
        return invalidArgument(fieldPath(stepPath, "tokens") +
                               ": outside the plan's tokens");
      if (step.layers.begin < plan.layers.begin ||
          step.layers.end > plan.layers.end)
        return invalidArgument(fieldPath(stepPath, "layers") +
                               ": outside the plan's layers");
    }
  }

  int64_t onCycle = 0;
  std::vector<int64_t> order = exec_detail::topologicalOrder(
      int64_t(n), [&](int64_t i) -> const std::vector<int64_t> & {
        return plan.tasks[i].after;
      }, &onCycle);
  if (order.size() != n)
    return invalidArgument(path + ": the task graph has a cycle through task " +
                           std::to_string(onCycle));

  Ancestors ancestors(n);
  for (int64_t task : order)
    for (int64_t dep : plan.tasks[task].after)
      ancestors.addDependency(task, dep);

  // Every value read was written by a task that finished first.
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<int64_t> &inputs = plan.tasks[i].inputs;
    for (std::size_t r = 0; r < inputs.size(); ++r)
      if (!ancestors.has(int64_t(i), inputs[r]))
        return invalidArgument(
            indexPath(fieldPath(indexPath(tasksPath, i), "inputs"), r) +
            ": reads the value of task " + std::to_string(inputs[r]) +
            " before it is written (task " + std::to_string(inputs[r]) +
            " is not among its dependencies)");
  }

  // The steps that compute, project or scatter a chunk work on the whole of
  // it: a chunk is what a task's fetch, recv or compute makes, or the chunk
  // of its first input.
  std::vector<std::optional<std::pair<BundleRange, BundleRange>>> chunks(n);
  for (int64_t i : order) {
    const BundleTask &task = plan.tasks[i];
    if (task.steps.empty())
      continue;
    const BundleStep &first = task.steps.front();
    if (first.kind == StepKind::Fetch || first.kind == StepKind::Recv ||
        first.kind == StepKind::ChunkCompute)
      chunks[i] = std::make_pair(first.tokens, first.layers);
    else if (!task.inputs.empty())
      chunks[i] = chunks[task.inputs.front()];
    if (!chunks[i])
      continue;
    const auto &[tokens, layers] = *chunks[i];
    for (std::size_t s = 0; s < task.steps.size(); ++s) {
      const BundleStep &step = task.steps[s];
      if ((step.kind != StepKind::Project &&
           step.kind != StepKind::ChunkCompute &&
           step.kind != StepKind::Scatter) ||
          (step.tokens == tokens && step.layers == layers))
        continue;
      auto range = [](const BundleRange &r) {
        return std::to_string(r.begin) + " to " + std::to_string(r.end);
      };
      return invalidArgument(
          indexPath(fieldPath(indexPath(tasksPath, i), "steps"), s) + ": " +
          name(step.kind) + " over tokens " + range(step.tokens) +
          " of layers " + range(step.layers) + " works on part of its chunk "
          "(tokens " + range(tokens) + " of layers " + range(layers) +
          "); the executor runs it on whole chunks");
    }
  }

  // A slot is refilled only after every reader of its previous contents.
  std::vector<std::vector<int64_t>> readers(n);
  for (std::size_t i = 0; i < n; ++i)
    for (int64_t input : plan.tasks[i].inputs)
      readers[input].push_back(int64_t(i));
  std::vector<std::vector<int64_t>> fillers(plan.stagingSlots);
  for (int64_t task : order)
    if (plan.tasks[task].slot)
      fillers[*plan.tasks[task].slot].push_back(task);
  for (int64_t slot = 0; slot < plan.stagingSlots; ++slot) {
    const std::vector<int64_t> &f = fillers[slot];
    for (std::size_t k = 1; k < f.size(); ++k) {
      int64_t previous = f[k - 1], next = f[k];
      if (!ancestors.has(next, previous))
        return invalidArgument(
            path + ": tasks " + std::to_string(previous) + " and " +
            std::to_string(next) + " may fill staging slot " +
            std::to_string(slot) + " at the same time");
      for (int64_t reader : readers[previous])
        if (reader != next && !ancestors.has(next, reader))
          return invalidArgument(
              path + ": task " + std::to_string(next) +
              " refills staging slot " + std::to_string(slot) +
              " while task " + std::to_string(reader) +
              " may still read it");
    }
  }
  return Status::ok();
}

/// PTX larger than this is not a kernel kvc generated.
constexpr std::size_t kMaxPtxBytes = 16u << 20;

Status readTriple(const Json &obj, const std::string &path,
                  std::string_view key, std::array<int64_t, 3> &out) {
  std::vector<int64_t> values;
  KVC_RETURN_IF_ERROR(readIntArray(obj, path, key, values, Presence::Required));
  if (values.size() != 3 || *std::min_element(values.begin(), values.end()) < 1)
    return invalidArgument(fieldPath(path, key) +
                           ": expected [x, y, z], each >= 1");
  std::copy(values.begin(), values.end(), out.begin());
  return Status::ok();
}

Status parseKernel(const Json &obj, const std::string &path, int64_t version,
                   BundleKernel &kernel) {
  KVC_RETURN_IF_ERROR(expectObject(obj, path));
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "name", kernel.name, Presence::Required));
  std::string kind = "restore";
  KVC_RETURN_IF_ERROR(readString(obj, path, "kind", kind, Presence::Optional));
  std::optional<BundleKernel::Kind> parsed = parseBundleKernelKind(kind);
  if (!parsed)
    return invalidArgument(fieldPath(path, "kind") + ": unknown kind \"" +
                           kind +
                           "\" (expected \"restore\", "
                           "\"rope_scatter\", \"save\" or \"rms_norm\")");
  kernel.kind = *parsed;
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "function", kernel.function, Presence::Required));
  if (version >= 4) {
    KVC_RETURN_IF_ERROR(
        readString(obj, path, "format", kernel.format, Presence::Required));
    if (!isKernelFormat(kernel.format))
      return invalidArgument(fieldPath(path, "format") + ": unknown format \"" +
                             kernel.format + "\" (expected \"ptx\")");
    KVC_RETURN_IF_ERROR(
        readString(obj, path, "target", kernel.target, Presence::Required));
    KVC_RETURN_IF_ERROR(
        readString(obj, path, "binary", kernel.binary, Presence::Required));
  } else { // Version 3: PTX by fields of its own.
    kernel.format = "ptx";
    KVC_RETURN_IF_ERROR(
        readString(obj, path, "arch", kernel.target, Presence::Required));
    KVC_RETURN_IF_ERROR(
        readString(obj, path, "ptx", kernel.binary, Presence::Required));
  }
  KVC_RETURN_IF_ERROR(readTriple(obj, path, "grid", kernel.grid));
  KVC_RETURN_IF_ERROR(readTriple(obj, path, "block", kernel.block));
  const Json *args;
  KVC_RETURN_IF_ERROR(readArray(obj, path, "args", args, Presence::Required));
  for (std::size_t i = 0; i < args->size(); ++i) {
    if (!(*args)[i].is_string())
      return invalidArgument(indexPath(fieldPath(path, "args"), i) +
                             ": expected a string");
    kernel.args.push_back((*args)[i].get<std::string>());
  }
  for (auto [key, field] :
       {std::pair<const char *, int64_t *>{"tokens", &kernel.tokens},
        {"layers", &kernel.layers},
        {"kv_heads", &kernel.kvHeads},
        {"head_dim", &kernel.headDim},
        {"block_size", &kernel.blockSize},
        {"payload_bytes", &kernel.payloadBytes}}) {
    KVC_RETURN_IF_ERROR(readInt(obj, path, key, *field, Presence::Required));
    if (*field < 1)
      return invalidArgument(fieldPath(path, key) + ": must be >= 1");
  }
  KVC_RETURN_IF_ERROR(
      readInt(obj, path, "hidden", kernel.hidden, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readNumber(obj, path, "eps", kernel.eps, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "storage", kernel.storage, Presence::Required));
  if (kernel.storage != "bf16" && kernel.storage != "f16" &&
      kernel.storage != "f32")
    return invalidArgument(fieldPath(path, "storage") +
                           ": expected \"bf16\", \"f16\" or \"f32\"");
  std::string codec;
  KVC_RETURN_IF_ERROR(
      readString(obj, path, "codec", codec, Presence::Required));
  StatusOr<CodecSpec> spec = parseCodecSpec(codec);
  if (!spec)
    return spec.status().withContext(fieldPath(path, "codec"));
  if (spec->lossless != CodecSpec::Lossless::None || !spec->layerBits.empty())
    return invalidArgument(fieldPath(path, "codec") +
                           ": a kernel decodes neither lossless stages nor "
                           "layer bins");
  kernel.codec = *spec;
  for (auto [key, axis] : {std::pair<const char *, CodecSpec::Axis *>{
                               "key_axis", &kernel.codec.keyAxis},
                           {"value_axis", &kernel.codec.valueAxis}}) {
    std::string name;
    KVC_RETURN_IF_ERROR(readString(obj, path, key, name, Presence::Required));
    if (name != "token" && name != "channel")
      return invalidArgument(fieldPath(path, key) +
                             ": expected \"token\" or \"channel\"");
    *axis = name == "token" ? CodecSpec::Axis::Token : CodecSpec::Axis::Channel;
  }
  return Status::ok();
}

Status validateKernel(const BundleKernel &kernel, const std::string &path) {
  // PTX, the one format there is: text for a known chip, naming the entry.
  if (!isKernelFormat(kernel.format))
    return invalidArgument(path + ".format: unknown format \"" +
                           kernel.format + "\" (expected \"ptx\")");
  if (!isKernelChip(kernel.target))
    return invalidArgument(path + ".target: unknown architecture \"" +
                           kernel.target + "\" (expected " + kKernelChips +
                           ")");
  if (kernel.binary.empty() || kernel.binary.size() > kMaxPtxBytes)
    return invalidArgument(path + ".binary: " +
                           std::to_string(kernel.binary.size()) +
                           " bytes of PTX (expected 1 to " +
                           std::to_string(kMaxPtxBytes) + ")");
  if (kernel.binary.find(".target " + kernel.target) == std::string::npos)
    return invalidArgument(path + ".binary: does not target " + kernel.target);
  if (kernel.binary.find(".entry " + kernel.function + "(") ==
      std::string::npos)
    return invalidArgument(path + ".binary: has no entry \"" +
                           kernel.function + "\"");
  // Each dimension first, so that the product cannot overflow.
  if (std::max({kernel.block[0], kernel.block[1], kernel.block[2]}) > 1024 ||
      kernel.block[0] * kernel.block[1] * kernel.block[2] > 1024)
    return invalidArgument(path + ".block: more than 1024 threads per block");
  const std::vector<std::string> &names = bundleKernelArgNames(kernel.kind);
  std::vector<std::string> sorted = kernel.args, expected = names;
  std::sort(sorted.begin(), sorted.end());
  std::sort(expected.begin(), expected.end());
  if (sorted != expected) {
    std::string list;
    for (const std::string &name : names)
      list += (list.empty() ? "" : ", ") + name;
    return invalidArgument(path + ".args: a " +
                           bundleKernelKindName(kernel.kind) +
                           " kernel takes each of " + list + " once");
  }
  if (kernel.kind == BundleKernel::Kind::RopeScatter &&
      (kernel.storage != "f32" || !kernel.codec.isRaw()))
    return invalidArgument(path + ": a rope_scatter kernel reads raw f32 "
                           "projections (storage \"f32\", codec \"raw\")");
  if (kernel.kind == BundleKernel::Kind::RmsNorm &&
      (kernel.hidden < 1 || !(kernel.eps > 0) || !kernel.codec.isRaw()))
    return invalidArgument(path +
                           ": an rms_norm kernel normalizes raw rows "
                           "of \"hidden\" >= 1 values with an \"eps\" > 0 "
                           "(codec \"raw\")");
  return Status::ok();
}

/// A task's entry names a kernel generated for its chunk.
Status validateEntry(const PlanBundle &bundle, const BundleTask &task,
                     const std::string &path) {
  const BundleKernel *kernel = bundle.findKernel(task.entry);
  if (!kernel)
    return invalidArgument(path + ".entry: no kernel \"" + task.entry +
                           "\" in the bundle's kernel table");
  // A save kernel starts with the gather of its chunk, the others end with
  // its scatter.
  const bool saves = kernel->kind == BundleKernel::Kind::Save;
  const BundleStep &edge = saves ? task.steps.front() : task.steps.back();
  const bool projects = std::any_of(
      task.steps.begin(), task.steps.end(),
      [](const BundleStep &step) { return step.kind == StepKind::Project; });
  if (projects != (kernel->kind == BundleKernel::Kind::RopeScatter))
    return invalidArgument(path + ".entry: kernel \"" + task.entry +
                           "\" is a " + bundleKernelKindName(kernel->kind) +
                           " kernel; the task's steps " +
                           (projects ? "project hidden states"
                                     : "do not project hidden states"));
  if (edge.kind != (saves ? StepKind::Gather : StepKind::Scatter) ||
      edge.form != Form::KV || edge.tokens.size() != kernel->tokens ||
      edge.layers.size() != kernel->layers)
    return invalidArgument(path + ".entry: kernel \"" + task.entry + "\" " +
                           (saves ? "gathers " : "scatters ") +
                           std::to_string(kernel->tokens) + " tokens x " +
                           std::to_string(kernel->layers) +
                           " layers of KV; the task's " +
                           (saves ? "first" : "last") + " step does not");
  if (task.prologue.empty())
    return Status::ok();
  const BundleKernel *prologue = bundle.findKernel(task.prologue);
  if (!prologue || prologue->kind != BundleKernel::Kind::RmsNorm ||
      kernel->kind != BundleKernel::Kind::RopeScatter ||
      prologue->tokens != kernel->tokens || prologue->layers != kernel->layers)
    return invalidArgument(
        path + ".prologue: \"" + task.prologue +
        "\" is not an rms_norm kernel of the table for the " +
        std::to_string(kernel->tokens) + " tokens x " +
        std::to_string(kernel->layers) +
        " layers its rope_scatter entry "
        "projects");
  return Status::ok();
}

} // namespace

Status checkCompiledFor(const PlanBundle &bundle,
                        const std::string &fingerprint) {
  const std::string &compiledFor = bundle.modelFingerprint;
  if (compiledFor.empty() || compiledFor == fingerprint)
    return Status::ok();
  return failedPrecondition("the plan bundle was compiled for model " +
                            compiledFor.substr(0, 16) + ", not " +
                            fingerprint.substr(0, 16));
}

Status validatePlanBundle(const PlanBundle &bundle) {
  if (bundle.version < kOldestPlanBundleVersion ||
      bundle.version > kPlanBundleVersion)
    return invalidArgument("version: unsupported plan bundle version " +
                           std::to_string(bundle.version) + " (this runtime "
                           "reads versions " +
                           std::to_string(kOldestPlanBundleVersion) + " to " +
                           std::to_string(kPlanBundleVersion) + ")");
  for (std::size_t i = 0; i < bundle.kernels.size(); ++i) {
    std::string path = indexPath("kernels", i);
    KVC_RETURN_IF_ERROR(validateKernel(bundle.kernels[i], path));
    for (std::size_t j = 0; j < i; ++j)
      if (bundle.kernels[j].name == bundle.kernels[i].name)
        return invalidArgument(path + ".name: kernel \"" +
                               bundle.kernels[i].name + "\" appears twice");
  }
  for (std::size_t i = 0; i < bundle.plans.size(); ++i) {
    const BundlePlan &plan = bundle.plans[i];
    KVC_RETURN_IF_ERROR(validatePlan(plan, indexPath("plans", i)));
    for (std::size_t j = 0; j < i; ++j)
      if (bundle.plans[j].name == plan.name)
        return invalidArgument(indexPath("plans", i) + ".name: plan \"" +
                               plan.name + "\" appears twice");
    for (std::size_t t = 0; t < plan.tasks.size(); ++t)
      if (!plan.tasks[t].entry.empty() || !plan.tasks[t].prologue.empty())
        KVC_RETURN_IF_ERROR(validateEntry(
            bundle, plan.tasks[t],
            indexPath(indexPath("plans", i) + ".tasks", t)));
  }
  return Status::ok();
}

StatusOr<PlanBundle> parsePlanBundle(std::string_view text) {
  StatusOr<Json> json = parseJson(text);
  if (!json)
    return json.status();
  const Json &root = *json;
  KVC_RETURN_IF_ERROR(expectObject(root, ""));
  std::string format;
  KVC_RETURN_IF_ERROR(
      readString(root, "", "format", format, Presence::Required));
  if (format != "kvc-plan-bundle")
    return invalidArgument("format: expected \"kvc-plan-bundle\", got \"" +
                           format + "\"");
  PlanBundle bundle;
  KVC_RETURN_IF_ERROR(
      readInt(root, "", "version", bundle.version, Presence::Required));
  // Check the version before the fields, whose meaning it fixes.
  if (bundle.version < kOldestPlanBundleVersion ||
      bundle.version > kPlanBundleVersion)
    return validatePlanBundle(bundle);
  KVC_RETURN_IF_ERROR(readString(root, "", "model_fingerprint",
                                 bundle.modelFingerprint, Presence::Optional));
  const Json *plans;
  KVC_RETURN_IF_ERROR(readArray(root, "", "plans", plans, Presence::Required));
  for (std::size_t i = 0; i < plans->size(); ++i) {
    bundle.plans.emplace_back();
    KVC_RETURN_IF_ERROR(
        parsePlan((*plans)[i], indexPath("plans", i), bundle.plans.back()));
  }
  if (bundle.version >= 2) {
    const Json *kernels;
    KVC_RETURN_IF_ERROR(
        readArray(root, "", "kernels", kernels, Presence::Optional));
    if (bundle.version == 2 && kernels && !kernels->empty())
      return invalidArgument(
          "kernels: a version 2 bundle's kernels take one chunk's first_token "
          "and first_layer; this runtime launches kernels over a table of "
          "chunks (version 3): compile the plans again with kvc-opt");
    for (std::size_t i = 0; kernels && i < kernels->size(); ++i) {
      bundle.kernels.emplace_back();
      KVC_RETURN_IF_ERROR(parseKernel((*kernels)[i], indexPath("kernels", i),
                                      bundle.version, bundle.kernels.back()));
    }
  }
  KVC_RETURN_IF_ERROR(validatePlanBundle(bundle));
  return bundle;
}

StatusOr<PlanBundle> readPlanBundle(const std::string &path) {
  std::string text;
  KVC_RETURN_IF_ERROR(readFile(path, text));
  StatusOr<PlanBundle> bundle = parsePlanBundle(text);
  if (!bundle)
    return bundle.status().withContext(path);
  return bundle;
}

} // namespace kvc
