//===- PartitionLayers.cpp - kvc-partition-layers -------------------------===//
//
// HCache: hidden states for the upper layers, the complement below.
//
//===----------------------------------------------------------------------===//

#include "PlanRestore.h"

#include "kvc/Transforms/Passes.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCPARTITIONLAYERSPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

namespace {

struct KVCPartitionLayersPass
    : public PlanRestorePass<KVCPartitionLayersPass,
                             kvc::compiler::impl::KVCPartitionLayersPassBase> {
  using PlanRestorePass::PlanRestorePass;

  std::optional<planning::Evaluation> choose(const planning::Planner &planner,
                                             RestoreOp restore) {
    if (std::optional<planning::Evaluation> hcache = planner.hcache())
      return *hcache;
    mlir::emitRemark(restore.getLoc(), "no usable hidden-state source: using the best plan "
                       "without one");
    planning::Evaluation best = planner.computeOnly();
    if (std::optional<planning::Evaluation> kv = planner.kvOnly();
        kv && kv->firstTokenSeconds < best.firstTokenSeconds)
      best = *kv;
    return best;
  }
};

} // namespace
