//===- Rope.cpp - Rotary position embedding -------------------------------===//

#include "kvc/Runtime/Model/Rope.h"

#include <cmath>

namespace kvc {

std::vector<float> ropeFrequencies(const ModelConfig &c) {
  int64_t half = c.headDim / 2;
  std::vector<float> inv(half);
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.ropeTheta, double(2 * i) / double(c.headDim));
    const RopeScaling &s = c.ropeScaling;
    if (s.kind == RopeScaling::Kind::Linear) {
      f /= s.factor;
    } else if (s.kind == RopeScaling::Kind::Llama3) {
      double lowWavelen = double(s.originalMaxPositions) / s.lowFreqFactor;
      double highWavelen = double(s.originalMaxPositions) / s.highFreqFactor;
      double wavelen = 2 * pi / f;
      if (wavelen > lowWavelen) {
        f /= s.factor;
      } else if (wavelen >= highWavelen) {
        double smooth =
            (double(s.originalMaxPositions) / wavelen - s.lowFreqFactor) /
            (s.highFreqFactor - s.lowFreqFactor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = float(f);
  }
  return inv;
}


void ropeCosSin(const std::vector<float> &invFreq, int64_t position, int64_t n,
                float *out) {
  const int64_t half = int64_t(invFreq.size());
  for (int64_t i = 0; i < n; ++i) {
    double pos = double(position + i);
    float *row = out + i * 2 * half;
    for (int64_t j = 0; j < half; ++j) {
      double angle = pos * double(invFreq[j]);
      row[j] = float(std::cos(angle));
      row[half + j] = float(std::sin(angle));
    }
  }
}

void applyRope(float *x, int64_t n, int64_t heads, int64_t headDim,
               const float *cosSin) {
  const int64_t half = headDim / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float *cos = cosSin + i * headDim, *sin = cos + half;
    for (int64_t hd = 0; hd < heads; ++hd) {
      float *head = x + (i * heads + hd) * headDim;
      for (int64_t j = 0; j < half; ++j) {
        float a = head[j], b = head[j + half];
        head[j] = a * cos[j] - b * sin[j];
        head[j + half] = b * cos[j] + a * sin[j];
      }
    }
  }
}

} // namespace kvc
