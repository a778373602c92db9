//===- Measure.cpp - Restores measured and verified -----------------------===//

#include "kvc/Host/Tools/Measure.h"

#include "kvc/Runtime/Base/Memory.h"
#include "kvc/Host/Session.h"

#include <algorithm>

namespace kvc::host {

StatusOr<PlanRun> runPlan(MeasuredRequest &request, const BundlePlan &plan,
                          const RestoreOptions &options, bool verify,
                          int64_t keepRoom) {
  Device &device = deviceOr(request.device);
  std::vector<std::string> tiers;
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch)
        tiers.push_back(step.tier);
  const int64_t n = int64_t(request.tokens.size());
  KVC_ASSIGN_OR_RETURN(
      into, destinationFor(
                device, *request.model, request.tokens, request.store, tiers,
                std::max({keepRoom, request.forwardTokens, int64_t(0)})));
  KVC_ASSIGN_OR_RETURN(pools, device.createPools(planResources(plan)));
  PlanRun run;
  run.cacheBytes = into->cache->bytes();
  run.residentBefore = residentBytes();
  resetPeakResident();
  if (request.forwardTokens > 0) {
    if (n == 0)
      return invalidArgument("a forward pass after an empty request");
    std::vector<int32_t> next(size_t(request.forwardTokens));
    for (size_t i = 0; i < next.size(); ++i)
      next[i] = request.tokens[i % size_t(n)];
    std::vector<float> logits(size_t(request.model->config().vocabSize));
    Clock::time_point start = Clock::now();
    KVC_ASSIGN_OR_RETURN(restoring,
                         RestoreHandle::start(*pools, plan, into->target, options));
    Status forward =
        device.createRunner(*request.model)
            ->decode(*into->cache, into->table, n, next.data(),
                     request.forwardTokens, logits.data(), [&](int64_t layer) {
                       return restoring->waitLayer(layer);
                     });
    run.firstTokenSeconds = secondsSince(start);
    KVC_ASSIGN_OR_RETURN(metrics, restoring->wait());
    KVC_RETURN_IF_ERROR(forward);
    run.metrics = std::move(metrics);
  } else {
    KVC_ASSIGN_OR_RETURN(metrics, restore(*pools, plan, into->target, options));
    run.metrics = std::move(metrics);
  }
  run.residentPeak = peakResidentBytes();
  if (verify) {
    if (!request.reference) {
      KVC_ASSIGN_OR_RETURN(
          reference,
          fullPrefill(*device.createRunner(*request.model), request.tokens));
      request.reference = std::move(reference);
    }
    KVC_ASSIGN_OR_RETURN(error,
                         restoreError(*request.model, *request.reference, n,
                                      *into->cache, into->table, device));
    run.error = error;
  }
  if (keepRoom >= 0)
    run.destination = std::move(into);
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
  for (const PlanRun &run : runs)
    if (run.error) {
      summary.worstError.max = std::max(summary.worstError.max, run.error->max);
      summary.worstError.relativeL2 =
          std::max(summary.worstError.relativeL2, run.error->relativeL2);
    }
  summary.medianSeconds = runs[runs.size() / 2].metrics.makespanSeconds;
  summary.fastest = std::move(runs.front());
  return summary;
}

} // namespace kvc::host
