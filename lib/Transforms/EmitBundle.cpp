//===- EmitBundle.cpp - kvc-emit-bundle: plans for the runtime ------------===//
//
// Builds the module's exec-level plans as the runtime's plan bundle
// (kvc/Runtime/Exec/PlanBundle.h) and writes it as JSON (docs/plan-bundle.md),
// the one format the runtime reads. Tasks are numbered in program order,
// which kvc-schedule makes a topological order. An in-process compile takes
// the built bundle as it is and validates it; a bundle read from a file is
// parsed and validated by the runtime.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/EmitBundle.h"
#include "kvc/Transforms/Passes.h"

#include "kvc/Conversion/KernelGen.h"

#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCEMITBUNDLEPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

namespace {

kvc::BundleRange rangeOf(RangeAttr range) {
  return {range.getBegin(), range.getEnd()};
}

/// The chunk a step works on: the one it produces for the steps that create
/// chunks (a fetch, a gather, a recv; a chunk compute, whose operands are the
/// prefix it attends to), else the one it consumes.
ChunkType stepChunk(Operation *step) {
  if (isa<FetchOp, GatherOp, RecvOp, ChunkComputeOp>(step))
    return dyn_cast<ChunkType>(step->getResult(0).getType());
  for (Type type : step->getOperandTypes())
    if (auto chunk = dyn_cast<ChunkType>(type))
      return chunk;
  return {};
}

FailureOr<kvc::BundleStep> buildStep(Operation *step) {
  ChunkType chunk = stepChunk(step);
  std::optional<kvc::StepKind> kind = getStepKind(step);
  if (!chunk || !kind)
    return step->emitOpError("has no chunk to describe in a plan bundle");
  kvc::BundleStep out;
  out.kind = *kind;
  out.form = toVocabulary(chunk.getForm());
  out.tokens = rangeOf(chunk.getTokens());
  out.layers = rangeOf(chunk.getLayers());
  out.codec = getCodecSpec(chunk.getCodec());
  if (auto store = dyn_cast<StoreOp>(step))
    out.tier = store.getTier().str();
  if (auto send = dyn_cast<SendOp>(step))
    out.node = send.getNode().str();
  if (auto recv = dyn_cast<RecvOp>(step))
    out.node = recv.getNode().str();
  if (auto fetch = dyn_cast<FetchOp>(step)) {
    out.tier = fetch.getSource().getTier().str();
    if (auto bytes =
            fetch->getAttrOfType<IntegerAttr>(KVCDialect::kBytesAttrName))
      out.predictedBytes = bytes.getInt();
  }
  return out;
}

/// A generated kernel with its code: kvc-lower-kernels' function after
/// kvc-kernels-to-ptx, which left one gpu.launch_func in it.
struct GeneratedKernel {
  func::FuncOp func;
  KernelSpec spec;
  gpu::LaunchFuncOp launch;
  gpu::BinaryOp binary;
};

/// The kernels of the module that carry PTX, by function name.
FailureOr<llvm::StringMap<GeneratedKernel>> generatedKernels(ModuleOp module) {
  llvm::StringMap<GeneratedKernel> kernels;
  for (auto func : module.getOps<func::FuncOp>()) {
    auto specAttr =
        func->getAttrOfType<DictionaryAttr>(KVCDialect::kEntryAttrName);
    if (!specAttr)
      continue;
    FailureOr<KernelSpec> spec = KernelSpec::fromAttr(specAttr);
    if (failed(spec))
      return func.emitOpError("has a malformed kernel specialization");
    SmallVector<gpu::LaunchFuncOp> launches(func.getOps<gpu::LaunchFuncOp>());
    if (launches.empty())
      continue; // Not lowered to PTX: the bundle carries no code for it.
    if (launches.size() != 1)
      return func.emitOpError("launches ") << launches.size()
                                            << " kernels; expected one";
    auto binary = SymbolTable::lookupNearestSymbolFrom<gpu::BinaryOp>(
        module, launches.front().getKernelModuleName());
    if (!binary)
      return func.emitOpError("launches a kernel with no gpu.binary; run "
                              "kvc-kernels-to-ptx whole");
    kernels[func.getSymName()] = {func, *spec, launches.front(), binary};
  }
  return kernels;
}

FailureOr<kvc::BundleKernel> buildKernel(GeneratedKernel kernel) {
  gpu::LaunchFuncOp launch = kernel.launch;
  auto object = dyn_cast<gpu::ObjectAttr>(kernel.binary.getObjects()[0]);
  auto target = object ? dyn_cast<NVVM::NVVMTargetAttr>(object.getTarget())
                       : NVVM::NVVMTargetAttr();
  if (!target || object.getFormat() != gpu::CompilationTarget::Assembly)
    return kernel.binary.emitOpError("holds no PTX for an NVVM target");
  const KernelSpec &spec = kernel.spec;
  kvc::BundleKernel out;
  out.name = kernel.func.getSymName().str();
  out.kind = spec.kind;
  out.function = launch.getKernelName().getValue().str();
  out.format = "ptx";
  out.target = target.getChip().str();
  // The PTX text ends with a NUL byte.
  out.binary = object.getObject().getValue().rtrim('\0').str();
  for (Value operand : launch.getKernelOperands()) {
    auto arg = dyn_cast<BlockArgument>(operand);
    if (!arg || arg.getOwner()->getParentOp() != kernel.func)
      return launch.emitOpError("passes a value that is not an argument of "
                                "its function; the bundle cannot name it");
    out.args.push_back(
        kvc::bundleKernelArgNames(spec.kind)[arg.getArgNumber()]);
  }
  // The grid's y is the launch's chunks, computed from the size of the
  // chunks argument alone; the bundle records it as 1, and the runtime sets
  // it per launch.
  auto isChunkCount = [&](Value v) {
    SetVector<Operation *> slice;
    getBackwardSlice(v, &slice);
    slice.insert(v.getDefiningOp());
    bool readsChunks = false;
    for (Operation *op : slice) {
      auto dim = dyn_cast_or_null<memref::DimOp>(op);
      auto source = dim ? dyn_cast<BlockArgument>(dim.getSource()) : nullptr;
      if (source) {
        if (source.getOwner()->getParentOp() != kernel.func ||
            kvc::bundleKernelArgNames(spec.kind)[source.getArgNumber()] !=
                "chunks")
          return false;
        readsChunks = true;
        continue;
      }
      if (!op || !isPure(op) || llvm::any_of(op->getOperands(), [](Value x) {
            return isa<BlockArgument>(x);
          }))
        return false;
    }
    return readsChunks;
  };
  auto dims = [&](gpu::KernelDim3 dim3, bool grid,
                  std::array<int64_t, 3> &sizes) -> LogicalResult {
    Value values[] = {dim3.x, dim3.y, dim3.z};
    for (auto [i, v] : llvm::enumerate(values)) {
      std::optional<int64_t> c = getConstantIntValue(v);
      if (!c && grid && i == 1 && isChunkCount(v))
        c = 1;
      if (!c)
        return launch.emitOpError("has a launch size that is not a constant");
      sizes[i] = *c;
    }
    return success();
  };
  if (failed(
          dims(launch.getGridSizeOperandValues(), /*grid=*/true, out.grid)) ||
      failed(
          dims(launch.getBlockSizeOperandValues(), /*grid=*/false, out.block)))
    return failure();
  out.tokens = spec.tokens;
  out.layers = spec.layers;
  out.kvHeads = spec.kvHeads;
  out.headDim = spec.headDim;
  out.blockSize = spec.blockSize;
  if (spec.kind == KernelKind::RmsNorm) {
    out.hidden = spec.hidden;
    out.eps = spec.eps;
  }
  out.storage.clear();
  llvm::raw_string_ostream(out.storage) << spec.storage;
  out.codec = getCodecSpec(spec.codec);
  out.payloadBytes = spec.payloadBytes();
  return out;
}

FailureOr<kvc::BundleTask>
buildTask(TaskOp task, int64_t id,
          const llvm::DenseMap<Operation *, int64_t> &ids,
          const llvm::StringMap<GeneratedKernel> &kernels) {
  auto idsOf = [&](auto values) {
    std::vector<int64_t> out;
    for (Value value : values)
      if (auto found = ids.find(value.getDefiningOp()); found != ids.end())
        if (!llvm::is_contained(out, found->second))
          out.push_back(found->second);
    return out;
  };
  kvc::BundleTask out;
  out.id = id;
  out.resource = toVocabulary(task.getResource());
  out.lane = task.getLane();
  out.after = idsOf(task.getDeps());
  out.inputs = idsOf(stepInputs(task));
  out.slot = task.getSlot();
  if (auto time =
          task->getAttrOfType<DenseI64ArrayAttr>(KVCDialect::kTimeAttrName);
      time && time.size() == 2)
    out.predictedNs = std::make_pair(time[0], time[1]);
  SmallVector<Operation *> steps;
  for (Operation &op : task.getBody().front()) {
    if (auto kernel = dyn_cast<KernelOp>(op)) {
      out.kernel = kernel.getKernelName().str();
      if (auto entry = kernel->getAttrOfType<FlatSymbolRefAttr>(
              KVCDialect::kEntryAttrName);
          entry && kernels.count(entry.getValue()))
        out.entry = entry.getValue().str();
      if (auto prologue = kernel->getAttrOfType<FlatSymbolRefAttr>(
              KVCDialect::kPrologueAttrName);
          prologue && kernels.count(prologue.getValue()))
        out.prologue = prologue.getValue().str();
      for (Operation &inner : kernel.getBody().front())
        if (!isa<YieldOp>(inner))
          steps.push_back(&inner);
    } else if (!isa<YieldOp>(op)) {
      steps.push_back(&op);
    }
  }
  for (Operation *step : steps) {
    FailureOr<kvc::BundleStep> built = buildStep(step);
    if (failed(built))
      return failure();
    out.steps.push_back(std::move(*built));
  }
  return out;
}

FailureOr<kvc::BundlePlan>
buildPlan(PlanOp plan, const llvm::StringMap<GeneratedKernel> &kernels) {
  llvm::DenseMap<Operation *, int64_t> ids;
  kvc::BundlePlan out;
  out.name = plan.getSymName().str();
  out.tokens = rangeOf(plan.getTokens());
  out.layers = rangeOf(plan.getLayers());
  out.predictedUs = plan.getPredictedUs();
  out.prefillStep = plan.getPrefillStep();
  for (Operation &op : plan.getBody().front()) {
    auto task = cast<TaskOp>(op); // Checked by buildPlanBundle.
    if (std::optional<int64_t> slot = task.getSlot())
      out.stagingSlots = std::max(out.stagingSlots, *slot + 1);
    ids[task] = int64_t(ids.size());
  }
  for (Operation &op : plan.getBody().front()) {
    FailureOr<kvc::BundleTask> task =
        buildTask(cast<TaskOp>(op), ids[&op], ids, kernels);
    if (failed(task))
      return failure();
    out.tasks.push_back(std::move(*task));
  }
  return out;
}

void writeRange(llvm::json::OStream &json, StringRef key,
                const kvc::BundleRange &range) {
  json.attributeArray(key, [&] {
    json.value(range.begin);
    json.value(range.end);
  });
}

void writeTriple(llvm::json::OStream &json, StringRef key,
                 const std::array<int64_t, 3> &values) {
  json.attributeArray(key, [&] {
    for (int64_t value : values)
      json.value(value);
  });
}

void writeStep(llvm::json::OStream &json, const kvc::BundleStep &step) {
  json.object([&] {
    json.attribute("op", kvc::name(step.kind));
    json.attribute("form", kvc::name(step.form));
    writeRange(json, "tokens", step.tokens);
    writeRange(json, "layers", step.layers);
    json.attribute("codec", step.codec.str());
    if (!step.tier.empty())
      json.attribute("tier", step.tier);
    if (!step.node.empty())
      json.attribute("node", step.node);
    if (step.predictedBytes)
      json.attribute("predicted_bytes", *step.predictedBytes);
  });
}

void writeTask(llvm::json::OStream &json, const kvc::BundleTask &task) {
  json.object([&] {
    json.attribute("id", task.id);
    json.attribute("resource", kvc::name(task.resource));
    json.attribute("lane", task.lane);
    json.attributeArray("after", [&] {
      for (int64_t dep : task.after)
        json.value(dep);
    });
    json.attributeArray("inputs", [&] {
      for (int64_t input : task.inputs)
        json.value(input);
    });
    if (task.slot)
      json.attribute("slot", *task.slot);
    if (task.predictedNs)
      writeRange(json, "predicted_ns",
                 {task.predictedNs->first, task.predictedNs->second});
    if (!task.kernel.empty())
      json.attribute("kernel", task.kernel);
    if (!task.entry.empty())
      json.attribute("entry", task.entry);
    if (!task.prologue.empty())
      json.attribute("prologue", task.prologue);
    json.attributeArray("steps", [&] {
      for (const kvc::BundleStep &step : task.steps)
        writeStep(json, step);
    });
  });
}

void writePlan(llvm::json::OStream &json, const kvc::BundlePlan &plan) {
  json.object([&] {
    json.attribute("name", plan.name);
    writeRange(json, "tokens", plan.tokens);
    writeRange(json, "layers", plan.layers);
    if (plan.predictedUs)
      json.attribute("predicted_us", *plan.predictedUs);
    if (plan.prefillStep)
      json.attribute("prefill_step", *plan.prefillStep);
    json.attribute("staging_slots", plan.stagingSlots);
    json.attributeArray("tasks", [&] {
      for (const kvc::BundleTask &task : plan.tasks)
        writeTask(json, task);
    });
  });
}

void writeKernel(llvm::json::OStream &json, const kvc::BundleKernel &kernel) {
  json.object([&] {
    json.attribute("name", kernel.name);
    json.attribute("kind", kvc::bundleKernelKindName(kernel.kind));
    json.attribute("function", kernel.function);
    json.attribute("format", kernel.format);
    json.attribute("target", kernel.target);
    writeTriple(json, "grid", kernel.grid);
    writeTriple(json, "block", kernel.block);
    json.attributeArray("args", [&] {
      for (const std::string &arg : kernel.args)
        json.value(arg);
    });
    json.attribute("tokens", kernel.tokens);
    json.attribute("layers", kernel.layers);
    json.attribute("kv_heads", kernel.kvHeads);
    json.attribute("head_dim", kernel.headDim);
    json.attribute("block_size", kernel.blockSize);
    if (kernel.kind == kvc::BundleKernel::Kind::RmsNorm) {
      json.attribute("hidden", kernel.hidden);
      json.attribute("eps", kernel.eps);
    }
    json.attribute("storage", kernel.storage);
    json.attribute("codec", kernel.codec.str());
    json.attribute("key_axis", kvc::axisName(kernel.codec.keyAxis));
    json.attribute("value_axis", kvc::axisName(kernel.codec.valueAxis));
    json.attribute("payload_bytes", kernel.payloadBytes);
    json.attribute("binary", kernel.binary);
  });
}

} // namespace

