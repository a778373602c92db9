//===- AttentionTest.cpp - Blocked causal attention -----------------------===//

#include "kvc/Runtime/Model/Attention.h"

#include "Tolerance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace kvc;

namespace {

/// The textbook version: one softmax over each row's causal keys, the
/// `window` up to its own when not 0.
std::vector<float> naiveAttention(const std::vector<float> &q,
                                  const std::vector<float> &k,
                                  const std::vector<float> &v, int64_t d,
                                  int64_t pos0, int64_t n, float scale,
                                  int64_t window) {
  std::vector<float> out(n * d);
  for (int64_t i = 0; i < n; ++i) {
    int64_t visible = pos0 + i + 1;
    int64_t first = window ? std::max<int64_t>(0, visible - window) : 0;
    std::vector<double> p(visible, -INFINITY);
    double peak = -INFINITY, sum = 0;
    for (int64_t j = first; j < visible; ++j) {
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
      for (int64_t j = first; j < visible; ++j)
        acc += p[j] * v[j * d + c];
      out[i * d + c] = float(acc / sum);
    }
  }
  return out;
}

// Queries spanning several query blocks, after a prefix spanning several key
// blocks, with a key count that is no multiple of either block; two query
// heads share each key/value head (GQA), and the source hands out key blocks
// in scratch it overwrites, as a paged cache's does. Without a window, and
// with windows within a key block and across several (Mistral's sliding
// window): the blocks wholly before every row's window are not read.
TEST(CausalAttention, MatchesOneSoftmaxPerRowAcrossBlocks) {
  const int64_t d = 16, heads = 4, kvHeads = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t window : {0, 100, 600})
    for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 300},
                           {700, 1},
                           {1000, 333},
                           {511, 129}}) {
      std::vector<float> q(n * heads * d), k((pos0 + n) * kvHeads * d),
          v((pos0 + n) * kvHeads * d);
      for (auto *x : {&q, &k, &v})
        for (float &value : *x)
          value = normal(rng);
      std::vector<float> out(n * heads * d), scratchK, scratchV;
      int64_t blocks = 0;
      CausalAttention attention(heads, kvHeads, d, window);
      Status status = attention.run(
          q.data(), pos0, n,
          [&](int64_t first, int64_t count, KeyValueRows &rows) {
            EXPECT_EQ(first % CausalAttention::kKeyBlock, 0);
            ++blocks;
            scratchK.assign(k.begin() + first * kvHeads * d,
                            k.begin() + (first + count) * kvHeads * d);
            scratchV.assign(v.begin() + first * kvHeads * d,
                            v.begin() + (first + count) * kvHeads * d);
            rows = {scratchK.data(), scratchV.data()};
            return Status::ok();
          },
          out.data());
      ASSERT_TRUE(status.isOk()) << status.toString();
      const int64_t skipped = window ? std::max<int64_t>(0, pos0 - window + 1) /
                                           CausalAttention::kKeyBlock
                                     : 0;
      EXPECT_EQ(blocks, (pos0 + n + CausalAttention::kKeyBlock - 1) /
                                CausalAttention::kKeyBlock -
                            skipped);
      for (int64_t hd = 0; hd < heads; ++hd) {
        auto column = [&](const std::vector<float> &x, int64_t rows,
                          int64_t stride, int64_t head) {
          std::vector<float> out(rows * d);
          for (int64_t i = 0; i < rows; ++i)
            std::copy_n(x.begin() + i * stride + head * d, d,
                        out.begin() + i * d);
          return out;
        };
        std::vector<float> expected =
            naiveAttention(column(q, n, heads * d, hd),
                           column(k, pos0 + n, kvHeads * d, hd / 2),
                           column(v, pos0 + n, kvHeads * d, hd / 2), d, pos0, n,
                           1.0f / std::sqrt(float(d)), window);
        // Each row of a head within fp32 summation noise of its largest value.
        for (int64_t i = 0; i < n; ++i)
          ASSERT_LE(test::relativeMaxError(out.data() + i * heads * d + hd * d,
                                           expected.data() + i * d, size_t(d)),
                    1e-4)
              << "window " << window << ", pos0 " << pos0 << ", head " << hd
              << ", row " << i;
      }
    }
}

TEST(CausalAttention, ReportsTheSourcesError) {
  CausalAttention attention(1, 1, 4);
  std::vector<float> q(4), out(4);
  Status status = attention.run(
      q.data(), 0, 1,
      [](int64_t, int64_t, KeyValueRows &) {
        return internalError("no such block");
      },
      out.data());
  EXPECT_EQ(status.code(), StatusCode::Internal);
}

} // namespace
