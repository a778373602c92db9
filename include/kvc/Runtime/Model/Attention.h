//===- Attention.h - Causal attention, constant working set -----*- C++ -*-===//
//
// The CPU reference model's attention, FlashAttention-style: keys in blocks
// of kKeyBlock rows aligned to position 0, each met by every head's queries
// in blocks of kQueryBlock rows, with a running maximum and sum per row.
// Keys and values come from a source one block at a time, so attention can
// read them where a prefill keeps them — its own fp32 vectors, or a paged
// cache's bf16 blocks converted one block at a time — and the working set
// is constant in the context length. Every query row meets the same key
// blocks in the same order however the prompt is chunked, so chunked and
// one-shot prefills agree.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_ATTENTION_H
#define KVC_RUNTIME_MODEL_ATTENTION_H

#include "kvc/Runtime/Base/Status.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace kvc {

/// Keys and values of a run of tokens, [tokens][kvHeads * headDim] fp32
/// each.
struct KeyValueRows {
  const float *k = nullptr;
  const float *v = nullptr;
};

class CausalAttention {
public:
  static constexpr int64_t kQueryBlock = 128, kKeyBlock = 512;

  /// Fills `rows` with keys and values of tokens [first, first + count);
  /// they must stay valid until the next call.
  using Source =
      std::function<Status(int64_t first, int64_t count, KeyValueRows &rows)>;

  /// Scratch for `heads` query heads sharing `kvHeads` key/value heads of
  /// `headDim` values; each query attends to the `window` keys up to its
  /// own (0: every key before it).
  CausalAttention(int64_t heads, int64_t kvHeads, int64_t headDim,
                  int64_t window = 0);

  /// out[i] = softmax(q[i] . K[lo, pos0 + i]^T / sqrt(headDim))
  /// V[lo, pos0 + i] for the n query rows i at positions pos0 + i and every
  /// head, lo the first key of the row's window (0 without one): `q` and
  /// `out` are [n][heads * headDim], K and V the source's tokens; key
  /// blocks wholly before every row's window are not asked for.
  Status run(const float *q, int64_t pos0, int64_t n, const Source &source,
             float *out);

private:
  int64_t heads_, kvHeads_, d_, window_;
  std::vector<float> scores_, max_;
  std::vector<double> sum_;
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_ATTENTION_H
