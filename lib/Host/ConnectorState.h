//===- ConnectorState.h - What the Connector's files share ------*- C++ -*-===//
//
// Private to lib/Host. The Connector's state: the stores (one ChunkStore per
// recorded layout of each), a local prefix index, two caches keyed by a
// request's shape (PlanShape: the priced decision with the plan it chose,
// the compiled plan), the pools per set of lanes, and the requests. One
// mutex guards them; loads and saves run on threads of their own and are
// waited for without it. A cold decision searches each candidate's plan
// once (pricing it) and compiles the one it keeps as chosen (PricedPlan),
// outside the mutex.
//
// The Connector's files, by concern: Connector.cpp (creating it, the
// server's caches, what it reports), ConnectorDecide.cpp (lookups, prices,
// plans and decisions), ConnectorJobs.cpp (loads and saves).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_HOST_CONNECTORSTATE_H
#define KVC_LIB_HOST_CONNECTORSTATE_H

#include "kvc/Host/Connector.h"

#include "kvc/Planning/Planner.h"
#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace kvc::host {

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

  bool operator<(const PlanShape &o) const {
    auto tie = [](const PlanShape &x) {
      return std::tie(x.tokens, x.forwardTokens, x.server, x.store,
                      x.chunkTokens, x.layerGroup, x.sources, x.strategies);
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
  StatusOr<double> computePrice(int64_t tokens);

  /// The best of `strategies` for `request`, by the first token.
  StatusOr<Priced>
  price(const planning::Request &request, int64_t chunkTokens,
        const std::vector<planning::Strategy> &strategies) const;

  /// The plan compiled for `shape`, or null.
  std::shared_ptr<const CompiledPlan> cachedPlan(const PlanShape &shape);

  /// The plan of `strategy` for `request`, compiled: `chosen` (decide's
  /// pricing) as it is, or, without one, as the planner chooses. Touches
  /// nothing the lock guards (the options, model, target and cost model are
  /// fixed at create): called without it, so that a compile does not hold
  /// up other requests.
  StatusOr<std::shared_ptr<const CompiledPlan>>
  compilePlan(const planning::Request &request, int64_t chunkTokens,
              planning::Strategy strategy,
              std::shared_ptr<const planning::Evaluation> chosen) const;

  /// Keeps `plan` as `shape`'s; the one kept first if another request
  /// compiled the same shape meanwhile.
  std::shared_ptr<const CompiledPlan>
  keepPlan(const PlanShape &shape, std::shared_ptr<const CompiledPlan> plan);

  /// The plan of `strategy` for `request` (`chosen` by decide's pricing,
  /// if it was priced), compiled once per `shape`: `lock` (held on
  /// `mutex`) is let go while it compiles.
  StatusOr<std::shared_ptr<const CompiledPlan>>
  planFor(std::unique_lock<std::mutex> &lock, const PlanShape &shape,
          const planning::Request &request, int64_t chunkTokens,
          planning::Strategy strategy,
          std::shared_ptr<const planning::Evaluation> chosen = nullptr);

  /// The price of `request`'s loads by the best of `shape`'s strategies,
  /// priced once per shape: `lock` (held on `mutex`) is let go while the
  /// planner prices it.
  StatusOr<Priced> priceFor(std::unique_lock<std::mutex> &lock,
                            const PlanShape &shape,
                            const planning::Request &request);

  /// Store `s`'s holding `match` of `tokens` in `store`, with what of it
  /// answers now (Lookup::Held::answering): the parts of a tier known not
  /// to answer (Tier::answers) are asked nothing.
  static Lookup::Held answering(ChunkStore &store, int s,
                                const std::vector<int32_t> &tokens,
                                const PrefixMatch &match);

  /// The stores' answers for `tokens`, from the index when it knows the
  /// whole request, else from the stores (what they hold recorded).
  StatusOr<Lookup> lookupLocked(const std::vector<int32_t> &tokens);

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
      return failedPrecondition("connector: request " + id + " is loading");
    return Status::ok();
  }

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
                      int64_t length, int64_t n, int64_t onDevice) const;

  /// Store `store`'s chunks in `layout`, or null where it has none open.
  ChunkStore *layoutOf(int store, const StoreLayout &layout) const {
    for (const auto &open : stores[store].layouts)
      if (open->layout().chunkTokens == layout.chunkTokens &&
          open->layout().layerGroup == layout.layerGroup)
        return open.get();
    return nullptr;
  }

  /// `request` loads by `plan` from store `store`'s chunks in `layout`.
  void loadBy(Request &request, std::shared_ptr<const CompiledPlan> plan,
              int store, const StoreLayout &layout) const {
    request.plan = std::move(plan);
    request.stores[stores[store].tier] = layoutOf(store, layout);
  }

  /// Forgets request `id`'s decision and load (a save of the same id goes
  /// on) and starts it again with `tokens`.
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
      return failedPrecondition(
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

} // namespace kvc::host

#endif // KVC_LIB_HOST_CONNECTORSTATE_H
