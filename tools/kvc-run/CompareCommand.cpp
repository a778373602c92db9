//===- CompareCommand.cpp - kvc-run compare: every plan, measured ---------===//
//
// Restores one request with every plan of a bundle (or compiled in-process),
// each the fastest of its repeats, verifies each against a full prefill and
// tables predicted beside measured.
//
//===----------------------------------------------------------------------===//

#include "Commands.h"
#include "kvc/Host/ConnectorSpec.h"
#include "kvc/Host/Session.h"
#include "kvc/Host/Tools/Calibrate.h"
#include "kvc/Host/Tools/Generate.h"
#include "kvc/Host/Tools/Measure.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Exec/DynamicCake.h"
#include "kvc/Runtime/Model/Llama2c.h"
#include "kvc/Runtime/Model/Tokenizer.h"
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace kvc::run {

using namespace kvc::host;

namespace {

/// `seconds` in milliseconds.
std::vector<double> milliseconds(const std::vector<double> &seconds) {
  std::vector<double> ms;
  for (double s : seconds)
    ms.push_back(s * 1e3);
  return ms;
}

/// Where compare writes the trace of `plan`'s run `round`.
std::string runTracePath(const std::string &prefix, const std::string &plan,
                         int64_t round) {
  return prefix + "-" + plan + "-run" + std::to_string(round) + ".json";
}

/// Keeps the trace of the fastest of `runs` as PREFIX-PLAN.json and removes
/// the others.
Status keepFastestTrace(const std::string &prefix, const std::string &plan,
                        const std::vector<PlanRun> &runs) {
  std::size_t fastest = 0;
  for (std::size_t r = 1; r < runs.size(); ++r)
    if (runs[r].metrics.makespanSeconds < runs[fastest].metrics.makespanSeconds)
      fastest = r;
  std::error_code error;
  std::string kept = prefix + "-" + plan + ".json";
  std::filesystem::rename(runTracePath(prefix, plan, int64_t(fastest)), kept,
                          error);
  if (error)
    return internalError(
        kept + ": cannot keep the fastest run's trace: " + error.message());
  for (std::size_t r = 0; r < runs.size(); ++r)
    if (r != fastest)
      std::filesystem::remove(runTracePath(prefix, plan, int64_t(r)), error);
  std::printf("trace of %s's fastest run: %s\n", plan.c_str(), kept.c_str());
  return Status::ok();
}

} // namespace

/// Restores the request with every plan of a bundle, verifies each, and
/// prints one table: predicted and measured time, bytes read, FLOPs,
/// fallbacks, error, and the measured speedup over every other plan.
Status compareCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(setup, loadRestoreSetup(args, "all"));
  KVC_ASSIGN_OR_RETURN(repeat, args.integer("repeat", 1));
  if (repeat <= 0)
    return invalidArgument("--repeat must be positive");
  const std::string tracePrefix = args.get("trace");
  const std::string jsonPath = args.get("json");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  const std::vector<BundlePlan> &plans = setup.bundle->plans;
  // A plan with the schedule of an earlier one is measured once and shown
  // for both (sameSchedules).
  const std::vector<std::size_t> sameAs = sameSchedules(plans);
  // One restore first, unmeasured: the first restore of a process pays for
  // thread pools, allocator growth and first-touch page faults (30-40% more
  // than later ones on the 2-core VM of docs/results.md), which would
  // otherwise land on one plan.
  if (!plans.empty())
    KVC_RETURN_IF_ERROR(runPlan(setup.request,
                                {setup.bundle, plans.front().name}, {},
                                /*verify=*/false)
                            .status());
  // Each plan `repeat` times, round robin so that a noisy stretch of the
  // machine does not land on one plan. With a target, calibration's
  // reference chunk is timed before each round too: predictions hold while
  // the machine runs at the speed it was calibrated at, and these timings
  // say whether it did.
  std::vector<std::vector<PlanRun>> all(plans.size());
  std::vector<double> probes;
  std::optional<Progress> progress(std::in_place);
  double price = 0;
  int64_t probeTokens = 0;
  for (int64_t r = 0; r < repeat; ++r) {
    if (setup.target) {
      KVC_ASSIGN_OR_RETURN(
          probe, measureReferenceChunk(backend(), *setup.model, *setup.target));
      probes.push_back(probe.measuredSeconds);
      price = probe.predictedSeconds;
      probeTokens = probe.tokens;
    }
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (sameAs[i] != i)
        continue;
      progress->show("compare: round " + std::to_string(r + 1) + " of " +
                     std::to_string(repeat) + ", plan " + plans[i].name);
      // Every run is verified (after its timing): a run that goes wrong
      // once in a while fails the comparison too. Each traced run writes
      // its own file; the fastest keeps it.
      LoadOptions options;
      if (!tracePrefix.empty())
        options.tracePath = runTracePath(tracePrefix, plans[i].name, r);
      KVC_ASSIGN_OR_RETURN(run,
                           runPlan(setup.request, {setup.bundle, plans[i].name},
                                   options, /*verify=*/true));
      all[i].push_back(std::move(run));
    }
  }
  progress.reset(); // Erased before the table.
  if (!probes.empty()) {
    double typical = median(probes);
    std::printf("machine: a %lld-token chunk from position 0 took %.2f ms",
                (long long)probeTokens, typical * 1e3);
    if (probes.size() > 1)
      std::printf(" at the median of %zu rounds (%.2f to %.2f)", probes.size(),
                  *std::min_element(probes.begin(), probes.end()) * 1e3,
                  *std::max_element(probes.begin(), probes.end()) * 1e3);
    std::printf(", %s prices it at %.2f ms (%+.0f%%)\n",
                setup.target->name.c_str(), price * 1e3,
                (typical / price - 1) * 100);
    // Not even the fastest timing reached the calibrated speed: the
    // machine was slower throughout, and `off` measures that, not the model.
    double quickest = *std::min_element(probes.begin(), probes.end());
    if (quickest > 1.1 * price)
      std::printf("(the machine never ran at the speed %s prices: its "
                  "fastest timing was %+.0f%% over the price, so off "
                  "measures the machine, not the cost model; %s)\n",
                  setup.target->name.c_str(), (quickest / price - 1) * 100,
                  setup.target->calibrated
                      ? "it ran slower than when it was calibrated (a "
                        "loaded machine?)"
                      : "calibrate first");
  }
  // The fastest run is held against the prediction, the median shown
  // beside it (summarize says why).
  std::vector<PlanRun> runs;
  std::vector<PlanSummary> summaries; // Their fastest runs moved to `runs`.
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (sameAs[i] != i) {
      runs.push_back(runs[sameAs[i]]);
      summaries.push_back(summaries[sameAs[i]]);
      continue;
    }
    if (!tracePrefix.empty())
      KVC_RETURN_IF_ERROR(keepFastestTrace(tracePrefix, plans[i].name, all[i]));
    // The table shows (and verification holds) the worst error of them all.
    PlanSummary summary = summarize(std::move(all[i]));
    runs.push_back(std::move(summary.fastest));
    runs.back().error = summary.worstError;
    summaries.push_back(std::move(summary));
  }
  std::printf("%-10s %12s %10s %6s %10s %10s %9s %6s %10s %9s", "plan",
              "predicted ms", "fastest ms", "off", "median ms", "read MB",
              "GFLOP", "fallbk", "max error", "L2 error");
  for (const BundlePlan &base : plans)
    std::printf(" %10s", ("vs " + base.name).substr(0, 10).c_str());
  std::printf("\n");
  Status worst;
  nlohmann::json table = nlohmann::json::array();
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const RestoreMetrics &m = runs[i].metrics;
    int64_t bytes = 0;
    for (const auto &[tier, b] : m.bytesRead)
      bytes += b;
    char predicted[32] = "-", off[32] = "-";
    if (m.predictedSeconds) {
      std::snprintf(predicted, sizeof(predicted), "%.3f",
                    *m.predictedSeconds * 1e3);
      std::snprintf(off, sizeof(off), "%+.0f%%",
                    (m.makespanSeconds / *m.predictedSeconds - 1) * 100);
    }
    std::printf("%-10s %12s %10.3f %6s %10.3f %10.3f %9.3f %6zu %10.3g %9.3g",
                plans[i].name.c_str(), predicted, m.makespanSeconds * 1e3, off,
                summaries[i].medianSeconds() * 1e3, double(bytes) * 1e-6,
                m.flops * 1e-9, m.fallbacks.size(), runs[i].error->max,
                runs[i].error->relativeL2);
    for (const PlanRun &base : runs)
      std::printf(" %9.2fx", base.metrics.makespanSeconds / m.makespanSeconds);
    std::printf("\n");
    nlohmann::json row = {{"plan", plans[i].name},
                          {"fastest_ms", m.makespanSeconds * 1e3},
                          {"median_ms", summaries[i].medianSeconds() * 1e3},
                          {"runs_ms", milliseconds(summaries[i].runSeconds)},
                          {"read_mb", double(bytes) * 1e-6},
                          {"host_traffic", hostTrafficJson(m)},
                          {"gflop", m.flops * 1e-9},
                          {"fallbacks", m.fallbacks.size()},
                          {"max_error", runs[i].error->max},
                          {"relative_l2", runs[i].error->relativeL2}};
    if (m.predictedSeconds)
      row["predicted_ms"] = *m.predictedSeconds * 1e3;
    if (sameAs[i] != i)
      row["same_schedule_as"] = plans[sameAs[i]].name;
    table.push_back(std::move(row));
    if (worst.isOk())
      worst =
          checkVerification(*runs[i].error, planBound(plans[i], runs[i].metrics,
                                                      setup.maxError))
              .withContext("plan " + plans[i].name);
  }
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (sameAs[i] != i)
      std::printf("(%s is the same schedule as %s: measured once, shown for "
                  "both)\n",
                  plans[i].name.c_str(), plans[sameAs[i]].name.c_str());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const RestoreMetrics &m = runs[i].metrics;
    if (sameAs[i] != i || (!m.kernelChunks && m.kernelsNotLaunched.empty()))
      continue;
    std::printf("%s:\n", plans[i].name.c_str());
    printKernels(m);
  }
  if (repeat > 1)
    std::printf("(of %lld runs each: off and the speedups compare the "
                "fastest runs; every run was verified, the errors are the "
                "worst)\n",
                (long long)repeat);
  std::printf("verify: every plan within what its codecs allow of a full "
              "prefill: %s\n",
              worst.isOk() ? "ok" : "FAILED");
  if (!jsonPath.empty()) {
    std::ofstream json(jsonPath);
    json << nlohmann::json{{"plans", table},
                           {"repeat", repeat},
                           {"verified", worst.isOk()}}
                .dump(1)
         << "\n";
    if (!json)
      return unavailable(jsonPath + ": cannot write the comparison");
  }
  return worst;
}

} // namespace kvc::run
