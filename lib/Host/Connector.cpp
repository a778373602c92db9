//===- Connector.cpp - The one object a server calls ----------------------===//
//
// State: the stores (one ChunkStore per recorded layout of each), a local
// prefix index, two caches keyed by a request's shape (PlanShape: the priced
// decision with the plan it chose, the compiled plan), the pools per set of
// lanes, and the requests. One mutex guards them; loads and saves run on
// threads of their own and are waited for without it. A cold decision
// searches each candidate's plan once (pricing it) and compiles the one it
// keeps as chosen (PricedPlan), outside the mutex.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Connector.h"

#include "kvc/Planning/Planner.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Sha256.h"
#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Save/Saver.h"

#include <algorithm>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

namespace kvc::host {

namespace {

//===----------------------------------------------------------------------===//
// The local prefix index
//===----------------------------------------------------------------------===//

/// One chunk of a request held by one store under one layout, form and
/// encoding.
struct HeldChunk {
  int store = 0;
  int layout = 0; ///< Index into the store's layouts.
  Form form = Form::KV;
  CodecSpec codec;
  bool operator==(const HeldChunk &other) const {
    return store == other.store && layout == other.layout &&
           form == other.form && codec == other.codec;
  }
};

/// What this process saved or saw stored, by a 64-bit chain over each
/// chunk's tokens (fast to compute; a collision can only make a load miss
/// an object, which is recomputed, since loads use the stores' own keys).
class PrefixIndex {
public:
  /// Keys of the whole chunks of `tokens`.
  static std::vector<uint64_t> keys(const std::vector<int32_t> &tokens,
                                    int64_t chunkTokens, uint64_t seed) {
    std::vector<uint64_t> out;
    uint64_t parent = seed;
    for (int64_t begin = 0; begin + chunkTokens <= int64_t(tokens.size());
         begin += chunkTokens) {
      uint64_t h = parent ^ (uint64_t(chunkTokens) * 0x9e3779b97f4a7c15ull);
      for (int64_t i = begin; i < begin + chunkTokens; ++i) {
        h ^= uint64_t(uint32_t(tokens[i])) * 0xff51afd7ed558ccdull;
        h = (h << 31 | h >> 33) * 0xc4ceb9fe1a85ec53ull;
      }
      h ^= h >> 29; // splitmix64's finalizer
      h *= 0xbf58476d1ce4e5b9ull;
      h ^= h >> 32;
      out.push_back(parent = h);
    }
    return out;
  }

  void add(uint64_t key, const HeldChunk &held) {
    if (chunks_.size() >= kMaxChunks)
      chunks_.clear(); // A server's index is a cache: start again.
    std::vector<HeldChunk> &entries = chunks_[key];
    if (std::find(entries.begin(), entries.end(), held) == entries.end())
      entries.push_back(held);
  }
  const std::vector<HeldChunk> *find(uint64_t key) const {
    auto it = chunks_.find(key);
    return it == chunks_.end() ? nullptr : &it->second;
  }
  /// Forgets what it knew of the chunk `key`: the next lookup of it asks
  /// the stores.
  void forget(uint64_t key) { chunks_.erase(key); }

private:
  static constexpr std::size_t kMaxChunks = std::size_t(1) << 20;
  std::unordered_map<uint64_t, std::vector<HeldChunk>> chunks_;
};

/// A seed per model and tenant, so that two tenants' chunks never meet.
uint64_t indexSeed(const std::string &fingerprint, const std::string &tenant) {
  Sha256 hash;
  hash.update("kvc-index-v1").update(fingerprint).update(tenant);
  Digest digest = hash.finish();
  uint64_t seed = 0;
  for (int i = 0; i < 8; ++i)
    seed = seed << 8 | digest[i];
  return seed;
}

//===----------------------------------------------------------------------===//
// Requests
//===----------------------------------------------------------------------===//

/// A plan compiled for one shape, or chosen by the caller.
struct CompiledPlan {
  std::shared_ptr<const PlanBundle> bundle;
  const BundlePlan *plan = nullptr;
};

/// A running (or ended) load.
struct LoadJob {
  std::vector<int32_t> tokens; ///< The loaded prefix.
  int64_t chunkTokens = 0;     ///< Its store layout's.
  BlockTable table;
  int64_t resident = 0;
  std::shared_ptr<const CompiledPlan> plan;
  RestoreTarget target;
  std::atomic<bool> cancel{false};
  std::unique_ptr<RestoreHandle> handle;
  bool reported = false;
  /// Set once, under the Connector's mutex; `waiting` lets one caller
  /// collect it from the handle.
  std::optional<StatusOr<RestoreMetrics>> result;
  std::mutex waiting;
};

/// A running (or ended) save.
struct SaveJob {
  std::vector<int32_t> tokens; ///< The saved whole chunks.
  BlockTable table;
  BundlePlan plan;
  LayerProgress filling;
  std::vector<bool> given; ///< Layers handed over by saveLayer.
  std::unique_ptr<PagedCacheSource> source;
  SaveTarget target;
  std::atomic<bool> copied{false}, ended{false};
  std::thread thread;
  StatusOr<SaveMetrics> result = SaveMetrics();
  bool reported = false;
  ~SaveJob() {
    if (thread.joinable())
      thread.join();
  }
};

struct Request {
  std::vector<int32_t> tokens;
  int64_t onDevice = 0;
  std::optional<Decision> decision;
  /// The decided plan and the stores its tiers read.
  std::shared_ptr<const CompiledPlan> plan;
  std::map<std::string, ChunkStore *> stores;
  std::shared_ptr<LoadJob> load;
  std::shared_ptr<SaveJob> save;
};

/// A decision's price for one shape: the best strategy, its seconds and
/// the plan the planner chose for it (what planFor compiles).
struct Priced {
  planning::Strategy strategy = planning::Strategy::Compute;
  double seconds = std::numeric_limits<double>::infinity();
  std::shared_ptr<const planning::Evaluation> evaluation;
};

/// What a load is priced and its plan compiled for: requests of one shape
/// (another prompt of the same lengths, read from the same holding) share
/// both.
struct PlanShape {
  /// Where the server's own tokens end: none, at a chunk's edge, inside one
  /// (which narrows the strategies to loads of K and V).
  enum class Server { None, AtChunk, InChunk };

