//===- PlanRestore.cpp - kvc-choose-merge-point, -partition-layers, -plan -===//
//
// The three restore planners share everything but the strategy: each turns
// every kvc.restore of the module into a kvc.plan of the same name, chosen by
// the planning library for the module's model and target.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Support/Format.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

#include <cmath>
#include "llvm/Support/Format.h"

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCCHOOSEMERGEPOINTPASS
#define GEN_PASS_DEF_KVCPARTITIONLAYERSPASS
#define GEN_PASS_DEF_KVCPLANPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;
namespace planning = ::kvc::planning;

namespace {

/// "12.3 ms".
std::string ms(double seconds) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%.3f ms", seconds * 1e3);
  return text;
}

/// What a plan chose, segment by segment: "compute tokens 0-512 layers
/// 0-32; load kv tokens 512-4096 layers 0-32 (dram, int8/g32+deflate)".
std::string describePlan(const planning::Plan &plan,
                         const planning::Request &request) {
  std::string text;
  llvm::raw_string_ostream os(text);
  for (const planning::Segment &segment : plan.segments) {
    if (!text.empty())
      os << "; ";
    os << (segment.method == planning::Method::Compute  ? "compute"
           : segment.method == planning::Method::LoadKV ? "load kv"
                                                        : "load hidden")
       << " tokens " << segment.box.t0 << "-" << segment.box.t1 << " layers "
       << segment.box.l0 << "-" << segment.box.l1;
    if (segment.method != planning::Method::Compute && segment.source >= 0) {
      const planning::Source &source = request.sources[segment.source];
      os << " (" << source.tier << ", " << source.codec.str() << ")";
    }
  }
  return text;
}

/// The report of kvc-plan{report}: one line per baseline and for the chosen
/// plan, with when layer 0 is complete (and, for a request with a forward
/// pass, when its first token is), busy time per resource, bytes, FLOPs and
/// its time over the chosen plan's; then what each chose.
std::string formatReport(const planning::Planner &planner,
                         const planning::Request &request,
                         const std::vector<planning::Evaluation> &rows) {
  std::vector<std::string> resources;
  for (const planning::Evaluation &e : rows)
    for (const std::string &r : e.resources)
      if (llvm::find(resources, r) == resources.end())
        resources.push_back(r);
  std::string text;
  llvm::raw_string_ostream os(text);
  const planning::Evaluation &chosen = rows.back();
  const bool forward = request.forwardTokens > 0;
  const char *strategy = "strategy", *makespan = "makespan";
  const char *layer0 = "layer 0", *firstToken = "first token";
  const char *read = "read GB", *tflop = "TFLOP", *ratio = "time/chosen";
  os << llvm::format("%-9s %14s %14s", strategy, makespan, layer0);
  if (forward)
    os << llvm::format(" %14s", firstToken);
  for (const std::string &r : resources)
    os << llvm::format(" %14s", r.c_str());
  os << llvm::format(" %10s %10s %11s\n", read, tflop, ratio);
  for (const planning::Evaluation &e : rows) {
    os << llvm::format(
        "%-9s %14s %14s", e.plan.strategy.c_str(), ms(e.seconds).c_str(),
        ms(e.layerReadySeconds.empty() ? e.seconds
                                       : e.layerReadySeconds.front())
            .c_str());
    if (forward)
      os << llvm::format(" %14s", ms(e.firstTokenSeconds).c_str());
    for (const std::string &r : resources) {
      double busy = 0;
      for (size_t i = 0; i < e.resources.size(); ++i)
        if (e.resources[i] == r)
          busy = e.busy[i];
      os << llvm::format(" %14s", ms(busy).c_str());
    }
    os << llvm::format(" %10.3f %10.3f %10.2fx\n", e.bytesRead / 1e9,
                       e.flops / 1e12,
                       e.firstTokenSeconds / chosen.firstTokenSeconds);
  }
  if (forward)
    os << "(layer 0: when it holds every token; first token: when the "
          "server's forward pass over "
       << request.forwardTokens
       << " tokens ends beside the restore, its layers on the compute "
          "counted in its busy time; time/chosen: each plan's first token "
          "over the chosen "
       << chosen.plan.strategy << " plan's)\n";
  else
    os << "(layer 0: when it holds every token; time/chosen: each plan's "
          "makespan over the chosen "
       << chosen.plan.strategy << " plan's)\n";
  for (const planning::Evaluation &e : rows)
    os << llvm::format("%-9s ", e.plan.strategy.c_str())
       << describePlan(e.plan, request) << "\n";
  os << "chunks of " << planner.chunkTokens() << " tokens, loads in groups of "
     << planner.layerGroup() << " layers"
     << (planner.options().layerWise ? ", issued layer by layer" : "");
  return text;
}

/// Shared body: plan every kvc.restore with `DerivedT::choose`.
template <typename DerivedT, template <typename> class GeneratedBaseT>
struct PlanRestorePass : public PlanningPass<DerivedT, GeneratedBaseT> {
  using PlanningPass<DerivedT, GeneratedBaseT>::PlanningPass;

  void runOnOperation() override {
    ModuleOp module = this->getOperation();
    SmallVector<RestoreOp> restores(module.getOps<RestoreOp>());
    if (restores.empty())
      return;
    FailureOr<PlanningContext> context =
        getPlanningContext(module, this->getArgument(), this->costModelFlags());
    if (failed(context))
      return this->signalPassFailure();

    for (RestoreOp restore : restores) {
      planning::Request request = getRequest(restore);
      planning::Planner planner(*context->cost, request, context->options);
      if (::kvc::Status status = planner.validate(); !status.isOk()) {
        restore.emitOpError() << status.message();
        return this->signalPassFailure();
      }
      std::optional<planning::Evaluation> best =
          static_cast<DerivedT *>(this)->choose(planner, restore);
      if (!best)
        return this->signalPassFailure();
      const planning::Evaluation &chosen = *best;
      if (chosen.seconds > request.sloSeconds) {
        InFlightDiagnostic diag = this->allowSloMiss
                                      ? mlir::emitWarning(restore.getLoc())
                                      : restore.emitOpError();
        diag << "the best " << chosen.plan.strategy << " plan takes "
             << ms(chosen.seconds) << ", more than slo_ms = "
             << ::kvc::formatNumber(request.sloSeconds * 1e3);
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
  void emitReport(const planning::Planner &, const planning::Evaluation &,
              PlanOp) {}
};

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

struct KVCPartitionLayersPass
    : public PlanRestorePass<KVCPartitionLayersPass,
                             mlir::kvc::impl::KVCPartitionLayersPassBase> {
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

struct KVCPlanPass
    : public PlanRestorePass<KVCPlanPass, mlir::kvc::impl::KVCPlanPassBase> {
  using PlanRestorePass::PlanRestorePass;

  /// The joint plan, or the baseline `strategy` names; fails (with a
  /// diagnostic) when the request stores nothing that baseline loads.
  std::optional<planning::Evaluation> choose(const planning::Planner &planner,
                                             RestoreOp restore) {
    StringRef name = strategy;
    std::optional<planning::Strategy> strategy = planning::parseStrategy(name);
    if (!strategy) {
      restore.emitOpError() << "cannot be planned with strategy \"" << name
                            << "\" (expected joint, compute, kv, hidden, "
                               "cake or hcache)";
      return std::nullopt;
    }
    std::optional<planning::Evaluation> planned = planner.plan(*strategy);
    if (!planned)
      restore.emitOpError()
          << "has no usable "
          << (planning::strategyNeeds(*strategy) == ::kvc::Form::Hidden
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
