//===- Schedule.cpp - kvc-schedule: steps to tasks, slots and rounds ------===//
//
// Wraps every top-level step of a dataflow plan in a kvc.task on the resource
// that runs it: fetches and stores on the lanes of their tier (round robin,
// like HCache's striping), host decoding on the decode pool, copies on the copy
// engine, everything else on the compute stream. Tasks wait for the tasks
// whose values they use.
//
// Staging memory is bounded (ShadowServe): each fetch takes one of
// floor(budget / largest fetch) buffer slots, holding its host buffer until
// its chunk's copy to the device has finished and its device buffer from
// that copy until the step that consumes the chunk on the device (the
// scatter, or a kernel ending in one); a fetch that reuses a slot waits for
// the copy, and a copy into a slot for that consumer. A request larger than
// the budget so runs in rounds, on both sides of the link.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCSCHEDULEPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

namespace {

struct KVCSchedulePass
    : public PlanningPass<KVCSchedulePass,
                          kvc::compiler::impl::KVCSchedulePassBase> {
  using PlanningPass::PlanningPass;

  void runOnOperation() override {
    // Dataflow-level plans: no segments, no tasks yet.
    auto dataflow = [](PlanOp plan) {
      return !holdsSegments(plan) && plan.getBody().getOps<TaskOp>().empty() &&
             !plan.getBody().front().empty();
    };
    if (failed(forEachPlan(
            getOperation(), getArgument(), planOptions(), dataflow,
            [&](PlanOp plan, const PlanningContext &context) {
              schedule(plan, context);
              return success();
            },
            given.get())))
      signalPassFailure();
  }

  /// Host bytes a fetch holds (planning::stagingBytes).
  static double stagingBytes(FetchOp fetch,
                             const kvc::planning::CostModel &cost) {
    ChunkType c = fetch.getResult().getType();
    return kvc::planning::stagingBytes(cost, toVocabulary(c.getForm()),
                                       getCodecSpec(c.getCodec()), getBox(c));
  }

  void schedule(PlanOp plan, const PlanningContext &context) {
    const kvc::planning::CostModel &cost = *context.cost;
    Block &body = plan.getBody().front();
    SmallVector<Operation *> steps =
        llvm::map_to_vector(body, [](Operation &op) { return &op; });

    // As many slots of the largest fetch as the budget holds, and no more
    // than there are fetches (a plan without any needs none; sizing it by
    // the budget alone gave a compute-only plan 2^28 one-byte slots).
    double largestFetch = 1;
    int64_t fetches = 0;
    for (Operation *step : steps)
      if (auto fetch = dyn_cast<FetchOp>(step)) {
        largestFetch = std::max(largestFetch, stagingBytes(fetch, cost));
        ++fetches;
      }
    int64_t slots = std::clamp<int64_t>(
        int64_t(double(context.options.stagingBytes()) / largestFetch), 1,
        std::max<int64_t>(fetches, 1));

    // The task that defines each value, the lanes handed out per tier, and
    // per slot the copy task that frees it.
    llvm::DenseMap<Value, TaskOp> definingTask;
    llvm::StringMap<int64_t> nextLane;
    SmallVector<Value> slotFreedBy(slots), deviceFreedBy(slots);
    llvm::DenseMap<Value, int64_t> slotOfValue;   // Host chunks in a slot.
    llvm::DenseMap<Value, int64_t> deviceOfValue; // Device chunks in a slot.
    int64_t nextSlot = 0;

    OpBuilder builder(plan.getContext());
    for (Operation *step : steps) {
      Resource resource = getResource(step);
      int64_t lane = 0;
      if (StringRef tier = getStepTier(step); !tier.empty()) {
        const kvc::TierDesc *desc = cost.target().findTier(tier.str());
        lane = nextLane[tier]++ % (desc ? desc->lanes : 1);
      }
      SmallVector<Value> deps;
      for (Value operand : step->getOperands())
        if (TaskOp task = definingTask.lookup(operand))
          if (!llvm::is_contained(deps, task.getDone()))
            deps.push_back(task.getDone());
      IntegerAttr slotAttr;
      std::optional<int64_t> slot;
      if (isa<FetchOp>(step)) {
        slot = nextSlot++ % slots;
        slotAttr = builder.getI64IntegerAttr(*slot);
        if (Value freedBy = slotFreedBy[*slot])
          if (!llvm::is_contained(deps, freedBy))
            deps.push_back(freedBy);
      } else if (step->getNumOperands() == 1) {
        // Host chunks derived from a fetch stay in its slot.
        auto it = slotOfValue.find(step->getOperand(0));
        if (it != slotOfValue.end())
          slot = it->second;
      }
      // A copy into a slot's device buffer waits for the step that consumed
      // the chunk before it there.
      if (isa<TransferToDeviceOp>(step) && slot)
        if (Value freedBy = deviceFreedBy[*slot])
          if (!llvm::is_contained(deps, freedBy))
            deps.push_back(freedBy);
      std::optional<int64_t> deviceSlot;
      for (Value operand : step->getOperands())
        if (auto it = deviceOfValue.find(operand); it != deviceOfValue.end())
          deviceSlot = it->second;

      builder.setInsertionPoint(step);
      auto task = builder.create<TaskOp>(
          step->getLoc(), TokenType::get(plan.getContext()),
          step->getResultTypes(), resource, uint64_t(lane),
          deps, slotAttr);
      Block *taskBody = builder.createBlock(&task.getBody());
      step->moveBefore(taskBody, taskBody->end());
      builder.setInsertionPointToEnd(taskBody);
      builder.create<YieldOp>(step->getLoc(), step->getResults());
      for (auto [value, result] :
           llvm::zip(step->getResults(), task.getValues())) {
        value.replaceUsesWithIf(result, [&](OpOperand &use) {
          return use.getOwner()->getParentOp() != task.getOperation();
        });
        definingTask[result] = task;
        auto chunk = dyn_cast<ChunkType>(result.getType());
        if (!chunk)
          continue;
        if (slot && chunk.getSpace() == Space::host)
          slotOfValue[result] = *slot;
        // The copy fills the slot's device buffer; device steps keep it.
        if (chunk.getSpace() == Space::device) {
          if (isa<TransferToDeviceOp>(step) && slot)
            deviceOfValue[result] = *slot;
          else if (deviceSlot)
            deviceOfValue[result] = *deviceSlot;
        }
      }
      // A copy to the device frees its chunk's host buffer
      // (planning::freesStaging); the step that consumes a device chunk
      // without producing one frees its device one.
      std::optional<kvc::StepKind> kind = getStepKind(step);
      if (kind && kvc::planning::freesStaging(*kind) && slot)
        slotFreedBy[*slot] = task.getDone();
      if (deviceSlot && llvm::none_of(step->getResultTypes(), [](Type type) {
            auto chunk = dyn_cast<ChunkType>(type);
            return chunk && chunk.getSpace() == Space::device;
          }))
        deviceFreedBy[*deviceSlot] = task.getDone();
    }
  }
};

} // namespace

std::unique_ptr<Pass> kvc::compiler::createKVCSchedulePass(
    const KVCSchedulePassOptions &options,
    std::shared_ptr<const PlanningContext> given) {
  return createPlanningPass<KVCSchedulePass>(options, std::move(given));
}