  int64_t tokens = 0;        ///< Restored: [0, tokens).
  int64_t forwardTokens = 0; ///< The server's pass, rounded up to a chunk.
  Server server = Server::None;
  int store = -1;
  int64_t chunkTokens = 0, layerGroup = 0;
  /// The forms and encodings it may read (Source::form, the codec's name).
  std::vector<std::pair<Form, std::string>> sources;
  /// The strategies priced, or the one a caller decided.
  std::vector<planning::Strategy> strategies;
  bool decided = false; ///< A caller's Decided, not priced.

  bool operator<(const PlanShape &o) const {
    auto tie = [](const PlanShape &x) {
      return std::tie(x.tokens, x.forwardTokens, x.server, x.store,
                      x.chunkTokens, x.layerGroup, x.sources, x.strategies,
                      x.decided);
    };
    return tie(*this) < tie(o);
  }
};

/// Values by key, most recently used first, at most `capacity` of them.
template <typename K, typename V> class LruCache {
public:
  explicit LruCache(std::size_t capacity)
      : capacity_(std::max<std::size_t>(capacity, 1)) {}
  // Moved, the list's nodes (which the index points at) move with it.
  LruCache(LruCache &&) = default;
  LruCache &operator=(LruCache &&) = default;

  /// The value of `key` (now the most recently used), or null.
  const V *find(const K &key) {
    auto it = index_.find(key);
    if (it == index_.end())
      return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  /// Keeps `value` as `key`'s, or the value kept first if there is one;
  /// drops the least recently used past the capacity.
  const V &insert(const K &key, V value) {
    if (const V *kept = find(key))
      return *kept;
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }

private:
  std::size_t capacity_;
  std::list<std::pair<K, V>> order_;
  std::map<K, typename std::list<std::pair<K, V>>::iterator> index_;
};

/// Prices kept per compiled plan: decide prices several candidates (up to
/// kLoadFractions lengths a holding) for each plan it compiles.
constexpr std::size_t kPricesPerPlan = 16;

/// decide prices loads of all a holding holds and, for the strategies that
/// only load, of its first 1/k .. (k-1)/k.
constexpr int64_t kLoadFractions = 8;

} // namespace

//===----------------------------------------------------------------------===//
// State
//===----------------------------------------------------------------------===//

struct Connector::State {
  struct OpenStore {
    StoreSpec spec;
    std::string tier;
    std::vector<std::unique_ptr<ChunkStore>> layouts;
    std::shared_ptr<Tier> shared;
  };

  ConnectorOptions options;
  Device *device = nullptr;
  TargetDesc target; ///< With each store's tier capped at its throttle.
  std::shared_ptr<const planning::CostModel> cost;
  std::vector<OpenStore> stores;
  ChunkStore *saveStore = nullptr;
  uint64_t seed = 0;

  mutable std::mutex mutex;
  PrefixIndex index;
  /// Chunks no store held when last asked, and when: for a while a lookup
  /// that reaches one needs not ask again (a server asks each step while a
  /// request waits).
  std::unordered_map<uint64_t, Clock::time_point> misses;
  static constexpr double kMissSeconds = 1.0;
  std::unique_ptr<PagedKVCache> caches;
  /// Sized at create from ConnectorOptions::planCacheEntries.
  LruCache<PlanShape, Priced> prices{1};
  std::map<int64_t, double> computeSeconds;
  LruCache<PlanShape, std::shared_ptr<const CompiledPlan>> plans{1};
  std::map<std::map<std::string, int>, std::unique_ptr<ResourcePools>> pools;
  std::map<std::string, Request> requests;
  /// Cancelled requests' jobs, until they end.
  std::vector<std::pair<std::string, std::shared_ptr<LoadJob>>> retiredLoads;
  std::vector<std::pair<std::string, std::shared_ptr<SaveJob>>> retiredSaves;
  int64_t compiled = 0, hits = 0;

  StatusOr<ResourcePools *> poolsFor(const BundlePlan &plan) {
    std::map<std::string, int> lanes = planResources(plan);
    std::unique_ptr<ResourcePools> &slot = pools[lanes];
    if (!slot) {
      KVC_ASSIGN_OR_RETURN(created, device->createPools(lanes));
      slot = std::move(created);
    }
    return slot.get();
  }

  /// Seconds to compute tokens [0, tokens) through the model (the
  /// planner's compute-only price), cached.
  StatusOr<double> computePrice(int64_t tokens) {
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

  /// The best of `strategies` for `request`, by the first token.
  StatusOr<Priced> price(const planning::Request &request,
                         int64_t chunkTokens,
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
        best = {strategy, evaluation->firstTokenSeconds,
                std::make_shared<const planning::Evaluation>(
                    std::move(*evaluation))};
    }
    return best;
  }

