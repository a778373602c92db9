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
#include "kvc/Transforms/Passes.h"

#include <memory>
#include <optional>

namespace kvc::compiler {

/// The planning library's view of a module: built by each pass that plans
/// from the module's `kvc.model` and `kvc.target`, or given to it by an
/// in-process compile that priced the plan already (compileChosen), whose
/// cost model the passes then share.
struct PlanningContext {
  std::shared_ptr<const kvc::planning::CostModel> cost;
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
          options.layerWise, options.candidates};
}

/// A pass that plans, on its generated base (whose options include
/// KVC_CostModelOptions).
template <typename DerivedT, template <typename> class GeneratedBaseT>
struct PlanningPass : public GeneratedBaseT<DerivedT> {
  using GeneratedBaseT<DerivedT>::GeneratedBaseT;

  /// The context its caller built (createPlanningPass), or null: each run
  /// builds one from the module.
  std::shared_ptr<const PlanningContext> given;

  /// Its cost-model options as the planner's options.
  kvc::planning::PlanOptions planOptions() const {
    kvc::planning::PlanOptions options;
    options.codecProfile = this->codecProfile;
    options.chunkTokens = this->chunkTokens;
    options.stagingMiB = this->stagingMiB;
    options.layerWise = this->layerWise;
    options.candidates = this->candidates;
    return options;
  }
};

/// A planning pass of type `PassT` with `options`, planning with `given`
/// (null: a context built from the module on each run).
template <typename PassT, typename OptionsT>
std::unique_ptr<Pass>
createPlanningPass(const OptionsT &options,
                   std::shared_ptr<const PlanningContext> given) {
  auto pass = std::make_unique<PassT>(options);
  pass->given = std::move(given);
  return pass;
}

/// The passes that plan with a context given (their generated constructors
/// build their own).
std::unique_ptr<Pass>
createKVCExpandPass(const KVCExpandPassOptions &options,
                    std::shared_ptr<const PlanningContext> given);
std::unique_ptr<Pass>
createKVCSchedulePass(const KVCSchedulePassOptions &options,
                      std::shared_ptr<const PlanningContext> given);
std::unique_ptr<Pass>
createKVCEstimatePass(const KVCEstimatePassOptions &options,
                      std::shared_ptr<const PlanningContext> given);

/// `given` when there is one; else builds the cost model from the
/// `kvc.model` and `kvc.target` around `op` and `options`' codec profile
/// (built-in when empty), reporting what is missing on `op` and failing.
FailureOr<PlanningContext>
getPlanningContext(Operation *op, StringRef passArgument,
                   const kvc::planning::PlanOptions &options,
                   const PlanningContext *given = nullptr);

/// Calls `fn` on every plan of `module` that `select` accepts, with the
/// planning context (`given`, or one built once, only when some plan is
/// selected). Fails at the first failure.
LogicalResult
forEachPlan(ModuleOp module, StringRef passArgument,
            const kvc::planning::PlanOptions &options,
            function_ref<bool(PlanOp)> select,
            function_ref<LogicalResult(PlanOp, const PlanningContext &)> fn,
            const PlanningContext *given = nullptr);

/// The passes that lower chosen plans (kvc-expand, kvc-fuse, kvc-schedule,
/// kvc-estimate, kvc-generate-kernels), planning with `given` when set:
/// what kvc-restore-pipeline and kvc-save-pipeline run after choosing, and
/// what an in-process compile of a chosen plan runs alone.
void buildLoweringPipeline(OpPassManager &pm,
                           const kvc::planning::PlanOptions &options,
                           std::shared_ptr<const PlanningContext> given = {});

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
