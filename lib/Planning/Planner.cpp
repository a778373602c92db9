//===- Planner.cpp - Choosing how to restore a request's KV ---------------===//

#include "kvc/Planning/Planner.h"

#include "kvc/Planning/Pipeline.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace kvc::planning {

namespace {
/// Smallest power of two >= `value`.
int64_t powerOfTwoAtLeast(double value) {
  int64_t p = 1;
  while (double(p) < value)
    p *= 2;
  return p;
}

/// Largest number of chunks the merge-point grid has.
constexpr int64_t kMaxChunks = 64;

Form formOf(Method method) {
  return method == Method::LoadKV ? Form::KV : Form::Hidden;
}
} // namespace

Planner::Planner(const CostModel &cost, Request request, PlanOptions options)
    : cost_(cost), request_(std::move(request)), options_(options) {
  int64_t tokens = std::max<int64_t>(request_.tokens, 1);
  if (options_.chunkTokens > 0) {
    chunk_ = options_.chunkTokens;
  } else {
    // Chunks large enough for efficient GEMMs (4x the half-efficiency
    // size), and few enough to keep the grid at kMaxChunks.
    chunk_ = std::clamp<int64_t>(
        powerOfTwoAtLeast(4 * cost_.target().compute.gemmHalfTokens), 256,
        2048);
    while ((tokens + chunk_ - 1) / chunk_ > kMaxChunks)
      chunk_ *= 2;
  }
  // Chunks of whole stored objects: every load then starts and ends where
  // objects do (a finer chunk would read its objects more than once).
  int64_t tokenObjects = 1;
  for (const Source &source : request_.sources)
    tokenObjects =
        std::lcm(tokenObjects, std::max<int64_t>(source.tokenGroup, 1));
  chunk_ = (chunk_ + tokenObjects - 1) / tokenObjects * tokenObjects;
  numChunks_ = (tokens + chunk_ - 1) / chunk_;
  const ModelConfig &model = cost_.model();
  double perLayer = 2.0 * double(chunk_) *
                    double(std::max(model.kvBytesPerTokenLayer(),
                                    model.hiddenBytesPerTokenLayer()));
  loadLayers_ = std::clamp<int64_t>(
      int64_t(double(options_.stagingBytes()) / 4.0 / perLayer), 1,
      std::max<int64_t>(model.numLayers, 1));
  // Loads move whole stored objects: a multiple of every source's group.
  int64_t objects = 1;
  for (const Source &source : request_.sources)
    objects = std::lcm(objects, std::max<int64_t>(source.layerGroup, 1));
  const int64_t layers = std::max<int64_t>(model.numLayers, 1);
  if (options_.layerWise)
    loadLayers_ = (layers + PlanOptions::kMaxLoadSteps - 1) /
                  PlanOptions::kMaxLoadSteps;
  loadLayers_ =
      std::min((loadLayers_ + objects - 1) / objects * objects, layers);

  const TargetDesc &target = cost_.target();
  for (const Source &source : request_.sources) {
    LoadCost c;
    const TierDesc *tier = target.findTier(source.tier);
    c.ok =
        tier && source.box.t0 <= 0 && source.box.t1 >= request_.tokens &&
        cost_.profile().allows(source.codec, request_.maxError, request_.maxKl);
    if (tier) {
      c.tier = int(tier - target.tiers.data());
      double stored = cost_.storedBytes(source.form, source.codec, 1, 1);
      double quantized = cost_.quantizedBytes(source.form, source.codec, 1, 1);
      c.fetch = stored / (CostModel::readGBs(*tier) * 1e9);
      c.fetchLatency = tier->latencyUs * 1e-6 / double(tier->lanes);
      const ChunkState loaded{source.form, source.codec, false, true,
                              source.form == Form::KV};
      if (checksAsRead(cost_, loaded, tier)) {
        // Read into the cache and checked by the lane that read it: a
        // lane's read with its check, over the lanes as `fetch` is.
        const double lane =
            cost_.readCheckedSeconds(*tier, stored) - tier->latencyUs * 1e-6;
        c.fetch = lane / double(tier->lanes);
        c.copy = c.copyLatency = 0;
      } else if (writesCacheRows(cost_, loaded)) {
        // Read whole, or decoded into the cache: nothing uploaded (a raw
        // chunk is checked and copied there).
        c.copy = source.codec.isRaw() ? cost_.uploadCheckSeconds(stored) : 0;
        c.copyLatency = 0;
      } else {
        c.copy = quantized / (target.link.h2dGBs * 1e9);
        c.copyLatency = target.link.latencyUs * 1e-6;
      }
      // Host decoding and the device steps are linear in tokens x layers
      // (projection at the GEMM rate of a chunk's rows): their steps' costs
      // over one chunk of one layer, per token.
      const Box unit{0, chunk_, 0, 1};
      for (const PipelineStep &step :
           restoreSteps(source.form, source.codec, /*toCache=*/true)) {
        Resource resource = stepResource(step);
        if (resource != Resource::Decode && resource != Resource::Compute)
          continue;
        StepCost sc = stepCost(cost_, step, unit, tier);
        (resource == Resource::Decode ? c.decode : c.device) +=
            sc.seconds / double(chunk_);
      }
    }
    loadCosts_.push_back(c);
  }
  if (request_.forwardTokens > 0)
    forwardLayer_ = cost_.prefillSeconds(
        request_.tokens, request_.tokens + request_.forwardTokens, 1);
  computePrefix_.assign(numChunks_ + 1, 0.0);
  for (int64_t i = 0; i < numChunks_; ++i) {
    int64_t t0 = i * chunk_, t1 = std::min(tokens, t0 + chunk_);
    computePrefix_[i + 1] =
        computePrefix_[i] +
        cost_.prefillSeconds(t0, t1, 1);
  }
}

