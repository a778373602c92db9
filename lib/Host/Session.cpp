//===- Session.cpp - Restoring and saving a server's requests -------------===//

#include "kvc/Host/Session.h"

#include "kvc/Planning/Planner.h"
#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Exec/DynamicCake.h"

#include <algorithm>
#include <tuple>

namespace kvc::host {

StatusOr<PlanBundle>
planRestore(const PlanHook &hook, const ModelCompute &model, ChunkStore &store,
            const std::vector<int32_t> &tokens, const TargetDesc &target,
            const std::string &tier, const PlanOptions &options) {
  if (!hook)
    return unimplemented("no planner: pass a compiled plan bundle");
  KVC_ASSIGN_OR_RETURN(matches, matchPrefix(store, tokens));
  planning::Request request;
  request.tokens = int64_t(tokens.size());
  request.sources = sourcesOf(store, matches, request.tokens, tier);
  request.maxKl = options.maxKl;
  request.forwardTokens = options.forwardTokens;
  PlanOptions resolved = options;
  resolved.chunkTokens = store.layout().chunkTokens;
  if (resolved.strategies.empty())
    resolved.strategies = planning::strategiesFor(request.sources);
  return hook(model, target, request, resolved, /*chosen=*/nullptr);
}

StatusOr<std::unique_ptr<Destination>>
destinationFor(Device &device, const ModelCompute &model,
               const std::vector<int32_t> &tokens, ChunkStore *store,
               const std::vector<std::string> &tiers, int64_t room) {
  auto out = std::make_unique<Destination>();
  KVC_ASSIGN_OR_RETURN(
      cache, device.cacheFor(model.config(), int64_t(tokens.size()) +
                                                 std::max<int64_t>(room, 0)));
  std::tie(out->cache, out->table) = std::move(cache);
  out->target.device = &device;
  out->target.model = &model;
  for (const std::string &tier : tiers)
    out->target.stores[tier] = store;
  out->target.tokens = &tokens;
  out->target.cache = out->cache.get();
  out->target.table = &out->table;
  return out;
}

StatusOr<std::unique_ptr<RestoreHandle>>
RestoreHandle::start(ResourcePools &pools, const BundlePlan &plan,
                     const RestoreTarget &target, RestoreOptions options) {
  return start(plan, target, std::move(options),
               [&pools](const BundlePlan &plan, const RestoreTarget &target,
                        const RestoreOptions &options) {
                 return restore(pools, plan, target, options);
               });
}

StatusOr<std::unique_ptr<RestoreHandle>>
RestoreHandle::startWalk(ResourcePools &pools, const BundlePlan &plan,
                         const RestoreTarget &target, RestoreOptions options) {
  KVC_ASSIGN_OR_RETURN(walk, dynamicCakeOptions(plan));
  return start(plan, target, std::move(options),
               [&pools, walk](const BundlePlan &, const RestoreTarget &target,
                              const RestoreOptions &options) {
                 return restoreDynamicCake(pools, target, walk, options);
               });
}

StatusOr<std::unique_ptr<RestoreHandle>> RestoreHandle::start(
    const BundlePlan &plan, const RestoreTarget &target, RestoreOptions options,
    std::function<StatusOr<RestoreMetrics>(
        const BundlePlan &, const RestoreTarget &, const RestoreOptions &)>
        run) {
  std::unique_ptr<RestoreHandle> handle(new RestoreHandle);
  handle->plan_ = plan;
  handle->target_ = target;
  options.progress = &handle->progress_;
  RestoreHandle *self = handle.get();
  KVC_ASSIGN_OR_RETURN(
      thread, startThread([self, options, run = std::move(run)] {
        self->result_ = run(self->plan_, self->target_, options);
        self->ended_ = true;
      }));
  handle->thread_ = std::move(thread);
  return handle;
}

RestoreHandle::~RestoreHandle() {
  if (thread_.joinable())
    thread_.join();
}

StatusOr<RestoreMetrics> RestoreHandle::wait() {
  if (!thread_.joinable())
    return failedPrecondition("the restore was waited for already");
  thread_.join();
  return std::move(result_);
}

StatusOr<SaveMetrics> saveFromCache(Device &device, const PagedKVCache &cache,
                                    const BlockTable &table, ChunkStore &store,
                                    const std::vector<int32_t> &tokens,
                                    const CodecSpec &codec) {
  BundlePlan plan =
      savePlanFor(store, int64_t(tokens.size()), {Form::KV}, codec, "store");
  KVC_ASSIGN_OR_RETURN(pools, device.createPools(planResources(plan)));
  PagedCacheSource source(device, cache, table);
  SaveTarget target;
  target.source = &source;
  target.stores["store"] = &store;
  target.tokens = &tokens;
  return save(*pools, plan, target);
}

} // namespace kvc::host
