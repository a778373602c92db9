//===- Simulator.cpp - Makespan of a plan on a machine --------------------===//

#include "kvc/Planning/Simulator.h"

#include <algorithm>
#include <cassert>
#include <queue>
#include <tuple>

namespace kvc::planning {

int JobGraph::addResource(std::string name, int lanes) {
  resources_.push_back({std::move(name), std::max(1, lanes)});
  return numResources() - 1;
}

namespace {
template <typename Range>
int addJobImpl(std::vector<SimJob> &jobs, std::vector<int> &deps,
               std::vector<int> &depStart, const SimJob &job,
               const Range &jobDeps) {
  int index = static_cast<int>(jobs.size());
  jobs.push_back(job);
  for (int dep : jobDeps) {
    assert(dep >= 0 && dep < index && "a job depends on an earlier job");
    deps.push_back(dep);
  }
  depStart.push_back(static_cast<int>(deps.size()));
  return index;
}
} // namespace

int JobGraph::addJob(const SimJob &job, const std::vector<int> &deps) {
  return addJobImpl(jobs_, deps_, depStart_, job, deps);
}

int JobGraph::addJob(const SimJob &job, std::initializer_list<int> deps) {
  return addJobImpl(jobs_, deps_, depStart_, job, deps);
}

SimResult simulate(const JobGraph &graph, int64_t stagingBudget,
                   double handoffSeconds) {
  const int n = graph.numJobs();
  const int numResources = graph.numResources();
  SimResult result;
  result.start.assign(n, 0.0);
  result.finish.assign(n, 0.0);
  result.busy.assign(numResources, 0.0);

  // Dependents (CSR) and remaining dependency counts.
  std::vector<int> remaining(n, 0), offsets(n + 1, 0);
  for (int j = 0; j < n; ++j) {
    remaining[j] = static_cast<int>(graph.depsEnd(j) - graph.depsBegin(j));
    for (const int *dep = graph.depsBegin(j); dep != graph.depsEnd(j); ++dep)
      ++offsets[*dep + 1];
  }
  for (int j = 0; j < n; ++j)
    offsets[j + 1] += offsets[j];
  std::vector<int> dependents(offsets[n]);
  {
    std::vector<int> fill(offsets.begin(), offsets.end() - 1);
    for (int j = 0; j < n; ++j)
      for (const int *dep = graph.depsBegin(j); dep != graph.depsEnd(j); ++dep)
        dependents[fill[*dep]++] = j;
  }

  // Ready jobs per resource, a max-heap on (priority, -index).
  auto lower = [&](int a, int b) {
    int pa = graph.job(a).priority, pb = graph.job(b).priority;
    return pa != pb ? pa < pb : a > b;
  };
  std::vector<std::vector<int>> ready(numResources);
  auto pushReady = [&](int j) {
    std::vector<int> &heap = ready[graph.job(j).resource];
    heap.push_back(j);
    std::push_heap(heap.begin(), heap.end(), lower);
  };
  std::vector<int> freeLanes(numResources);
  for (int r = 0; r < numResources; ++r)
    freeLanes[r] = graph.lanes(r);

  // Staging held, and what each job's finish releases.
  int64_t held = 0;
  std::vector<int64_t> releases(n, 0);

  // Events at one instant: jobs finish (a lane frees, dependents count
  // down), then handed-off jobs arrive on their resource's queue.
  enum : int { Finish = 0, Arrive = 1 };
  struct Event {
    double time;
    int kind;
    int job;
    bool operator>(const Event &o) const {
      return std::tie(time, kind, job) > std::tie(o.time, o.kind, o.job);
    }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  double now = 0;
  int done = 0;
  // When a job may arrive: after each dependency on its own resource, and
  // `handoffSeconds` after each on another (or after the start, or after
  // its input from outside the graph is made).
  std::vector<double> arrival(n);
  for (int j = 0; j < n; ++j)
    arrival[j] = graph.job(j).notBefore + handoffSeconds;
  auto arrive = [&](int j) {
    if (arrival[j] > now)
      events.push({arrival[j], Arrive, j});
    else
      pushReady(j);
  };

  for (int j = 0; j < n; ++j)
    if (remaining[j] == 0)
      arrive(j);

  auto dispatch = [&] {
    for (int r = 0; r < numResources; ++r) {
      std::vector<int> &heap = ready[r];
      while (freeLanes[r] > 0 && !heap.empty()) {
        int j = heap.front();
        const SimJob &job = graph.job(j);
        // Staging is taken in priority order: a job that does not fit
        // waits, and so does the rest of its resource's queue.
        if (job.stagingBytes > 0 && held > 0 &&
            held + job.stagingBytes > stagingBudget)
          break;
        std::pop_heap(heap.begin(), heap.end(), lower);
        heap.pop_back();
        --freeLanes[r];
        held += job.stagingBytes;
        result.peakStagingBytes = std::max(result.peakStagingBytes, held);
        releases[job.releasedBy >= 0 ? job.releasedBy : j] += job.stagingBytes;
        result.start[j] = now;
        result.finish[j] = now + job.seconds;
        result.busy[r] += job.seconds;
        events.push({result.finish[j], Finish, j});
      }
    }
  };

  dispatch();
  while (!events.empty()) {
    // Finish every job that ends at this instant before dispatching again.
    now = events.top().time;
    while (!events.empty() && events.top().time == now) {
      Event event = events.top();
      events.pop();
      int j = event.job;
      if (event.kind == Arrive) {
        pushReady(j);
        continue;
      }
      ++done;
      ++freeLanes[graph.job(j).resource];
      held -= releases[j];
      for (int k = offsets[j]; k < offsets[j + 1]; ++k) {
        int dependent = dependents[k];
        bool crosses = graph.job(dependent).resource != graph.job(j).resource;
        arrival[dependent] = std::max(arrival[dependent],
                                      now + (crosses ? handoffSeconds : 0.0));
        if (--remaining[dependent] == 0)
          arrive(dependent);
      }
    }
    dispatch();
  }
  assert(done == n && "every job runs: the graph is acyclic");
  (void)done;
  result.makespan = now;
  return result;
}

} // namespace kvc::planning