Status Planner::validate() const {
  const ModelConfig &model = cost_.model();
  if (request_.tokens <= 0)
    return invalidArgument("the request restores no tokens");
  if (request_.tokens > model.maxPositions)
    return invalidArgument("the request's " + std::to_string(request_.tokens) +
                           " tokens exceed the model's context of " +
                           std::to_string(model.maxPositions));
  if (request_.forwardTokens < 0 ||
      request_.tokens + request_.forwardTokens > model.maxPositions)
    return invalidArgument(
        "a forward pass of " + std::to_string(request_.forwardTokens) +
        " tokens after the request's " + std::to_string(request_.tokens) +
        " does not fit the model's context of " +
        std::to_string(model.maxPositions));
  for (size_t i = 0; i < request_.sources.size(); ++i) {
    const Source &s = request_.sources[i];
    std::string name = "source " + std::to_string(i) + " (" +
                       kvc::name(s.form) + " in \"" + s.tier + "\")";
    if (!cost_.target().findTier(s.tier))
      return invalidArgument(name + ": target \"" + cost_.target().name +
                             "\" has no tier \"" + s.tier + "\"");
    if (s.box.l0 < 0 || s.box.l1 > model.numLayers || s.box.empty())
      return invalidArgument(name + ": layers " + std::to_string(s.box.l0) +
                             " to " + std::to_string(s.box.l1) +
                             " are not layers of the model");
    if (s.box.t0 > 0 || s.box.t1 < request_.tokens)
      return invalidArgument(
          name + " holds tokens " + std::to_string(s.box.t0) + " to " +
          std::to_string(s.box.t1) + ", which do not cover the request's 0 to " +
          std::to_string(request_.tokens));
  }
  return Status::ok();
}

bool Planner::usable(int source, Form form, int64_t l0, int64_t l1) const {
  const Source &s = request_.sources[source];
  // Layers [l0, l1) must be whole stored objects (the model's last group
  // may be short): a load of part of one would read all of it.
  const int64_t group = std::max<int64_t>(s.layerGroup, 1);
  bool whole = l0 % group == 0 &&
               (l1 % group == 0 || l1 == cost_.model().numLayers);
  return loadCosts_[source].ok && s.form == form && s.box.l0 <= l0 &&
         l1 <= s.box.l1 && whole;
}

//===----------------------------------------------------------------------===//
// Candidates
//===----------------------------------------------------------------------===//

