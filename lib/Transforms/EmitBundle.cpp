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

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCEMITBUNDLEPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;

namespace {

void writeRange(llvm::json::OStream &json, StringRef key, int64_t begin,
                int64_t end) {
  json.attributeArray(key, [&] {
    json.value(begin);
    json.value(end);
  });
}

/// The chunk a step works on: the one it produces for the steps that create
/// chunks (a fetch; a chunk compute, whose operands are the prefix it
/// attends to), else the one it consumes.
ChunkType stepChunk(Operation *step) {
  if (isa<FetchOp, ChunkComputeOp>(step))
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
    if (auto fetch = dyn_cast<FetchOp>(step)) {
      json.attribute("tier", fetch.getSource().getTier());
      if (auto bytes =
              fetch->getAttrOfType<IntegerAttr>(KVCDialect::kBytesAttrName))
        json.attribute("predicted_bytes", bytes.getInt());
    }
  });
  return success();
}

LogicalResult writeTask(llvm::json::OStream &json, TaskOp task, int64_t id,
                        const llvm::DenseMap<Operation *, int64_t> &ids) {
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

LogicalResult writePlan(llvm::json::OStream &json, PlanOp plan) {
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
    json.attribute("staging_slots", slots);
    json.attributeArray("tasks", [&] {
      for (Operation &op : plan.getBody().front())
        if (failed(writeTask(json, cast<TaskOp>(op), ids[&op], ids)))
          result = failure();
    });
  });
  return result;
}

} // namespace

LogicalResult mlir::kvc::writePlanBundle(ModuleOp module, raw_ostream &out) {
  // Check every plan before writing anything.
  SmallVector<PlanOp> plans(module.getOps<PlanOp>());
  for (PlanOp plan : plans)
    for (Operation &op : plan.getBody().front())
      if (!isa<TaskOp>(op))
        return plan.emitOpError("is not scheduled (holds '")
               << op.getName() << "'); run kvc-schedule before kvc-emit-bundle";

  std::string buffer;
  llvm::raw_string_ostream os(buffer);
  LogicalResult result = success();
  {
    llvm::json::OStream json(os, /*IndentSize=*/1);
    json.object([&] {
      json.attribute("format", "kvc-plan-bundle");
      json.attribute("version", ::kvc::kPlanBundleVersion);
      StringRef fingerprint;
      if (auto model =
              module->getAttrOfType<ModelAttr>(KVCDialect::kModelAttrName))
        fingerprint = model.getFingerprint();
      json.attribute("model_fingerprint", fingerprint);
      json.attributeArray("plans", [&] {
        for (PlanOp plan : plans)
          if (failed(writePlan(json, plan)))
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
    : public mlir::kvc::impl::KVCEmitBundlePassBase<KVCEmitBundlePass> {
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
