//===- Estimate.cpp - kvc-estimate: simulated times on plans --------------===//
//
// Times every plan with the planning library's simulator. A strategy-level
// plan is simulated as the planner simulates it (by chunks of its segments);
// a dataflow or exec plan is turned into a job graph step by step — one job
// per top-level step, kernel or task, its cost from the cost model, its
// dependencies from the values and tokens it uses, fetches holding staging
// memory until their chunk's copy to the device ends. The plan gets
// `predicted` microseconds, each step `kvc.time_ns = array<i64: start, finish>`
// and each fetch `kvc.bytes`, what it is priced to read.
//
// Two inputs come from outside a plan. A save's or a sender's gathers wait
// for the prefill they run beside (a plan's `prefill_step`) to write their
// chunk's last layer (planning::prefillReadySeconds). A receive plan
// `X_recv` is priced after its sender `X_send` (the two plans kvc-expand
// makes of a kvc.transfer): each recv starts no earlier than the sender's
// send of the same object does, and takes the wire's time, as that send
// does; a recv with no such send starts at once. So a transfer's
// prediction at the receiver includes the sender's prefill, encoding and
// link.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

#include <cmath>
#include <map>
#include <tuple>

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCESTIMATEPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

namespace {

/// The first op of type `OpTy` inside `step` (or `step` itself), or null.
template <typename OpTy> OpTy findStep(Operation *step) {
  OpTy found;
  step->walk([&](OpTy op) {
    found = op;
    return WalkResult::interrupt();
  });
  return found;
}

/// The tokens x layers of the chunk a step makes or takes.
planning::Box boxOf(Value chunk) {
  return getBox(cast<ChunkType>(chunk.getType()));
}
using BoxKey = std::tuple<int64_t, int64_t, int64_t, int64_t>;
BoxKey keyOf(const planning::Box &box) {
  return {box.t0, box.t1, box.l0, box.l1};
}

/// True when `step` (or a step inside it) frees its chunk's staging memory
/// (planning::freesStaging).
bool freesStaging(Operation *step) {
  bool found = false;
  step->walk([&](Operation *op) {
    if (std::optional<kvc::StepKind> kind = getStepKind(op))
      found |= planning::freesStaging(*kind);
  });
  return found;
}

/// The resource a step runs on, named as Planner::buildJobs names them.
std::string resourceName(Operation *step) {
  Resource resource;
  if (auto task = dyn_cast<TaskOp>(step))
    resource = task.getResource();
  else
    resource = getResource(step);
  return kvc::poolName(toVocabulary(resource), getStepTier(step));
}

/// The longest prediction the attributes hold: kvc.time_ns counts int64
/// nanoseconds (about 292 years).
constexpr double kMaxPredictedSeconds = 9.2e9;

/// An error on `plan` unless `seconds` fits kvc.time_ns and predicted_us.
LogicalResult checkRepresentable(PlanOp plan, double seconds) {
  if (seconds >= 0 && seconds < kMaxPredictedSeconds)
    return success();
  return plan.emitOpError("is predicted to take ")
         << seconds << " s, beyond the " << kMaxPredictedSeconds
         << " s that kvc.time_ns (int64 nanoseconds) holds";
}

struct KVCEstimatePass
    : public PlanningPass<KVCEstimatePass,
                          kvc::compiler::impl::KVCEstimatePassBase> {
  using PlanningPass::PlanningPass;

  /// When each object a sender plan sends starts on the link, by plan.
  llvm::StringMap<std::map<BoxKey, double>> sendStarts;

  void runOnOperation() override {
    auto estimate = [&](PlanOp plan, const PlanningContext &context) {
      std::optional<double> seconds = holdsSegments(plan)
                                          ? estimateSegments(plan, context)
                                          : estimateSteps(plan, context);
      if (!seconds || failed(checkRepresentable(plan, *seconds)))
        return failure();
      plan.setPredictedUsAttr(
          OpBuilder(plan).getI64IntegerAttr(std::llround(*seconds * 1e6)));
      return success();
    };
    // Senders before receivers, whose recvs wait for their sends.
    sendStarts.clear();
    auto receives = [](PlanOp plan) {
      return !holdsSegments(plan) && findStep<RecvOp>(plan);
    };
    for (bool receivers : {false, true})
      if (failed(forEachPlan(
              getOperation(), getArgument(), planOptions(),
              [&](PlanOp plan) { return receives(plan) == receivers; },
              estimate, given.get())))
        return signalPassFailure();
  }

  std::optional<double> estimateSegments(PlanOp plan,
                                         const PlanningContext &context) {
    auto segmentPlan = getSegmentPlan(plan, context.layers);
    if (failed(segmentPlan))
      return std::nullopt;
    planning::Planner planner(*context.cost, segmentPlan->first,
                              context.options);
    if (kvc::Status status = planner.validate(); !status.isOk()) {
      plan.emitOpError() << status.message();
      return std::nullopt;
    }
    return planner.evaluate(segmentPlan->second).seconds;
  }

  std::optional<double> estimateSteps(PlanOp plan,
                                      const PlanningContext &context) {
    const planning::CostModel &cost = *context.cost;
    planning::JobGraph graph;
    llvm::StringMap<int> resources;
    llvm::DenseMap<Operation *, int> jobOf;
    // Values still staged on the host, and the fetch job holding them.
    llvm::DenseMap<Value, int> stagedBy;
    SmallVector<Operation *> steps;
    for (Operation &step : plan.getBody().front())
      steps.push_back(&step);
    // Inputs made outside the plan: the prefill's layers a gather takes,
    // the sender's objects a recv takes.
    const int64_t layers = plan.getLayers().getEnd();
    std::optional<int64_t> prefillStep = plan.getPrefillStep();
    const std::map<BoxKey, double> *sent = nullptr;
    if (StringRef name = plan.getSymName(); name.consume_back("_recv"))
      if (auto it = sendStarts.find((name + "_send").str());
          it != sendStarts.end())
        sent = &it->second;
    auto notBefore = [&](Operation *step) -> double {
      if (auto gather = findStep<GatherOp>(step); gather && prefillStep)
        return planning::prefillReadySeconds(cost, plan.getTokens().getEnd(),
                                             *prefillStep, layers,
                                             boxOf(gather.getResult()));
      if (auto recv = findStep<RecvOp>(step); recv && sent) {
        auto it = sent->find(keyOf(boxOf(recv.getResult())));
        return it == sent->end() ? 0 : it->second;
      }
      return 0;
    };

    for (Operation *step : steps) {
      std::string name = resourceName(step);
      auto [it, inserted] = resources.try_emplace(name, 0);
      if (inserted) {
        int lanes = 1;
        if (const kvc::TierDesc *tier =
                cost.target().findTier(getStepTier(step).str()))
          lanes = int(tier->lanes);
        it->second = graph.addResource(name, lanes);
      }
      StepCost c = getStepCost(step, cost);
      planning::SimJob job{it->second, c.seconds, c.priority};
      job.notBefore = notBefore(step);
      std::vector<int> deps;
      int holder = -1;
      for (Value operand : stepInputs(step)) {
        if (Operation *def = operand.getDefiningOp())
          if (auto found = jobOf.find(def); found != jobOf.end() &&
                                            !llvm::is_contained(deps, found->second))
            deps.push_back(found->second);
        if (auto staged = stagedBy.find(operand); staged != stagedBy.end())
          holder = staged->second;
      }
      if (auto fetch = findStep<FetchOp>(step)) {
        ChunkType chunk = fetch.getResult().getType();
        kvc::Form form = toVocabulary(chunk.getForm());
        kvc::CodecSpec codec = getCodecSpec(chunk.getCodec());
        planning::Box box = getBox(chunk);
        double stored =
            cost.storedBytes(form, codec, box.tokens(), box.layers());
        job.stagingBytes =
            int64_t(planning::stagingBytes(cost, form, codec, box));
        fetch->setAttr(KVCDialect::kBytesAttrName,
                       OpBuilder(fetch).getI64IntegerAttr(
                           int64_t(std::llround(stored))));
      }
      int index = graph.addJob(job, deps);
      jobOf[step] = index;
      if (job.stagingBytes > 0)
        holder = index;
      if (holder >= 0) {
        if (freesStaging(step))
          graph.job(holder).releasedBy = index;
        else
          for (Value result : step->getResults())
            stagedBy[result] = holder;
      }
    }

    planning::SimResult sim =
        planning::simulate(graph, context.options.stagingBytes(),
                           cost.target().host.handoffUs * 1e-6);
    if (failed(checkRepresentable(plan, sim.makespan)))
      return std::nullopt;
    std::map<BoxKey, double> &starts = sendStarts[plan.getSymName()];
    starts.clear();
    for (Operation *step : steps) {
      int j = jobOf[step];
      // The object starts on the link its wire time before the send (or
      // the task holding it) ends.
      if (auto send = findStep<SendOp>(step))
        starts[keyOf(boxOf(send.getInput()))] =
            sim.finish[j] - getStepCost(send, cost).seconds;
      step->setAttr(KVCDialect::kTimeAttrName,
                    DenseI64ArrayAttr::get(
                        plan.getContext(),
                        {int64_t(std::llround(sim.start[j] * 1e9)),
                         int64_t(std::llround(sim.finish[j] * 1e9))}));
    }
    return sim.makespan;
  }
};

} // namespace

std::unique_ptr<Pass> kvc::compiler::createKVCEstimatePass(
    const KVCEstimatePassOptions &options,
    std::shared_ptr<const PlanningContext> given) {
  return createPlanningPass<KVCEstimatePass>(options, std::move(given));
}