Plan Planner::makePlan(const Candidate &c) const {
  Plan plan;
  const int64_t tokens = request_.tokens, layers = cost_.model().numLayers;
  const int64_t merge = std::min(tokens, c.merge * chunk_);
  if (merge > 0)
    plan.segments.push_back({Method::Compute, Box{0, merge, 0, layers}, -1});
  if (merge < tokens) {
    if (c.split > 0)
      plan.segments.push_back(
          {c.lower, Box{merge, tokens, 0, c.split}, c.lowerSource});
    if (c.split < layers)
      plan.segments.push_back(
          {c.upper, Box{merge, tokens, c.split, layers}, c.upperSource});
  }
  return plan;
}

double Planner::estimate(const Candidate &c, double *fillOut) const {
  const int64_t tokens = request_.tokens, layers = cost_.model().numLayers;
  const int64_t m = std::min(c.merge, numChunks_);
  const double rest = double(tokens - std::min(tokens, m * chunk_));
  const double blocks = double(numChunks_ - m);
  double compute = computePrefix_[m] * double(layers);
  double decode = 0, copy = 0, fill = 0;
  // IO seconds per tier; a request reads at most two sources.
  int tiers[2] = {-1, -1};
  double io[2] = {0, 0};

  auto addLoad = [&](int source, int64_t numLayers) {
    const LoadCost &lc = loadCosts_[source];
    double chunks =
        blocks * double((numLayers + loadLayers_ - 1) / loadLayers_);
    double volume = rest * double(numLayers);
    // Chunks spread over the tier's lanes; fewer chunks than lanes leave
    // lanes idle.
    double lanes = double(cost_.target().tiers[lc.tier].lanes);
    double perFetch =
        lc.fetchLatency * lanes + volume * lc.fetch * lanes / chunks;
    double fetch = std::ceil(chunks / lanes) * perFetch;
    double dec = volume * lc.decode;
    double cp = chunks * lc.copyLatency + volume * lc.copy;
    double dev = volume * lc.device;
    int slot = tiers[0] < 0 || tiers[0] == lc.tier ? 0 : 1;
    tiers[slot] = lc.tier;
    io[slot] += fetch;
    decode += dec;
    copy += cp;
    compute += dev;
    // Pipeline fill: one chunk passes every stage but the bottleneck alone.
    double stages[] = {perFetch, dec / chunks, cp / chunks, dev / chunks};
    double sum = stages[0] + stages[1] + stages[2] + stages[3];
    double peak = std::max({stages[0], stages[1], stages[2], stages[3]});
    fill = std::max(fill, sum - peak);
  };

  if (rest > 0) {
    if (c.split > 0) {
      if (c.lower == Method::Compute)
        compute += (computePrefix_[numChunks_] - computePrefix_[m]) *
                   double(c.split);
      else
        addLoad(c.lowerSource, c.split);
    }
    if (c.split < layers)
      addLoad(c.upperSource, layers - c.split);
  }
  if (fillOut)
    *fillOut = fill;
  const double loads = std::max({decode, copy, io[0], io[1]});
  const double restore = std::max(compute, loads);
  if (forwardLayer_ <= 0)
    return restore + fill;
  // The server's forward pass ends no sooner than the compute it shares
  // runs both, than the layers the loads complete last run after them
  // (token-major every loaded layer, layer-wise the last group), or than
  // every layer runs after the computed ones complete.
  const double forward = forwardLayer_ * double(layers);
  int64_t loaded = 0;
  bool computed = m > 0;
  if (rest > 0) {
    if (c.split > 0 && c.lower == Method::Compute)
      computed = true;
    else if (c.split > 0)
      loaded += c.split;
    if (c.split < layers)
      loaded += layers - c.split;
  }
  const int64_t tail =
      options_.layerWise ? std::min(loadLayers_, loaded) : loaded;
  double end = compute + forward;
  if (loaded > 0)
    end = std::max(end, restore + double(tail) * forwardLayer_);
  if (computed)
    end = std::max(end, std::min(compute, restore) + forward);
  return end + fill;
}

