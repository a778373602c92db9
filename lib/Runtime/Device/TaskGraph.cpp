//===- TaskGraph.cpp - Running task graphs on shared resource pools -------===//

#include "kvc/Runtime/Device/TaskGraph.h"

#include "GraphOrder.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Threads.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>

namespace kvc {

//===----------------------------------------------------------------------===//
// ResourcePools
//===----------------------------------------------------------------------===//

StatusOr<std::unique_ptr<ResourcePools>>
ResourcePools::create(const std::map<std::string, int> &lanes) {
  for (const auto &[name, count] : lanes)
    KVC_RETURN_IF_ERROR(checkWorkers("resource \"" + name + "\"", count));
  // On a failure the destructor stops and joins the workers started.
  std::unique_ptr<ResourcePools> pools(new ResourcePools());
  for (const auto &[name, count] : lanes) {
    Pool &pool =
        *pools->pools_.emplace(name, std::make_unique<Pool>()).first->second;
    for (int worker = 0; worker < count; ++worker)
      KVC_RETURN_IF_ERROR(startThread(pool.workers, &ResourcePools::work,
                                      std::ref(pool), worker));
  }
  return pools;
}

ResourcePools::~ResourcePools() {
  for (auto &[name, pool] : pools_) {
    {
      std::lock_guard<std::mutex> lock(pool->mutex);
      pool->stopping = true;
    }
    pool->ready.notify_all();
    for (std::thread &worker : pool->workers)
      worker.join();
  }
}

int ResourcePools::lanes(const std::string &resource) const {
  auto it = pools_.find(resource);
  return it == pools_.end() ? 0 : int(it->second->workers.size());
}

void ResourcePools::submit(const std::string &resource,
                           std::function<void(int)> job) {
  Pool &pool = *pools_.at(resource);
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.queue.push_back(std::move(job));
  }
  pool.ready.notify_one();
}

void ResourcePools::work(Pool &pool, int worker) {
  for (;;) {
    std::function<void(int)> job;
    {
      std::unique_lock<std::mutex> lock(pool.mutex);
      pool.ready.wait(lock,
                      [&] { return pool.stopping || !pool.queue.empty(); });
      if (pool.queue.empty())
        return; // Stopping, and drained.
      job = std::move(pool.queue.front());
      pool.queue.pop_front();
    }
    job(worker);
  }
}

//===----------------------------------------------------------------------===//
// Runs
//===----------------------------------------------------------------------===//

namespace {

/// The bookkeeping of one run, shared with the jobs in the pools (a worker
/// may still hold it for an instant after the caller has been woken).
struct RunState {
  RunState(ResourcePools &pools, const TaskGraph &graph)
      : pools(pools), graph(graph), pending(graph.tasks.size(), 0),
        users(graph.tasks.size()), timings(graph.tasks.size()),
        remaining(int64_t(graph.tasks.size())) {}

  /// Submits the ready tasks (a batch key's to its queue, with a job to
  /// drain it where none is pending), or skips them (and whatever they make
  /// ready) once the run has failed. Tasks released together join their
  /// queues before any drain job of theirs can run, so they batch.
  void release(std::vector<int64_t> ready,
               const std::shared_ptr<RunState> &self) {
    std::vector<int64_t> alone;
    std::vector<int64_t> drains; // A task of each key to drain.
    {
      std::lock_guard<std::mutex> lock(mutex);
      // In order; skipped tasks append what they release.
      for (std::size_t next = 0; next < ready.size(); ++next) {
        int64_t task = ready[next];
        if (!status.isOk()) {
          finishLocked(task, ready);
          continue;
        }
        const std::string &key = graph.batchOf(task);
        if (key.empty()) {
          alone.push_back(task);
          continue;
        }
        std::deque<int64_t> &queue = waiting[key];
        if (queue.empty())
          drains.push_back(task);
        queue.push_back(task);
      }
    }
    for (int64_t task : alone)
      pools.submit(graph.tasks[task].resource,
                   [self, task](int worker) { self->run(task, worker, self); });
    for (int64_t task : drains)
      submitDrain(task, self);
  }

  /// Queues a job that drains the batch of `task`'s key.
  void submitDrain(int64_t task, const std::shared_ptr<RunState> &self) {
    pools.submit(graph.tasks[task].resource,
                 [self, key = graph.batchOf(task)](int worker) {
                   self->drain(key, worker, self);
                 });
  }

