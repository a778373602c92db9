//===- PagedKVCache.h - The restore target, in vLLM's layout ----*- C++ -*-===//
//
// Where a restore puts the KV cache: per layer, a key cache and a value cache
// of shape [num_blocks, block_size, num_kv_heads, head_dim] in bf16, as vLLM
// lays out its paged attention cache; a request's tokens are addressed
// through a block table (logical block -> physical block). The executor
// writes each restored chunk straight into the blocks it covers, so the
// cache a server decodes from is the one the plan filled — there is no
// contiguous copy to hand over.
//
// The caches are kvc's own (create) or a view of memory a caller owns
// (view): a server's cache, a PyTorch tensor's storage. A view also takes
// the distance between consecutive blocks, so that it covers both of vLLM's
// layouts: K and V caches of their own (blocks block_size * kv_heads *
// head_dim apart) and one tensor interleaving them per block
// ([num_blocks, 2, block_size, kv_heads, head_dim]: blocks twice that
// apart, V one block's size after K).
//
// A cache lives in host memory (the CPU backend's) or in a GPU's memory
// (the CUDA backend's, or a view of a server's device tensors). The host
// reads and writes below touch host caches only; a device cache is written
// and read through its backend.
//
// Blocks are handed out by a thread-safe free list, so concurrent restores
// in one process share one cache as a server's requests do. Writes from
// concurrent restores touch disjoint blocks; within one restore, chunks
// cover disjoint (token, layer) ranges.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_PAGEDKVCACHE_H
#define KVC_RUNTIME_DEVICE_PAGEDKVCACHE_H

#include "kvc/Runtime/Base/ByteSpan.h"
#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace kvc {

struct PagedCacheConfig {
  int64_t layers = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  int64_t blockSize = 16; ///< Tokens per block (vLLM's default).
  int64_t numBlocks = 0;
  /// Elements from one block's start to the next's; 0: blockSize *
  /// numKvHeads * headDim (blocks back to back).
  int64_t blockStride = 0;
  /// The elements' type: bf16 (kvc's own caches), or f16 for a server's
  /// (host caches only: values written are rounded to it, a value beyond
  /// its range is an error, and generated kernels are not launched on it).
  DType dtype = DType::BF16;
};

/// One layer's caches in memory a caller owns: the first element of block 0
/// of its key cache and of its value cache (elements of the cache's dtype).
struct PagedLayerMemory {
  uint16_t *keys = nullptr;
  uint16_t *values = nullptr;
};

/// Where a cache's memory is.
enum class CacheMemory { Host, Device };

/// A request's logical -> physical block mapping.
struct BlockTable {
  std::vector<int32_t> blocks;
  /// Tokens the table can hold.
  int64_t capacity(int64_t blockSize) const {
    return int64_t(blocks.size()) * blockSize;
  }
};

class PagedKVCache {
public:
  /// Allocates the caches; fails on a non-positive dimension or when they
  /// would not fit in memory.
  static StatusOr<std::unique_ptr<PagedKVCache>>
  create(const PagedCacheConfig &config);
  /// A cache over `layers` (one entry per layer) in `memory`, which the
  /// caller keeps alive while the cache is used (or hands over as `owner`,
  /// released with the cache); each must hold numBlocks blocks
  /// `blockStride` elements apart. Fails on a missing pointer, a
  /// non-positive dimension or a stride shorter than a block.
  static StatusOr<std::unique_ptr<PagedKVCache>>
  view(const PagedCacheConfig &config, std::vector<PagedLayerMemory> layers,
       CacheMemory memory = CacheMemory::Host,
       std::shared_ptr<void> owner = nullptr);

  const PagedCacheConfig &config() const { return config_; }
  CacheMemory memory() const { return memory_; }
  int64_t kvDim() const { return config_.numKvHeads * config_.headDim; }
  /// Bytes of all key and value caches (their blocks' rows).
  int64_t bytes() const;
  /// Elements from one block's start to the next's.
  int64_t blockStride() const { return stride_; }

  /// Takes blocks for `tokens` tokens; Unavailable when too few are free
  /// (none are taken then: the server may retry once others release).
  StatusOr<BlockTable> allocate(int64_t tokens);
  /// Returns a table's blocks to the free list.
  void release(BlockTable &table);
  int64_t freeBlocks() const;

  /// Checks that tokens first.. first+n of layers [layerBegin, layerEnd)
  /// lie in `table`, whose blocks exist.
  Status checkRange(const BlockTable &table, int64_t layerBegin,
                    int64_t layerEnd, int64_t first, int64_t n) const;
  Status checkRange(const BlockTable &table, int64_t layer, int64_t first,
                    int64_t n) const {
    return checkRange(table, layer, layer + 1, first, n);
  }
  /// The offset of `token`'s row in a layer's cache, in elements.
  int64_t rowOf(const BlockTable &table, int64_t token) const;

  /// Writes K and V ([n][kvDim] fp32, rounded to the cache's type) of
  /// `layer` for tokens first.. first+n of the request mapped by `table`;
  /// FailedPrecondition on a device cache (as for the other host accesses
  /// below), DataLoss for a finite value beyond an f16 cache's range.
  Status write(const BlockTable &table, int64_t layer, int64_t first,
               int64_t n, const float *k, const float *v);
  /// The same from bf16 values, copied as they are (converted, into an f16
  /// cache).
  Status write(const BlockTable &table, int64_t layer, int64_t first,
               int64_t n, const uint16_t *k, const uint16_t *v);
  /// Reads them back as fp32 (for verification and the CPU attention).
  Status read(const BlockTable &table, int64_t layer, int64_t first,
              int64_t n, float *k, float *v) const;

  /// The host memory of tokens first.. first+n of `layer`'s key cache (or
  /// its value cache), one span per run of rows within a block, in token
  /// order: where a reader puts stored rows as they are, each byte once.
  /// FailedPrecondition on a device cache; checkRange's errors.
  StatusOr<std::vector<ByteSpan>> hostRows(const BlockTable &table,
                                           int64_t layer, bool values,
                                           int64_t first, int64_t n);

  /// The raw caches of `layer`: block b's [block_size, num_kv_heads,
  /// head_dim] elements (bf16 or f16 bits, config().dtype) start
  /// b * blockStride() elements in (device addresses in a device cache).
  const uint16_t *keyCache(int64_t layer) const { return layers_[layer].keys; }
  const uint16_t *valueCache(int64_t layer) const {
    return layers_[layer].values;
  }

private:
  explicit PagedKVCache(const PagedCacheConfig &config);
  static Status checkConfig(const PagedCacheConfig &config);
  Status checkHost() const;
  /// Writes row t < n of `k` and `v` (kvDim values each) with `store(dst,
  /// src, count)`.
  template <typename T, typename StoreFn>
  Status writeRows(const BlockTable &table, int64_t layer, int64_t first,
                   int64_t n, const T *k, const T *v, StoreFn store);

  PagedCacheConfig config_;
  int64_t stride_ = 0;
  std::vector<PagedLayerMemory> layers_;
  CacheMemory memory_ = CacheMemory::Host;
  /// The memory of a cache that create() made.
  std::vector<std::vector<uint16_t>> owned_;
  /// Memory handed over by view().
  std::shared_ptr<void> owner_;
  mutable std::mutex mutex_; ///< Guards free_.
  std::vector<int32_t> free_;
};

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_PAGEDKVCACHE_H