template <typename Fn>
void Planner::forEachCandidate(Filter filter, Fn fn) const {
  const int64_t layers = cost_.model().numLayers;
  const int numSources = static_cast<int>(request_.sources.size());
  auto consider = [&](const Candidate &c) {
    if (filter(c))
      fn(c);
  };
  // m = n: compute everything.
  consider(Candidate{numChunks_, 0, Method::Compute, -1, Method::Compute, -1});
  for (int64_t m = 0; m < numChunks_; ++m) {
    for (int64_t k = 0; k <= layers; ++k) {
      // Lower part [0, k): compute or a KV source (nothing when k == 0; and
      // computing all L layers is the m = n point).
      auto forEachLower = [&](auto &&body) {
        if (k == 0 || k < layers)
          body(Method::Compute, -1);
        if (k > 0)
          for (int s = 0; s < numSources; ++s)
            if (usable(s, Form::KV, 0, k))
              body(Method::LoadKV, s);
      };
      // Upper part [k, L): a hidden or KV source (nothing when k == L).
      auto forEachUpper = [&](auto &&body) {
        if (k == layers) {
          body(Method::Compute, -1);
          return;
        }
        for (int s = 0; s < numSources; ++s) {
          if (usable(s, Form::Hidden, k, layers))
            body(Method::LoadHidden, s);
          if (usable(s, Form::KV, k, layers))
            body(Method::LoadKV, s);
        }
      };
      forEachLower([&](Method lower, int ls) {
        forEachUpper([&](Method upper, int us) {
          // KV from one source on both sides is the k = 0 point.
          if (k > 0 && lower == Method::LoadKV && upper == Method::LoadKV &&
              ls == us)
            return;
          consider(Candidate{m, k, lower, ls, upper, us});
        });
      });
    }
  }
}

std::vector<Candidate> Planner::enumerate(Filter filter) const {
  std::vector<Candidate> out;
  forEachCandidate(filter, [&](const Candidate &c) { out.push_back(c); });
  return out;
}

//===----------------------------------------------------------------------===//
// Search
//===----------------------------------------------------------------------===//