FailureOr<kvc::PlanBundle> kvc::compiler::buildPlanBundle(ModuleOp module) {
  // Check every plan before building any.
  SmallVector<PlanOp> plans(module.getOps<PlanOp>());
  for (PlanOp plan : plans)
    for (Operation &op : plan.getBody().front())
      if (!isa<TaskOp>(op))
        return plan.emitOpError("is not scheduled (holds '")
               << op.getName() << "'); run "
               << (isa<SegmentOp>(op) ? "kvc-expand, kvc-fuse and kvc-schedule"
                                      : "kvc-schedule")
               << " (or --kvc-restore-pipeline) before kvc-emit-bundle";

  FailureOr<llvm::StringMap<GeneratedKernel>> kernels =
      generatedKernels(module);
  if (failed(kernels))
    return failure();

  kvc::PlanBundle bundle;
  if (auto model = module->getAttrOfType<ModelAttr>(KVCDialect::kModelAttrName))
    bundle.modelFingerprint = model.getFingerprint().str();
  for (PlanOp plan : plans) {
    FailureOr<kvc::BundlePlan> built = buildPlan(plan, *kernels);
    if (failed(built))
      return failure();
    bundle.plans.push_back(std::move(*built));
  }
  for (const auto &kernel : *kernels) {
    FailureOr<kvc::BundleKernel> built = buildKernel(kernel.getValue());
    if (failed(built))
      return failure();
    bundle.kernels.push_back(std::move(*built));
  }
  return bundle;
}

