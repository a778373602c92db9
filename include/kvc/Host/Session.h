//===- Session.h - Restoring and saving a server's requests -----*- C++ -*-===//
//
// The calls a server makes around its forward pass, over the runtime:
//
//   planRestore    what the stores hold for a request -> a plan bundle,
//                  through a PlanHook (kvc-run binds it to the compiler; a
//                  server without LLVM passes bundles it compiled ahead)
//   RestoreHandle  runs a plan in the background into the server's paged
//                  cache and block table; the server waits for layer i
//                  while later layers still load
//   saveFromCache  writes a request's KV from a paged cache to a store
//
// Threading: every call may come from any thread; restores share the
// ResourcePools (and so the machine's lanes) they are started on. Ownership:
// the caller owns the model, stores, cache, block table and tokens a
// restore reads and writes, and keeps them alive until the handle's wait()
// returns (or the handle is destroyed, which waits). Errors are values.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_SESSION_H
#define KVC_HOST_SESSION_H

#include "kvc/Host/Stores.h"
#include "kvc/Planning/Planner.h"
#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Save/SavePlan.h"

#include <atomic>
#include <functional>
#include <limits>
#include <thread>

namespace kvc::host {

/// How to plan (the compiler's restore pipeline options).
/// How a host plans: the planner's one set of options (strategies, chunk
/// size, staging, layer-wise loads, codec profile, GPU chip) and the
/// request's own budget and forward pass, which planRestore puts in the
/// planning::Request.
struct PlanOptions : planning::PlanOptions {
  /// The tokens of the server's forward pass beside the restore
  /// (planning::Request::forwardTokens): plans are chosen for when it
  /// ends, the first token; 0: for the restore's end.
  int64_t forwardTokens = 0;
  /// The request's quality budget in next-token KL divergence (nats;
  /// planning::Request::maxKl), judged by the profile's measures.
  double maxKl = std::numeric_limits<double>::infinity();
};

/// A plan the caller's planner chose already, and the cost model that
/// priced it (the model's on the target's machine): the Connector's decide,
/// which prices every candidate, hands the one it keeps to the PlanHook.
struct PricedPlan {
  std::shared_ptr<const planning::CostModel> cost;
  /// The strategy whose plan it is (the bundle's plan is named after it).
  planning::Strategy strategy = planning::Strategy::Joint;
  std::shared_ptr<const planning::Evaluation> evaluation;
};

/// Compiles a restore of `request` for `target`: one plan per strategy of
/// `options` (never empty), chunks of `options.chunkTokens`; given `chosen`
/// (`options` then names its strategy), that plan as it was chosen, not
/// searched for again (compilerPlanHook), or the one compiled ahead for the
/// strategy (bundleHook).
using PlanHook = std::function<StatusOr<PlanBundle>(
    const ModelCompute &model, const TargetDesc &target,
    const planning::Request &request, const PlanOptions &options,
    const PricedPlan *chosen)>;

/// Plans the restore of `tokens` from what `store` holds (on `tier` of
/// `target`) through `hook`, in the store's chunks; no strategies in
/// `options`: every one the store's holdings allow.
StatusOr<PlanBundle>
planRestore(const PlanHook &hook, const ModelCompute &model, ChunkStore &store,
            const std::vector<int32_t> &tokens, const TargetDesc &target,
            const std::string &tier, const PlanOptions &options);

/// A paged cache just large enough for a request (and `room` more tokens,
/// to decode after it), its block table, and a restore target naming them,
/// the model, the request's tokens and `store` as every tier in `tiers`
/// (none for a transfer's receiver): what a restore needs when the caller
/// has no cache of its own (kvc-run).
/// Held by pointer: the target points into it.
struct Destination {
  std::unique_ptr<PagedKVCache> cache;
  BlockTable table;
  RestoreTarget target;
};
StatusOr<std::unique_ptr<Destination>>
destinationFor(Device &device, const ModelCompute &model,
               const std::vector<int32_t> &tokens, ChunkStore *store,
               const std::vector<std::string> &tiers, int64_t room = 0);

/// A restore running on a thread of its own (its tasks run on the pools).
class RestoreHandle {
public:
  /// Starts `plan` (copied) into `target`; Unavailable when the system
  /// cannot start the restore's thread.
  static StatusOr<std::unique_ptr<RestoreHandle>>
  start(ResourcePools &pools, const BundlePlan &plan,
        const RestoreTarget &target, RestoreOptions options = {});
  /// The same, running a Cake-shaped `plan` as Cake's two-sided walk
  /// (restoreDynamicCake); InvalidArgument for a plan of another shape.
  static StatusOr<std::unique_ptr<RestoreHandle>>
  startWalk(ResourcePools &pools, const BundlePlan &plan,
            const RestoreTarget &target, RestoreOptions options = {});
  /// Waits for the restore.
  ~RestoreHandle();

  /// Blocks until `layer` holds every token of the request (ok), or the
  /// restore failed (its error), or `timeout` passed (Unavailable).
  Status waitLayer(
      int64_t layer,
      std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    return progress_.wait(layer, timeout);
  }
  /// Runs `then` when `layer` holds every token or the restore has ended
  /// (LayerProgress::whenReady).
  void whenLayerReady(int64_t layer, std::function<void()> then) {
    progress_.whenReady(layer, std::move(then));
  }
  /// Whether the restore has ended (wait() then returns at once).
  bool ended() const { return ended_.load(); }

  /// Blocks until the restore ends; its metrics or its error. Once.
  StatusOr<RestoreMetrics> wait();

private:
  RestoreHandle() = default;
  static StatusOr<std::unique_ptr<RestoreHandle>>
  start(const BundlePlan &plan, const RestoreTarget &target,
        RestoreOptions options,
        std::function<StatusOr<RestoreMetrics>(
            const BundlePlan &, const RestoreTarget &, const RestoreOptions &)>
            run);

  BundlePlan plan_;
  RestoreTarget target_;
  LayerProgress progress_;
  std::atomic<bool> ended_{false};
  StatusOr<RestoreMetrics> result_ = internalError("the restore has not ended");
  std::thread thread_;
};

/// Saves the KV of `tokens` (rows [0, n) of `table` in `cache`) to `store`
/// with `codec`, through savePlanFor's plan: a request a server prefilled,
/// kept for later turns. Objects already stored with `codec` are skipped;
/// other encodings of the same chunks stay beside them; a failed save
/// removes what it wrote. A server with a compiled save plan runs it with
/// kvc::save (SavePlan.h).
StatusOr<SaveMetrics> saveFromCache(Device &device, const PagedKVCache &cache,
                                    const BlockTable &table, ChunkStore &store,
                                    const std::vector<int32_t> &tokens,
                                    const CodecSpec &codec);

} // namespace kvc::host

#endif // KVC_HOST_SESSION_H
