//===- PrefillState.h - The computed part of a restore -----------*- C++ -*-===//
//
// Private to lib/Runtime/Exec. Both restore paths (compiled plans and
// Cake's dynamic mode) compute their part of a request through one
// PrefillState, which writes exact K and V into the paged cache.
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
// projected). Those come from a private fp32 prefill, seeded with the tokens
// computed into the cache and extended as far as they need; only restores
// that take that path hold it. Thread-safe.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_EXEC_PREFILLSTATE_H
#define KVC_LIB_RUNTIME_EXEC_PREFILLSTATE_H

#include "kvc/Runtime/Exec/PagedKVCache.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#include <algorithm>
#include <mutex>
#include <optional>

namespace kvc::exec_detail {

/// A request's paged cache as a prefill's attention context: appends write
/// blocks, reads convert one run of rows at a time into scratch.
class PagedContext final : public KVContext {
public:
  PagedContext(PagedKVCache &cache, const BlockTable &table)
      : cache_(cache), table_(table) {}

  Status append(int64_t layer, int64_t position, int64_t n, const float *k,
                const float *v) override {
    return cache_.write(table_, layer, position, n, k, v);
  }
  Status rows(int64_t layer, int64_t first, int64_t count,
              KeyValueRows &out) override {
    k_.resize(count * cache_.kvDim());
    v_.resize(count * cache_.kvDim());
    KVC_RETURN_IF_ERROR(
        cache_.read(table_, layer, first, count, k_.data(), v_.data()));
    out = {k_.data(), v_.data()};
    return Status::ok();
  }

private:
  PagedKVCache &cache_;
  const BlockTable &table_;
  std::vector<float> k_, v_;
};

class PrefillState {
public:
  PrefillState(const LlamaModel &model, const std::vector<int32_t> &tokens,
               PagedKVCache &cache, const BlockTable &table)
      : model_(model), tokens_(tokens), cache_(cache), table_(table),
        computed_(model.config().numLayers, 0) {}

  /// Writes exact K and V of tokens [t0, t1), layers [l0, l1) into the
  /// paged cache.
  Status compute(int64_t t0, int64_t t1, int64_t l0, int64_t l1) {
    std::lock_guard<std::mutex> lock(mutex_);
    bool extendsComputed = l0 == 0;
    for (int64_t l = 0; l < l1; ++l)
      extendsComputed &= computed_[l] == t0;
    if (extendsComputed) {
      PagedContext context(cache_, table_);
      KVC_RETURN_IF_ERROR(model_.prefill(context, t0, tokens_.data() + t0,
                                         t1 - t0, {}, l1));
      std::fill(computed_.begin(), computed_.begin() + l1, t1);
      flops_ += model_.prefillFlops(t1 - t0, l1);
      return Status::ok();
    }
    KVC_RETURN_IF_ERROR(extendExactLocked(t1, l1));
    const int64_t kv = model_.kvDim();
    for (int64_t l = l0; l < l1; ++l)
      KVC_RETURN_IF_ERROR(cache_.write(table_, l, t0, t1 - t0,
                                       exact_->k[l].data() + t0 * kv,
                                       exact_->v[l].data() + t0 * kv));
    return Status::ok();
  }

  /// FLOPs of the projections and MLPs prefilled so far (attention left
  /// out, as the executor's other FLOP counts do).
  double flops() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return flops_;
  }

  /// Bytes the private prefill holds (0 when nothing needed it).
  int64_t exactBytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t bytes = 0;
    if (exact_)
      for (std::size_t l = 0; l < exact_->k.size(); ++l)
        bytes += int64_t((exact_->k[l].capacity() + exact_->v[l].capacity()) *
                         sizeof(float));
    return bytes;
  }

private:
  /// Makes layers [0, depth) of the private prefill hold tokens [0, end).
  /// Plans compute the first layers of late tokens only (HCache's
  /// complement), so its deeper layers may lag; a box that needs one of
  /// those starts over at full depth.
  Status extendExactLocked(int64_t end, int64_t depth) {
    const int64_t kv = model_.kvDim();
    bool lagging = false;
    if (exact_) {
      const int64_t needed = std::min(end, exact_->tokens) * kv;
      for (int64_t l = 0; l < depth; ++l)
        lagging |= int64_t(exact_->k[l].size()) < needed;
    }
    if (!exact_ || lagging) {
      KVC_RETURN_IF_ERROR(seedExactLocked());
      depth = model_.config().numLayers;
    } else if (end <= exact_->tokens) {
      return Status::ok();
    }
    const int64_t begin = exact_->tokens;
    if (end <= begin)
      return Status::ok();
    KVC_RETURN_IF_ERROR(model_.prefill(*exact_, tokens_.data() + begin,
                                       end - begin, {}, depth));
    flops_ += model_.prefillFlops(end - begin, depth);
    return Status::ok();
  }

  /// Starts the private prefill from the tokens every layer computed into
  /// the cache: they are exact there, bf16 as the model holds them.
  Status seedExactLocked() {
    const int64_t seeded =
        *std::min_element(computed_.begin(), computed_.end());
    const int64_t kv = model_.kvDim();
    exact_ = model_.newCache();
    for (int64_t l = 0; l < model_.config().numLayers; ++l) {
      exact_->k[l].resize(seeded * kv);
      exact_->v[l].resize(seeded * kv);
      KVC_RETURN_IF_ERROR(cache_.read(table_, l, 0, seeded,
                                      exact_->k[l].data(),
                                      exact_->v[l].data()));
    }
    exact_->tokens = seeded;
    return Status::ok();
  }

  const LlamaModel &model_;
  const std::vector<int32_t> &tokens_;
  PagedKVCache &cache_;
  const BlockTable &table_;
  mutable std::mutex mutex_;
  /// Per layer, the tokens [0, n) this state prefilled into the cache.
  std::vector<int64_t> computed_;
  std::optional<LlamaModel::Cache> exact_;
  double flops_ = 0;
};

} // namespace kvc::exec_detail

#endif // KVC_LIB_RUNTIME_EXEC_PREFILLSTATE_H
