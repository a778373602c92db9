//===- Planner.h - Choosing how to restore a request's KV -------*- C++ -*-===//
//
// The planner searches one discretized space that contains every strategy of
// the four papers and their combinations:
//
//   tokens [0, m)  x layers [0, L)  compute          (Cake's front)
//   tokens [m, T)  x layers [0, k)  compute | load KV (HCache's complement)
//   tokens [m, T)  x layers [k, L)  load hidden | load KV
//
// with m on the chunk grid, k in [0, L] and a choice among the stored
// sources of each form (codecs). Compute-only is m = T; KV-only and
// hidden-only are m = k = 0; Cake is k = 0 with KV loads; HCache is m = 0
// with hidden loads. Each point gets an O(1) analytic estimate (per-resource
// busy time plus pipeline fill, from prefix sums over the chunk grid); the
// best candidates are then timed with the simulator, improved by a local
// search in (m, k) and compared with the simulated baselines, so the chosen
// plan is never slower than any baseline by the simulator.
//
// What "slower" means is the request's: the restore's makespan, or, for a
// request with Request::forwardTokens, when the server's forward pass over
// them ends. That pass is simulated with the restore: a job per layer on
// the device's compute, after the restore's last write of the layer and
// the pass's previous layer, ahead of the restore's own compute jobs (a
// server launches its layer as soon as it may).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_PLANNER_H
#define KVC_PLANNING_PLANNER_H

#include "kvc/Planning/CostModel.h"
#include "kvc/Planning/Simulator.h"

#include <optional>
#include <string_view>
#include <vector>

namespace kvc::planning {

/// The strategies a restore is planned by: the papers' baselines and the
/// joint search. One table (Planner.cpp) names them and says which stored
/// form each needs, whether it only loads and whether it is a baseline.
enum class Strategy { Compute, Kv, Hidden, Cake, HCache, Joint };

/// Every strategy, in the order above.
const std::vector<Strategy> &allStrategies();
/// "compute", "kv", "hidden", "cake", "hcache", "joint".
const char *strategyName(Strategy strategy);
/// The strategy `name` names; none for another name.
std::optional<Strategy> parseStrategy(std::string_view name);
/// A comma-separated list of names ("kv,cake"); "all" (or "") is the empty
/// list, every strategy the request's sources allow. An unknown name is an
/// error listing the known ones.
StatusOr<std::vector<Strategy>> parseStrategies(std::string_view list);
/// The form a strategy loads (none: it loads nothing, or whatever is
/// stored).
std::optional<Form> strategyNeeds(Strategy strategy);
/// Whether plans of `strategy` load every token they restore (kv, hidden):
/// the others compute some of them, choosing their own split.
bool strategyOnlyLoads(Strategy strategy);
/// Whether the joint search is held against `strategy` (Planner::baselines):
/// every single technique, not the joint plan itself.
bool strategyIsBaseline(Strategy strategy);
/// The strategies whose loads `sources` allow, in the order above.
std::vector<Strategy> strategiesFor(const std::vector<Source> &sources);

/// How to plan, the one set of options of everyone who plans: the planner
/// itself, the compiler's planning passes and kvc-restore-pipeline (whose
/// pass options wrap it: RestorePipelineOptions, KVC_CostModelOptions),
/// the in-process compiler (compileRestore) and a server's plan hook
/// (host::PlanOptions adds the request's own fields).
struct PlanOptions {
  /// One plan per strategy, named after it (Joint searches them all);
  /// empty: every strategy the request's sources allow (strategiesFor).
  std::vector<Strategy> strategies = {Strategy::Joint};
  /// Tokens per chunk; 0 chooses from the target (see chunkTokens()).
  int64_t chunkTokens = 0;
  /// Host staging memory for fetched chunks (ShadowServe's bounded
  /// buffers), MiB.
  int64_t stagingMiB = 256;
  /// Analytic candidates the search times with the simulator.
  int candidates = 4;
  /// Plan for a server that runs its forward pass beside the restore,
  /// waiting on each layer (RestoreHandle::waitLayer): loads as deep as
  /// the stored objects (at most kMaxLoadSteps steps of layers) in ChunkOrder::
  /// LayerWise, so that the first layers complete early. Otherwise loads
  /// take as many layers as a quarter of the staging holds, token-major,
  /// and layers complete together near the end.
  bool layerWise = false;
  static constexpr int64_t kMaxLoadSteps = 16;
  /// A measured codec profile (kvc-codec-profile/1 JSON file) the cost
  /// model prices codecs by; empty: the built-in estimate.
  std::string codecProfile;
  /// The GPU architecture to generate the plans' fused kernels for (sm_90:
  /// H100, H200), into the bundle's kernel table; empty: the target's chip,
  /// if it names one; "none": no kernels (a CPU backend runs none).
  std::string gpuChip;

