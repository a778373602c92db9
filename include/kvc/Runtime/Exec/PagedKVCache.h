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
// Blocks are handed out by a thread-safe free list, so concurrent restores
// in one process share one cache as a server's requests do. Writes from
// concurrent restores touch disjoint blocks; within one restore, chunks
// cover disjoint (token, layer) ranges.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_EXEC_PAGEDKVCACHE_H
#define KVC_RUNTIME_EXEC_PAGEDKVCACHE_H

#include "kvc/Runtime/Base/Status.h"

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
};

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

  const PagedCacheConfig &config() const { return config_; }
  int64_t kvDim() const { return config_.numKvHeads * config_.headDim; }
  /// Bytes of all key and value caches.
  int64_t bytes() const;

  /// Takes blocks for `tokens` tokens; Unavailable when too few are free
  /// (none are taken then: the server may retry once others release).
  StatusOr<BlockTable> allocate(int64_t tokens);
  /// Returns a table's blocks to the free list.
  void release(BlockTable &table);
  int64_t freeBlocks() const;

  /// Writes K and V ([n][kvDim] fp32, rounded to bf16) of `layer` for tokens
  /// first.. first+n of the request mapped by `table`.
  Status write(const BlockTable &table, int64_t layer, int64_t first,
               int64_t n, const float *k, const float *v);
  /// The same from bf16 values, copied as they are.
  Status write(const BlockTable &table, int64_t layer, int64_t first,
               int64_t n, const uint16_t *k, const uint16_t *v);
  /// Reads them back as fp32 (for verification and the CPU attention).
  Status read(const BlockTable &table, int64_t layer, int64_t first,
              int64_t n, float *k, float *v) const;

  /// The raw caches of `layer`: [num_blocks, block_size, num_kv_heads,
  /// head_dim] bf16 bits.
  const uint16_t *keyCache(int64_t layer) const { return keys_[layer].data(); }
  const uint16_t *valueCache(int64_t layer) const {
    return values_[layer].data();
  }

private:
  explicit PagedKVCache(const PagedCacheConfig &config) : config_(config) {}
  Status checkRange(const BlockTable &table, int64_t layer, int64_t first,
                    int64_t n) const;
  /// The row of `token` in a layer's cache ([num_blocks * block_size] rows).
  int64_t slotOf(const BlockTable &table, int64_t token) const;
  /// Writes row t < n of `k` and `v` (kvDim values each) with `store(dst,
  /// src, count)`.
  template <typename T, typename StoreFn>
  Status writeRows(const BlockTable &table, int64_t layer, int64_t first,
                   int64_t n, const T *k, const T *v, StoreFn store);

  PagedCacheConfig config_;
  std::vector<std::vector<uint16_t>> keys_, values_;
  mutable std::mutex mutex_; ///< Guards free_.
  std::vector<int32_t> free_;
};

} // namespace kvc

#endif // KVC_RUNTIME_EXEC_PAGEDKVCACHE_H
