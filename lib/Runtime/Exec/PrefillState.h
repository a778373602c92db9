//===- PrefillState.h - The exact prefill a restore extends -----*- C++ -*-===//
//
// Private to lib/Runtime/Exec. Both restore paths (compiled plans and
// Cake's dynamic mode) keep one fp32 prefill of the request that compute
// chunks and fallback recomputes extend as far as they need, so a box is
// exact whatever order chunks are computed or recovered in. Thread-safe.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_EXEC_PREFILLSTATE_H
#define KVC_LIB_RUNTIME_EXEC_PREFILLSTATE_H

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Exec/PagedKVCache.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace kvc::exec_detail {

class PrefillState {
public:
  PrefillState(const LlamaModel &model, const std::vector<int32_t> &tokens)
      : model_(model), tokens_(tokens), cache_(model.newCache()) {}

  /// Writes K and V of tokens [t0, t1), layers [l0, l1) into `cache`.
  Status writeTo(PagedKVCache &cache, const BlockTable &table, int64_t t0,
                 int64_t t1, int64_t l0, int64_t l1) {
    std::lock_guard<std::mutex> lock(mutex_);
    KVC_RETURN_IF_ERROR(extendLocked(t1, l1));
    const int64_t kv = model_.kvDim();
    for (int64_t l = l0; l < l1; ++l)
      KVC_RETURN_IF_ERROR(cache.write(table, l, t0, t1 - t0,
                                      cache_.k[l].data() + t0 * kv,
                                      cache_.v[l].data() + t0 * kv));
    return Status::ok();
  }

  /// Copies K and V of tokens [t0, t1), layers [0, l1) into `out` as bf16,
  /// laid out per layer as K then V ([t1 - t0][kvDim] each). Only the first
  /// `l1` layers are prefilled for tokens past those computed before.
  Status copyTo(int64_t t0, int64_t t1, int64_t l1,
                std::vector<uint16_t> &out) {
    std::lock_guard<std::mutex> lock(mutex_);
    KVC_RETURN_IF_ERROR(extendLocked(t1, l1));
    const int64_t kv = model_.kvDim(), n = t1 - t0;
    out.resize(l1 * 2 * n * kv);
    for (int64_t l = 0; l < l1; ++l)
      for (int64_t i = 0; i < n * kv; ++i) {
        out[(2 * l) * n * kv + i] = floatToBf16(cache_.k[l][t0 * kv + i]);
        out[(2 * l + 1) * n * kv + i] = floatToBf16(cache_.v[l][t0 * kv + i]);
      }
    return Status::ok();
  }

  /// FLOPs of the projections and MLPs prefilled so far (attention left
  /// out, as the executor's other FLOP counts do).
  double flops() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return flops_;
  }

private:
  /// Makes layers [0, depth) hold tokens [0, end). Plans compute the first
  /// layers of late tokens only (HCache's complement), so deeper layers may
  /// lag; a fallback that needs one of those starts over at full depth.
  Status extendLocked(int64_t end, int64_t depth) {
    const int64_t kv = model_.kvDim();
    const int64_t needed = std::min(end, cache_.tokens) * kv;
    bool lagging = false;
    for (int64_t l = 0; l < depth; ++l)
      lagging |= int64_t(cache_.k[l].size()) < needed;
    if (lagging) {
      cache_ = model_.newCache();
      depth = model_.config().numLayers;
    } else if (end <= cache_.tokens) {
      return Status::ok();
    }
    const int64_t begin = cache_.tokens;
    KVC_RETURN_IF_ERROR(model_.prefill(cache_, tokens_.data() + begin,
                                       end - begin, {}, depth));
    flops_ += model_.prefillFlops(end - begin, depth);
    return Status::ok();
  }

  const LlamaModel &model_;
  const std::vector<int32_t> &tokens_;
  mutable std::mutex mutex_;
  LlamaModel::Cache cache_;
  double flops_ = 0;
};

} // namespace kvc::exec_detail

#endif // KVC_LIB_RUNTIME_EXEC_PREFILLSTATE_H
