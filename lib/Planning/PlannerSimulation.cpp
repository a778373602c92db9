//===- PlannerSimulation.cpp - Timing a plan with the simulator -----------===//
//
// A plan's chunks in the order they run, the job graph of its steps on the
// target's resources (with the server's forward pass beside it, where the
// request has one) and the simulated evaluation the search ranks plans by.
//
//===----------------------------------------------------------------------===//

#include "kvc/Planning/Planner.h"

#include "kvc/Planning/Pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace kvc::planning {

//===----------------------------------------------------------------------===//
// Simulation
//===----------------------------------------------------------------------===//

std::vector<Chunk> Planner::chunks(const Plan &plan) const {
  std::vector<Chunk> out = chunkPlan(plan, chunk_, loadLayers_);
  orderChunks(out, options_.layerWise ? ChunkOrder::LayerWise
                                      : ChunkOrder::TokenMajor);
  return out;
}

JobGraph Planner::buildJobs(const Plan &plan,
                            std::vector<JobInfo> *info) const {
  JobGraph graph;
  std::vector<JobInfo> localInfo;
  std::vector<JobInfo> &jobs = info ? *info : localInfo;
  jobs.clear();
  // One lane of each device-side resource, a tier's lanes for its IO.
  std::map<std::string, int> resources;
  for (Resource r : {Resource::Compute, Resource::H2D, Resource::Decode})
    resources[poolName(r)] = graph.addResource(poolName(r), 1);
  // A chunk kind's steps and the resource each runs on, made on first use
  // (so resources are added in the order chunks need them): loads per
  // source, into the cache or (a computed chunk's hidden input) not, and
  // computed chunks. A step reads or writes a tier only as a source's IO.
  struct Chain {
    std::vector<PipelineStep> steps;
    std::vector<int> resources;
    const Source *source = nullptr;
    const TierDesc *tier = nullptr;
  };
  std::map<std::pair<int, bool>, Chain> chains;
  auto chainOf = [&](int sourceIndex, bool toCache) -> const Chain & {
    auto [it, inserted] = chains.try_emplace({sourceIndex, toCache});
    Chain &chain = it->second;
    if (!inserted)
      return chain;
    if (sourceIndex >= 0) {
      chain.source = &request_.sources[sourceIndex];
      chain.tier = cost_.target().findTier(chain.source->tier);
      chain.steps =
          restoreSteps(chain.source->form, chain.source->codec, toCache);
    } else {
      chain.steps = computeSteps();
    }
    for (const PipelineStep &step : chain.steps) {
      Resource r = stepResource(step);
      std::string name =
          poolName(r, r == Resource::IO ? chain.source->tier : "");
      auto [found, added] = resources.try_emplace(name, -1);
      if (added)
        found->second =
            graph.addResource(name, chain.tier ? int(chain.tier->lanes) : 1);
      chain.resources.push_back(found->second);
    }
    return chain;
  };

  /// Adds the jobs of `chain` over `box` after `deps` and returns the last:
  /// consecutive steps on one resource are one job at its first step's
  /// priority (as kvc-fuse fuses a chunk's device steps into one kernel),
  /// and a fetch holds its staging bytes until the job that frees them ends.
  auto addChain = [&](int chunk, const Chain &chain, const Box &box,
                      std::vector<int> deps) {
    const std::vector<PipelineStep> &steps = chain.steps;
    int last = -1, holder = -1;
    for (size_t s = 0; s < steps.size();) {
      SimJob job{chain.resources[s], 0, stepPriority(steps[s].kind)};
      JobInfo what{steps[s].kind, chunk, 0, 0, box};
      bool frees = false;
      for (; s < steps.size() && chain.resources[s] == job.resource; ++s) {
        StepCost c = stepCost(cost_, steps[s], box, chain.tier);
        job.seconds += c.seconds;
        what.bytesRead += c.bytesRead;
        what.flops += c.flops;
        frees |= freesStaging(steps[s].kind);
        what.writesCache |= steps[s].kind == StepKind::Scatter;
        if (steps[s].kind == StepKind::Fetch)
          job.stagingBytes = int64_t(stagingBytes(cost_, chain.source->form,
                                                  chain.source->codec, box));
      }
      last = graph.addJob(job, last < 0 ? deps : std::vector<int>{last});
      jobs.push_back(what);
      if (job.stagingBytes > 0)
        holder = last;
      if (frees && holder >= 0)
        graph.job(holder).releasedBy = last;
    }
    return last;
  };

  std::vector<Chunk> chunks = this->chunks(plan);
  std::vector<int> final(chunks.size(), -1);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk &c = chunks[i];
    int chunk = static_cast<int>(i);
    if (c.method != Method::Compute) {
      final[i] =
          addChain(chunk, chainOf(c.source, /*toCache=*/true), c.box, {});
      continue;
    }
    // Attention needs the KV of every earlier token in these layers, and
    // the chunk the hidden states entering its first layer, where computed.
    std::vector<int> deps;
    int hiddenFrom = -1;
    for (size_t j = 0; j < i; ++j) {
      if (!dependsOn(c, chunks[j]))
        continue;
      if (chunks[j].box.t0 < c.box.t0)
        deps.push_back(final[j]);
      else
        hiddenFrom = final[j];
    }
    if (c.box.l0 > 0) {
      if (hiddenFrom < 0 && c.source >= 0)
        hiddenFrom =
            addChain(chunk, chainOf(c.source, /*toCache=*/false),
                     Box{c.box.t0, c.box.t1, c.box.l0, c.box.l0 + 1}, {});
      if (hiddenFrom >= 0)
        deps.push_back(hiddenFrom);
    }
    final[i] = addChain(chunk, chainOf(-1, false), c.box, deps);
  }
  addForward(graph, jobs, resources[poolName(Resource::Compute)]);
  return graph;
}

