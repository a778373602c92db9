//===- CodecQuality.cpp - How much a lossy codec changes ------------------===//

#include "kvc/Runtime/Codec/CodecQuality.h"

#include <cmath>

namespace kvc {

double relativeL2(const std::vector<float> &a, const std::vector<float> &b) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double d = double(a[i]) - double(b[i]);
    err += d * d;
    norm += double(b[i]) * double(b[i]);
  }
  return norm > 0 ? std::sqrt(err / norm) : 0;
}

std::vector<float> sampleAttention(const std::vector<float> &kv,
                                   const ChunkShape &shape,
                                   const std::vector<float> &queries) {
  const int64_t tokens = shape.tokens, width = shape.width,
                headDim = shape.headDim;
  const int64_t numQueries = int64_t(queries.size()) / headDim;
  std::vector<float> out;
  std::vector<double> p(tokens);
  for (int64_t l = 0; l < shape.layers; ++l) {
    const float *k = kv.data() + (2 * l) * tokens * width;
    const float *v = kv.data() + (2 * l + 1) * tokens * width;
    for (int64_t q = 0; q < numQueries; ++q) {
      const float *qv = queries.data() + q * headDim;
      double peak = -1e300, sum = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        double s = 0;
        for (int64_t d = 0; d < headDim; ++d)
          s += double(qv[d]) * k[t * width + d];
        p[t] = s / std::sqrt(double(headDim));
        peak = std::max(peak, p[t]);
      }
      for (int64_t t = 0; t < tokens; ++t)
        sum += (p[t] = std::exp(p[t] - peak));
      for (int64_t d = 0; d < headDim; ++d) {
        double o = 0;
        for (int64_t t = 0; t < tokens; ++t)
          o += p[t] / sum * v[t * width + d];
        out.push_back(float(o));
      }
    }
  }
  return out;
}

} // namespace kvc
