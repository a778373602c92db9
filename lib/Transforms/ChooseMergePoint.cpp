//===- ChooseMergePoint.cpp - kvc-choose-merge-point ----------------------===//
//
// Cake: compute the front, load KV for the back, at the best merge point.
//
//===----------------------------------------------------------------------===//

#include "PlanRestore.h"

#include "kvc/Transforms/Passes.h"

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCCHOOSEMERGEPOINTPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;
namespace planning = ::kvc::planning;

namespace {

struct KVCChooseMergePointPass
    : public PlanRestorePass<KVCChooseMergePointPass,
                             mlir::kvc::impl::KVCChooseMergePointPassBase> {
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