  /// The plan compiled for `shape`, or null.
  std::shared_ptr<const CompiledPlan> cachedPlan(const PlanShape &shape) {
    const std::shared_ptr<const CompiledPlan> *kept = plans.find(shape);
    if (!kept)
      return nullptr;
    ++hits;
    return *kept;
  }

  /// The plan of `strategy` for `request`, compiled: `chosen` (decide's
  /// pricing) as it is, or, without one, as the planner chooses. Touches
  /// nothing the lock guards (the options, model, target and cost model are
  /// fixed at create): called without it, so that a compile does not hold
  /// up other requests.
  StatusOr<std::shared_ptr<const CompiledPlan>>
  compilePlan(const planning::Request &request, int64_t chunkTokens,
              planning::Strategy strategy,
              std::shared_ptr<const planning::Evaluation> chosen) const {
    PlanOptions planOptions = options.plans;
    planOptions.strategies = {strategy};
    planOptions.chunkTokens = chunkTokens;
    planOptions.layerWise = true;
    planOptions.forwardTokens = request.forwardTokens;
    std::optional<PricedPlan> given;
    if (chosen)
      given = PricedPlan{cost, *chosen};
    KVC_ASSIGN_OR_RETURN(bundle, options.planner(*options.model, target,
                                                 request, planOptions,
                                                 given ? &*given : nullptr));
    const std::string name = planning::strategyName(strategy);
    auto compiledPlan = std::make_shared<CompiledPlan>();
    compiledPlan->bundle = std::make_shared<PlanBundle>(std::move(bundle));
    for (const BundlePlan &plan : compiledPlan->bundle->plans)
      if (plan.name == name && !compiledPlan->plan)
        compiledPlan->plan = &plan;
    if (!compiledPlan->plan && compiledPlan->bundle->plans.size() == 1)
      compiledPlan->plan = &compiledPlan->bundle->plans.front();
    if (!compiledPlan->plan)
      return Status(StatusCode::FailedPrecondition,
                    "connector: the planner returned no plan " + name +
                        " for " + std::to_string(request.tokens) + " tokens");
    return std::shared_ptr<const CompiledPlan>(std::move(compiledPlan));
  }

  /// Keeps `plan` as `shape`'s; the one kept first if another request
  /// compiled the same shape meanwhile.
  std::shared_ptr<const CompiledPlan>
  keepPlan(const PlanShape &shape, std::shared_ptr<const CompiledPlan> plan) {
    if (std::shared_ptr<const CompiledPlan> kept = cachedPlan(shape))
      return kept;
    ++compiled;
    return plans.insert(shape, std::move(plan));
  }

