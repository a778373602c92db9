//===- Simulator.h - Makespan of a plan on a machine ------------*- C++ -*-===//
//
// A discrete-event list scheduler over a job graph. Resources have lanes (the
// four SSDs of a tier, the copy engine, the compute stream); a job runs on one
// lane of its resource once its dependencies have finished, and may hold
// staging memory from its start until another job finishes (a fetched chunk
// occupies host buffers until its copy to the device is done, as in
// ShadowServe). Among ready jobs a free lane takes the one of highest
// priority, so pipelines drain before new chunks enter them. A job released
// by a job on another resource (or by the start) reaches its resource's
// queue a hand-off later: the executor's worker threads sleep while their
// queue is empty, and waking one costs the machine's `host.handoff_us`
// (tens of microseconds on a VM whose idle vCPUs halt). The result is
// the makespan, every job's start and finish, each resource's busy time and
// the peak staging memory. Every planning pass, the report and the tests
// time plans with this one simulator.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_SIMULATOR_H
#define KVC_PLANNING_SIMULATOR_H

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kvc::planning {

struct SimJob {
  int resource = 0;
  double seconds = 0;
  int priority = 0;          ///< Higher runs first among ready jobs.
  int64_t stagingBytes = 0;  ///< Held from this job's start...
  int releasedBy = -1;       ///< ...until this job finishes (-1: own finish).
  /// The job starts no earlier than this (seconds from the start): an input
  /// made outside the graph, such as a layer of the prefill a save runs
  /// beside, or an object a transfer's sender puts on the link.
  double notBefore = 0;
};

/// Jobs and their dependencies; a job may only depend on earlier jobs.
class JobGraph {
public:
  /// Adds a resource with `lanes` parallel lanes; returns its index.
  int addResource(std::string name, int lanes);
  /// Adds a job; `deps` must name earlier jobs. Returns its index.
  int addJob(const SimJob &job, const std::vector<int> &deps = {});
  int addJob(const SimJob &job, std::initializer_list<int> deps);

  int numJobs() const { return static_cast<int>(jobs_.size()); }
  int numResources() const { return static_cast<int>(resources_.size()); }
  const SimJob &job(int index) const { return jobs_[index]; }
  SimJob &job(int index) { return jobs_[index]; }
  const std::string &resourceName(int r) const { return resources_[r].name; }
  int lanes(int r) const { return resources_[r].lanes; }
  /// The jobs `job` waits for.
  const int *depsBegin(int job) const { return deps_.data() + depStart_[job]; }
  const int *depsEnd(int job) const {
    return deps_.data() + depStart_[job + 1];
  }

private:
  struct Resource {
    std::string name;
    int lanes;
  };
  std::vector<Resource> resources_;
  std::vector<SimJob> jobs_;
  /// Dependencies of job j: deps_[depStart_[j] .. depStart_[j + 1]).
  std::vector<int> deps_;
  std::vector<int> depStart_{0};
};

struct SimResult {
  double makespan = 0;
  std::vector<double> start, finish; ///< Per job.
  std::vector<double> busy;          ///< Per resource, summed over lanes.
  int64_t peakStagingBytes = 0;
};

/// Schedules every job; staging above `stagingBudget` bytes waits (a single
/// job larger than the budget runs alone), and a job waits `handoffSeconds`
/// after the start, after its `notBefore` and after each dependency on
/// another resource.
SimResult simulate(const JobGraph &graph, int64_t stagingBudget,
                   double handoffSeconds = 0);

} // namespace kvc::planning

#endif // KVC_PLANNING_SIMULATOR_H