  void run(int64_t task, int worker, const std::shared_ptr<RunState> &self) {
    double start = seconds();
    Status result = graph.tasks[task].fn ? graph.tasks[task].fn(worker)
                                         : Status::ok();
    finish({task}, start, worker, result, self);
  }

  /// Runs up to maxBatch tasks waiting under `key` as one batch.
  void drain(const std::string &key, int worker,
             const std::shared_ptr<RunState> &self) {
    std::vector<int64_t> tasks;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      std::deque<int64_t> &queue = waiting[key];
      while (!queue.empty() && int64_t(tasks.size()) < graph.maxBatch) {
        tasks.push_back(queue.front());
        queue.pop_front();
      }
      if (!queue.empty())
        submitDrain(queue.front(), self);
      failed = !status.isOk();
    }
    if (tasks.empty())
      return;
    if (failed) {
      std::vector<int64_t> ready;
      {
        std::lock_guard<std::mutex> lock(mutex);
        for (int64_t task : tasks)
          finishLocked(task, ready);
      }
      release(std::move(ready), self);
      return;
    }
    double start = seconds();
    finish(tasks, start, worker, graph.batches.at(key)(worker, tasks), self);
  }

  /// Records `tasks`, run from `start` by `worker` with `result`, as done
  /// and releases what they make ready.
  void finish(const std::vector<int64_t> &tasks, double start, int worker,
              const Status &result, const std::shared_ptr<RunState> &self) {
    double end = seconds();
    std::vector<int64_t> ready;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!result.isOk() && status.isOk())
        status = result.withContext(graph.tasks[tasks.front()].name);
      busy[graph.tasks[tasks.front()].resource] += end - start;
      for (int64_t task : tasks) {
        timings[task] = TaskTiming{start, end, worker, true};
        finishLocked(task, ready);
      }
    }
    release(std::move(ready), self);
  }

  /// Marks `task` done and appends the tasks it makes ready to `ready`.
  void finishLocked(int64_t task, std::vector<int64_t> &ready) {
    for (int64_t user : users[task])
      if (--pending[user] == 0)
        ready.push_back(user);
    if (--remaining == 0)
      done.notify_all();
  }

  double seconds() const {
    return secondsSince(begin);
  }

  ResourcePools &pools;
  const TaskGraph &graph;
  Clock::time_point begin = Clock::now();
  std::mutex mutex;
  std::condition_variable done;
  std::vector<int64_t> pending;
  std::vector<std::vector<int64_t>> users;
  std::vector<TaskTiming> timings;
  /// Tasks of each batch key waiting for a drain job, which is queued
  /// whenever they are some.
  std::map<std::string, std::deque<int64_t>> waiting;
  /// Seconds each resource ran this run's calls (a batch counted once).
  std::map<std::string, double> busy;
  int64_t remaining;
  Status status;
};

Status checkGraph(const ResourcePools &pools, const TaskGraph &graph) {
  const int64_t n = int64_t(graph.tasks.size());
  std::map<std::string, std::string> batchResource;
  for (int64_t i = 0; i < n; ++i) {
    const GraphTask &task = graph.tasks[i];
    if (!pools.has(task.resource))
      return invalidArgument("task " + std::to_string(i) + " (" + task.name +
                             "): no workers for resource \"" + task.resource +
                             "\"");
    for (int64_t dep : task.after)
      if (dep < 0 || dep >= n || dep == i)
        return invalidArgument("task " + std::to_string(i) + " (" +
                               task.name + "): bad dependency " +
                               std::to_string(dep));
    const std::string &batch = graph.batchOf(i);
    if (batch.empty())
      continue;
    if (!graph.batches.count(batch))
      return invalidArgument("task " + std::to_string(i) + " (" + task.name +
                             "): no function for batch \"" + batch + "\"");
    const std::string &resource =
        batchResource.emplace(batch, task.resource).first->second;
    if (resource != task.resource)
      return invalidArgument("task " + std::to_string(i) + " (" + task.name +
                             "): batch \"" + batch + "\" spans resources \"" +
                             resource + "\" and \"" + task.resource + "\"");
  }
  if (graph.maxBatch < 1)
    return invalidArgument("a batch of at most " +
                           std::to_string(graph.maxBatch) + " tasks");
  int64_t onCycle = 0;
  if (int64_t(exec_detail::topologicalOrder(
                  n,
                  [&](int64_t i) -> const std::vector<int64_t> & {
                    return graph.tasks[i].after;
                  },
                  &onCycle)
                  .size()) != n)
    return invalidArgument("the task graph has a cycle through task " +
                           std::to_string(onCycle));
  return Status::ok();
}

} // namespace