  /// The plan of `strategy` for `request` (`chosen` by decide's pricing,
  /// if it was priced), compiled once per `shape`: `lock` (held on
  /// `mutex`) is let go while it compiles.
  StatusOr<std::shared_ptr<const CompiledPlan>>
  planFor(std::unique_lock<std::mutex> &lock, const PlanShape &shape,
          const planning::Request &request, int64_t chunkTokens,
          planning::Strategy strategy,
          std::shared_ptr<const planning::Evaluation> chosen = nullptr) {
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

  /// The price of `request`'s loads by the best of `shape`'s strategies,
  /// priced once per shape: `lock` (held on `mutex`) is let go while the
  /// planner prices it.
  StatusOr<Priced> priceFor(std::unique_lock<std::mutex> &lock,
                            const PlanShape &shape,
                            const planning::Request &request) {
    if (const Priced *cached = prices.find(shape))
      return *cached;
    lock.unlock();
    StatusOr<Priced> priced =
        price(request, shape.chunkTokens, shape.strategies);
    lock.lock();
    if (!priced.isOk())
      return priced.status();
    return prices.insert(shape, std::move(*priced));
  }

  /// Store `s`'s holding `match` of `tokens` in `store`, with what of it
  /// answers now (Lookup::Held::answering): the parts of a tier known not
  /// to answer (Tier::answers) are asked nothing.
  static Lookup::Held answering(ChunkStore &store, int s,
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

  /// The stores' answers for `tokens`, from the index when it knows the
  /// whole request, else from the stores (what they hold recorded).
  StatusOr<Lookup> lookupLocked(const std::vector<int32_t> &tokens) {
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
              out.held.push_back(answering(
                  store, int(s), tokens, {form, extent.tokens, extent.codec}));
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

  bool recentMiss(uint64_t key) const {
    auto it = misses.find(key);
    return it != misses.end() && secondsSince(it->second) < kMissSeconds;
  }

  /// Whether a load or save may still touch the registered caches.
  bool cachesInUse() const {
    auto running = [](const std::shared_ptr<LoadJob> &load,
                      const std::shared_ptr<SaveJob> &save) {
      return (load && !load->handle->ended()) || (save && !save->ended);
    };
    for (const auto &[id, request] : requests)
      if (running(request.load, request.save))
        return true;
    for (const auto &[id, load] : retiredLoads)
      if (running(load, nullptr))
        return true;
    for (const auto &[id, save] : retiredSaves)
      if (running(nullptr, save))
        return true;
    return false;
  }

  /// Checks a request's tokens and the server's share of them.
  Status checkRequest(const std::string &id, int64_t n, int64_t onDevice) {
    if (n == 0)
      return invalidArgument("connector: request " + id + " has no tokens");
    if (onDevice < 0 || onDevice > n)
      return invalidArgument("connector: " + std::to_string(onDevice) +
                             " tokens on the device of a request of " +
                             std::to_string(n));
    if (Request *old = find(id);
        old && old->load && !old->load->handle->ended())
      return Status(StatusCode::FailedPrecondition,
                    "connector: request " + id + " is loading");
    return Status::ok();
  }

  /// Forgets request `id`'s decision and load (a save of the same id goes
  /// on) and starts it again with `tokens`.
  /// A load of tokens [0, length) of an n-token request from `held`: the
  /// planner's request (every form and encoding the store holds of it in
  /// that layout), its shape (strategies left to the caller), and what it
  /// reads, in words.
  struct Candidate {
    planning::Request request;
    PlanShape shape;
    std::string what;
  };
  Candidate candidate(const Lookup &found, const Lookup::Held &held,
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
      out.what += std::string(out.what.empty() ? "" : ", ") +
                  name(source.form) + " " + source.codec.str();
    }
    return out;
  }

  /// Store `store`'s chunks in `layout`, or null where it has none open.
  ChunkStore *layoutOf(int store, const StoreLayout &layout) const {
    for (const auto &open : stores[store].layouts)
      if (open->layout().chunkTokens == layout.chunkTokens &&
          open->layout().layerGroup == layout.layerGroup)
        return open.get();
    return nullptr;
  }

  Request &renew(const std::string &id, const std::vector<int32_t> &tokens,
                 int64_t onDevice) {
    Request &request = requests[id];
    std::shared_ptr<SaveJob> saving = std::move(request.save);
    request = Request();
    request.save = std::move(saving);
    request.tokens = tokens;
    request.onDevice = onDevice;
    return request;
  }

  /// Of store `store`'s layouts, the one `found` holds the most under.
  ChunkStore &fullestLayout(const Lookup &found, int store) const {
    const OpenStore &open = stores[store];
    ChunkStore *fullest = open.layouts.front().get();
    int64_t most = 0;
    for (const Lookup::Held &held : found.held)
      if (held.store == store && held.match.tokens > most)
        for (const auto &layout : open.layouts)
          if (layout->layout().chunkTokens == held.layout.chunkTokens &&
              layout->layout().layerGroup == held.layout.layerGroup) {
            fullest = layout.get();
            most = held.match.tokens;
          }
    return *fullest;
  }

  Request *find(const std::string &id) {
    auto it = requests.find(id);
    return it == requests.end() ? nullptr : &it->second;
  }

  /// The blocks of `ids` for tokens [0, tokens), checked against the
  /// registered caches.
  StatusOr<BlockTable> tableFor(const std::vector<int32_t> &ids,
                                int64_t tokens) const {
    if (!caches)
      return Status(StatusCode::FailedPrecondition,
                    "connector: no caches registered (registerCaches)");
    const PagedCacheConfig &config = caches->config();
    const int64_t needed = (tokens + config.blockSize - 1) / config.blockSize;
    if (int64_t(ids.size()) < needed)
      return invalidArgument("connector: " + std::to_string(ids.size()) +
                             " block ids for " + std::to_string(tokens) +
                             " tokens, which need " + std::to_string(needed));
    BlockTable table;
    std::set<int32_t> seen;
    for (int64_t b = 0; b < needed; ++b) {
      const int32_t id = ids[b];
      if (id < 0 || id >= config.numBlocks)
        return invalidArgument("connector: block id " + std::to_string(id) +
                               " outside the caches' " +
                               std::to_string(config.numBlocks) + " blocks");
      if (!seen.insert(id).second)
        return invalidArgument("connector: block id " + std::to_string(id) +
                               " given twice");
      table.blocks.push_back(id);
    }
    return table;
  }
};

//===----------------------------------------------------------------------===//
// Caches
//===----------------------------------------------------------------------===//

StatusOr<std::unique_ptr<PagedKVCache>>
viewServerCaches(const ServerCaches &caches, const ModelConfig &model) {
  if (caches.dtype != DType::BF16 && caches.dtype != DType::F16)
    return unimplemented(std::string("connector: ") + dtypeName(caches.dtype) +
                         " caches (bf16 or f16)");
  if (caches.numKvHeads != model.numKvHeads || caches.headDim != model.headDim)
    return invalidArgument(
        "connector: caches of " + std::to_string(caches.numKvHeads) + " heads x " +
        std::to_string(caches.headDim) + " values for a model of " +
        std::to_string(model.numKvHeads) + " x " + std::to_string(model.headDim));
  if (int64_t(caches.keys.size()) != model.numLayers ||
      (caches.layout == CacheLayout::Separate &&
       caches.values.size() != caches.keys.size()))
    return invalidArgument("connector: caches of " +
                           std::to_string(caches.keys.size()) +
                           " layers for a model of " +
                           std::to_string(model.numLayers));
  PagedCacheConfig config;
  config.dtype = caches.dtype;
  config.layers = model.numLayers;
  config.numKvHeads = model.numKvHeads;
  config.headDim = model.headDim;
  config.blockSize = caches.blockSize;
  config.numBlocks = caches.numBlocks;
  const int64_t block = caches.blockSize * model.numKvHeads * model.headDim;
  std::vector<PagedLayerMemory> layers;
  for (std::size_t l = 0; l < caches.keys.size(); ++l) {
    auto *keys = static_cast<uint16_t *>(caches.keys[l]);
    switch (caches.layout) {
    case CacheLayout::Separate:
      layers.push_back({keys, static_cast<uint16_t *>(caches.values[l])});
      break;
    case CacheLayout::KeysFirst:
      layers.push_back({keys, keys ? keys + caches.numBlocks * block : nullptr});
      break;
    case CacheLayout::BlocksFirst:
      config.blockStride = 2 * block;
      layers.push_back({keys, keys ? keys + block : nullptr});
      break;
    }
  }
  return PagedKVCache::view(config, std::move(layers), caches.memory);
}

//===----------------------------------------------------------------------===//
// Connector
//===----------------------------------------------------------------------===//

Connector::Connector(std::unique_ptr<State> state) : state_(std::move(state)) {}

Connector::~Connector() {
  for (auto &[id, request] : state_->requests) {
    if (request.load)
      request.load->cancel = true;
    if (request.save)
      request.save->filling.finish(saveInterrupted());
  }
  // Jobs join as they are destroyed (RestoreHandle, SaveJob).
}

StatusOr<std::unique_ptr<Connector>>
Connector::create(ConnectorOptions options) {
  if (!options.model)
    return invalidArgument("connector: no model");
  if (!options.planner)
    return invalidArgument("connector: no planner (compilerPlanHook, or "
                           "bundleHook over bundles compiled ahead)");
  if (options.saveLayout.chunkTokens <= 0 || options.saveLayout.layerGroup <= 0)
    return invalidArgument("connector: the save layout's chunk tokens and "
                           "layer group must be positive");
  auto state = std::make_unique<State>();
  state->device = options.device ? options.device : &cpuDevice();
  state->target = options.target;
  state->seed = indexSeed(options.model->fingerprint(), options.tenant);
  std::set<std::string> tiers;
  for (std::size_t s = 0; s < options.stores.size(); ++s) {
    State::OpenStore open;
    open.spec = options.stores[s];
    StoreOptions first;
    first.url = open.spec.url;
    first.tenant = options.tenant;
    first.layout = options.saveLayout;
    // The first store is written: it may be created, and records the
    // saves' layout.
    first.access = s == 0 && options.createStores ? TierAccess::Create
                                                  : TierAccess::Existing;
    KVC_ASSIGN_OR_RETURN(written, openStore(first, *options.model));
    if (state->target.tiers.empty()) {
      // Chosen plans only: the store is the tier its spec names.
      open.tier = !open.spec.tier.empty() ? open.spec.tier
                  : s == 0                ? std::string("store")
                                          : "store" + std::to_string(s);
    } else {
      KVC_ASSIGN_OR_RETURN(
          tier, storeTier(state->target, written->tier(), open.spec.tier));
      open.tier = tier->name;
    }
    if (!tiers.insert(open.tier).second)
      return invalidArgument("connector: two stores on tier " + open.tier +
                             " (name a tier per store)");
    KVC_ASSIGN_OR_RETURN(recorded,
                         recordedLayouts(written->tier(),
                                         options.model->fingerprint(),
                                         options.tenant));
    std::shared_ptr<Tier> shared = written->sharedTier();
    open.shared = shared;
    const bool writes = s == 0;
    open.layouts.push_back(std::move(written));
    for (const StoreLayout &layout : recorded) {
      if (layout.chunkTokens == options.saveLayout.chunkTokens &&
          layout.layerGroup == options.saveLayout.layerGroup)
        continue;
      open.layouts.push_back(std::make_unique<ChunkStore>(
          shared, options.model->config(), options.model->fingerprint(),
          options.tenant, layout));
    }
    if (writes)
      state->saveStore = open.layouts.front().get();
    state->stores.push_back(std::move(open));
  }
  KVC_ASSIGN_OR_RETURN(profile,
                       options.plans.codecProfile.empty()
                           ? StatusOr<planning::CodecProfile>(
                                 planning::CodecProfile::defaults())
                           : planning::CodecProfile::load(
                                 options.plans.codecProfile));
  state->cost = std::make_shared<const planning::CostModel>(
      options.model->config(), state->target, std::move(profile));
  state->plans = decltype(state->plans)(options.planCacheEntries);
  state->prices =
      decltype(state->prices)(options.planCacheEntries * kPricesPerPlan);
  state->options = std::move(options);
  return std::unique_ptr<Connector>(new Connector(std::move(state)));
}

Status Connector::registerCaches(std::unique_ptr<PagedKVCache> caches) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!caches)
    return invalidArgument("connector: no caches");
  const ModelConfig &model = state_->options.model->config();
  const PagedCacheConfig &config = caches->config();
  if (config.layers != model.numLayers || config.numKvHeads != model.numKvHeads ||
      config.headDim != model.headDim)
    return invalidArgument("connector: caches of another model's shape");
  if (state_->caches && state_->cachesInUse())
    return Status(StatusCode::FailedPrecondition,
                  "connector: caches are registered already, and a load or "
                  "save still uses them");
  if (caches->memory() == CacheMemory::Device &&
      std::string(state_->device->name()) == "cpu")
    return invalidArgument("connector: device caches with the cpu backend");
  state_->caches = std::move(caches);
  return Status::ok();
}

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
    return Status(StatusCode::FailedPrecondition,
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
  const bool loads =
      policy != LoadPolicy::Never && best.store >= 0 &&
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
  const std::string recompute =
      ms(decision.recomputeSeconds) + " recomputing " +
      std::to_string(n - onDevice) + " tokens";
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
    decision.why = "recomputes: loading " + std::to_string(best.tokens) +
                   " tokens by " + planning::strategyName(best.priced.strategy) +
                   " is predicted at " +
                   ms(best.priced.seconds) + ", not faster than " + recompute;
  } else {
    decision.loadTokens = best.tokens;
    decision.strategy = planning::strategyName(best.priced.strategy);
    decision.predictedSeconds = best.priced.seconds;
    decision.store = best.store;
    decision.layout = best.layout;
    // A plan of strategy kv or hidden loads every token it restores; the
    // others compute some of them beside the loads.
    decision.why = "restores " + std::to_string(best.tokens) + " of " +
                   std::to_string(n) + " tokens by " + decision.strategy +
                   " (" + best.what + " stored in " +
                   s.stores[best.store].spec.url +
                   "): first token predicted at " + ms(best.priced.seconds) +
                   " against " + recompute;
    if (best.priced.seconds >= decision.recomputeSeconds)
      decision.why += ", loaded all the same (LoadPolicy::Always)";
    request.plan = std::move(plan);
    request.stores[s.stores[best.store].tier] =
        s.layoutOf(best.store, best.layout);
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
    return invalidArgument(
        "connector: no store " + std::to_string(decided.store) +
        " in layout " + std::to_string(decided.layout.chunkTokens) + "x" +
        std::to_string(decided.layout.layerGroup));
  const int64_t ct = decided.layout.chunkTokens;
  if (decided.loadTokens <= tokensOnDevice || decided.loadTokens >= n + 1 ||
      decided.loadTokens % ct)
    return invalidArgument("connector: a decided load of " +
                           std::to_string(decided.loadTokens) +
                           " tokens, not whole chunks past the server's " +
                           std::to_string(tokensOnDevice) + " of " +
                           std::to_string(n));
  KVC_ASSIGN_OR_RETURN(found, s.lookupLocked(tokens));
  const Lookup::Held *holding = nullptr;
  for (const Lookup::Held &held : found.held)
    if (held.store == decided.store &&
        held.layout.chunkTokens == ct &&
        held.layout.layerGroup == decided.layout.layerGroup &&
        held.match.tokens >= decided.loadTokens)
      holding = &held;
  if (!holding)
    return Status(StatusCode::NotFound,
                  "connector: store " + s.stores[decided.store].spec.url +
                      " no longer holds the " +
                      std::to_string(decided.loadTokens) +
                      " tokens decided for request " + id);
  auto [request, shape, what] =
      s.candidate(found, *holding, decided.loadTokens, n, tokensOnDevice);
  shape.strategies = {*strategy};
  shape.decided = true;
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
                 std::to_string(n) + " tokens by " + decision.strategy +
                 " (" + what + " stored in " +
                 s.stores[decided.store].spec.url + ")";
  Request &entry = s.renew(id, tokens, tokensOnDevice);
  entry.plan = std::move(plan);
  entry.stores[s.stores[decided.store].tier] =
      s.layoutOf(decided.store, decided.layout);
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
  KVC_RETURN_IF_ERROR(
      checkCompiledFor(bundle, s.options.model->fingerprint())
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
      return Status(StatusCode::FailedPrecondition,
                    "connector: planRequest plans for a target machine, and "
                    "ConnectorOptions::target has no tiers");
    if (s.stores.empty())
      return Status(StatusCode::FailedPrecondition,
                    "connector: no store to plan loads from");
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

Status Connector::startLoad(const std::string &id,
                            const std::vector<int32_t> &blockIds,
                            const LoadOptions &run) {
  State &s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  Request *request = s.find(id);
  if (!request || !request->decision)
    return Status(StatusCode::NotFound,
                  "connector: no decided request " + id);
  if (!request->decision->loads())
    return Status(StatusCode::FailedPrecondition,
                  "connector: request " + id + " loads nothing (" +
                      request->decision->why + ")");
  if (request->load)
    return Status(StatusCode::FailedPrecondition,
                  "connector: request " + id + " was started already");
  const int64_t tokens = request->decision->loadTokens;
  KVC_ASSIGN_OR_RETURN(table, s.tableFor(blockIds, tokens));
  auto job = std::make_shared<LoadJob>();
  job->tokens.assign(request->tokens.begin(), request->tokens.begin() + tokens);
  job->chunkTokens = request->decision->layout.chunkTokens;
  job->table = std::move(table);
  job->resident = request->onDevice;
  job->plan = request->plan;
  job->target.device = s.device;
  job->target.model = s.options.model;
  job->target.runner = s.options.runner;
  job->target.stores = request->stores;
  job->target.tokens = &job->tokens;
  job->target.cache = s.caches.get();
  job->target.table = &job->table;
  KVC_ASSIGN_OR_RETURN(pools, s.poolsFor(*job->plan->plan));
  RestoreOptions options;
  options.kernels = &job->plan->bundle->kernels;
  options.resident = job->resident;
  options.cancel = &job->cancel;
  options.recomputeFallbacks = s.options.recomputeFailures;
  options.removeDamaged = true; // The next save of its chunk writes it.
  options.tracePath = run.tracePath;
  KVC_ASSIGN_OR_RETURN(
      handle, run.dynamic ? RestoreHandle::startWalk(*pools, *job->plan->plan,
                                                     job->target, options)
                          : RestoreHandle::start(*pools, *job->plan->plan,
                                                 job->target, options));
  job->handle = std::move(handle);
  request->load = std::move(job);
  return Status::ok();
}

namespace {

/// A request's load, or why there is none.
StatusOr<std::shared_ptr<LoadJob>> loadOf(std::mutex &mutex,
                                          std::map<std::string, Request> &all,
                                          const std::string &id) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = all.find(id);
  if (it == all.end())
    return Status(StatusCode::NotFound, "connector: no request " + id);
  if (!it->second.load)
    return Status(StatusCode::FailedPrecondition,
                  "connector: request " + id + " has no load");
  return it->second.load;
}

/// The load's result, waiting for it once. The index forgets the chunks
/// the load found gone from their store (missing, or damaged and removed):
/// the next lookup asks the stores what they hold, rather than every later
/// load failing on them.
const StatusOr<RestoreMetrics> &resultOf(LoadJob &job, PrefixIndex &index,
                                         uint64_t seed, std::mutex &mutex) {
  std::lock_guard<std::mutex> collecting(job.waiting);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (job.result)
      return *job.result;
  }
  StatusOr<RestoreMetrics> result = job.handle->wait();
  std::lock_guard<std::mutex> lock(mutex);
  if (job.result)
    return *job.result;
  if (result.isOk()) {
    // The keys are computed only for a load that lost chunks: the rare case.
    std::vector<uint64_t> keys;
    const RestoreMetrics &metrics = *result;
    for (std::size_t f = 0;
         f < metrics.fallbackTokens.size() && f < metrics.fallbackFaults.size();
         ++f) {
      const ChunkFault fault = metrics.fallbackFaults[f];
      if (fault != ChunkFault::Missing && fault != ChunkFault::Corrupt &&
          fault != ChunkFault::Truncated)
        continue;
      if (keys.empty())
        keys = PrefixIndex::keys(job.tokens, job.chunkTokens, seed);
      const BundleRange &range = metrics.fallbackTokens[f];
      for (int64_t c = range.begin / job.chunkTokens;
           c * job.chunkTokens < range.end && c < int64_t(keys.size()); ++c)
        index.forget(keys[c]);
    }
  }
  job.result = std::move(result);
  return *job.result;
}

} // namespace

Status Connector::waitLayer(const std::string &id, int64_t layer,
                            std::optional<std::chrono::milliseconds> timeout) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  return job->handle->waitLayer(layer, timeout);
}

Status Connector::waitLayerOn(const std::string &id, int64_t layer,
                              void *stream) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  // Where the device makes no stream wait (none on this device, none free
  // now, or an error), the host waits: the layer is never left unwaited.
  StatusOr<std::shared_ptr<StreamSignal>> signal =
      state_->device->streamWait(stream);
  if (!signal)
    return job->handle->waitLayer(layer);
  job->handle->whenLayerReady(
      layer, [signal = std::move(*signal)] { signal->raise(); });
  return Status::ok();
}

