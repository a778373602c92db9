//===- PagedPrefill.cpp - A restore's computed part, on any device --------===//
//
// Both restore paths (compiled plans and Cake's dynamic mode) compute their
// part of a request through one PagedPrefill, which writes exact K and V
// into the paged cache with the runner's prefillInto and the device's
// copyRows.
//
// Plans compute each layer forward from token 0: Cake's front, HCache's
// recomputed first layers, the joint plans' both. Such a chunk is prefilled
// straight into the paged cache and attends over the tokens this state
// computed there before, as a server's chunked prefill attends over its
// cache: the cache is the attention context, so computing costs no memory
// that grows with the context. The model rounds K and V to the cache's
// bf16 where it produces them, so this is the same prefill as the
// reference's over its own vectors.
//
// Anything else — a fallback for a chunk that could not be loaded, a chunk
// computed after tokens that were loaded — is exact only over an exact
// context, and loaded tokens need not be (a lossy codec, hidden states
// projected). Those come from a private prefill into a second paged cache
// of the device's, seeded with the tokens computed into the restore's
// cache and extended as far as they need; only restores that take that
// path hold it. Thread-safe.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Model/ModelRunner.h"

#include <algorithm>
#include <mutex>

namespace kvc {

namespace {

class PagedPrefill final : public PrefillSession {
public:
  PagedPrefill(ModelRunner &runner, const std::vector<int32_t> &tokens,
               PagedKVCache &cache, const BlockTable &table)
      : runner_(runner), device_(runner.device()), model_(runner.model()),
        tokens_(tokens), cache_(cache), table_(table),
        computed_(model_.config().numLayers, 0),
        held_(model_.config().numLayers, 0) {}

  ~PagedPrefill() override {
    if (exact_)
      exact_->release(exactTable_);
  }

  Status compute(const ChunkBox &box) override {
    const int64_t t0 = box.tokenBegin, t1 = box.tokenEnd;
    const int64_t l0 = box.layerBegin, l1 = box.layerEnd;
    std::lock_guard<std::mutex> lock(mutex_);
    bool extendsComputed = l0 == 0;
    for (int64_t l = 0; l < l1; ++l)
      extendsComputed &= computed_[l] == t0;
    if (extendsComputed) {
      KVC_RETURN_IF_ERROR(runner_.prefillInto(
          cache_, table_, tokens_.data() + t0, t0, t1 - t0, l1));
      std::fill(computed_.begin(), computed_.begin() + l1, t1);
      flops_ += model_.prefillFlops(t1 - t0, l1);
      return Status::ok();
    }
    KVC_RETURN_IF_ERROR(extendExactLocked(t1, l1));
    for (int64_t l = l0; l < l1; ++l)
      KVC_RETURN_IF_ERROR(device_.copyRows(*exact_, exactTable_, cache_, table_,
                                           l, t0, t1 - t0));
    return Status::ok();
  }

  double flops() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return flops_;
  }

  int64_t exactContextBytes() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return exact_ ? exact_->bytes() : 0;
  }

private:
  /// Makes layers [0, depth) of the private prefill hold tokens [0, end).
  /// Plans compute the first layers of late tokens only (HCache's
  /// complement), so its deeper layers may lag; a box that needs one of
  /// those starts over at full depth.
  Status extendExactLocked(int64_t end, int64_t depth) {
    bool lagging = false;
    if (exact_) {
      const int64_t needed = std::min(end, exactTokens_);
      for (int64_t l = 0; l < depth; ++l)
        lagging |= held_[l] < needed;
    }
    if (!exact_ || lagging) {
      KVC_RETURN_IF_ERROR(seedExactLocked());
      depth = model_.config().numLayers;
    }
    const int64_t begin = exactTokens_;
    if (end <= begin)
      return Status::ok();
    KVC_RETURN_IF_ERROR(runner_.prefillInto(*exact_, exactTable_,
                                            tokens_.data() + begin, begin,
                                            end - begin, depth));
    std::fill(held_.begin(), held_.begin() + depth, end);
    exactTokens_ = end;
    flops_ += model_.prefillFlops(end - begin, depth);
    return Status::ok();
  }

  /// Starts the private prefill from the tokens every layer computed into
  /// the cache: they are exact there, bf16 as the model holds them.
  Status seedExactLocked() {
    if (!exact_) {
      PagedCacheConfig config = cache_.config();
      config.blockStride = 0;
      config.numBlocks =
          (int64_t(tokens_.size()) + config.blockSize - 1) / config.blockSize;
      KVC_ASSIGN_OR_RETURN(cache, device_.createCache(config));
      exact_ = std::move(cache);
      KVC_ASSIGN_OR_RETURN(table, exact_->allocate(int64_t(tokens_.size())));
      exactTable_ = std::move(table);
    }
    const int64_t seeded =
        *std::min_element(computed_.begin(), computed_.end());
    for (int64_t l = 0; l < model_.config().numLayers; ++l)
      KVC_RETURN_IF_ERROR(
          device_.copyRows(cache_, table_, *exact_, exactTable_, l, 0, seeded));
    std::fill(held_.begin(), held_.end(), seeded);
    exactTokens_ = seeded;
    return Status::ok();
  }

  ModelRunner &runner_;
  Device &device_;
  const ModelCompute &model_;
  const std::vector<int32_t> &tokens_;
  PagedKVCache &cache_;
  const BlockTable &table_;
  mutable std::mutex mutex_;
  /// Per layer, the tokens [0, n) this state prefilled into the cache.
  std::vector<int64_t> computed_;
  /// The private exact prefill: per layer, the tokens [0, n) it holds, and
  /// the tokens its last full-depth extension reached.
  std::unique_ptr<PagedKVCache> exact_;
  BlockTable exactTable_;
  std::vector<int64_t> held_;
  int64_t exactTokens_ = 0;
  double flops_ = 0;
};

} // namespace

std::unique_ptr<PrefillSession>
ModelRunner::prefill(const std::vector<int32_t> &tokens, PagedKVCache &cache,
                     const BlockTable &table) {
  return std::make_unique<PagedPrefill>(*this, tokens, cache, table);
}

} // namespace kvc