RunResult runGraph(ResourcePools &pools, const TaskGraph &graph) {
  RunResult result;
  result.status = checkGraph(pools, graph);
  if (!result.status.isOk())
    return result;

  auto state = std::make_shared<RunState>(pools, graph);
  std::vector<int64_t> ready;
  for (int64_t i = 0; i < int64_t(graph.tasks.size()); ++i) {
    for (int64_t dep : graph.tasks[i].after) {
      state->users[dep].push_back(i);
      ++state->pending[i];
    }
  }
  for (int64_t i = 0; i < int64_t(graph.tasks.size()); ++i)
    if (state->pending[i] == 0)
      ready.push_back(i);
  if (!graph.tasks.empty())
    state->release(std::move(ready), state);

  std::unique_lock<std::mutex> lock(state->mutex);
  state->done.wait(lock, [&] { return state->remaining == 0; });
  result.status = state->status;
  result.begin = state->begin;
  result.timings = state->timings;
  result.busy = state->busy;
  for (const TaskTiming &t : result.timings)
    if (t.ran)
      result.makespan = std::max(result.makespan, t.end);
  return result;
}

StatusOr<double> measureHandoff(ResourcePools &pools, const std::string &a,
                                const std::string &b, double workSeconds,
                                int64_t tasks) {
  if (tasks < 2)
    return invalidArgument("a hand-off needs a chain of two tasks or more");
  TaskGraph graph;
  for (int64_t i = 0; i < tasks; ++i) {
    // Busy, not asleep: the other worker idles meanwhile.
    GraphTask task{"handoff", i % 2 ? b : a, {}, [workSeconds](int) {
                     spinFor(workSeconds);
                     return Status::ok();
                   }};
    if (i > 0)
      task.after = {i - 1};
    graph.add(std::move(task));
  }
  RunResult result = runGraph(pools, graph);
  KVC_RETURN_IF_ERROR(result.status);
  double work = 0;
  for (const auto &[resource, seconds] : result.busy)
    work += seconds;
  return std::max(0.0, result.makespan - result.timings[0].start - work) /
         double(tasks - 1);
}

Status writeChromeTrace(const TaskGraph &graph, const RunResult &result,
                        const std::string &path,
                        const std::vector<DeviceSpan> &device,
                        const TaskCounters &counters) {
  using Json = nlohmann::json;
  Json events = Json::array();
  // One trace thread per (resource, worker), named, in resource order.
  std::map<std::pair<std::string, int>, int> threads;
  for (std::size_t i = 0; i < graph.tasks.size(); ++i)
    if (result.timings[i].ran)
      threads.emplace(std::make_pair(graph.tasks[i].resource,
                                     result.timings[i].worker),
                      0);
  for (const DeviceSpan &span : device)
    threads.emplace(std::make_pair("device", span.queue), 0);
  int tid = 0;
  for (auto &[key, id] : threads) {
    id = ++tid;
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 1},
                      {"tid", id},
                      {"args", {{"name", key.first + "/" +
                                             std::to_string(key.second)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 1},
                      {"tid", id},
                      {"args", {{"sort_index", id}}}});
  }
  for (std::size_t i = 0; i < graph.tasks.size(); ++i) {
    const TaskTiming &t = result.timings[i];
    if (!t.ran)
      continue;
    const GraphTask &task = graph.tasks[i];
    Json args = {{"task", i}};
    if (i < counters.size())
      for (const auto &[name, value] : counters[i])
        if (value != 0)
          args[name] = value;
    events.push_back({{"ph", "X"},
                      {"name", task.name},
                      {"cat", task.resource},
                      {"pid", 1},
                      {"tid", threads[{task.resource, t.worker}]},
                      {"ts", t.start * 1e6},
                      {"dur", (t.end - t.start) * 1e6},
                      {"args", std::move(args)}});
  }
  for (const DeviceSpan &span : device) {
    using Seconds = std::chrono::duration<double>;
    events.push_back({{"ph", "X"},
                      {"name", span.name},
                      {"cat", "device"},
                      {"pid", 1},
                      {"tid", threads[{"device", span.queue}]},
                      {"ts", Seconds(span.start - result.begin).count() * 1e6},
                      {"dur", Seconds(span.end - span.start).count() * 1e6}});
  }
  std::ofstream out(path);
  if (!out)
    return notFound(path + ": cannot create the trace file");
  out << events.dump() << "\n";
  if (!out)
    return dataLoss(path + ": write error");
  return Status::ok();
}

} // namespace kvc