StatusOr<RestoreMetrics> Connector::waitLoad(const std::string &id) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  return resultOf(*job, state_->index, state_->seed, state_->mutex);
}

StatusOr<std::vector<int32_t>>
Connector::failedBlocks(const std::string &id) {
  KVC_ASSIGN_OR_RETURN(job, loadOf(state_->mutex, state_->requests, id));
  std::vector<int32_t> failed;
  if (!job->handle->ended())
    return failed;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!job->result)
    return failed; // finished() or waitLoad collects it.
  const int64_t blockSize = state_->caches->config().blockSize;
  auto add = [&](int64_t from, int64_t to) {
    for (int64_t b = std::max(from, job->resident) / blockSize;
         b * blockSize < to && b < int64_t(job->table.blocks.size()); ++b)
      if (std::find(failed.begin(), failed.end(), job->table.blocks[b]) ==
          failed.end())
        failed.push_back(job->table.blocks[b]);
  };
  if (!job->result->isOk())
    add(job->resident, int64_t(job->tokens.size()));
  else if (!state_->options.recomputeFailures)
    for (const BundleRange &range : (*job->result)->fallbackTokens)
      add(range.begin, range.end);
  std::sort(failed.begin(), failed.end());
  return failed;
}

Status Connector::saveLayer(const std::string &id,
                            const std::vector<int32_t> &tokens, int64_t layer,
                            const std::vector<int32_t> &blockIds) {
  State &s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.saveStore)
    return Status(StatusCode::FailedPrecondition,
                  "connector: no store to save to");
  const int64_t layers = s.options.model->config().numLayers;
  if (layer < 0 || layer >= layers)
    return invalidArgument("connector: no layer " + std::to_string(layer) +
                           " in a model of " + std::to_string(layers));
  Request &request = s.requests[id];
  if (request.tokens.empty())
    request.tokens = tokens;
  if (!request.save) {
    const int64_t ct = s.saveStore->layout().chunkTokens;
    const int64_t whole = int64_t(tokens.size()) / ct * ct;
    auto job = std::make_shared<SaveJob>();
    job->tokens.assign(tokens.begin(), tokens.begin() + whole);
    job->given.assign(layers, false);
    if (whole == 0) {
      job->copied = job->ended = true; // Nothing whole to keep.
    } else {
      KVC_ASSIGN_OR_RETURN(table, s.tableFor(blockIds, whole));
      job->table = std::move(table);
      job->filling.reset(layers, whole);
      job->plan = savePlanFor(*s.saveStore, whole, {Form::KV},
                              s.options.saveCodec, "store");
      job->source = std::make_unique<PagedCacheSource>(
          *s.device, *s.caches, job->table, &job->filling);
      job->target.source = job->source.get();
      job->target.stores["store"] = s.saveStore;
      job->target.tokens = &job->tokens;
      KVC_ASSIGN_OR_RETURN(pools, s.poolsFor(job->plan));
      SaveJob *raw = job.get();
      State *state = &s;
      KVC_ASSIGN_OR_RETURN(thread, startThread([raw, pools, state] {
        SaveRunOptions run;
        run.snapshotted = [raw] { raw->copied = true; };
        StatusOr<SaveMetrics> result =
            save(*pools, raw->plan, raw->target, run);
        if (result.isOk()) {
          // What this process saved, for later lookups.
          std::lock_guard<std::mutex> lock(state->mutex);
          ChunkStore &store = *state->saveStore;
          const std::vector<uint64_t> keys = PrefixIndex::keys(
              raw->tokens, store.layout().chunkTokens, state->seed);
          for (uint64_t key : keys)
            state->index.add(key,
                             {0, 0, Form::KV, state->options.saveCodec});
        }
        raw->result = std::move(result);
        raw->copied = true;
        raw->ended = true;
      }));
      job->thread = std::move(thread);
    }
    request.save = std::move(job);
  }
  SaveJob &job = *request.save;
  if (!job.given[layer] && !job.tokens.empty())
    job.filling.add(layer, layer + 1, int64_t(job.tokens.size()));
  job.given[layer] = true;
  return Status::ok();
}

