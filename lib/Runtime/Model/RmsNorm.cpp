//===- RmsNorm.cpp - RMSNorm in one summation order -----------------------===//

#include "kvc/Runtime/Model/RmsNorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvc {

int64_t rmsNormLanes(int64_t h) {
  const int64_t pieces = std::max<int64_t>((h + 7) / 8, 1);
  int64_t lanes = 1;
  while (lanes * 2 <= std::min<int64_t>(32, pieces))
    lanes *= 2;
  return lanes;
}

void rmsNorm(const float *x, int64_t n, int64_t h, float eps,
             const float *weight, float *out) {
  const int64_t pieces = (h + 7) / 8, lanes = rmsNormLanes(h);
  std::vector<float> total(lanes);
  for (int64_t i = 0; i < n; ++i) {
    const float *row = x + i * h;
    for (int64_t l = 0; l < lanes; ++l) {
      float a[8] = {};
      for (int64_t p = l; p < pieces; p += lanes)
        for (int e = 0; e < 8; ++e) {
          const int64_t j = 8 * p + e;
          const float v = j < h ? row[j] : 0.0f;
          const float square = v * v;
          a[e] = a[e] + square;
        }
      float s[4], t[2];
      for (int j = 0; j < 4; ++j)
        s[j] = a[j] + a[j + 4];
      for (int j = 0; j < 2; ++j)
        t[j] = s[j] + s[j + 2];
      total[l] = t[0] + t[1];
    }
    for (int64_t width = lanes; width > 1; width /= 2)
      for (int64_t l = 0; l < width / 2; ++l)
        total[l] = total[2 * l] + total[2 * l + 1];
    const float scale = 1.0f / std::sqrt(total[0] / float(h) + eps);
    for (int64_t j = 0; j < h; ++j)
      out[i * h + j] = (row[j] * scale) * weight[j];
  }
}

} // namespace kvc
