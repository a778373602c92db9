//===- Attention.cpp - Causal attention with a constant working set -------===//

#include "kvc/Runtime/Model/Attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace kvc {

CausalAttention::CausalAttention(int64_t headDim)
    : d_(headDim), scores_(kQueryBlock * kKeyBlock),
      acc_(kQueryBlock * headDim), max_(kQueryBlock), sum_(kQueryBlock) {}

void CausalAttention::run(const float *q, int64_t qStride, const float *k,
                          const float *v, int64_t kvStride, int64_t pos0,
                          int64_t n, float scale, float *out,
                          int64_t outStride) {
  for (int64_t q0 = 0; q0 < n; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, n - q0);
    const int64_t keys = pos0 + q0 + rows; // Visible to the block's last row.
    std::fill(max_.begin(), max_.end(), -INFINITY);
    std::fill(sum_.begin(), sum_.end(), 0.0);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    for (int64_t k0 = 0; k0 < keys; k0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, keys - k0);
      // scores[rows][cols] = Q K^T / sqrt(d).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows),
                  int(cols), int(d_), scale, q + q0 * qStride, int(qStride),
                  k + k0 * kvStride, int(kvStride), 0.0f, scores_.data(),
                  int(kKeyBlock));
      for (int64_t i = 0; i < rows; ++i) {
        float *row = scores_.data() + i * kKeyBlock;
        // Keys [k0, k0 + visible) are causal for this row.
        int64_t visible =
            std::clamp<int64_t>(pos0 + q0 + i + 1 - k0, 0, cols);
        float peak = max_[i];
        for (int64_t j = 0; j < visible; ++j)
          peak = std::max(peak, row[j]);
        float correction =
            max_[i] == -INFINITY ? 0.0f : std::exp(max_[i] - peak);
        double sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          row[j] = std::exp(row[j] - peak);
          sum += row[j];
        }
        std::fill(row + visible, row + cols, 0.0f);
        if (visible > 0) {
          sum_[i] = sum_[i] * correction + sum;
          max_[i] = peak;
          for (int64_t c = 0; c < d_; ++c)
            acc_[i * d_ + c] *= correction;
        }
      }
      // acc[rows][d] += P V.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows),
                  int(d_), int(cols), 1.0f, scores_.data(), int(kKeyBlock),
                  v + k0 * kvStride, int(kvStride), 1.0f, acc_.data(),
                  int(d_));
    }
    for (int64_t i = 0; i < rows; ++i) {
      float inv = float(1.0 / sum_[i]);
      for (int64_t c = 0; c < d_; ++c)
        out[(q0 + i) * outStride + c] = acc_[i * d_ + c] * inv;
    }
  }
}

} // namespace kvc
