//===- ConnectorDecide.cpp - Lookups, prices, plans and decisions ---------===//
//
// What the stores hold of a request (from the local index, else asked),
// what loading each candidate prefix costs (the planner, once per shape),
// the plan of the cheapest compiled once per shape, and the decision.
//
//===----------------------------------------------------------------------===//

#include "ConnectorState.h"

namespace kvc::host {

namespace {

/// decide prices loads of all a holding holds and, for the strategies that
/// only load, of its first 1/k .. (k-1)/k.
constexpr int64_t kLoadFractions = 8;

} // namespace

//===----------------------------------------------------------------------===//
// Prices and plans
//===----------------------------------------------------------------------===//

StatusOr<double> Connector::State::computePrice(int64_t tokens) {
  if (tokens <= 0)
    return 0.0;
  auto it = computeSeconds.find(tokens);
  if (it != computeSeconds.end())
    return it->second;
  planning::Request request;
  request.tokens = tokens;
  planning::PlanOptions planOptions;
  planOptions.chunkTokens = options.saveLayout.chunkTokens;
  planning::Planner planner(*cost, request, planOptions);
  KVC_RETURN_IF_ERROR(planner.validate());
  const double seconds = planner.computeOnly().seconds;
  computeSeconds[tokens] = seconds;
  return seconds;
}

StatusOr<Priced> Connector::State::price(
    const planning::Request &request, int64_t chunkTokens,
    const std::vector<planning::Strategy> &strategies) const {
  planning::PlanOptions planOptions = options.plans;
  planOptions.chunkTokens = chunkTokens;
  planOptions.layerWise = true;
  planning::Planner planner(*cost, request, planOptions);
  KVC_RETURN_IF_ERROR(planner.validate());
  Priced best;
  for (planning::Strategy strategy : strategies) {
    std::optional<planning::Evaluation> evaluation = planner.plan(strategy);
    if (evaluation && evaluation->firstTokenSeconds < best.seconds)
      best = {
          strategy, evaluation->firstTokenSeconds,
          std::make_shared<const planning::Evaluation>(std::move(*evaluation))};
  }
  return best;
}

std::shared_ptr<const CompiledPlan>
Connector::State::cachedPlan(const PlanShape &shape) {
  const std::shared_ptr<const CompiledPlan> *kept = plans.find(shape);
  if (!kept)
    return nullptr;
  ++hits;
  return *kept;
}

StatusOr<std::shared_ptr<const CompiledPlan>> Connector::State::compilePlan(
    const planning::Request &request, int64_t chunkTokens,
    planning::Strategy strategy,
    std::shared_ptr<const planning::Evaluation> chosen) const {
  PlanOptions planOptions = options.plans;
  planOptions.strategies = {strategy};
  planOptions.chunkTokens = chunkTokens;
  planOptions.layerWise = true;
  planOptions.forwardTokens = request.forwardTokens;
  std::optional<PricedPlan> given;
  if (chosen)
    given = PricedPlan{cost, strategy, std::move(chosen)};
  KVC_ASSIGN_OR_RETURN(bundle,
                       options.planner(*options.model, target, request,
                                       planOptions, given ? &*given : nullptr));
  const std::string name = planning::strategyName(strategy);
  auto compiledPlan = std::make_shared<CompiledPlan>();
  compiledPlan->bundle = std::make_shared<PlanBundle>(std::move(bundle));
  for (const BundlePlan &plan : compiledPlan->bundle->plans)
    if (plan.name == name && !compiledPlan->plan)
      compiledPlan->plan = &plan;
  if (!compiledPlan->plan && compiledPlan->bundle->plans.size() == 1)
    compiledPlan->plan = &compiledPlan->bundle->plans.front();
  if (!compiledPlan->plan)
    return failedPrecondition("connector: the planner returned no plan " +
                              name + " for " + std::to_string(request.tokens) +
                              " tokens");
  return std::shared_ptr<const CompiledPlan>(std::move(compiledPlan));
}

std::shared_ptr<const CompiledPlan>
Connector::State::keepPlan(const PlanShape &shape,
                           std::shared_ptr<const CompiledPlan> plan) {
  if (std::shared_ptr<const CompiledPlan> kept = cachedPlan(shape))
    return kept;
  ++compiled;
  return plans.insert(shape, std::move(plan));
}

StatusOr<std::shared_ptr<const CompiledPlan>>
Connector::State::planFor(std::unique_lock<std::mutex> &lock,
                          const PlanShape &shape,
                          const planning::Request &request, int64_t chunkTokens,
                          planning::Strategy strategy,
                          std::shared_ptr<const planning::Evaluation> chosen) {
  if (std::shared_ptr<const CompiledPlan> kept = cachedPlan(shape))
    return kept;
  lock.unlock();
  StatusOr<std::shared_ptr<const CompiledPlan>> plan =
      compilePlan(request, chunkTokens, strategy, std::move(chosen));
  lock.lock();
  if (!plan.isOk())
    return plan.status();
  return keepPlan(shape, std::move(*plan));
}

StatusOr<Priced> Connector::State::priceFor(std::unique_lock<std::mutex> &lock,
                                            const PlanShape &shape,
                                            const planning::Request &request) {
  if (const Priced *cached = prices.find(shape))
    return *cached;
  lock.unlock();
  StatusOr<Priced> priced = price(request, shape.chunkTokens, shape.strategies);
  lock.lock();
  if (!priced.isOk())
    return priced.status();
  return prices.insert(shape, std::move(*priced));
}

Lookup::Held Connector::State::answering(ChunkStore &store, int s,
                                         const std::vector<int32_t> &tokens,
                                         const PrefixMatch &match) {
  Lookup::Held held{s, store.layout(), match, match.tokens, 0};
  Tier &tier = store.tier();
  if (match.tokens <= 0 || !tier.partlyDown())
    return held;
  for (const ChunkRef &ref :
       store.refs(tokens.data(), match.tokens, match.form, match.codec))
    if (!tier.answers(ref.name())) {
      held.answering = std::min(held.answering, ref.tokenBegin);
      held.unreachableEnd = std::max(held.unreachableEnd, ref.tokenEnd);
    }
  return held;
}

StatusOr<Lookup>
Connector::State::lookupLocked(const std::vector<int32_t> &tokens) {
  Lookup out;
  const int64_t n = int64_t(tokens.size());
  // From the index: per store and layout, each holding that starts at
  // chunk 0, as far as it goes.
  bool whole = false;
  std::map<int64_t, std::vector<uint64_t>> keysByChunk;
  for (std::size_t s = 0; s < stores.size(); ++s)
    for (std::size_t l = 0; l < stores[s].layouts.size(); ++l) {
      const int64_t ct = stores[s].layouts[l]->layout().chunkTokens;
      auto [it, inserted] = keysByChunk.try_emplace(ct);
      if (inserted)
        it->second = PrefixIndex::keys(tokens, ct, seed);
      const std::vector<uint64_t> &keys = it->second;
      if (keys.empty())
        continue;
      const std::vector<HeldChunk> *first = index.find(keys.front());
      if (!first)
        continue;
      for (const HeldChunk &held : *first) {
        if (held.store != int(s) || held.layout != int(l))
          continue;
        std::size_t run = 1;
        while (run < keys.size()) {
          const std::vector<HeldChunk> *next = index.find(keys[run]);
          if (!next ||
              std::find(next->begin(), next->end(), held) == next->end())
            break;
          ++run;
        }
        out.held.push_back(
            answering(*stores[s].layouts[l], int(s), tokens,
                      {held.form, int64_t(run) * ct, held.codec}));
        // Every whole chunk, or as far as the stores held lately.
        whole |= run == keys.size() || recentMiss(keys[run]);
      }
    }
  if (whole) {
    out.fromIndex = true;
  } else {
    out.held.clear();
    std::map<int64_t, int64_t> reach; // Per chunk size, chunks held.
    for (std::size_t s = 0; s < stores.size(); ++s)
      for (std::size_t l = 0; l < stores[s].layouts.size(); ++l) {
        ChunkStore &store = *stores[s].layouts[l];
        const int64_t ct = store.layout().chunkTokens;
        for (Form form : {Form::KV, Form::Hidden}) {
          StatusOr<std::vector<StoredExtent>> extents =
              store.stored(tokens.data(), n, form);
          if (!extents)
            continue; // An unreachable store holds nothing for now.
          for (const StoredExtent &extent : *extents) {
            if (extent.tokens <= 0)
              continue;
            out.held.push_back(answering(store, int(s), tokens,
                                         {form, extent.tokens, extent.codec}));
            const std::vector<uint64_t> &keys = keysByChunk[ct];
            for (int64_t c = 0; c < extent.tokens / ct; ++c)
              index.add(keys[c], {int(s), int(l), form, extent.codec});
            reach[ct] = std::max(reach[ct], extent.tokens / ct);
          }
        }
      }
    const Clock::time_point now = Clock::now();
    if (misses.size() >= (std::size_t(1) << 16))
      misses.clear();
    for (const auto &[ct, keys] : keysByChunk)
      if (reach[ct] < int64_t(keys.size()))
        misses[keys[reach[ct]]] = now;
  }
  for (const Lookup::Held &held : out.held)
    out.tokens = std::max(out.tokens, std::min(held.match.tokens, n));
  return out;
}

Connector::State::Candidate
Connector::State::candidate(const Lookup &found, const Lookup::Held &held,
                            int64_t length, int64_t n, int64_t onDevice) const {
  const int64_t ct = held.layout.chunkTokens;
  Candidate out;
  out.request.tokens = length;
  out.request.maxKl = options.plans.maxKl;
  // The server's own pass: its tokens rounded up to a chunk, so that
  // requests of one shape share a plan.
  out.request.forwardTokens = (n - length + ct - 1) / ct * ct;
  // The plan restores [0, length); the server's own tokens only narrow
  // the strategies (and are skipped when it runs): requests share it.
  PlanShape &shape = out.shape;
  shape.tokens = length;
  shape.forwardTokens = out.request.forwardTokens;
  shape.server = onDevice == 0   ? PlanShape::Server::None
                 : onDevice % ct ? PlanShape::Server::InChunk
                                 : PlanShape::Server::AtChunk;
  shape.store = held.store;
  shape.chunkTokens = ct;
  shape.layerGroup = held.layout.layerGroup;
  for (const Lookup::Held &other : found.held) {
    if (other.store != held.store ||
        other.layout.chunkTokens != held.layout.chunkTokens ||
        other.layout.layerGroup != held.layout.layerGroup ||
        other.match.tokens < length)
      continue;
    planning::Source source;
    source.tier = stores[held.store].tier;
    source.form = other.match.form;
    source.codec = other.match.codec;
    source.box = {0, length, 0, options.model->config().numLayers};
    source.tokenGroup = ct;
    source.layerGroup = other.layout.layerGroup;
    out.request.sources.push_back(source);
    shape.sources.emplace_back(source.form, source.codec.str());
    out.what += std::string(out.what.empty() ? "" : ", ") + name(source.form) +
                " " + source.codec.str();
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Decisions
//===----------------------------------------------------------------------===//

StatusOr<Lookup> Connector::lookup(const std::vector<int32_t> &tokens) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->lookupLocked(tokens);
}

StatusOr<Decision> Connector::decide(const std::string &id,
                                     const std::vector<int32_t> &tokens,
                                     int64_t tokensOnDevice,
                                     std::optional<double> recomputeSeconds) {
  State &s = *state_;
  // Held but while the planner prices and compiles (priceFor, planFor).
  std::unique_lock<std::mutex> lock(s.mutex);
  const int64_t n = int64_t(tokens.size());
  KVC_RETURN_IF_ERROR(s.checkRequest(id, n, tokensOnDevice));
  if (s.target.tiers.empty())
    return failedPrecondition(
        "connector: decide prices loads for a target machine, and "
        "ConnectorOptions::target has no tiers");
  const int64_t onDevice = tokensOnDevice;
  KVC_ASSIGN_OR_RETURN(found, s.lookupLocked(tokens));
  Decision decision;
  decision.loadTokens = onDevice;
  if (recomputeSeconds) {
    decision.recomputeSeconds = *recomputeSeconds;
  } else {
    KVC_ASSIGN_OR_RETURN(all, s.computePrice(n));
    KVC_ASSIGN_OR_RETURN(resident, s.computePrice(onDevice));
    decision.recomputeSeconds = all - resident;
  }
  decision.predictedSeconds = decision.recomputeSeconds;

  // Candidates: per store and layout, each prefix length its holdings end
  // at (whole chunks, leaving the server at least one token), loaded from
  // every holding that covers it.
  struct Best {
    Priced priced;
    int64_t tokens = 0;
    int store = -1;
    StoreLayout layout;
    planning::Request request;
    PlanShape shape;
    std::string what;
  } best;
  using planning::Strategy;
  std::vector<Strategy> strategies = s.options.plans.strategies;
  if (strategies.empty())
    strategies = planning::allStrategies();
  // Only loads may follow the server's own tokens; a server prefix that
  // ends inside a chunk only loads of K and V (below).
  std::vector<Strategy> offGrid;
  if (onDevice > 0) {
    strategies.clear();
    for (Strategy strategy : planning::allStrategies())
      if (planning::strategyOnlyLoads(strategy)) {
        strategies.push_back(strategy);
        if (planning::strategyNeeds(strategy) == Form::KV)
          offGrid.push_back(strategy);
      }
  }
  bool loadable = false; // Whether any holding reaches past the server's.
  for (const Lookup::Held &held : found.held) {
    const int64_t ct = held.layout.chunkTokens;
    const int64_t whole = std::min(held.match.tokens, n - 1) / ct * ct;
    if (whole <= onDevice)
      continue;
    loadable = true;
    // A server prefix that ends inside a chunk: the chunk is loaded and
    // only its rows past the server's are written, which K and V allow
    // and hidden states (projected per chunk) do not.
    const std::vector<Strategy> &allowed =
        onDevice % ct == 0 ? strategies : offGrid;
    // All it holds, and, for the strategies that only load (the others
    // choose their own split of the tokens), shorter prefixes in eighths:
    // the server computes the rest beside the load, and where the link is
    // slow a shorter load meets its pass sooner.
    std::vector<Strategy> loadOnly;
    for (Strategy strategy : allowed)
      if (planning::strategyOnlyLoads(strategy))
        loadOnly.push_back(strategy);
    std::vector<std::pair<int64_t, const std::vector<Strategy> *>> lengths = {
        {whole, &allowed}};
    if (s.options.policy == LoadPolicy::Cheapest && !loadOnly.empty())
      for (int64_t eighth = kLoadFractions - 1; eighth > 0; --eighth) {
        const int64_t length = whole * eighth / kLoadFractions / ct * ct;
        if (length > onDevice && length < lengths.back().first)
          lengths.emplace_back(length, &loadOnly);
      }
    // Where part of the store does not answer, the load of what answers
    // before it too; a longer one recomputes the chunks it cannot read, at
    // the price of computing up to the last of them (their exact context).
    const int64_t answering = std::min(held.answering, whole) / ct * ct;
    if (answering < whole && answering > onDevice &&
        std::none_of(lengths.begin(), lengths.end(),
                     [&](const auto &l) { return l.first == answering; }))
      lengths.emplace_back(answering, &allowed);
    for (const auto &[length, tried] : lengths) {
      auto [request, shape, what] =
          s.candidate(found, held, length, n, onDevice);
      shape.strategies = *tried;
      KVC_ASSIGN_OR_RETURN(priced, s.priceFor(lock, shape, request));
      if (length > answering) {
        KVC_ASSIGN_OR_RETURN(
            recompute, s.computePrice(std::min(length, held.unreachableEnd)));
        priced.seconds += recompute;
      }
      if (priced.seconds < best.priced.seconds)
        best = {priced, length, held.store, held.layout, request, shape, what};
    }
  }

  std::shared_ptr<const CompiledPlan> plan;
  const LoadPolicy policy = s.options.policy;
  const bool loads = policy != LoadPolicy::Never && best.store >= 0 &&
                     !(policy == LoadPolicy::Cheapest &&
                       best.priced.seconds >= decision.recomputeSeconds);
  if (loads) {
    KVC_ASSIGN_OR_RETURN(compiled, s.planFor(lock, best.shape, best.request,
                                             best.layout.chunkTokens,
                                             best.priced.strategy,
                                             best.priced.evaluation));
    plan = std::move(compiled);
  }
  // The lock was let go: the request may have started loading meanwhile.
  KVC_RETURN_IF_ERROR(s.checkRequest(id, n, tokensOnDevice));
  Request &request = s.renew(id, tokens, onDevice);
  auto ms = [](double seconds) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.2f ms", seconds * 1e3);
    return std::string(text);
  };
  const std::string recompute = ms(decision.recomputeSeconds) +
                                " recomputing " + std::to_string(n - onDevice) +
                                " tokens";
  if (policy == LoadPolicy::Never) {
    decision.why = "recomputes: the connector never loads (LoadPolicy::Never)";
  } else if (best.store < 0) {
    decision.why =
        found.held.empty() ? "recomputes: the stores hold none of its prefix"
        : loadable
            ? "recomputes: no allowed strategy plans a load of what the "
              "stores hold (a quality budget, maxKl, can rule out their "
              "encodings)"
            : "recomputes: the stores hold no whole chunk past the server's "
              "own " +
                  std::to_string(onDevice) + " tokens";
  } else if (policy == LoadPolicy::Cheapest &&
             best.priced.seconds >= decision.recomputeSeconds) {
    decision.why =
        "recomputes: loading " + std::to_string(best.tokens) + " tokens by " +
        planning::strategyName(best.priced.strategy) + " is predicted at " +
        ms(best.priced.seconds) + ", not faster than " + recompute;
  } else {
    decision.loadTokens = best.tokens;
    decision.strategy = planning::strategyName(best.priced.strategy);
    decision.predictedSeconds = best.priced.seconds;
    decision.store = best.store;
    decision.layout = best.layout;
    // A plan of strategy kv or hidden loads every token it restores; the
    // others compute some of them beside the loads.
    decision.why =
        "restores " + std::to_string(best.tokens) + " of " + std::to_string(n) +
        " tokens by " + decision.strategy + " (" + best.what + " stored in " +
        s.stores[best.store].spec.url + "): first token predicted at " +
        ms(best.priced.seconds) + " against " + recompute;
    if (best.priced.seconds >= decision.recomputeSeconds)
      decision.why += ", loaded all the same (LoadPolicy::Always)";
    s.loadBy(request, std::move(plan), best.store, best.layout);
  }
  request.decision = decision;
  return decision;
}

StatusOr<Decision> Connector::decide(const std::string &id,
                                     const std::vector<int32_t> &tokens,
                                     int64_t tokensOnDevice,
                                     const Decided &decided) {
  State &s = *state_;
  // Held but while the plan compiles (planFor).
  std::unique_lock<std::mutex> lock(s.mutex);
  const int64_t n = int64_t(tokens.size());
  KVC_RETURN_IF_ERROR(s.checkRequest(id, n, tokensOnDevice));
  std::optional<planning::Strategy> strategy =
      planning::parseStrategy(decided.strategy);
  if (!strategy)
    return invalidArgument("connector: no strategy " + decided.strategy);
  if (decided.store < 0 || decided.store >= int(s.stores.size()) ||
      !s.layoutOf(decided.store, decided.layout))
    return invalidArgument("connector: no store " +
                           std::to_string(decided.store) + " in layout " +
                           std::to_string(decided.layout.chunkTokens) + "x" +
                           std::to_string(decided.layout.layerGroup));
  const int64_t ct = decided.layout.chunkTokens;
  if (decided.loadTokens <= tokensOnDevice || decided.loadTokens >= n + 1 ||
      decided.loadTokens % ct)
    return invalidArgument(
        "connector: a decided load of " + std::to_string(decided.loadTokens) +
        " tokens, not whole chunks past the server's " +
        std::to_string(tokensOnDevice) + " of " + std::to_string(n));
  KVC_ASSIGN_OR_RETURN(found, s.lookupLocked(tokens));
  const Lookup::Held *holding = nullptr;
  for (const Lookup::Held &held : found.held)
    if (held.store == decided.store && held.layout.chunkTokens == ct &&
        held.layout.layerGroup == decided.layout.layerGroup &&
        held.match.tokens >= decided.loadTokens)
      holding = &held;
  if (!holding)
    return notFound("connector: store " + s.stores[decided.store].spec.url +
                    " no longer holds the " +
                    std::to_string(decided.loadTokens) +
                    " tokens decided for request " + id);
  auto [request, shape, what] =
      s.candidate(found, *holding, decided.loadTokens, n, tokensOnDevice);
  shape.strategies = {*strategy};
  KVC_ASSIGN_OR_RETURN(plan, s.planFor(lock, shape, request, ct, *strategy));
  // The lock was let go: the request may have started loading meanwhile.
  KVC_RETURN_IF_ERROR(s.checkRequest(id, n, tokensOnDevice));
  Decision decision;
  decision.loadTokens = decided.loadTokens;
  decision.strategy = planning::strategyName(*strategy);
  decision.store = decided.store;
  decision.layout = decided.layout;
  decision.why = "runs the decision it was given: restores " +
                 std::to_string(decided.loadTokens) + " of " +
                 std::to_string(n) + " tokens by " + decision.strategy + " (" +
                 what + " stored in " + s.stores[decided.store].spec.url + ")";
  Request &entry = s.renew(id, tokens, tokensOnDevice);
  s.loadBy(entry, std::move(plan), decided.store, decided.layout);
  entry.decision = decision;
  return decision;
}

StatusOr<Decision> Connector::decide(const std::string &id,
                                     const std::vector<int32_t> &tokens,
                                     int64_t tokensOnDevice,
                                     ChosenPlan chosen) {
  State &s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const int64_t n = int64_t(tokens.size());
  KVC_RETURN_IF_ERROR(s.checkRequest(id, n, tokensOnDevice));
  if (!chosen.bundle)
    return invalidArgument("connector: no bundle for request " + id);
  const PlanBundle &bundle = *chosen.bundle;
  KVC_RETURN_IF_ERROR(checkCompiledFor(bundle, s.options.model->fingerprint())
                          .withContext("connector: request " + id));
  const BundlePlan *plan = chosen.name.empty() && bundle.plans.size() == 1
                               ? &bundle.plans.front()
                               : bundle.findPlan(chosen.name);
  if (!plan)
    return invalidArgument(
        chosen.name.empty()
            ? "connector: the bundle holds " +
                  std::to_string(bundle.plans.size()) + " plans: name one"
            : "connector: the bundle has no plan " + chosen.name);
  // Each tier the plan reads is the store on it, or the only store.
  KVC_ASSIGN_OR_RETURN(found, s.lookupLocked(tokens));
  std::map<std::string, ChunkStore *> stores;
  for (const BundleTask &task : plan->tasks)
    for (const BundleStep &step : task.steps) {
      if (step.kind != StepKind::Fetch || stores.count(step.tier))
        continue;
      int index = -1;
      for (std::size_t i = 0; i < s.stores.size(); ++i)
        if (s.stores[i].tier == step.tier)
          index = int(i);
      if (index < 0 && s.stores.size() == 1)
        index = 0;
      if (index < 0)
        return invalidArgument("connector: plan " + plan->name +
                               " reads tier " + step.tier +
                               ", which none of the connector's " +
                               std::to_string(s.stores.size()) + " stores is");
      stores[step.tier] = &s.fullestLayout(found, index);
    }
  Decision decision;
  decision.loadTokens = std::max(tokensOnDevice, std::min(plan->tokens.end, n));
  decision.strategy = plan->name;
  if (plan->predictedUs)
    decision.predictedSeconds = double(*plan->predictedUs) * 1e-6;
  if (!s.target.tiers.empty()) {
    KVC_ASSIGN_OR_RETURN(all, s.computePrice(n));
    KVC_ASSIGN_OR_RETURN(resident, s.computePrice(tokensOnDevice));
    decision.recomputeSeconds = all - resident;
  }
  decision.why = "runs plan " + plan->name +
                 ", chosen by the caller (not "
                 "priced), over tokens " +
                 std::to_string(tokensOnDevice) + " to " +
                 std::to_string(decision.loadTokens);
  Request &request = s.renew(id, tokens, tokensOnDevice);
  auto compiled = std::make_shared<CompiledPlan>();
  compiled->bundle = std::move(chosen.bundle);
  compiled->plan = plan;
  request.plan = std::move(compiled);
  request.stores = std::move(stores);
  request.decision = decision;
  return decision;
}

StatusOr<PlanBundle> Connector::planRequest(const std::vector<int32_t> &tokens,
                                            PlanOptions options) {
  State &s = *state_;
  planning::Request request;
  request.tokens = int64_t(tokens.size());
  request.maxKl = options.maxKl;
  request.forwardTokens = options.forwardTokens;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.target.tiers.empty())
      return failedPrecondition(
          "connector: planRequest plans for a target machine, and "
          "ConnectorOptions::target has no tiers");
    if (s.stores.empty())
      return failedPrecondition("connector: no store to plan loads from");
    KVC_ASSIGN_OR_RETURN(found, s.lookupLocked(tokens));
    int store = 0;
    int64_t most = 0;
    for (const Lookup::Held &held : found.held)
      if (held.match.tokens > most) {
        store = held.store;
        most = held.match.tokens;
      }
    const ChunkStore &layout = s.fullestLayout(found, store);
    std::vector<PrefixMatch> matches;
    for (const Lookup::Held &held : found.held)
      if (held.store == store &&
          held.layout.chunkTokens == layout.layout().chunkTokens &&
          held.layout.layerGroup == layout.layout().layerGroup)
        matches.push_back(held.match);
    request.sources =
        sourcesOf(layout, matches, request.tokens, s.stores[store].tier);
    options.chunkTokens = layout.layout().chunkTokens;
  }
  if (options.strategies.empty())
    options.strategies = planning::strategiesFor(request.sources);
  // Compiled without the lock: the planner may take seconds.
  return s.options.planner(*s.options.model, s.target, request, options,
                           /*chosen=*/nullptr);
}

} // namespace kvc::host
