//===- Attention.cpp - Causal attention with a constant working set -------===//

#include "kvc/Runtime/Model/Attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace kvc {

CausalAttention::CausalAttention(int64_t heads, int64_t kvHeads,
                                 int64_t headDim, int64_t window)
    : heads_(heads), kvHeads_(kvHeads), d_(headDim), window_(window),
      scores_(kQueryBlock * kKeyBlock) {}

Status CausalAttention::run(const float *q, int64_t pos0, int64_t n,
                            const Source &source, float *out) {
  const int64_t qStride = heads_ * d_, kvStride = kvHeads_ * d_;
  const int64_t group = heads_ / kvHeads_;
  const float scale = 1.0f / std::sqrt(float(d_));
  // Running state per (head, row); `out` accumulates P V until the end.
  max_.assign(heads_ * n, -INFINITY);
  sum_.assign(heads_ * n, 0.0);
  std::fill(out, out + n * qStride, 0.0f);
  // The first key of position p's window (0 without one).
  auto firstKey = [&](int64_t p) {
    return window_ > 0 ? std::max<int64_t>(0, p - window_ + 1) : 0;
  };
  for (int64_t k0 = firstKey(pos0) / kKeyBlock * kKeyBlock; k0 < pos0 + n;
       k0 += kKeyBlock) {
    KeyValueRows block;
    KVC_RETURN_IF_ERROR(
        source(k0, std::min(kKeyBlock, pos0 + n - k0), block));
    for (int64_t hd = 0; hd < heads_; ++hd) {
      const float *k = block.k + (hd / group) * d_;
      const float *v = block.v + (hd / group) * d_;
      for (int64_t q0 = 0; q0 < n; q0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, n - q0);
        // Keys visible to the query block's last row.
        const int64_t cols = std::min(kKeyBlock, pos0 + q0 + rows - k0);
        if (cols <= 0)
          continue;
        float *acc = out + q0 * qStride + hd * d_;
        // scores[rows][cols] = Q K^T / sqrt(d).
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows),
                    int(cols), int(d_), scale, q + q0 * qStride + hd * d_,
                    int(qStride), k, int(kvStride), 0.0f, scores_.data(),
                    int(kKeyBlock));
        for (int64_t i = 0; i < rows; ++i) {
          float *row = scores_.data() + i * kKeyBlock;
          float &max = max_[hd * n + q0 + i];
          double &sum = sum_[hd * n + q0 + i];
          // Keys [k0 + hidden, k0 + visible) are causal for this row and in
          // its window.
          const int64_t p = pos0 + q0 + i;
          int64_t visible = std::clamp<int64_t>(p + 1 - k0, 0, cols);
          int64_t hidden = std::clamp<int64_t>(firstKey(p) - k0, 0, visible);
          float peak = max;
          for (int64_t j = hidden; j < visible; ++j)
            peak = std::max(peak, row[j]);
          float correction = max == -INFINITY ? 0.0f : std::exp(max - peak);
          double blockSum = 0;
          for (int64_t j = hidden; j < visible; ++j) {
            row[j] = std::exp(row[j] - peak);
            blockSum += row[j];
          }
          std::fill(row, row + hidden, 0.0f);
          std::fill(row + visible, row + cols, 0.0f);
          if (visible > hidden) {
            sum = sum * correction + blockSum;
            max = peak;
            for (int64_t c = 0; c < d_; ++c)
              acc[i * qStride + c] *= correction;
          }
        }
        // acc[rows][d] += P V.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows),
                    int(d_), int(cols), 1.0f, scores_.data(), int(kKeyBlock),
                    v, int(kvStride), 1.0f, acc, int(qStride));
      }
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t hd = 0; hd < heads_; ++hd) {
      float inv = float(1.0 / sum_[hd * n + i]);
      float *row = out + i * qStride + hd * d_;
      for (int64_t c = 0; c < d_; ++c)
        row[c] *= inv;
    }
  return Status::ok();
}

} // namespace kvc