void Planner::addForward(JobGraph &graph, std::vector<JobInfo> &jobs,
                         int compute) const {
  if (request_.forwardTokens <= 0)
    return;
  const int64_t layers = cost_.model().numLayers;
  std::vector<std::vector<int>> writers(size_t(std::max<int64_t>(layers, 0)));
  for (size_t j = 0; j < jobs.size(); ++j)
    if (jobs[j].writesCache)
      for (int64_t l = jobs[j].box.l0; l < jobs[j].box.l1; ++l)
        writers[l].push_back(int(j));
  const int64_t t0 = request_.tokens, t1 = t0 + request_.forwardTokens;
  const double flops = cost_.prefillFlops(t0, t1, 1);
  // Ahead of every step of the restore: a server runs its layer once the
  // restore has written it.
  const int priority = 1 + stepPriority(StepKind::Scatter);
  int previous = -1;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<int> deps = writers[l];
    if (previous >= 0)
      deps.push_back(previous);
    previous = graph.addJob(SimJob{compute, forwardLayer_, priority}, deps);
    JobInfo what{StepKind::ChunkCompute, -1, 0, flops, Box{t0, t1, l, l + 1}};
    what.forward = true;
    jobs.push_back(what);
  }
}

Evaluation Planner::evaluate(const Plan &plan) const {
  std::vector<JobInfo> info;
  JobGraph graph = buildJobs(plan, &info);
  SimResult sim = simulate(graph, options_.stagingBytes(),
                           cost_.target().host.handoffUs * 1e-6);
  Evaluation e;
  e.plan = plan;
  e.firstTokenSeconds = sim.makespan;
  for (int r = 0; r < graph.numResources(); ++r)
    e.busy.push_back(sim.busy[r] / graph.lanes(r));
  e.peakStagingBytes = sim.peakStagingBytes;
  e.jobs = graph.numJobs();
  for (int r = 0; r < graph.numResources(); ++r)
    e.resources.push_back(graph.resourceName(r));
  e.layerReadySeconds.assign(
      size_t(std::max<int64_t>(cost_.model().numLayers, 0)), 0);
  for (size_t j = 0; j < info.size(); ++j) {
    const JobInfo &job = info[j];
    if (job.forward)
      continue;
    e.seconds = std::max(e.seconds, sim.finish[j]);
    e.bytesRead += job.bytesRead;
    e.flops += job.flops;
    if (job.writesCache)
      for (int64_t l = job.box.l0; l < job.box.l1; ++l)
        e.layerReadySeconds[l] =
            std::max(e.layerReadySeconds[l], sim.finish[j]);
  }
  return e;
}

Evaluation Planner::evaluateCandidate(const Candidate &c,
                                      const char *strategy) const {
  Plan plan = makePlan(c);
  plan.strategy = strategy;
  Evaluation e = evaluate(plan);
  e.estimate = estimate(c);
  return e;
}

} // namespace kvc::planning
