//===- ChooseMergePoint.cpp - kvc-choose-merge-point ----------------------===//
//
// Cake: compute the front, load KV for the back, at the best merge point.
//
//===----------------------------------------------------------------------===//

#include "PlanRestore.h"

#include "kvc/Transforms/Passes.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCCHOOSEMERGEPOINTPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

namespace {

struct KVCChooseMergePointPass
    : public PlanRestorePass<KVCChooseMergePointPass,
                             kvc::compiler::impl::KVCChooseMergePointPassBase> {
  using PlanRestorePass::PlanRestorePass;

  std::optional<planning::Evaluation> choose(const planning::Planner &planner,
                                             RestoreOp restore) {
    if (std::optional<planning::Evaluation> cake = planner.cake())
      return *cake;
    mlir::emitRemark(restore.getLoc(), "no usable KV source: computing every token");
    return planner.computeOnly();
  }
};

} // namespace
