//===- Attention.h - Causal attention, constant working set -----*- C++ -*-===//
//
// The CPU reference model's attention, FlashAttention-style: queries in
// blocks of kQueryBlock rows against keys in blocks of kKeyBlock columns
// aligned to position 0, with a running maximum and sum per row. The working
// set is constant in the context length (a one-shot prefill of 32K tokens
// would otherwise hold a 32K x 32K score matrix), and every query
// row meets the same key blocks however the prompt is chunked, so chunked
// and one-shot prefills agree.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_ATTENTION_H
#define KVC_RUNTIME_MODEL_ATTENTION_H

#include <cstdint>
#include <vector>

namespace kvc {

class CausalAttention {
public:
  static constexpr int64_t kQueryBlock = 128, kKeyBlock = 512;

  /// Scratch for heads of `headDim` values.
  explicit CausalAttention(int64_t headDim);

  /// out[i] = softmax(q[i] . k[0, pos0 + i]^T * scale) v[0, pos0 + i] for
  /// the n query rows i at positions pos0 + i, one head: `q` is [n] rows of
  /// stride `qStride`, `k` and `v` [pos0 + n] rows of stride `kvStride`,
  /// `out` [n] rows of stride `outStride`, each row's first headDim values.
  void run(const float *q, int64_t qStride, const float *k, const float *v,
           int64_t kvStride, int64_t pos0, int64_t n, float scale, float *out,
           int64_t outStride);

private:
  int64_t d_;
  std::vector<float> scores_, acc_, max_;
  std::vector<double> sum_;
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_ATTENTION_H