  int64_t stagingBytes() const { return stagingMiB << 20; }
};

/// What one simulated job is, for reports and traces: the chunk it works
/// on, its first step, the bytes it reads from a tier and the FLOPs it
/// computes.
struct JobInfo {
  StepKind kind = StepKind::ChunkCompute;
  int chunk = -1;
  double bytesRead = 0;
  double flops = 0;
  Box box;                  ///< What it works on.
  bool writesCache = false; ///< It scatters `box` into the paged cache.
  /// A layer of the server's forward pass (Request::forwardTokens), not
  /// the restore's.
  bool forward = false;
};

/// A plan timed by the simulator.
struct Evaluation {
  Plan plan;
  double seconds = 0; ///< Simulated makespan of the restore.
  /// When the server's forward pass over Request::forwardTokens ends, or
  /// `seconds` without one: what the search minimizes.
  double firstTokenSeconds = 0;
  double estimate = 0; ///< Analytic estimate the search ranked it by.
  std::vector<std::string> resources;
  std::vector<double> busy; ///< Per resource, busy seconds per lane.
  double bytesRead = 0;
  double flops = 0;
  int64_t peakStagingBytes = 0;
  int jobs = 0; ///< Simulated jobs.
  /// Per layer, when its last chunk is in the paged cache.
  std::vector<double> layerReadySeconds;
};

/// A point of the search space.
struct Candidate {
  int64_t merge = 0;   ///< m, in chunks: tokens [0, m*chunk) are computed.
  int64_t split = 0;   ///< k: layers [0, k) use `lower`, [k, L) use `upper`.
  Method lower = Method::Compute;
  int lowerSource = -1;
  Method upper = Method::LoadHidden;
  int upperSource = -1;
};

class Planner {
public:
  Planner(const CostModel &cost, Request request, PlanOptions options = {});

  /// Checks the request against the model and target: tiers exist, sources
  /// hold the whole request's tokens and lie inside the model.
  Status validate() const;

  const CostModel &cost() const { return cost_; }
  const Request &request() const { return request_; }
  int64_t chunkTokens() const { return chunk_; }
  int64_t numChunks() const { return numChunks_; }
  /// Layers per load chunk, in whole stored objects: as many as keep a
  /// chunk's staging within a quarter of the budget (four chunks in
  /// flight), or layer-wise 1/kMaxLoadSteps of the layers. (Not the
  /// store's layer group, the layers of one stored object, whose multiple
  /// it is.)
  int64_t loadLayers() const { return loadLayers_; }
  const PlanOptions &options() const { return options_; }

  /// `plan`'s chunks in the order they are simulated and expanded
  /// (orderChunks: layer-wise or token-major, as the options say), so that
  /// every chunk's dependencies come before it.
  std::vector<Chunk> chunks(const Plan &plan) const;
  /// The job graph of `plan` (and what each job is, when `info` is given).
  JobGraph buildJobs(const Plan &plan,
                     std::vector<JobInfo> *info = nullptr) const;
  /// Times `plan` with the simulator.
  Evaluation evaluate(const Plan &plan) const;

  Plan makePlan(const Candidate &candidate) const;
  /// The analytic estimate of `candidate`; `fill` receives its pipeline-fill
  /// part, the part the estimate is least sure of.
  double estimate(const Candidate &candidate, double *fill = nullptr) const;

  /// Baselines; null when the request stores nothing of that kind.
  Evaluation computeOnly() const;
  std::optional<Evaluation> kvOnly() const;
  std::optional<Evaluation> hiddenOnly() const;
  /// Cake: compute the front, load KV for the back (k = 0), best m.
  std::optional<Evaluation> cake() const;
  /// HCache: hidden states for layers [k, L), the complement for [0, k).
  std::optional<Evaluation> hcache() const;
  /// Every baseline that applies, in the order above.
  std::vector<Evaluation> baselines() const;
  /// The joint plan: never slower than any baseline (by firstTokenSeconds).
  Evaluation joint() const;
  /// The plan of `strategy`: one of the above; none where the request
  /// stores nothing the strategy loads.
  std::optional<Evaluation> plan(Strategy strategy) const;
  /// Calls of plan() in this process, by every planner: what a test counts
  /// to hold that a plan chosen once is not searched for again.
  static int64_t plansMade();
  /// The best point of the space by simulating all of it (for tests).
  Evaluation exhaustive() const;
  /// The analytic part of the joint search alone: the point of the whole
  /// space with the lowest estimate.
  Candidate bestEstimate() const;

private:
  using Filter = bool (*)(const Candidate &);
  /// Calls `fn` on every candidate the sources allow that passes `filter`.
  template <typename Fn> void forEachCandidate(Filter filter, Fn fn) const;
  /// Every candidate the request's sources allow that passes `filter`.
  std::vector<Candidate> enumerate(Filter filter) const;
  /// Ranks by estimate, simulates the best, refines locally in (m, k).
  std::optional<Evaluation> search(Filter filter, const char *strategy) const;
  bool usable(int source, Form form, int64_t l0, int64_t l1) const;
  /// Adds the server's forward pass to `graph`, whose `jobs` are the
  /// restore's: a layer's job on `compute` after the restore's writes of
  /// it and the previous layer's.
  void addForward(JobGraph &graph, std::vector<JobInfo> &jobs,
                  int compute) const;
  Evaluation evaluateCandidate(const Candidate &candidate,
                               const char *strategy) const;

  const CostModel &cost_;
  Request request_;
  PlanOptions options_;
  int64_t chunk_ = 0;
  int64_t numChunks_ = 0;
  int64_t loadLayers_ = 1;
  /// Seconds to recompute chunks [0, i) through one layer.
  std::vector<double> computePrefix_;
  /// Seconds of one layer of the server's forward pass (0 without one).
  double forwardLayer_ = 0;
  /// Per source: whether it may be loaded at all, and the seconds each
  /// resource spends per token x layer loading it (all are linear in both).
  struct LoadCost {
    bool ok = false;
    int tier = 0; ///< Index into the target's tiers.
    double fetch = 0, decode = 0, copy = 0, device = 0;
    double fetchLatency = 0, copyLatency = 0; ///< Per chunk.
  };
  std::vector<LoadCost> loadCosts_;
};

} // namespace kvc::planning

#endif // KVC_PLANNING_PLANNER_H
