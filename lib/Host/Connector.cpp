//===- Connector.cpp - The one object a server calls ----------------------===//
//
// Creating a Connector (its stores and the cost model its decisions price
// with), the server's caches it writes, and what it reports. Decisions are
// in ConnectorDecide.cpp, loads and saves in ConnectorJobs.cpp; the state
// they share in ConnectorState.h.
//
//===----------------------------------------------------------------------===//

#include "ConnectorState.h"

#include "kvc/Runtime/Base/Sha256.h"

namespace kvc::host {

namespace {

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

} // namespace

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
        "connector: caches of " + std::to_string(caches.numKvHeads) +
        " heads x " + std::to_string(caches.headDim) +
        " values for a model of " + std::to_string(model.numKvHeads) + " x " +
        std::to_string(model.headDim));
  if (int64_t(caches.keys.size()) != model.numLayers ||
      (caches.layout == CacheLayout::Separate &&
       caches.values.size() != caches.keys.size()))
    return invalidArgument(
        "connector: caches of " + std::to_string(caches.keys.size()) +
        " layers for a model of " + std::to_string(model.numLayers));
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
      layers.push_back(
          {keys, keys ? keys + caches.numBlocks * block : nullptr});
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
    KVC_ASSIGN_OR_RETURN(recorded, recordedLayouts(written->tier(),
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
  KVC_ASSIGN_OR_RETURN(
      profile,
      options.plans.codecProfile.empty()
          ? StatusOr<planning::CodecProfile>(planning::CodecProfile::defaults())
          : planning::CodecProfile::load(options.plans.codecProfile));
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
  if (config.layers != model.numLayers ||
      config.numKvHeads != model.numKvHeads || config.headDim != model.headDim)
    return invalidArgument("connector: caches of another model's shape");
  if (state_->caches && state_->cachesInUse())
    return failedPrecondition(
        "connector: caches are registered already, and a load or "
        "save still uses them");
  if (caches->memory() == CacheMemory::Device &&
      std::string(state_->device->name()) == "cpu")
    return invalidArgument("connector: device caches with the cpu backend");
  state_->caches = std::move(caches);
  return Status::ok();
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
      std::optional<planning::Strategy> strategy =
          planning::parseStrategy(name);
      return strategy &&
             std::find(options.strategies.begin(), options.strategies.end(),
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
    return notFound("no bundle holds a plan of " +
                    std::to_string(request.tokens) + " tokens");
  };
}

} // namespace kvc::host