std::optional<Evaluation> Planner::search(Filter filter,
                                          const char *strategy) const {
  // Seeds: the best estimates overall, and the best of every structure
  // (methods and sources, and whether m is 0, interior or n), so that an
  // estimate error in one structure cannot hide another.
  auto structure = [&](const Candidate &c) {
    int mClass = c.merge == 0 ? 0 : c.merge == numChunks_ ? 2 : 1;
    return std::make_tuple(mClass, int(c.lower), c.lowerSource, int(c.upper),
                           c.upperSource);
  };
  std::vector<std::pair<double, Candidate>> top;
  std::map<decltype(structure(Candidate{})), std::pair<double, Candidate>>
      perStructure;
  const size_t keep = std::max(1, options_.candidates);
  forEachCandidate(filter, [&](const Candidate &c) {
    double e = estimate(c);
    auto [it, inserted] = perStructure.try_emplace(structure(c), e, c);
    if (!inserted && e < it->second.first)
      it->second = {e, c};
    if (top.size() < keep || e < top.back().first) {
      top.insert(std::upper_bound(top.begin(), top.end(), e,
                                  [](double v, const auto &p) {
                                    return v < p.first;
                                  }),
                 {e, c});
      if (top.size() > keep)
        top.pop_back();
    }
  });
  if (top.empty())
    return std::nullopt;

  auto key = [](const Candidate &c) {
    return std::make_tuple(c.merge, c.split, int(c.lower), c.lowerSource,
                           int(c.upper), c.upperSource);
  };
  // Simulated points, and a budget of simulations that follows how unsure
  // the estimates are: the pipeline fill is what they approximate, so when
  // it is a sliver of the restore time (long requests, costly to simulate)
  // a few simulations suffice, and short requests (cheap) get many.
  std::map<decltype(key(Candidate{})), double> seconds;
  std::optional<Evaluation> best;
  double fill = 0, bestEstimate = estimate(top.front().second, &fill);
  double unsure = bestEstimate > 0 ? fill / bestEstimate : 1.0;
  int64_t simulations =
      std::clamp<int64_t>(int64_t(8 + 1000 * unsure), 8, 400);
  int64_t jobBudget = 0; // Set from the first simulation's size.
  auto simulateOnce = [&](const Candidate &c) -> double {
    auto it = seconds.find(key(c));
    if (it != seconds.end())
      return it->second;
    Evaluation e = evaluateCandidate(c, strategy);
    if (seconds.empty())
      jobBudget = simulations * int64_t(e.jobs);
    jobBudget -= e.jobs;
    seconds[key(c)] = e.firstTokenSeconds;
    double result = e.firstTokenSeconds;
    if (!best || e.firstTokenSeconds < best->firstTokenSeconds)
      best = std::move(e);
    return result;
  };
  for (const auto &[e, c] : top)
    simulateOnce(c);
  // Other structures only when their estimate is within the estimates' own
  // uncertainty of the best.
  double margin = 1.0 + std::max(0.02, 4.0 * unsure);
  for (const auto &[s, entry] : perStructure)
    if (entry.first <= bestEstimate * margin)
      simulateOnce(entry.second);

  const int64_t layers = cost_.model().numLayers;
  // Normalizes `n` into `out`: no lower part at k = 0, no upper part at
  // k = L, nothing but compute at m = n. False when it is not a point of
  // the space.
  auto valid = [&](Candidate n, Candidate &out) {
    if (n.merge < 0 || n.merge > numChunks_ || n.split < 0 ||
        n.split > layers)
      return false;
    if (n.split == 0)
      n.lower = Method::Compute, n.lowerSource = -1;
    if (n.split == layers)
      n.upper = Method::Compute, n.upperSource = -1;
    if (n.merge == numChunks_)
      n = Candidate{numChunks_, 0, Method::Compute, -1, Method::Compute, -1};
    if (n.merge < numChunks_) {
      if (n.split > 0 && n.lower != Method::Compute &&
          !usable(n.lowerSource, Form::KV, 0, n.split))
        return false;
      if (n.split < layers &&
          (n.upper == Method::Compute ||
           !usable(n.upperSource, formOf(n.upper), n.split, layers)))
        return false;
      if (n.split == layers && n.lower == Method::Compute)
        return false;
    }
    if (!filter(n))
      return false;
    out = n;
    return true;
  };

  // Coordinate descent by simulation from each seed, best first, while the
  // budget lasts: scan k, then
  // m, then m along the ridge where compute and IO balance (k re-chosen by
  // estimate for each m), each coarsely (eight strides) and then finely
  // around the best stride.
  std::vector<std::pair<double, Candidate>> ranked;
  for (const auto &[k, v] : seconds)
    ranked.push_back({v, Candidate{std::get<0>(k), std::get<1>(k),
                                   Method(std::get<2>(k)), std::get<3>(k),
                                   Method(std::get<4>(k)), std::get<5>(k)}});
  std::sort(ranked.begin(), ranked.end(),
            [](const auto &a, const auto &b) { return a.first < b.first; });
  for (size_t start = 0; start < ranked.size() && jobBudget > 0; ++start) {
    Candidate center = ranked[start].second;
    double centerSeconds = ranked[start].first;
    for (int round = 0; round < 3 && jobBudget > 0; ++round) {
      bool improved = false;
      for (int axis = 0; axis < 3 && jobBudget > 0; ++axis) {
        int64_t limit = axis == 0 ? layers : numChunks_;
        int64_t stride = std::max<int64_t>(1, (limit + 1) / 8);
        auto at = [&](int64_t v, Candidate &out) {
          Candidate n = center;
          (axis == 0 ? n.split : n.merge) = v;
          if (axis < 2)
            return valid(n, out);
          bool found = false;
          double bestEstimate = 0;
          for (int64_t k = 0; k <= layers; ++k) {
            Candidate r = n, normalized;
            r.split = k;
            if (!valid(r, normalized))
              continue;
            double e = estimate(normalized);
            if (!found || e < bestEstimate)
              found = true, bestEstimate = e, out = normalized;
          }
          return found;
        };
        auto scan = [&](int64_t lo, int64_t hi, int64_t step) {
          for (int64_t v = lo; v <= hi && jobBudget > 0; v += step) {
            Candidate n;
            if (!at(v, n))
              continue;
            double t = simulateOnce(n);
            if (t < centerSeconds) {
              centerSeconds = t;
              center = n;
              improved = true;
            }
          }
        };
        scan(0, limit, stride);
        int64_t v = axis == 0 ? center.split : center.merge;
        if (center.merge == numChunks_ && axis > 0)
          v = numChunks_;
        scan(std::max<int64_t>(0, v - stride + 1),
             std::min(limit, v + stride - 1), 1);
      }
      if (!improved)
        break;
    }
  }
  return best;
}