void kvc::compiler::writePlanBundle(const kvc::PlanBundle &bundle,
                                    raw_ostream &out) {
  {
    llvm::json::OStream json(out, /*IndentSize=*/1);
    json.object([&] {
      json.attribute("format", "kvc-plan-bundle");
      json.attribute("version", bundle.version);
      json.attribute("model_fingerprint", bundle.modelFingerprint);
      json.attributeArray("plans", [&] {
        for (const kvc::BundlePlan &plan : bundle.plans)
          writePlan(json, plan);
      });
      json.attributeArray("kernels", [&] {
        for (const kvc::BundleKernel &kernel : bundle.kernels)
          writeKernel(json, kernel);
      });
    });
  }
  out << "\n";
}

LogicalResult kvc::compiler::writePlanBundle(ModuleOp module,
                                             raw_ostream &out) {
  FailureOr<kvc::PlanBundle> bundle = buildPlanBundle(module);
  if (failed(bundle))
    return failure();
  writePlanBundle(*bundle, out);
  return success();
}

namespace {

struct KVCEmitBundlePass
    : public kvc::compiler::impl::KVCEmitBundlePassBase<KVCEmitBundlePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::string buffer;
    llvm::raw_string_ostream os(buffer);
    if (failed(writePlanBundle(module, os)))
      return signalPassFailure();

    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(file, &error);
    if (!out) {
      module.emitError() << "kvc-emit-bundle: " << error;
      return signalPassFailure();
    }
    out->os() << buffer;
    out->keep();
  }
};

} // namespace
