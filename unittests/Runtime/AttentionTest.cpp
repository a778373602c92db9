//===- AttentionTest.cpp - Blocked causal attention -----------------------===//

#include "kvc/Runtime/Model/Attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace kvc;

namespace {

/// The textbook version: one softmax over each row's causal keys.
std::vector<float> naiveAttention(const std::vector<float> &q,
                                  const std::vector<float> &k,
                                  const std::vector<float> &v, int64_t d,
                                  int64_t pos0, int64_t n, float scale) {
  std::vector<float> out(n * d);
  for (int64_t i = 0; i < n; ++i) {
    int64_t visible = pos0 + i + 1;
    std::vector<double> p(visible);
    double peak = -INFINITY, sum = 0;
    for (int64_t j = 0; j < visible; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c)
        dot += double(q[i * d + c]) * k[j * d + c];
      p[j] = dot * scale;
      peak = std::max(peak, p[j]);
    }
    for (double &x : p)
      sum += x = std::exp(x - peak);
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < visible; ++j)
        acc += p[j] * v[j * d + c];
      out[i * d + c] = float(acc / sum);
    }
  }
  return out;
}

// Queries spanning several query blocks, after a prefix spanning several key
// blocks, with a key count that is no multiple of either block.
TEST(CausalAttention, MatchesOneSoftmaxPerRowAcrossBlocks) {
  const int64_t d = 16;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 300},
                         {700, 1}, {1000, 333}, {511, 129}}) {
    std::vector<float> q(n * d), k((pos0 + n) * d), v((pos0 + n) * d);
    for (auto *x : {&q, &k, &v})
      for (float &value : *x)
        value = normal(rng);
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> expected = naiveAttention(q, k, v, d, pos0, n, scale);
    std::vector<float> out(n * d);
    CausalAttention attention(d);
    attention.run(q.data(), d, k.data(), v.data(), d, pos0, n, scale,
                  out.data(), d);
    for (int64_t i = 0; i < n * d; ++i)
      ASSERT_NEAR(out[i], expected[i], 1e-4f * (1 + std::abs(expected[i])))
          << "pos0 " << pos0 << ", row " << i / d;
  }
}

} // namespace
