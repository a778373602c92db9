//===- EmitBundle.cpp - kvc-emit-bundle: plans for the runtime ------------===//
//
// Writes the module's exec-level plans as a plan bundle (docs/plan-bundle.md),
// the one format the runtime reads (kvc/Runtime/Exec/PlanBundle.h). Tasks are
// numbered in program order, which kvc-schedule makes a topological order;
// the runtime re-validates everything written here.
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

void writeRange(llvm::json::OStream &json, StringRef key, int64_t begin,
                int64_t end) {
  json.attributeArray(key, [&] {
    json.value(begin);
    json.value(end);
  });
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

LogicalResult writeStep(llvm::json::OStream &json, Operation *step) {
  ChunkType chunk = stepChunk(step);
  if (!chunk)
    return step->emitOpError("has no chunk to describe in a plan bundle");
  json.object([&] {
    json.attribute("op", step->getName().stripDialect());
    json.attribute("form", stringifyForm(chunk.getForm()));
    writeRange(json, "tokens", chunk.getTokens().getBegin(),
               chunk.getTokens().getEnd());
    writeRange(json, "layers", chunk.getLayers().getBegin(),
               chunk.getLayers().getEnd());
    json.attribute("codec", getCodecSpec(chunk.getCodec()).str());
    if (auto store = dyn_cast<StoreOp>(step))
      json.attribute("tier", store.getTier());
    if (auto send = dyn_cast<SendOp>(step))
      json.attribute("node", send.getNode());
    if (auto recv = dyn_cast<RecvOp>(step))
      json.attribute("node", recv.getNode());
    if (auto fetch = dyn_cast<FetchOp>(step)) {
      json.attribute("tier", fetch.getSource().getTier());
      if (auto bytes =
              fetch->getAttrOfType<IntegerAttr>(KVCDialect::kBytesAttrName))
        json.attribute("predicted_bytes", bytes.getInt());
    }
  });
  return success();
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

LogicalResult writeKernel(llvm::json::OStream &json, GeneratedKernel kernel) {
  gpu::LaunchFuncOp launch = kernel.launch;
  auto object = dyn_cast<gpu::ObjectAttr>(kernel.binary.getObjects()[0]);
  auto target = object ? dyn_cast<NVVM::NVVMTargetAttr>(object.getTarget())
                       : NVVM::NVVMTargetAttr();
  if (!target || object.getFormat() != gpu::CompilationTarget::Assembly)
    return kernel.binary.emitOpError("holds no PTX for an NVVM target");
  // The PTX text ends with a NUL byte.
  StringRef ptx = object.getObject().getValue().rtrim('\0');
  SmallVector<StringRef> args;
  for (Value operand : launch.getKernelOperands()) {
    auto arg = dyn_cast<BlockArgument>(operand);
    if (!arg || arg.getOwner()->getParentOp() != kernel.func)
      return launch.emitOpError("passes a value that is not an argument of "
                                "its function; the bundle cannot name it");
    args.push_back(
        kvc::bundleKernelArgNames(kernel.spec.kind)[arg.getArgNumber()]);
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
            kvc::bundleKernelArgNames(
                kernel.spec.kind)[source.getArgNumber()] != "chunks")
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
  auto dims = [&](gpu::KernelDim3 dim3, StringRef key) -> LogicalResult {
    SmallVector<int64_t> sizes;
    for (Value v : {dim3.x, dim3.y, dim3.z}) {
      std::optional<int64_t> c = getConstantIntValue(v);
      if (!c && key == "grid" && v == dim3.y && isChunkCount(v))
        c = 1;
      if (!c)
        return launch.emitOpError("has a launch size that is not a constant");
      sizes.push_back(*c);
    }
    json.attributeArray(key, [&] {
      for (int64_t size : sizes)
        json.value(size);
    });
    return success();
  };
  const KernelSpec &spec = kernel.spec;
  kvc::CodecSpec codec = getCodecSpec(spec.codec);
  LogicalResult result = success();
  json.object([&] {
    json.attribute("name", kernel.func.getSymName());
    json.attribute("kind", kvc::bundleKernelKindName(spec.kind));
    json.attribute("function", launch.getKernelName().getValue());
    json.attribute("format", "ptx");
    json.attribute("target", target.getChip());
    if (failed(dims(launch.getGridSizeOperandValues(), "grid")) ||
        failed(dims(launch.getBlockSizeOperandValues(), "block")))
      result = failure();
    json.attributeArray("args", [&] {
      for (StringRef arg : args)
        json.value(arg);
    });
    json.attribute("tokens", spec.tokens);
    json.attribute("layers", spec.layers);
    json.attribute("kv_heads", spec.kvHeads);
    json.attribute("head_dim", spec.headDim);
    json.attribute("block_size", spec.blockSize);
    if (spec.kind == KernelKind::RmsNorm) {
      json.attribute("hidden", spec.hidden);
      json.attribute("eps", spec.eps);
    }
    std::string storage;
    llvm::raw_string_ostream(storage) << spec.storage;
    json.attribute("storage", storage);
    json.attribute("codec", codec.str());
    json.attribute("key_axis", kvc::axisName(codec.keyAxis));
    json.attribute("value_axis", kvc::axisName(codec.valueAxis));
    json.attribute("payload_bytes", spec.payloadBytes());
    json.attribute("binary", ptx);
  });
  return result;
}

LogicalResult writeTask(llvm::json::OStream &json, TaskOp task, int64_t id,
                        const llvm::DenseMap<Operation *, int64_t> &ids,
                        const llvm::StringMap<GeneratedKernel> &kernels) {
  auto idsOf = [&](auto values) {
    SmallVector<int64_t> out;
    for (Value value : values)
      if (auto found = ids.find(value.getDefiningOp()); found != ids.end())
        if (!llvm::is_contained(out, found->second))
          out.push_back(found->second);
    return out;
  };
  LogicalResult result = success();
  json.object([&] {
    json.attribute("id", id);
    json.attribute("resource", stringifyResource(task.getResource()));
    json.attribute("lane", task.getLane());
    json.attributeArray("after", [&] {
      for (int64_t dep : idsOf(task.getDeps()))
        json.value(dep);
    });
    json.attributeArray("inputs", [&] {
      for (int64_t input : idsOf(stepInputs(task)))
        json.value(input);
    });
    if (std::optional<int64_t> slot = task.getSlot())
      json.attribute("slot", *slot);
    if (auto time = task->getAttrOfType<DenseI64ArrayAttr>(
            KVCDialect::kTimeAttrName);
        time && time.size() == 2)
      writeRange(json, "predicted_ns", time[0], time[1]);
    SmallVector<Operation *> steps;
    for (Operation &op : task.getBody().front()) {
      if (auto kernel = dyn_cast<KernelOp>(op)) {
        json.attribute("kernel", kernel.getKernelName());
        if (auto entry = kernel->getAttrOfType<FlatSymbolRefAttr>(
                KVCDialect::kEntryAttrName);
            entry && kernels.count(entry.getValue()))
          json.attribute("entry", entry.getValue());
        if (auto prologue = kernel->getAttrOfType<FlatSymbolRefAttr>(
                KVCDialect::kPrologueAttrName);
            prologue && kernels.count(prologue.getValue()))
          json.attribute("prologue", prologue.getValue());
        for (Operation &inner : kernel.getBody().front())
          if (!isa<YieldOp>(inner))
            steps.push_back(&inner);
      } else if (!isa<YieldOp>(op)) {
        steps.push_back(&op);
      }
    }
    json.attributeArray("steps", [&] {
      for (Operation *step : steps)
        if (failed(writeStep(json, step)))
          result = failure();
    });
  });
  return result;
}

LogicalResult writePlan(llvm::json::OStream &json, PlanOp plan,
                        const llvm::StringMap<GeneratedKernel> &kernels) {
  llvm::DenseMap<Operation *, int64_t> ids;
  int64_t slots = 0;
  for (Operation &op : plan.getBody().front()) {
    auto task = cast<TaskOp>(op); // Checked by the pass.
    if (std::optional<int64_t> slot = task.getSlot())
      slots = std::max(slots, *slot + 1);
    ids[task] = int64_t(ids.size());
  }
  LogicalResult result = success();
  json.object([&] {
    json.attribute("name", plan.getSymName());
    writeRange(json, "tokens", plan.getTokens().getBegin(),
               plan.getTokens().getEnd());
    writeRange(json, "layers", plan.getLayers().getBegin(),
               plan.getLayers().getEnd());
    if (std::optional<int64_t> predicted = plan.getPredictedUs())
      json.attribute("predicted_us", *predicted);
    if (std::optional<int64_t> step = plan.getPrefillStep())
      json.attribute("prefill_step", *step);
    json.attribute("staging_slots", slots);
    json.attributeArray("tasks", [&] {
      for (Operation &op : plan.getBody().front())
        if (failed(writeTask(json, cast<TaskOp>(op), ids[&op], ids, kernels)))
          result = failure();
    });
  });
  return result;
}

} // namespace

LogicalResult kvc::compiler::writePlanBundle(ModuleOp module,
                                             raw_ostream &out) {
  // Check every plan before writing anything.
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

  std::string buffer;
  llvm::raw_string_ostream os(buffer);
  LogicalResult result = success();
  {
    llvm::json::OStream json(os, /*IndentSize=*/1);
    json.object([&] {
      json.attribute("format", "kvc-plan-bundle");
      json.attribute("version", kvc::kPlanBundleVersion);
      StringRef fingerprint;
      if (auto model =
              module->getAttrOfType<ModelAttr>(KVCDialect::kModelAttrName))
        fingerprint = model.getFingerprint();
      json.attribute("model_fingerprint", fingerprint);
      json.attributeArray("plans", [&] {
        for (PlanOp plan : plans)
          if (failed(writePlan(json, plan, *kernels)))
            result = failure();
      });
      json.attributeArray("kernels", [&] {
        for (const auto &kernel : *kernels)
          if (failed(writeKernel(json, kernel.getValue())))
            result = failure();
      });
    });
  }
  if (failed(result))
    return failure();
  out << buffer << "\n";
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
