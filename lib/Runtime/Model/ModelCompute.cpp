//===- ModelCompute.cpp - The model a restore computes with ---------------===//

#include "kvc/Runtime/Model/ModelCompute.h"

#include <algorithm>

namespace kvc {

ModelCompute::Cache ModelCompute::newCache() const {
  Cache cache;
  cache.dim = kvDim();
  cache.k.resize(config().numLayers);
  cache.v.resize(config().numLayers);
  return cache;
}

Status ModelCompute::Cache::append(int64_t layer, int64_t position, int64_t n,
                                   const float *kRows, const float *vRows) {
  std::vector<float> &K = k[layer], &V = v[layer];
  if (int64_t(K.size()) != position * dim)
    return failedPrecondition("prefilling layer " + std::to_string(layer) +
                              " at token " + std::to_string(position) +
                              ", where it holds " +
                              std::to_string(int64_t(K.size()) / dim));
  K.insert(K.end(), kRows, kRows + n * dim);
  V.insert(V.end(), vRows, vRows + n * dim);
  return Status::ok();
}

Status ModelCompute::Cache::rows(int64_t layer, int64_t first, int64_t count,
                                 KeyValueRows &out) {
  if (first < 0 || (first + count) * dim > int64_t(k[layer].size()))
    return internalError("cache: reading tokens past its end");
  out = {k[layer].data() + first * dim, v[layer].data() + first * dim};
  return Status::ok();
}

Status ModelCompute::prefill(Cache &cache, const int32_t *tokens, int64_t n,
                             const LayerCallback &onLayer,
                             int64_t layers) const {
  if (layers < 0)
    layers = config().numLayers;
  // (Too many layers: the general prefill says so.)
  for (int64_t l = 0; layers <= config().numLayers && l < layers; ++l)
    if (int64_t(cache.k[l].size()) != cache.tokens * kvDim())
      return failedPrecondition(
          "prefilling layer " + std::to_string(l) +
          ", which an earlier shallower prefill left behind");
  KVC_RETURN_IF_ERROR(prefill(static_cast<KVContext &>(cache), cache.tokens,
                              tokens, n, onLayer, layers));
  cache.tokens += std::max<int64_t>(n, 0);
  return Status::ok();
}

} // namespace kvc
