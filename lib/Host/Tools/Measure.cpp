//===- Measure.cpp - Restores measured and verified -----------------------===//

#include "kvc/Host/Tools/Measure.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Memory.h"

#include <algorithm>

namespace kvc::host {

StatusOr<PlanRun> runPlan(MeasuredRequest &request, const ChosenPlan &plan,
                          const LoadOptions &options, bool verify,
                          int64_t keepRoom) {
  static const std::string kId = "measured";
  Device &device = deviceOr(request.device);
  Connector &connector = *request.connector;
  const int64_t n = int64_t(request.tokens.size());
  if (request.forwardTokens > 0 && n == 0)
    return invalidArgument("a forward pass after an empty request");
  KVC_ASSIGN_OR_RETURN(
      cached, device.cacheFor(
                  request.model->config(),
                  n + std::max({keepRoom, request.forwardTokens, int64_t(0)})));
  auto [cache, table] = std::move(cached);
  PagedKVCache *into = cache.get();
  PlanRun run;
  run.cacheBytes = into->bytes();
  KVC_RETURN_IF_ERROR(connector.registerCaches(std::move(cache)));
  KVC_ASSIGN_OR_RETURN(decision,
                       connector.decide(kId, request.tokens, 0, plan));
  if (decision.loadTokens != n)
    return invalidArgument("plan " + decision.strategy + " restores " +
                           std::to_string(decision.loadTokens) +
                           " of the request's " + std::to_string(n) +
                           " tokens; a measured run restores them all");
  run.residentBefore = residentBytes();
  resetPeakResident();
  Clock::time_point start = Clock::now();
  KVC_RETURN_IF_ERROR(connector.startLoad(kId, table.blocks, options));
  Status forward;
  if (request.forwardTokens > 0) {
    std::vector<int32_t> next(size_t(request.forwardTokens));
    for (size_t i = 0; i < next.size(); ++i)
      next[i] = request.tokens[i % size_t(n)];
    std::vector<float> logits(size_t(request.model->config().vocabSize));
    forward = device.createRunner(*request.model)
                  ->decode(*into, table, n, next.data(), request.forwardTokens,
                           logits.data(), [&](int64_t layer) {
                             return connector.waitLayer(kId, layer);
                           });
    run.firstTokenSeconds = secondsSince(start);
  }
  StatusOr<RestoreMetrics> metrics = connector.waitLoad(kId);
  (void)connector.cancel(kId); // Ended: forgets it.
  KVC_RETURN_IF_ERROR(metrics.status());
  KVC_RETURN_IF_ERROR(forward);
  run.metrics = std::move(*metrics);
  run.residentPeak = peakResidentBytes();
  if (verify) {
    if (!request.reference) {
      KVC_ASSIGN_OR_RETURN(
          reference,
          fullPrefill(*device.createRunner(*request.model), request.tokens));
      request.reference = std::move(reference);
    }
    KVC_ASSIGN_OR_RETURN(error, restoreError(*request.model, *request.reference,
                                             n, *into, table, device));
    run.error = error;
  }
  if (keepRoom >= 0) {
    run.cache = into;
    run.table = std::move(table);
  }
  return run;
}

std::vector<std::size_t> sameSchedules(const std::vector<BundlePlan> &plans) {
  std::vector<std::size_t> sameAs(plans.size());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    sameAs[i] = i;
    for (std::size_t j = 0; j < i && sameAs[i] == i; ++j)
      if (sameAs[j] == j && plans[i].sameSchedule(plans[j]))
        sameAs[i] = j;
  }
  return sameAs;
}

PlanSummary summarize(std::vector<PlanRun> runs) {
  PlanSummary summary;
  if (runs.empty())
    return summary;
  std::sort(runs.begin(), runs.end(), [](const PlanRun &a, const PlanRun &b) {
    return a.metrics.makespanSeconds < b.metrics.makespanSeconds;
  });
  for (const PlanRun &run : runs) {
    summary.runSeconds.push_back(run.metrics.makespanSeconds);
    if (run.error) {
      summary.worstError.max = std::max(summary.worstError.max, run.error->max);
      summary.worstError.relativeL2 =
          std::max(summary.worstError.relativeL2, run.error->relativeL2);
    }
  }
  summary.fastest = std::move(runs.front());
  return summary;
}

} // namespace kvc::host
