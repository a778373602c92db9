//===- Measure.h - Restores measured and verified ---------------*- C++ -*-===//
//
// A request restored many times (kvc-run restore and compare, benchmarks)
// through a Connector, as a server's loads run: each run into a fresh paged
// cache registered with it, its memory measured, optionally verified
// against a full prefill computed once, optionally beside the forward pass
// a server runs after it; and the statistics compare reports over several
// runs of several plans.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_TOOLS_MEASURE_H
#define KVC_HOST_TOOLS_MEASURE_H

#include "kvc/Host/Connector.h"
#include "kvc/Runtime/Exec/Executor.h"

#include <memory>
#include <optional>
#include <vector>

namespace kvc::host {

/// A request, the Connector over its stores, and the full prefill
/// verification compares with.
struct MeasuredRequest {
  /// Opened on the request's stores, with the device below.
  Connector *connector = nullptr;
  Device *device = nullptr; ///< The CPU device when null.
  const ModelCompute *model = nullptr;
  std::vector<int32_t> tokens;
  /// A server's forward pass after the restore, run beside it: this many
  /// tokens at positions tokens.size().. (the request's first ones again),
  /// each layer once the restore has written it (Connector::waitLayer); 0:
  /// none.
  int64_t forwardTokens = 0;
  /// A full prefill of the request on the device, computed on the first
  /// verification.
  std::optional<ModelCompute::Cache> reference;
};

struct PlanRun {
  RestoreMetrics metrics;
  std::optional<RestoreError> error; ///< If verified.
  /// Resident memory before the restore (model, request, empty paged cache)
  /// and at its peak; the paged cache's size.
  int64_t residentBefore = 0, residentPeak = 0, cacheBytes = 0;
  /// The restored cache, when the run was asked to keep it: the
  /// connector's registered caches (until it registers others) and the
  /// request's blocks in them.
  PagedKVCache *cache = nullptr;
  BlockTable table;
  /// With a forward pass: when its next-token logits were ready, from the
  /// restore's start.
  std::optional<double> firstTokenSeconds;
};

/// Restores every token of the request with `plan` through the connector
/// (decide with the chosen plan, startLoad, waitLoad) into a fresh paged
/// cache it registers, beside its forward pass when it has one; verifies
/// the cache when asked. InvalidArgument for a plan that does not restore
/// the whole request. With `keepRoom` >= 0 the run keeps its cache, sized
/// for that many tokens more (to decode after the restore).
StatusOr<PlanRun> runPlan(MeasuredRequest &request, const ChosenPlan &plan,
                          const LoadOptions &options, bool verify,
                          int64_t keepRoom = -1);

/// For each plan, the first plan with its schedule (itself when none
/// before has it): a plan with an earlier one's schedule (the joint plan
/// choosing Cake's split) is that plan, measured once, so that run-to-run
/// noise does not rank a plan against itself.
std::vector<std::size_t> sameSchedules(const std::vector<BundlePlan> &plans);

/// Several verified runs of one plan: the fastest (held against the
/// prediction, as calibration takes the fastest of its rounds: a
/// co-tenant's load slows runs for seconds at a time, and the fastest is
/// the one it did not slow), the median beside it, and the worst error of
/// them all, and every run's time (fastest first: the spread).
struct PlanSummary {
  PlanRun fastest;
  RestoreError worstError;
  std::vector<double> runSeconds;

  double medianSeconds() const {
    return runSeconds.empty() ? 0 : runSeconds[runSeconds.size() / 2];
  }
};
PlanSummary summarize(std::vector<PlanRun> runs);

} // namespace kvc::host

#endif // KVC_HOST_TOOLS_MEASURE_H