Evaluation Planner::computeOnly() const {
  return evaluateCandidate(
      Candidate{numChunks_, 0, Method::Compute, -1, Method::Compute, -1},
      "compute");
}

std::optional<Evaluation> Planner::kvOnly() const {
  return search(
      [](const Candidate &c) {
        return c.merge == 0 && c.split == 0 && c.upper == Method::LoadKV;
      },
      "kv");
}

std::optional<Evaluation> Planner::hiddenOnly() const {
  return search(
      [](const Candidate &c) {
        return c.merge == 0 && c.split == 0 && c.upper == Method::LoadHidden;
      },
      "hidden");
}

std::optional<Evaluation> Planner::cake() const {
  bool anyKV = false;
  for (int s = 0; s < int(request_.sources.size()); ++s)
    anyKV |= usable(s, Form::KV, 0, cost_.model().numLayers);
  if (!anyKV)
    return std::nullopt;
  return search(
      [](const Candidate &c) {
        // Cake falls back to computing everything (m = n) when loading
        // does not pay.
        return c.split == 0 &&
               (c.upper == Method::LoadKV || c.upper == Method::Compute);
      },
      "cake");
}

std::optional<Evaluation> Planner::hcache() const {
  return search(
      [](const Candidate &c) {
        return c.merge == 0 && c.upper == Method::LoadHidden;
      },
      "hcache");
}

namespace {
std::atomic<int64_t> plansMadeInProcess{0};
} // namespace

int64_t Planner::plansMade() { return plansMadeInProcess.load(); }

std::optional<Evaluation> Planner::plan(Strategy strategy) const {
  plansMadeInProcess.fetch_add(1, std::memory_order_relaxed);
  switch (strategy) {
  case Strategy::Compute:
    return computeOnly();
  case Strategy::Kv:
    return kvOnly();
  case Strategy::Hidden:
    return hiddenOnly();
  case Strategy::Cake:
    return cake();
  case Strategy::HCache:
    return hcache();
  case Strategy::Joint:
    return joint();
  }
  return std::nullopt;
}

std::vector<Evaluation> Planner::baselines() const {
  std::vector<Evaluation> out;
  for (Strategy strategy : allStrategies())
    if (strategyIsBaseline(strategy))
      if (std::optional<Evaluation> e = plan(strategy))
        out.push_back(std::move(*e));
  return out;
}

Evaluation Planner::joint() const {
  Evaluation best = *search([](const Candidate &) { return true; }, "joint");
  for (Evaluation &baseline : baselines())
    if (baseline.firstTokenSeconds < best.firstTokenSeconds) {
      best = std::move(baseline);
      best.plan.strategy = "joint";
    }
  return best;
}

Candidate Planner::bestEstimate() const {
  Candidate best{numChunks_, 0, Method::Compute, -1, Method::Compute, -1};
  double bestSeconds = estimate(best);
  forEachCandidate([](const Candidate &) { return true; },
                   [&](const Candidate &c) {
                     double seconds = estimate(c);
                     if (seconds < bestSeconds) {
                       bestSeconds = seconds;
                       best = c;
                     }
                   });
  return best;
}

Evaluation Planner::exhaustive() const {
  std::optional<Evaluation> best;
  for (const Candidate &c : enumerate([](const Candidate &) { return true; })) {
    Evaluation e = evaluateCandidate(c, "exhaustive");
    if (!best || e.firstTokenSeconds < best->firstTokenSeconds)
      best = std::move(e);
  }
  return *best;
}

} // namespace kvc::planning
