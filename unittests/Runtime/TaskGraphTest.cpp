//===- TaskGraphTest.cpp - Task graphs on shared resource pools -----------===//

#include "kvc/Runtime/Device/TaskGraph.h"

#include "TestModel.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>

using namespace kvc;

namespace {

std::unique_ptr<ResourcePools> makePools() {
  auto pools = ResourcePools::create({{"io", 2}, {"decode", 1}, {"compute", 1}});
  EXPECT_TRUE(pools) << pools.status().toString();
  return std::move(pools).value();
}

/// A chain per chunk: fetch (io) -> decode -> scatter (compute), each task
/// appending its id to a log under a lock.
TaskGraph chunkPipelines(int chunks, std::vector<int64_t> &log,
                         std::mutex &m) {
  TaskGraph graph;
  for (int c = 0; c < chunks; ++c) {
    int64_t prev = -1;
    for (const char *resource : {"io", "decode", "compute"}) {
      int64_t id = int64_t(graph.tasks.size());
      GraphTask task{std::string(resource) + " " + std::to_string(c), resource,
                     {}, [id, &log, &m](int) {
                       std::lock_guard<std::mutex> lock(m);
                       log.push_back(id);
                       return Status::ok();
                     }};
      if (prev >= 0)
        task.after = {prev};
      prev = graph.add(std::move(task));
    }
  }
  return graph;
}

TEST(TaskGraphTest, RunsEveryTaskAfterItsDependencies) {
  auto pools = makePools();
  std::vector<int64_t> log;
  std::mutex m;
  TaskGraph graph = chunkPipelines(16, log, m);
  RunResult result = runGraph(*pools, graph);
  ASSERT_TRUE(result.status.isOk()) << result.status.toString();
  ASSERT_EQ(log.size(), graph.tasks.size());
  std::vector<int64_t> position(log.size());
  for (std::size_t i = 0; i < log.size(); ++i)
    position[log[i]] = int64_t(i);
  for (std::size_t i = 0; i < graph.tasks.size(); ++i) {
    ASSERT_TRUE(result.timings[i].ran);
    for (int64_t dep : graph.tasks[i].after) {
      EXPECT_LT(position[dep], position[i]);
      EXPECT_LE(result.timings[dep].end, result.timings[i].start);
    }
  }
  EXPECT_EQ(result.busy.size(), 3u);
  EXPECT_GT(result.makespan, 0);
}

TEST(TaskGraphTest, RunsIndependentTasksOnAResourcesLanesAtOnce) {
  auto pools = makePools();
  // Two io tasks that can finish only if both run at the same time (the io
  // pool has two workers); each gives up after 10 s rather than hang.
  std::atomic<int> arrived{0};
  auto meet = [&](int) {
    ++arrived;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2)
      if (std::chrono::steady_clock::now() > deadline)
        return internalError("the other lane never ran");
    return Status::ok();
  };
  TaskGraph graph;
  graph.add({"a", "io", {}, meet});
  graph.add({"b", "io", {}, meet});
  RunResult result = runGraph(*pools, graph);
  EXPECT_TRUE(result.status.isOk()) << result.status.toString();
  EXPECT_NE(result.timings[0].worker, result.timings[1].worker);
}

TEST(TaskGraphTest, StopsAtTheFirstFailure) {
  auto pools = makePools();
  std::atomic<int> ran{0};
  TaskGraph graph;
  int64_t bad = graph.add(
      {"fetch 0", "io", {}, [](int) { return dataLoss("bad chunk"); }});
  graph.add({"decode 0", "decode", {bad}, [&](int) {
               ++ran;
               return Status::ok();
             }});
  RunResult result = runGraph(*pools, graph);
  EXPECT_EQ(result.status.code(), StatusCode::DataLoss);
  EXPECT_EQ(result.status.message(), "fetch 0: bad chunk");
  EXPECT_EQ(ran.load(), 0);
  EXPECT_FALSE(result.timings[1].ran);
}

