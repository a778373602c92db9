//===- ComputeFitTest.cpp - Tests for the compute-rate fit ----------------===//

#include "kvc/Planning/ComputeFit.h"

#include <gtest/gtest.h>

using namespace kvc;
using namespace kvc::planning;

namespace {

/// The demo's generated model: small enough that attention is a large share
/// of a long chunk's time.
ModelConfig smallModel() {
  ModelConfig m;
  m.name = "small";
  m.modelType = "llama";
  m.numLayers = 4;
  m.hiddenSize = 256;
  m.numHeads = 8;
  m.numKvHeads = 2;
  m.headDim = 32;
  m.intermediateSize = 688;
  m.vocabSize = 1024;
  m.maxPositions = 4096;
  return m;
}

TargetDesc cpuTarget(double denseTflops, double half, double attention) {
  StatusOr<TargetDesc> t =
      loadTargetDesc(std::string(KVC_SOURCE_DIR) + "/targets/cpu-2core.json");
  EXPECT_TRUE(t.isOk());
  t->compute.denseTflops = denseTflops;
  t->compute.gemmHalfTokens = half;
  t->compute.attentionTflops = attention;
  return *t;
}

/// Calibration's grid: chunk sizes from position 0, and 256-token chunks
/// after longer and longer prefixes.
std::vector<PrefillSample> priced(const CostModel &cost) {
  std::vector<PrefillSample> samples;
  for (int64_t m : {16, 32, 64, 128, 256, 512})
    samples.push_back({0, m, 0});
  for (int64_t p : {256, 512, 1024, 1536})
    samples.push_back({p, 256, 0});
  for (PrefillSample &s : samples)
    s.seconds = cost.prefillSeconds(s.position, s.position + s.tokens, 4);
  return samples;
}

TEST(ComputeFit, RecoversTheRatesThatPricedTheSamples) {
  TargetDesc truth = cpuTarget(0.1, 8, 0.013);
  CostModel cost(smallModel(), truth, CodecProfile::defaults());
  std::vector<PrefillSample> samples = priced(cost);
  // The case the old two-step calibration got wrong: a chunk whose own
  // attention is more than half of its time.
  const PrefillSample &largest = samples[5];
  double attention =
      4 * cost.attentionFlops(0, 512) /
      (truth.compute.attentionTflops * 1e12 * truth.compute.restoreShare);
  ASSERT_GT(attention, 0.5 * largest.seconds);

  ComputeFit fit = fitComputeRates(cost, samples);
  EXPECT_EQ(fit.halfTokens, 8);
  EXPECT_LT(fit.worstError, 1e-9);
  TargetDesc fitted = cpuTarget(1, 100, 1);
  ASSERT_TRUE(fit.applyTo(fitted.compute).isOk());
  EXPECT_NEAR(fitted.compute.denseTflops, 0.1, 1e-9);
  EXPECT_NEAR(fitted.compute.attentionTflops, 0.013, 1e-9);
  CostModel refit(smallModel(), fitted, CodecProfile::defaults());
  for (const PrefillSample &s : samples)
    EXPECT_NEAR(refit.prefillSeconds(s.position, s.position + s.tokens, 4),
                s.seconds, 1e-9 * s.seconds);
}

TEST(ComputeFit, PricesAttentionAsGemmsWhenTheSamplesDo) {
  TargetDesc truth = cpuTarget(0.05, 16, 0);
  CostModel cost(smallModel(), truth, CodecProfile::defaults());
  ComputeFit fit = fitComputeRates(cost, priced(cost));
  EXPECT_EQ(fit.attentionFlops, 0);
  EXPECT_EQ(fit.halfTokens, 16);
  EXPECT_LT(fit.worstError, 1e-9);
  TargetDesc fitted = cpuTarget(1, 100, 1);
  ASSERT_TRUE(fit.applyTo(fitted.compute).isOk());
  EXPECT_EQ(fitted.compute.attentionTflops, 0);
  EXPECT_NEAR(fitted.compute.denseTflops, 0.05, 1e-9);
}

TEST(ComputeFit, ReportsASampleItCannotFit) {
  TargetDesc truth = cpuTarget(0.1, 8, 0.013);
  CostModel cost(smallModel(), truth, CodecProfile::defaults());
  std::vector<PrefillSample> samples = priced(cost);
  samples[4].seconds *= 1.5; // The 256-token chunk, timed in a slow moment.
  ComputeFit fit = fitComputeRates(cost, samples);
  EXPECT_GT(fit.worstError, 0.1);
  // The other nine still pull the rates close to the truth.
  EXPECT_NEAR(fit.attentionFlops, 13e9 * truth.compute.restoreShare,
              0.2 * 13e9 * truth.compute.restoreShare);
}

} // namespace

// A GPU's dense_tflops is its chip's peak: a fit that reached more than
// gemm_peak_fraction of it raises the fraction (and prices what it
// measured), one below keeps the fraction, and one above the peak itself
// is refused.
TEST(ComputeFit, KeepsAGpusPeakAndRefusesAFitAboveIt) {
  ComputeFit fit;
  fit.denseFlops = 860e12; // Reached: 87% of a 989 TFLOP/s peak.
  fit.halfTokens = 64;
  ComputeDesc gpu;
  gpu.kind = ComputeDesc::Kind::GPU;
  gpu.denseTflops = 989;
  gpu.gemmPeakFraction = 0.75;
  ASSERT_TRUE(fit.applyTo(gpu).isOk());
  EXPECT_DOUBLE_EQ(gpu.denseTflops, 989);
  EXPECT_NEAR(gpu.gemmPeakFraction * gpu.denseTflops, 860, 1e-9);

  fit.denseFlops = 500e12;
  gpu.gemmPeakFraction = 0.75;
  ASSERT_TRUE(fit.applyTo(gpu).isOk());
  EXPECT_DOUBLE_EQ(gpu.gemmPeakFraction, 0.75);
  EXPECT_NEAR(gpu.gemmPeakFraction * gpu.denseTflops, 500, 1e-9);

  fit.denseFlops = 1200e12;
  gpu.denseTflops = 989;
  Status refused = fit.applyTo(gpu);
  EXPECT_EQ(refused.code(), StatusCode::FailedPrecondition);
  EXPECT_NE(refused.message().find("above the device's peak"),
            std::string::npos);

  // A CPU's dense_tflops is an estimate: what the fit reached, over the
  // fraction.
  ComputeDesc cpu;
  cpu.kind = ComputeDesc::Kind::CPU;
  cpu.denseTflops = 0.05;
  cpu.gemmPeakFraction = 0.5;
  fit.denseFlops = 0.2e12;
  ASSERT_TRUE(fit.applyTo(cpu).isOk());
  EXPECT_NEAR(cpu.denseTflops, 0.4, 1e-9);
}
