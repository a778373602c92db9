//===- ExecutorBench.cpp - Scheduling overhead of task graph runs ---------===//
//
// How much a run adds to its tasks' work (docs/executor.md):
//   Schedule/empty/N      N independent empty tasks on one worker: the
//                         per-task cost of dependency release, queueing and
//                         timing (reported as us_per_task).
//   Schedule/chain/N      the same as a dependency chain: every task is
//                         released by the one before it.
//   Efficiency/W/N        N tasks of 20 us busy work on W workers, chunked
//                         as pipelines of 4; reports overhead_pct =
//                         makespan / (sum of work / W) - 1.
//   Handoff/U             a chain of 64 tasks of U us busy work that
//                         alternates between two resources of one worker
//                         each, as a chunk goes from decode to h2d: every
//                         task wakes the other resource's worker, idle
//                         for U us (measureHandoff, as calibration runs
//                         it). Reports us_per_handoff = (makespan - sum of
//                         work) / 63, the median of the runs: what a plan's
//                         task pays to start after its dependency on
//                         another lane.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Device/TaskGraph.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

using namespace kvc;

namespace {

/// Seconds the run's tasks worked, over every resource.
double busySeconds(const RunResult &result) {
  double busy = 0;
  for (const auto &[resource, seconds] : result.busy)
    busy += seconds;
  return busy;
}

void scheduleBench(benchmark::State &state, bool chain) {
  auto pools = ResourcePools::create({{"compute", 1}});
  const int64_t n = state.range(0);
  TaskGraph graph;
  for (int64_t i = 0; i < n; ++i) {
    GraphTask task{"t", "compute", {}, [](int) { return Status::ok(); }};
    if (chain && i > 0)
      task.after = {i - 1};
    graph.add(std::move(task));
  }
  double seconds = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    RunResult result = runGraph(**pools, graph);
    seconds += std::chrono::duration<double>(
                   std::chrono::steady_clock::now() - start)
                   .count();
    if (!result.status.isOk())
      state.SkipWithError(result.status.message().c_str());
  }
  // Wall time per task: what a run adds to each task it schedules.
  state.counters["us_per_task"] =
      seconds / double(state.iterations()) / double(n) * 1e6;
}

void BM_ScheduleEmpty(benchmark::State &state) { scheduleBench(state, false); }
void BM_ScheduleChain(benchmark::State &state) { scheduleBench(state, true); }

void BM_Efficiency(benchmark::State &state) {
  const int workers = int(state.range(0));
  const int64_t n = state.range(1);
  constexpr double kWork = 20e-6;
  auto pools = ResourcePools::create({{"compute", workers}});
  TaskGraph graph;
  for (int64_t i = 0; i < n; ++i) {
    GraphTask task{"t", "compute", {}, [](int) {
                     spinFor(kWork);
                     return Status::ok();
                   }};
    if (i % 4 != 0)
      task.after = {i - 1}; // Pipelines of four dependent steps.
    graph.add(std::move(task));
  }
  double overhead = 0;
  for (auto _ : state) {
    RunResult result = runGraph(**pools, graph);
    overhead = result.makespan / (busySeconds(result) / workers) - 1;
  }
  state.counters["overhead_pct"] = overhead * 100;
}

void BM_Handoff(benchmark::State &state) {
  auto pools = ResourcePools::create({{"a", 1}, {"b", 1}});
  std::vector<double> perHandoff;
  for (auto _ : state) {
    StatusOr<double> seconds = measureHandoff(
        **pools, "a", "b", double(state.range(0)) * 1e-6, /*tasks=*/64);
    if (!seconds.isOk()) {
      state.SkipWithError(seconds.status().message().c_str());
      return;
    }
    perHandoff.push_back(*seconds);
  }
  std::sort(perHandoff.begin(), perHandoff.end());
  state.counters["us_per_handoff"] = perHandoff[perHandoff.size() / 2] * 1e6;
}

} // namespace

BENCHMARK(BM_ScheduleEmpty)->Arg(4096)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScheduleChain)->Arg(4096)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Efficiency)
    ->Args({1, 4096})
    ->Args({2, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Handoff)
    ->Arg(20)
    ->Arg(200)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