StatusOr<SaveMetrics> Connector::waitSave(const std::string &id) {
  std::shared_ptr<SaveJob> job;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Request *request = state_->find(id);
    if (!request || !request->save)
      return Status(StatusCode::NotFound, "connector: no save of " + id);
    job = request->save;
    for (std::size_t l = 0; l < job->given.size(); ++l)
      if (!job->given[l])
        return Status(StatusCode::FailedPrecondition,
                      "connector: the save of " + id + " waits for layer " +
                          std::to_string(l) + " (saveLayer)");
    request->save.reset();
  }
  if (job->thread.joinable())
    job->thread.join();
  return std::move(job->result);
}

Status Connector::cancel(const std::string &id) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->requests.find(id);
  if (it == state_->requests.end())
    return Status(StatusCode::NotFound, "connector: no request " + id);
  Request &request = it->second;
  if (request.load) {
    request.load->cancel = true;
    state_->retiredLoads.emplace_back(id, std::move(request.load));
  }
  if (request.save) {
    request.save->filling.finish(saveInterrupted());
    state_->retiredSaves.emplace_back(id, std::move(request.save));
  }
  state_->requests.erase(it);
  return Status::ok();
}

Finished Connector::finished() {
  State &s = *state_;
  Finished out;
  std::vector<std::shared_ptr<LoadJob>> collect;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto &[id, request] : s.requests) {
      if (request.load && !request.load->reported &&
          request.load->handle->ended()) {
        request.load->reported = true;
        collect.push_back(request.load);
        out.loads.push_back(id);
      }
      if (request.save && !request.save->reported && request.save->copied) {
        request.save->reported = true;
        out.saves.push_back(id);
      }
    }
    for (auto it = s.retiredLoads.begin(); it != s.retiredLoads.end();)
      if (it->second->handle->ended()) {
        out.loads.push_back(it->first);
        collect.push_back(it->second);
        it = s.retiredLoads.erase(it);
      } else {
        ++it;
      }
    for (auto it = s.retiredSaves.begin(); it != s.retiredSaves.end();)
      if (it->second->ended) {
        out.saves.push_back(it->first);
        it = s.retiredSaves.erase(it); // Joins its thread, which has ended.
      } else {
        ++it;
      }
  }
  for (const std::shared_ptr<LoadJob> &job : collect)
    (void)resultOf(*job, s.index, s.seed, s.mutex); // Ended: at once.
  return out;
}

