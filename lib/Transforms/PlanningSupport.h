//===- PlanningSupport.h - What the planning passes share -------*- C++ -*-===//
//
// Private to lib/Transforms. Builds the planning library's inputs from a
// module (model, target, codec profile, requests), turns its plans back into
// IR, and defines the one mapping from dataflow steps to resources, costs and
// simulator jobs that kvc-schedule and kvc-estimate share.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_TRANSFORMS_PLANNINGSUPPORT_H
#define KVC_LIB_TRANSFORMS_PLANNINGSUPPORT_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Planning/Pipeline.h"
#include "kvc/Planning/Planner.h"

#include <memory>
#include <optional>

namespace kvc::compiler {

/// The planning library's view of a module.
struct PlanningContext {
  std::unique_ptr<kvc::planning::CostModel> cost;
  kvc::planning::PlanOptions options;
  int64_t layers = 0;
  Type elementType;
};

/// The planner's options as the generated options of a pass that plans:
/// KVC_CostModelOptions, the first fields of each (a pass's own options
/// after them keep their defaults).
template <typename PassOptionsT>
PassOptionsT toPassOptions(const kvc::planning::PlanOptions &options) {
  return {options.codecProfile, options.chunkTokens, options.stagingMiB,
          options.layerWise};
}

/// A pass that plans, on its generated base (whose options include
/// KVC_CostModelOptions).
template <typename DerivedT, template <typename> class GeneratedBaseT>
struct PlanningPass : public GeneratedBaseT<DerivedT> {
  using GeneratedBaseT<DerivedT>::GeneratedBaseT;

  /// Its cost-model options as the planner's options.
  kvc::planning::PlanOptions planOptions() const {
    kvc::planning::PlanOptions options;
    options.codecProfile = this->codecProfile;
    options.chunkTokens = this->chunkTokens;
    options.stagingMiB = this->stagingMiB;
    options.layerWise = this->layerWise;
    return options;
  }
};

/// Builds the cost model from the `kvc.model` and `kvc.target` around `op`
/// and `options`' codec profile (built-in when empty). Reports what is
/// missing on `op` and fails.
FailureOr<PlanningContext>
getPlanningContext(Operation *op, StringRef passArgument,
                   const kvc::planning::PlanOptions &options);

/// Calls `fn` on every plan of `module` that `select` accepts, with the
/// planning context built once (only when some plan is selected). Fails at
/// the first failure.
LogicalResult
forEachPlan(ModuleOp module, StringRef passArgument,
            const kvc::planning::PlanOptions &options,
            function_ref<bool(PlanOp)> select,
            function_ref<LogicalResult(PlanOp, const PlanningContext &)> fn);

/// The tier a step reads or writes: its fetch's or its store's (inside a
/// task or kernel too); empty for steps that touch no tier.
StringRef getStepTier(Operation *step);

/// True for a strategy-level plan (one holding segments).
bool holdsSegments(PlanOp plan);

kvc::planning::Source getSource(SourceAttr source);
SourceAttr getSourceAttr(MLIRContext *context,
                         const kvc::planning::Source &source);

/// The request of a `kvc.restore`.
kvc::planning::Request getRequest(RestoreOp restore);

/// The request a segment-level plan loads from (its segments' sources) and
/// the plan itself; fails (with a diagnostic) on plans not starting at
/// token 0 or covering only some layers.
FailureOr<std::pair<kvc::planning::Request, kvc::planning::Plan>>
getSegmentPlan(PlanOp plan, int64_t layers);

/// Creates `kvc.plan @name` holding `plan`'s segments.
PlanOp buildPlanOp(OpBuilder &builder, Location loc, StringRef name,
                   const kvc::planning::Request &request,
                   const kvc::planning::Plan &plan, int64_t layers);

/// The vocabulary's kind of a dataflow step; nothing for other ops.
std::optional<kvc::StepKind> getStepKind(Operation *op);

/// The planner's box of tokens x layers a chunk (or a range pair) spans.
kvc::planning::Box getBox(RangeAttr tokens, RangeAttr layers);
inline kvc::planning::Box getBox(ChunkType chunk) {
  return getBox(chunk.getTokens(), chunk.getLayers());
}

/// The resource that runs a dataflow step (planning::stepResource), or a
/// kernel (on compute).
Resource getResource(Operation *step);

/// The values a step reads from other steps: its operands, and for a task
/// also the values its body uses from outside.
SmallVector<Value> stepInputs(Operation *step);

/// A step's simulator job: its duration (planning::stepCost) and priority
/// (planning::stepPriority); a kernel's or task's are its steps' sum and
/// highest.
struct StepCost {
  double seconds = 0;
  int priority = 0;
};
StepCost getStepCost(Operation *step, const kvc::planning::CostModel &cost);

} // namespace kvc::compiler

#endif // KVC_LIB_TRANSFORMS_PLANNINGSUPPORT_H
