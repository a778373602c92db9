//===- Stores.cpp - Stores a server opens and matches requests against ----===//

#include "kvc/Host/Stores.h"

#include <algorithm>

namespace kvc::host {

StatusOr<std::unique_ptr<ChunkStore>> openStore(const StoreOptions &options,
                                                const ModelCompute &model) {
  StoreLayout layout = options.layout;
  if (layout.chunkTokens < 0 || layout.layerGroup <= 0)
    return invalidArgument("a store's chunk tokens and layer group must be "
                           "positive");
  KVC_ASSIGN_OR_RETURN(opened, openTier(options.url, options.access));
  std::shared_ptr<Tier> tier = std::move(opened);
  if (layout.chunkTokens == 0) {
    KVC_ASSIGN_OR_RETURN(recorded, recordedLayouts(*tier, model.fingerprint(),
                                                   options.tenant));
    layout = recorded.empty() ? StoreLayout() : recorded.front();
  }
  return std::make_unique<ChunkStore>(std::move(tier), model.config(),
                                      model.fingerprint(), options.tenant,
                                      layout);
}

StatusOr<std::vector<PrefixMatch>>
matchPrefix(ChunkStore &store, const std::vector<int32_t> &tokens) {
  const int64_t n = int64_t(tokens.size());
  std::vector<PrefixMatch> matches;
  bool any = false;
  for (Form form : {Form::KV, Form::Hidden}) {
    KVC_ASSIGN_OR_RETURN(extents, store.stored(tokens.data(), n, form));
    for (const StoredExtent &extent : extents) {
      matches.push_back({form, extent.tokens, extent.codec});
      any |= extent.tokens > 0;
    }
  }
  if (any)
    return matches;
  for (Form form : {Form::KV, Form::Hidden}) {
    KVC_ASSIGN_OR_RETURN(others, store.otherLayouts(tokens.data(), n, form));
    if (!others.empty())
      return Status(
          StatusCode::FailedPrecondition,
          "the store holds this request saved with --chunk-tokens " +
              std::to_string(others.front().chunkTokens) + " --layer-group " +
              std::to_string(others.front().layerGroup) + ", not the " +
              std::to_string(store.layout().chunkTokens) + " and " +
              std::to_string(store.layout().layerGroup) +
              " this command reads with; pass those");
  }
  return matches;
}

StatusOr<TierDesc *> storeTier(TargetDesc &target, const Tier &store,
                               const std::string &name) {
  const std::string &url = store.url();
  KVC_ASSIGN_OR_RETURN(scheme, tierSchemeOf(url));
  const TierDesc::Kind kind = scheme.kind;
  for (TierDesc &tier : target.tiers) {
    if (name.empty() ? tier.kind != kind : tier.name != name)
      continue;
    if (double gbs = store.throttleGBs(); gbs > 0)
      tier.throttleGBs = gbs;
    return &tier;
  }
  return invalidArgument("target " + target.name + " has no " +
                         (name.empty()
                              ? std::string("tier of the kind of ") + url
                              : "tier " + name) +
                         " (name one with --tier)");
}

std::vector<planning::Source> sourcesOf(const ChunkStore &store,
                                        const std::vector<PrefixMatch> &matches,
                                        int64_t tokens,
                                        const std::string &tier) {
  std::vector<planning::Source> sources;
  for (const PrefixMatch &match : matches) {
    if (match.tokens < tokens)
      continue;
    planning::Source source;
    source.tier = tier;
    source.form = match.form;
    source.codec = match.codec;
    source.box = {0, tokens, 0, store.model().numLayers};
    source.tokenGroup = store.layout().chunkTokens;
    source.layerGroup = store.layout().layerGroup;
    sources.push_back(source);
  }
  return sources;
}

} // namespace kvc::host
