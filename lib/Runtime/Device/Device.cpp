//===- Device.cpp - What every device shares ------------------------------===//

#include "kvc/Runtime/Device/Device.h"

namespace kvc {

StatusOr<std::pair<std::unique_ptr<PagedKVCache>, BlockTable>>
Device::cacheFor(const ModelConfig &model, int64_t tokens) {
  PagedCacheConfig config;
  config.layers = model.numLayers;
  config.numKvHeads = model.numKvHeads;
  config.headDim = model.headDim;
  config.numBlocks = (tokens + config.blockSize - 1) / config.blockSize;
  KVC_ASSIGN_OR_RETURN(cache, createCache(config));
  KVC_ASSIGN_OR_RETURN(table, cache->allocate(tokens));
  return std::pair(std::move(cache), std::move(table));
}

} // namespace kvc