TEST(TaskGraphTest, RejectsBadGraphsBeforeRunningAnything) {
  auto pools = makePools();
  std::atomic<int> ran{0};
  auto count = [&](int) {
    ++ran;
    return Status::ok();
  };
  TaskGraph cycle;
  cycle.add({"a", "io", {1}, count});
  cycle.add({"b", "io", {0}, count});
  EXPECT_EQ(runGraph(*pools, cycle).status.message(),
            "the task graph has a cycle through task 0");
  TaskGraph unknown;
  unknown.add({"a", "gpu", {}, count});
  EXPECT_EQ(runGraph(*pools, unknown).status.message(),
            "task 0 (a): no workers for resource \"gpu\"");
  TaskGraph dangling;
  dangling.add({"a", "io", {3}, count});
  EXPECT_EQ(runGraph(*pools, dangling).status.message(),
            "task 0 (a): bad dependency 3");
  EXPECT_EQ(ran.load(), 0);
  EXPECT_FALSE(ResourcePools::create({{"io", 0}}));
}

/// A gate task on io, then `n` tasks on compute that wait for it and run
/// in batches of key "k", each batch's tasks logged as one entry.
TaskGraph gatedBatches(int n, std::vector<std::vector<int64_t>> &batches,
                       std::mutex &m) {
  TaskGraph graph;
  int64_t gate =
      graph.add({"gate", "io", {}, [](int) { return Status::ok(); }});
  for (int i = 0; i < n; ++i)
    graph.add({"chunk " + std::to_string(i), "compute", {gate}, nullptr}, "k");
  graph.batches["k"] = [&](int, const std::vector<int64_t> &tasks) {
    std::lock_guard<std::mutex> lock(m);
    batches.push_back(tasks);
    return Status::ok();
  };
  return graph;
}

TEST(TaskGraphTest, TasksReleasedTogetherRunAsOneBatch) {
  auto pools = makePools();
  std::vector<std::vector<int64_t>> batches;
  std::mutex m;
  TaskGraph graph = gatedBatches(5, batches, m);
  RunResult result = runGraph(*pools, graph);
  ASSERT_TRUE(result.status.isOk()) << result.status.toString();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0], (std::vector<int64_t>{1, 2, 3, 4, 5}));
  for (int64_t task = 1; task <= 5; ++task) {
    EXPECT_TRUE(result.timings[task].ran);
    EXPECT_EQ(result.timings[task].start, result.timings[1].start);
    EXPECT_GE(result.timings[task].start, result.timings[0].end);
  }
  // Counted once in the resource's busy time.
  EXPECT_EQ(result.busy["compute"],
            result.timings[1].end - result.timings[1].start);

  // At most maxBatch per call, every task once.
  batches.clear();
  graph.maxBatch = 2;
  result = runGraph(*pools, graph);
  ASSERT_TRUE(result.status.isOk()) << result.status.toString();
  std::vector<int64_t> all;
  for (const std::vector<int64_t> &batch : batches) {
    EXPECT_LE(batch.size(), 2u);
    all.insert(all.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(batches.size(), 3u);
  EXPECT_EQ(all, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(TaskGraphTest, ATaskThatFindsItsResourceIdleRunsAlone) {
  auto pools = makePools();
  // A chain: each batchable task is released by the one before it.
  std::vector<std::vector<int64_t>> batches;
  std::mutex m;
  TaskGraph graph;
  for (int64_t i = 0; i < 3; ++i)
    graph.add({"chunk", "compute",
               i ? std::vector<int64_t>{i - 1} : std::vector<int64_t>{},
               nullptr},
              "k");
  graph.batches["k"] = [&](int, const std::vector<int64_t> &tasks) {
    std::lock_guard<std::mutex> lock(m);
    batches.push_back(tasks);
    return Status::ok();
  };
  ASSERT_TRUE(runGraph(*pools, graph).status.isOk());
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{0}, {1}, {2}}));
}

TEST(TaskGraphTest, AFailingBatchFailsTheRun) {
  auto pools = makePools();
  std::vector<std::vector<int64_t>> batches;
  std::mutex m;
  TaskGraph graph = gatedBatches(3, batches, m);
  std::atomic<int> after{0};
  graph.batches["k"] = [](int, const std::vector<int64_t> &) {
    return internalError("launch failed");
  };
  graph.add({"after", "io", {3}, [&](int) {
               ++after;
               return Status::ok();
             }});
  RunResult result = runGraph(*pools, graph);
  EXPECT_EQ(result.status.message(), "chunk 0: launch failed");
  EXPECT_EQ(after.load(), 0);
  EXPECT_FALSE(result.timings[4].ran);
}

