//===- TaskGraph.h - Task graphs on shared resource pools -------*- C++ -*-===//
//
// The executor's engine, independent of what tasks do. A plan becomes a
// TaskGraph: tasks, each on a named resource ("io:ssd", "decode", "h2d",
// "compute"), with the tasks it waits for. ResourcePools owns one pool of
// worker threads per resource — as many workers as the resource has lanes —
// shared by every run in the process, as a server shares its SSD queues and
// decode threads among requests. A run releases a task to its resource's
// queue when the last of its dependencies finishes; workers never wait on
// other tasks, so runs cannot deadlock one another, and a queue serves runs
// in the order their tasks became ready.
//
// Ownership: the pools outlive every run (they are joined on destruction,
// after draining); a run owns its graph and its bookkeeping and blocks its
// caller until every task has finished or been skipped. Errors are values:
// the first failing task's Status is the run's, and once a task has failed
// the run's tasks not yet started are skipped (those running finish). Tasks
// that can recover (a corrupt chunk recomputed) do so inside their function and
// succeed.
//
// Batches: tasks of a graph that share a batch key (chunks a generated
// kernel of one shape decodes) and are waiting for a worker at the same
// time run as one call of the key's BatchFn. Nothing waits to fill a batch:
// a task that finds its resource idle runs alone; those released together
// (by one finishing task) or queued behind a busy worker run together, up
// to TaskGraph::maxBatch per call.
//
// Every run records each task's start and end on a steady clock, giving the
// measured makespan, the busy time of each resource and a Chrome trace
// (chrome://tracing, Perfetto) with one lane per resource worker.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_TASKGRAPH_H
#define KVC_RUNTIME_DEVICE_TASKGRAPH_H

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Status.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvc {

/// One unit of work; `worker` is the index of the worker running it within
/// its resource (0 .. lanes-1), for tasks that keep per-worker scratch.
using TaskFn = std::function<Status(int worker)>;

/// Runs a batch: `tasks`, indices into the graph, in the order they became
/// ready.
using BatchFn =
    std::function<Status(int worker, const std::vector<int64_t> &tasks)>;

struct GraphTask {
  std::string name;     ///< Shown in traces ("fetch 1536:1792").
  std::string resource; ///< A resource of the pools.
  std::vector<int64_t> after;
  TaskFn fn;
};

/// Tasks in any order whose `after` edges form a DAG (a validated plan
/// bundle guarantees it; run() checks it again).
struct TaskGraph {
  std::vector<GraphTask> tasks;
  /// Each task's batch key, a key of `batches`: the task runs in a batch of
  /// that key's tasks (its `fn` unused); empty (or missing): alone.
  std::vector<std::string> batchKeys;
  /// What runs each key's batches; the tasks of a key share their resource.
  std::map<std::string, BatchFn> batches;
  /// The most tasks one batch call runs.
  int64_t maxBatch = 64;

  int64_t add(GraphTask task, std::string batch = {}) {
    tasks.push_back(std::move(task));
    batchKeys.resize(tasks.size());
    batchKeys.back() = std::move(batch);
    return int64_t(tasks.size()) - 1;
  }
  const std::string &batchOf(int64_t task) const {
    static const std::string alone;
    return task < int64_t(batchKeys.size()) ? batchKeys[task] : alone;
  }
};

/// Worker pools, one per resource; thread-safe; shared by concurrent runs.
class ResourcePools {
public:
  /// `lanes`: workers per resource name; each must be positive.
  static StatusOr<std::unique_ptr<ResourcePools>>
  create(const std::map<std::string, int> &lanes);
  ~ResourcePools();

  ResourcePools(const ResourcePools &) = delete;
  ResourcePools &operator=(const ResourcePools &) = delete;

  bool has(const std::string &resource) const {
    return pools_.count(resource) != 0;
  }
  int lanes(const std::string &resource) const;

  /// Queues `job` on `resource`'s workers (which must exist).
  void submit(const std::string &resource, std::function<void(int)> job);

private:
  struct Pool {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void(int)>> queue;
    std::vector<std::thread> workers;
    bool stopping = false;
  };
  ResourcePools() = default;
  static void work(Pool &pool, int worker);

  std::map<std::string, std::unique_ptr<Pool>> pools_;
};

/// One task's measured interval, seconds from the run's start.
struct TaskTiming {
  double start = 0;
  double end = 0;
  int worker = 0;
  bool ran = false; ///< False when skipped after a failure.
};

struct RunResult {
  Status status;
  Clock::time_point begin; ///< The run's start, which timings count from.
  double makespan = 0; ///< Seconds from the run's start to its last task.
  std::vector<TaskTiming> timings;
  /// Seconds each resource spent running this run's tasks (summed over its
  /// workers; a batch's time once).
  std::map<std::string, double> busy;
};

/// Runs `graph` on `pools`, blocking until it is done. Fails before running
/// anything when a task names a missing resource, a missing task or batch
/// key, a key's tasks name different resources, or the graph has a cycle.
/// Each task of a batch gets the batch call's start, end and worker.
RunResult runGraph(ResourcePools &pools, const TaskGraph &graph);

/// What a task pays to start after a task on another resource releases it,
/// once that resource's worker has been idle for about `workSeconds`: runs
/// a chain of `tasks` (>= 2) tasks of `workSeconds` of busy work each,
/// alternating between resources `a` and `b` of `pools`, and returns
/// (makespan - first task's start - work) / (tasks - 1). The first start is
/// left out: it follows the run's own submit, not a hand-off. Calibration
/// measures a target's host.handoff_us with it.
StatusOr<double> measureHandoff(ResourcePools &pools, const std::string &a,
                                const std::string &b, double workSeconds,
                                int64_t tasks);

/// Work a device ran on one of its queues (a copy, kernels), timed by the
/// device's own clock and placed on the host's (Device::takeSpans).
struct DeviceSpan {
  std::string name; ///< "upload", "scatter", ...
  int queue = 0;    ///< Which of the device's queues (streams) ran it.
  Clock::time_point start, end;
};

/// Numbers a task's trace event carries besides its index (a restore's
/// host bytes the task moved), by task; none when empty.
using TaskCounters = std::vector<std::vector<std::pair<std::string, int64_t>>>;

/// Writes a run as a Chrome trace (JSON array format): one thread per
/// resource worker, one complete event per task that ran, with its
/// `counters` (the non-zero ones) in its args; and one thread per device
/// queue with the device's spans of the run (`device`), so that the trace
/// shows when the device worked beside when the host asked it to.
Status writeChromeTrace(const TaskGraph &graph, const RunResult &result,
                        const std::string &path,
                        const std::vector<DeviceSpan> &device = {},
                        const TaskCounters &counters = {});

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_TASKGRAPH_H
