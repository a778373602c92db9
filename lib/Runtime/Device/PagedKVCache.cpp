//===- PagedKVCache.cpp - The restore target, in vLLM's layout ------------===//

#include "kvc/Runtime/Device/PagedKVCache.h"

#include "kvc/Runtime/Base/Half.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

namespace kvc {

PagedKVCache::PagedKVCache(const PagedCacheConfig &config)
    : config_(config),
      stride_(config.blockStride > 0
                  ? config.blockStride
                  : config.blockSize * config.numKvHeads * config.headDim) {
  // Hand out low block numbers first.
  for (int64_t b = config.numBlocks - 1; b >= 0; --b)
    free_.push_back(int32_t(b));
}

Status PagedKVCache::checkConfig(const PagedCacheConfig &config) {
  if (config.layers <= 0 || config.numKvHeads <= 0 || config.headDim <= 0 ||
      config.blockSize <= 0 || config.numBlocks <= 0)
    return invalidArgument("paged cache: layers, kv heads, head dim, block "
                           "size and block count must be positive");
  if (config.numBlocks > INT32_MAX)
    return invalidArgument("paged cache: at most 2^31-1 blocks");
  if (config.dtype != DType::BF16 && config.dtype != DType::F16)
    return invalidArgument(std::string("paged cache: elements of ") +
                           dtypeName(config.dtype) + " (bf16 or f16)");
  const int64_t block = config.blockSize * config.numKvHeads * config.headDim;
  if (config.blockStride != 0 && config.blockStride < block)
    return invalidArgument(
        "paged cache: a block stride of " + std::to_string(config.blockStride) +
        " elements is shorter than a block's " + std::to_string(block));
  return Status::ok();
}

StatusOr<std::unique_ptr<PagedKVCache>>
PagedKVCache::create(const PagedCacheConfig &config) {
  KVC_RETURN_IF_ERROR(checkConfig(config));
  std::unique_ptr<PagedKVCache> cache(new PagedKVCache(config));
  const int64_t perLayer = config.numBlocks * cache->stride_;
  try {
    cache->owned_.assign(2 * config.layers, std::vector<uint16_t>(perLayer));
  } catch (const std::bad_alloc &) {
    return unavailable("paged cache: cannot allocate " +
                       std::to_string(4 * config.layers * perLayer) + " bytes");
  }
  for (int64_t l = 0; l < config.layers; ++l)
    cache->layers_.push_back(
        {cache->owned_[2 * l].data(), cache->owned_[2 * l + 1].data()});
  return cache;
}

StatusOr<std::unique_ptr<PagedKVCache>>
PagedKVCache::view(const PagedCacheConfig &config,
                   std::vector<PagedLayerMemory> layers, CacheMemory memory,
                   std::shared_ptr<void> owner) {
  KVC_RETURN_IF_ERROR(checkConfig(config));
  if (int64_t(layers.size()) != config.layers)
    return invalidArgument("paged cache: " + std::to_string(layers.size()) +
                           " layers of memory for a " +
                           std::to_string(config.layers) + "-layer cache");
  for (std::size_t l = 0; l < layers.size(); ++l)
    if (!layers[l].keys || !layers[l].values)
      return invalidArgument("paged cache: layer " + std::to_string(l) +
                             " has no key or value memory");
  std::unique_ptr<PagedKVCache> cache(new PagedKVCache(config));
  cache->layers_ = std::move(layers);
  cache->memory_ = memory;
  cache->owner_ = std::move(owner);
  return cache;
}

int64_t PagedKVCache::bytes() const {
  return 2 * config_.layers * config_.numBlocks * config_.blockSize * kvDim() *
         int64_t(sizeof(uint16_t));
}

StatusOr<BlockTable> PagedKVCache::allocate(int64_t tokens) {
  if (tokens < 0)
    return invalidArgument("paged cache: negative token count");
  const int64_t needed = (tokens + config_.blockSize - 1) / config_.blockSize;
  std::lock_guard<std::mutex> lock(mutex_);
  if (needed > int64_t(free_.size()))
    return unavailable("paged cache: " + std::to_string(tokens) +
                       " tokens need " + std::to_string(needed) + " blocks, " +
                       std::to_string(free_.size()) + " are free");
  BlockTable table;
  table.blocks.assign(free_.end() - needed, free_.end());
  free_.resize(free_.size() - needed);
  return table;
}

void PagedKVCache::release(BlockTable &table) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.insert(free_.end(), table.blocks.rbegin(), table.blocks.rend());
  table.blocks.clear();
}

int64_t PagedKVCache::freeBlocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(free_.size());
}

Status PagedKVCache::checkHost() const {
  if (memory_ == CacheMemory::Device)
    return failedPrecondition(
        "paged cache: the cache is in device memory; the host "
        "reaches it through its backend");
  return Status::ok();
}