TEST(TaskGraphTest, RejectsBatchesWithoutAFunctionOrAcrossResources) {
  auto pools = makePools();
  std::vector<std::vector<int64_t>> batches;
  std::mutex m;
  TaskGraph graph = gatedBatches(2, batches, m);
  graph.tasks[2].resource = "decode";
  EXPECT_EQ(runGraph(*pools, graph).status.message(),
            "task 2 (chunk 1): batch \"k\" spans resources \"compute\" and "
            "\"decode\"");
  graph = gatedBatches(2, batches, m);
  graph.batches.clear();
  EXPECT_EQ(runGraph(*pools, graph).status.message(),
            "task 1 (chunk 0): no function for batch \"k\"");
  graph = gatedBatches(2, batches, m);
  graph.maxBatch = 0;
  EXPECT_EQ(runGraph(*pools, graph).status.message(),
            "a batch of at most 0 tasks");
  EXPECT_TRUE(batches.empty());
}

// A hand-off as calibration measures it: a time, not a failure, on two
// resources of the pools; a chain of fewer than two tasks or a missing
// resource is an error.
TEST(TaskGraphTest, MeasuresAHandoffBetweenTwoResources) {
  auto pools = makePools();
  StatusOr<double> seconds =
      measureHandoff(*pools, "decode", "compute", 50e-6, /*tasks=*/8);
  ASSERT_TRUE(seconds.isOk()) << seconds.status().toString();
  EXPECT_GT(*seconds, 0);   // Another thread's wake-up takes time.
  EXPECT_LT(*seconds, 0.1); // A wake-up, not a stall.
  // The tasks' own work is not the hand-off's: with 10 ms of it a task the
  // hand-off stays a wake-up (microseconds; a millisecond or two on a
  // loaded machine), where counting the work would make it 12 ms or more.
  StatusOr<double> afterWork =
      measureHandoff(*pools, "decode", "compute", 10e-3, /*tasks=*/6);
  ASSERT_TRUE(afterWork.isOk()) << afterWork.status().toString();
  EXPECT_GT(*afterWork, 0);
  EXPECT_LT(*afterWork, 5e-3);
  EXPECT_EQ(measureHandoff(*pools, "decode", "compute", 0, 1).status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(measureHandoff(*pools, "decode", "gpu", 0, 4).status().message(),
            "task 1 (handoff): no workers for resource \"gpu\"");
}

TEST(TaskGraphTest, ConcurrentRunsShareThePools) {
  auto pools = makePools();
  constexpr int kRuns = 8;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> logs(kRuns);
  std::vector<std::mutex> locks(kRuns);
  std::vector<char> ok(kRuns, 0); // Not vector<bool>: threads write it.
  for (int r = 0; r < kRuns; ++r)
    threads.emplace_back([&, r] {
      TaskGraph graph = chunkPipelines(32, logs[r], locks[r]);
      RunResult result = runGraph(*pools, graph);
      ok[r] = result.status.isOk() && logs[r].size() == graph.tasks.size();
    });
  for (std::thread &t : threads)
    t.join();
  for (int r = 0; r < kRuns; ++r)
    EXPECT_TRUE(ok[r]) << "run " << r;
}

TEST(TaskGraphTest, WritesAChromeTraceWithALanePerWorker) {
  auto pools = makePools();
  std::vector<int64_t> log;
  std::mutex m;
  TaskGraph graph = chunkPipelines(4, log, m);
  RunResult result = runGraph(*pools, graph);
  ASSERT_TRUE(result.status.isOk());
  // Per process: ctest runs this suite in several processes at once.
  std::string path = kvc::test::tempPath("trace");
  ASSERT_TRUE(writeChromeTrace(graph, result, path).isOk());
  std::ifstream in(path);
  nlohmann::json trace = nlohmann::json::parse(in);
  int complete = 0;
  std::set<std::string> lanes;
  for (const auto &event : trace) {
    if (event["ph"] == "X") {
      ++complete;
      EXPECT_GE(event["dur"].get<double>(), 0);
    } else if (event["name"] == "thread_name") {
      lanes.insert(event["args"]["name"].get<std::string>());
    }
  }
  EXPECT_EQ(complete, 12);
  EXPECT_TRUE(lanes.count("decode/0"));
  EXPECT_TRUE(lanes.count("compute/0"));
  EXPECT_FALSE(writeChromeTrace(graph, result, "/nonexistent/t.json").isOk());
}

} // namespace
