//===- Rope.cpp - Rotary position embedding -------------------------------===//

#include "kvc/Runtime/Model/Rope.h"

#include <algorithm>
#include <cmath>

namespace kvc {

namespace {

/// YaRN's blend of interpolated and extrapolated frequencies
/// (transformers' _compute_yarn_parameters): dimensions that rotate fewer
/// than beta_slow times over the trained context are interpolated, those
/// that rotate more than beta_fast times kept, a linear ramp between.
void yarnFrequencies(const ModelConfig &c, std::vector<double> &inv) {
  const RopeScaling &s = c.ropeScaling;
  const double pi = 3.14159265358979323846, dim = double(c.headDim);
  auto correctionDim = [&](double rotations) {
    return dim *
           std::log(double(s.originalMaxPositions) / (rotations * 2 * pi)) /
           (2 * std::log(c.ropeTheta));
  };
  double low = correctionDim(s.betaFast), high = correctionDim(s.betaSlow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high)
    high += 0.001;
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolated = 1 - ramp;
    inv[i] = inv[i] / s.factor * (1 - extrapolated) + inv[i] * extrapolated;
  }
}

} // namespace

std::vector<float> ropeFrequencies(const ModelConfig &c) {
  int64_t half = c.headDim / 2;
  std::vector<double> inv(half);
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(c.ropeTheta, double(2 * i) / double(c.headDim));
  const RopeScaling &s = c.ropeScaling;
  if (s.kind == RopeScaling::Kind::Yarn)
    yarnFrequencies(c, inv);
  for (double &f : inv) {
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
  }
  return std::vector<float>(inv.begin(), inv.end());
}

float ropeAttentionScale(const ModelConfig &c) {
  return c.ropeScaling.kind == RopeScaling::Kind::Yarn
             ? float(c.ropeScaling.attentionFactor)
             : 1.0f;
}

void ropeCosSin(const std::vector<float> &invFreq, int64_t position, int64_t n,
                float *out, float scale) {
  const int64_t half = int64_t(invFreq.size());
  for (int64_t i = 0; i < n; ++i) {
    double pos = double(position + i);
    float *row = out + i * 2 * half;
    for (int64_t j = 0; j < half; ++j) {
      double angle = pos * double(invFreq[j]);
      row[j] = float(std::cos(angle)) * scale;
      row[half + j] = float(std::sin(angle)) * scale;
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
