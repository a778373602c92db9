//===- Plan.cpp - kvc-plan ------------------------------------------------===//
//
// The joint plan, or the baseline a strategy names, with an optional
// report of every baseline beside it.
//
//===----------------------------------------------------------------------===//

#include "PlanRestore.h"

#include "kvc/Transforms/Passes.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCPLANPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

namespace {

struct KVCPlanPass
    : public PlanRestorePass<KVCPlanPass,
                             kvc::compiler::impl::KVCPlanPassBase> {
  using PlanRestorePass::PlanRestorePass;

  /// The joint plan, or the baseline `strategy` names; fails (with a
  /// diagnostic) when the request stores nothing that baseline loads.
  std::optional<planning::Evaluation> choose(const planning::Planner &planner,
                                             RestoreOp restore) {
    StringRef name = strategy;
    std::optional<planning::Strategy> strategy = planning::parseStrategy(name);
    if (!strategy) {
      InFlightDiagnostic diag = restore.emitOpError()
                                << "cannot be planned with strategy \"" << name
                                << "\" (expected ";
      llvm::interleave(
          planning::allStrategies(), diag,
          [&](planning::Strategy each) { diag << planning::strategyName(each); },
          ", ");
      diag << ")";
      return std::nullopt;
    }
    std::optional<planning::Evaluation> planned = planner.plan(*strategy);
    if (!planned)
      restore.emitOpError()
          << "has no usable "
          << (planning::strategyNeeds(*strategy) == kvc::Form::Hidden
                  ? "hidden-state"
                  : "KV")
          << " source for strategy \"" << name << "\"";
    return planned;
  }

  void emitReport(const planning::Planner &planner,
                  const planning::Evaluation &chosen, PlanOp plan) {
    if (!report)
      return;
    std::vector<planning::Evaluation> rows = planner.baselines();
    rows.push_back(chosen);
    mlir::emitRemark(plan.getLoc())
        << "kvc-plan @" << plan.getSymName() << ":\n"
        << formatReport(planner, planner.request(), rows);
  }
};

} // namespace