const TargetDesc &Connector::target() const { return state_->target; }

const std::string &Connector::tierOf(int store) const {
  return state_->stores.at(std::size_t(store)).tier;
}

const Tier &Connector::storage(int store) const {
  return *state_->stores.at(std::size_t(store)).shared;
}

int64_t Connector::plansCompiled() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->compiled;
}

int64_t Connector::planCacheHits() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->hits;
}

PlanHook bundleHook(std::vector<PlanBundle> bundles) {
  auto held = std::make_shared<std::vector<PlanBundle>>(std::move(bundles));
  return [held](const ModelCompute &model, const TargetDesc &,
                const planning::Request &request, const PlanOptions &options,
                const PricedPlan *) -> StatusOr<PlanBundle> {
    auto wanted = [&](const std::string &name) {
      std::optional<planning::Strategy> strategy = planning::parseStrategy(name);
      return strategy && std::find(options.strategies.begin(),
                                   options.strategies.end(),
                                   *strategy) != options.strategies.end();
    };
    Status otherModel;
    for (const PlanBundle &bundle : *held)
      for (const BundlePlan &plan : bundle.plans)
        if (plan.tokens.begin == 0 && plan.tokens.end == request.tokens &&
            wanted(plan.name)) {
          if (Status fits = checkCompiledFor(bundle, model.fingerprint());
              !fits.isOk()) {
            otherModel = fits; // Never run: say so if nothing else fits.
            continue;
          }
          PlanBundle one = bundle;
          one.plans = {plan};
          return one;
        }
    if (!otherModel.isOk())
      return otherModel;
    return Status(StatusCode::NotFound,
                  "no bundle holds a plan of " +
                      std::to_string(request.tokens) + " tokens");
  };
}

} // namespace kvc::host