Status PagedKVCache::checkRange(const BlockTable &table, int64_t layerBegin,
                                int64_t layerEnd, int64_t first,
                                int64_t n) const {
  if (layerBegin < 0 || layerEnd > config_.layers || layerBegin > layerEnd)
    return invalidArgument("paged cache: " +
                           (layerEnd == layerBegin + 1
                                ? "layer " + std::to_string(layerBegin)
                                : "layers " + std::to_string(layerBegin) +
                                      " to " + std::to_string(layerEnd)) +
                           " out of range");
  if (first < 0 || n < 0 || first + n > table.capacity(config_.blockSize))
    return invalidArgument(
        "paged cache: tokens " + std::to_string(first) + " to " +
        std::to_string(first + n) + " exceed the block table's " +
        std::to_string(table.capacity(config_.blockSize)) + " tokens");
  for (int32_t block : table.blocks)
    if (block < 0 || block >= config_.numBlocks)
      return invalidArgument("paged cache: block " + std::to_string(block) +
                             " does not exist");
  return Status::ok();
}

int64_t PagedKVCache::rowOf(const BlockTable &table, int64_t token) const {
  return int64_t(table.blocks[token / config_.blockSize]) * stride_ +
         token % config_.blockSize * kvDim();
}

StatusOr<std::vector<ByteSpan>>
PagedKVCache::hostRows(const BlockTable &table, int64_t layer, bool values,
                       int64_t first, int64_t n) {
  KVC_RETURN_IF_ERROR(checkHost());
  KVC_RETURN_IF_ERROR(checkRange(table, layer, first, n));
  uint16_t *base = values ? layers_[layer].values : layers_[layer].keys;
  const int64_t block = config_.blockSize;
  std::vector<ByteSpan> spans;
  for (int64_t t = first; t < first + n;) {
    const int64_t rows = std::min(block - t % block, first + n - t);
    spans.push_back({reinterpret_cast<char *>(base + rowOf(table, t)),
                     std::size_t(rows * kvDim()) * sizeof(uint16_t)});
    t += rows;
  }
  return spans;
}

template <typename T, typename StoreFn>
Status PagedKVCache::writeRows(const BlockTable &table, int64_t layer,
                               int64_t first, int64_t n, const T *k,
                               const T *v, StoreFn store) {
  KVC_RETURN_IF_ERROR(checkHost());
  KVC_RETURN_IF_ERROR(checkRange(table, layer, first, n));
  const int64_t dim = kvDim();
  uint16_t *keys = layers_[layer].keys;
  uint16_t *values = layers_[layer].values;
  for (int64_t t = 0; t < n; ++t) {
    int64_t row = rowOf(table, first + t);
    store(keys + row, k + t * dim, dim);
    store(values + row, v + t * dim, dim);
  }
  return Status::ok();
}

namespace {

/// Rounds `count` values to f16 into `dst`; false when a finite one is
/// beyond f16's range (it would be stored as an infinity).
template <typename ToFloat>
bool storeF16(uint16_t *dst, int64_t count, ToFloat value) {
  bool inRange = true;
  for (int64_t i = 0; i < count; ++i) {
    const float x = value(i);
    dst[i] = floatToF16(x);
    inRange &= (dst[i] & 0x7fff) != 0x7c00 || std::isinf(x);
  }
  return inRange;
}

Status outOfF16Range() {
  return dataLoss("paged cache: a value beyond f16's range (65504) for an f16 "
                  "cache");
}

} // namespace

Status PagedKVCache::write(const BlockTable &table, int64_t layer,
                           int64_t first, int64_t n, const float *k,
                           const float *v) {
  bool inRange = true;
  KVC_RETURN_IF_ERROR(writeRows(
      table, layer, first, n, k, v,
      [&](uint16_t *dst, const float *src, int64_t count) {
        if (config_.dtype == DType::F16) {
          inRange &= storeF16(dst, count, [&](int64_t i) { return src[i]; });
          return;
        }
        for (int64_t i = 0; i < count; ++i)
          dst[i] = floatToBf16(src[i]);
      }));
  return inRange ? Status::ok() : outOfF16Range();
}

Status PagedKVCache::write(const BlockTable &table, int64_t layer,
                           int64_t first, int64_t n, const uint16_t *k,
                           const uint16_t *v) {
  bool inRange = true;
  KVC_RETURN_IF_ERROR(writeRows(
      table, layer, first, n, k, v,
      [&](uint16_t *dst, const uint16_t *src, int64_t count) {
        if (config_.dtype == DType::F16) {
          inRange &= storeF16(dst, count,
                              [&](int64_t i) { return bf16ToFloat(src[i]); });
          return;
        }
        std::memcpy(dst, src, size_t(count) * sizeof(uint16_t));
      }));
  return inRange ? Status::ok() : outOfF16Range();
}

Status PagedKVCache::read(const BlockTable &table, int64_t layer,
                          int64_t first, int64_t n, float *k,
                          float *v) const {
  KVC_RETURN_IF_ERROR(checkHost());
  KVC_RETURN_IF_ERROR(checkRange(table, layer, first, n));
  const int64_t dim = kvDim();
  const uint16_t *keys = layers_[layer].keys;
  const uint16_t *values = layers_[layer].values;
  const bool f16 = config_.dtype == DType::F16;
  for (int64_t t = 0; t < n; ++t) {
    int64_t row = rowOf(table, first + t);
    for (int64_t i = 0; i < dim; ++i) {
      k[t * dim + i] = f16 ? f16ToFloat(keys[row + i]) : bf16ToFloat(keys[row + i]);
      v[t * dim + i] =
          f16 ? f16ToFloat(values[row + i]) : bf16ToFloat(values[row + i]);
    }
  }
  return Status::ok();
}

} // namespace kvc
