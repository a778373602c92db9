//===- PlanRestore.h - What the restore planners share ----------*- C++ -*-===//
//
// kvc-plan's body: it turns every kvc.restore of the module into a kvc.plan
// of the same name, chosen by the planning library for the module's model
// and target (the joint plan, or the baseline its strategy names).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_TRANSFORMS_PLANRESTORE_H
#define KVC_LIB_TRANSFORMS_PLANRESTORE_H

#include "kvc/Support/MLIR.h"

#include "PlanningSupport.h"

#include "kvc/Support/Format.h"

#include "mlir/IR/Builders.h"

#include <cmath>
#include <string>
#include <vector>

namespace kvc::compiler {

/// "12.3 ms".
std::string ms(double seconds);

/// The report of kvc-plan{report}: one line per baseline and for the chosen
/// plan, with when layer 0 is complete (and, for a request with a forward
/// pass, when its first token is), busy time per resource, bytes, FLOPs and
/// its time over the chosen plan's; then what each chose.
std::string formatReport(const kvc::planning::Planner &planner,
                         const kvc::planning::Request &request,
                         const std::vector<kvc::planning::Evaluation> &rows);

/// The body: plan every kvc.restore with `DerivedT::choose`.
template <typename DerivedT, template <typename> class GeneratedBaseT>
struct PlanRestorePass : public PlanningPass<DerivedT, GeneratedBaseT> {
  using PlanningPass<DerivedT, GeneratedBaseT>::PlanningPass;

  void runOnOperation() override {
    ModuleOp module = this->getOperation();
    SmallVector<RestoreOp> restores(module.getOps<RestoreOp>());
    if (restores.empty())
      return;
    FailureOr<PlanningContext> context =
        getPlanningContext(module, this->getArgument(), this->planOptions());
    if (failed(context))
      return this->signalPassFailure();

    for (RestoreOp restore : restores) {
      kvc::planning::Request request = getRequest(restore);
      kvc::planning::Planner planner(*context->cost, request, context->options);
      if (kvc::Status status = planner.validate(); !status.isOk()) {
        restore.emitOpError() << status.message();
        return this->signalPassFailure();
      }
      std::optional<kvc::planning::Evaluation> best =
          static_cast<DerivedT *>(this)->choose(planner, restore);
      if (!best)
        return this->signalPassFailure();
      const kvc::planning::Evaluation &chosen = *best;
      if (chosen.seconds > request.sloSeconds) {
        InFlightDiagnostic diag = this->allowSloMiss
                                      ? mlir::emitWarning(restore.getLoc())
                                      : restore.emitOpError();
        diag << "the best " << chosen.plan.strategy << " plan takes "
             << ms(chosen.seconds) << ", more than slo_ms = "
             << kvc::formatNumber(request.sloSeconds * 1e3);
        if (!this->allowSloMiss) {
          diag.attachNote() << "allow-slo-miss keeps it with a warning";
          return this->signalPassFailure();
        }
      }

      OpBuilder builder(restore);
      PlanOp plan = buildPlanOp(builder, restore.getLoc(),
                                restore.getSymName(), request, chosen.plan,
                                context->layers);
      plan.setPredictedUsAttr(
          builder.getI64IntegerAttr(std::llround(chosen.seconds * 1e6)));
      static_cast<DerivedT *>(this)->emitReport(planner, chosen, plan);
      restore.erase();
    }
  }

  /// No report unless a pass asks for one.
  void emitReport(const kvc::planning::Planner &,
                  const kvc::planning::Evaluation &, PlanOp) {}
};

} // namespace kvc::compiler

#endif // KVC_LIB_TRANSFORMS_PLANRESTORE_H
