//===- CostModelTest.cpp - Tests for the cost model -----------------------===//

#include "kvc/Planning/CostModel.h"
#include "kvc/Planning/Pipeline.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace kvc;
using namespace kvc::planning;

namespace {

ModelConfig llama2_7b() {
  StatusOr<ModelConfig> m = loadModelConfig(
      std::string(KVC_SOURCE_DIR) + "/examples/models/llama-2-7b/config.json");
  EXPECT_TRUE(m.isOk());
  return *m;
}

TargetDesc target(const char *name) {
  StatusOr<TargetDesc> t = loadTargetDesc(std::string(KVC_SOURCE_DIR) +
                                          "/targets/" + name + ".json");
  EXPECT_TRUE(t.isOk());
  return *t;
}

TEST(CostModel, LinearFlopsMatchParameterCount) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  // Per layer: 4 * 4096^2 attention weights + 3 * 4096 * 11008 MLP weights,
  // two FLOPs per weight per token.
  double weights = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008;
  EXPECT_DOUBLE_EQ(cost.linearFlopsPerTokenLayer(), 2.0 * weights);
}

TEST(CostModel, AttentionGrowsWithPosition) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  // Same chunk size, later position: more keys to attend to.
  EXPECT_GT(cost.attentionFlops(3584, 4096), cost.attentionFlops(0, 512));
  // One token at position p attends to p + 1 keys: 4 * 32 * 128 * (p + 1).
  EXPECT_DOUBLE_EQ(cost.attentionFlops(9, 10), 4.0 * 32 * 128 * 10);
  // Ranges add up.
  EXPECT_DOUBLE_EQ(cost.attentionFlops(0, 100) + cost.attentionFlops(100, 300),
                   cost.attentionFlops(0, 300));
}

TEST(CostModel, ProjectionIsSeveralTimesCheaperThanRecompute) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  double recompute = cost.prefillFlops(0, 1024, 1);
  double project = cost.projectFlops(1024, 1);
  // HCache §3.2: about 6x fewer FLOPs (K and V projections only).
  EXPECT_GT(recompute / project, 6.0);
}

TEST(CostModel, AttentionRunsAtItsOwnRateWhenTheTargetGivesOne) {
  TargetDesc t = target("cpu-2core");
  CostModel gemmRate(llama2_7b(), t, CodecProfile::defaults());
  // Without an attention rate, prefill is priced as one GEMM workload.
  EXPECT_DOUBLE_EQ(gemmRate.prefillSeconds(1024, 1280, 32),
                   gemmRate.computeSeconds(
                       gemmRate.prefillFlops(1024, 1280, 32), 256));
  // With one, the attention FLOPs move to it and the projections stay.
  t.compute.attentionTflops = 0.01;
  CostModel own(llama2_7b(), t, CodecProfile::defaults());
  double attention = 32 * own.attentionFlops(1024, 1280);
  double linear = own.prefillFlops(1024, 1280, 32) - attention;
  EXPECT_NEAR(own.prefillSeconds(1024, 1280, 32),
              own.computeSeconds(linear, 256) + attention / 0.01e12,
              1e-9 * own.prefillSeconds(1024, 1280, 32));
  // A later chunk costs more than an earlier one by its attention alone.
  EXPECT_GT(own.prefillSeconds(1024, 1280, 32) - own.prefillSeconds(0, 256, 32),
            gemmRate.prefillSeconds(1024, 1280, 32) -
                gemmRate.prefillSeconds(0, 256, 32));
}

// A prefill in steps prices as its steps summed, in closed form.
TEST(CostModel, APrefillInStepsCostsItsStepsSummed) {
  // Attention at the GEMM rate, and at a rate of its own.
  TargetDesc ownRate = target("a100-40gb");
  ownRate.compute.attentionTflops = 100;
  for (const TargetDesc &t : {target("a100-40gb"), ownRate}) {
    CostModel cost(llama2_7b(), t, CodecProfile::defaults());
    double steps = 0;
    for (int64_t t0 = 0; t0 < 1024; t0 += 256)
      steps += cost.prefillSeconds(t0, t0 + 256, 32);
    EXPECT_NEAR(cost.prefillSeconds(0, 1024, 32, 256), steps, 1e-12 * steps);
    EXPECT_GT(cost.prefillSeconds(0, 1024, 32, 256),
              cost.prefillSeconds(0, 1024, 32)); // Smaller GEMMs.
  }
}

// A prefill step writes a layer's K and V once it has projected Q, K and
// V (3 of Llama-2-7B's 4 attention matrices), a small share of the layer.
TEST(CostModel, AKvWriteWaitsForTheQkvProjectionOnly) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  EXPECT_DOUBLE_EQ(cost.kvWrittenSeconds(0, 512),
                   cost.computeSeconds(2.0 * 3 * 4096 * 4096 * 512, 512));
  EXPECT_LT(cost.kvWrittenSeconds(0, 512),
            0.25 * cost.prefillSeconds(0, 512, 1));
}

// The prefill beside a save: a box waits for the steps before the one
// holding its last token, that step's layers below its last, and the
// projection of its last layer.
TEST(CostModel, APrefillWritesABoxAfterItsStepsLayersAndProjection) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  const double step0 = cost.prefillSeconds(0, 256, 32);
  const double layer1 = cost.prefillSeconds(256, 300, 32) / 32;
  EXPECT_DOUBLE_EQ(prefillReadySeconds(cost, 300, 256, 32, {0, 256, 0, 1}),
                   cost.kvWrittenSeconds(0, 256));
  EXPECT_DOUBLE_EQ(prefillReadySeconds(cost, 300, 256, 32, {256, 300, 4, 8}),
                   step0 + 7 * layer1 + cost.kvWrittenSeconds(256, 300));
  // One step of the whole request: the first layer long before the last.
  EXPECT_LT(prefillReadySeconds(cost, 300, 512, 32, {256, 300, 0, 1}),
            prefillReadySeconds(cost, 300, 256, 32, {256, 300, 0, 1}));
}

TEST(CostModel, SmallChunksRunBelowPeak) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  EXPECT_LT(cost.gemmEfficiency(64), cost.gemmEfficiency(512));
  EXPECT_LT(cost.gemmEfficiency(512), 1.0);
  double flops = 1e12;
  EXPECT_GT(cost.computeSeconds(flops, 64), cost.computeSeconds(flops, 2048));
}

TEST(CostModel, BytesFollowFormAndCodec) {
  CostModel cost(llama2_7b(), target("a100-40gb"), CodecProfile::defaults());
  // MHA: K+V is twice the hidden state.
  EXPECT_DOUBLE_EQ(cost.rawBytes(Form::KV, 10, 2),
                   2 * cost.rawBytes(Form::Hidden, 10, 2));
  CodecSpec int4;
  int4.quant = CodecSpec::Quant::Int4;
  int4.group = 32;
  // 4 of 16 bits plus a 32-bit scale/zero pair per 32 elements.
  EXPECT_DOUBLE_EQ(cost.quantizedBytes(Form::KV, int4, 10, 2),
                   cost.rawBytes(Form::KV, 10, 2) * (0.25 + 2.0 / 32));
  CodecSpec deflate = int4;
  deflate.lossless = CodecSpec::Lossless::Deflate;
  EXPECT_LT(cost.storedBytes(Form::KV, deflate, 10, 2),
            cost.quantizedBytes(Form::KV, int4, 10, 2));
}

TEST(CostModel, RestoreShareSlowsCompute) {
  TargetDesc full = target("h100-sxm");
  TargetDesc eighth = full;
  eighth.compute.restoreShare = 0.125;
  CostModel a(llama2_7b(), full, CodecProfile::defaults());
  CostModel b(llama2_7b(), eighth, CodecProfile::defaults());
  EXPECT_DOUBLE_EQ(b.computeSeconds(1e12, 512), 8 * a.computeSeconds(1e12, 512));
}

TEST(CostModel, ReadsUseLaneBandwidthAndLatency) {
  TargetDesc t = target("a100-40gb");
  CostModel cost(llama2_7b(), t, CodecProfile::defaults());
  const TierDesc &ssd = *t.findTier("ssd");
  // One request on one of four lanes: 1/4 of the aggregate bandwidth.
  double bytes = 1e9;
  EXPECT_NEAR(cost.readSeconds(ssd, bytes),
              80e-6 + bytes / (27.6e9 / 4), 1e-12);
}

TEST(CostModel, HostDecodeUsesEveryCore) {
  TargetDesc t = target("a100-40gb");
  CostModel cost(llama2_7b(), t, CodecProfile::defaults());
  CodecSpec deflate;
  deflate.lossless = CodecSpec::Lossless::Deflate;
  // ShadowServe Table 1: 2.5 Gbps per core; 96 cores.
  EXPECT_NEAR(cost.hostDecodeSeconds(deflate, 0.3125e9 * 96), 1.0, 1e-9);
  EXPECT_EQ(cost.hostDecodeSeconds(CodecSpec(), 1e9), 0.0);
}

TEST(CostModel, CpuHostDecodeIsEveryStageOnOneThreadAtTheRateForItsData) {
  TargetDesc t = target("cpu-2core");
  t.codecs = {{CodecStage::Zstd, std::nullopt, 1, 1.0},
              {CodecStage::Zstd, CodecSpec::Quant::Int4, 1, 2.0},
              {CodecStage::Quant, CodecSpec::Quant::Int4, 1, 8.0},
              {CodecStage::Quant, std::nullopt, 1, 4.0}};
  CostModel cost(llama2_7b(), t, CodecProfile());
  CodecSpec int4z;
  int4z.quant = CodecSpec::Quant::Int4;
  int4z.lossless = CodecSpec::Lossless::Zstd;
  const double raw = 1e9;
  const double quantized = raw * cost.quantizedBytes(Form::KV, int4z, 1, 1) /
                           cost.rawBytes(Form::KV, 1, 1);
  // zstd at its int4 rate on the quantized bytes, dequantization at int4's
  // rate on the raw bytes: one core, not two.
  EXPECT_NEAR(cost.hostDecodeSeconds(int4z, quantized),
              quantized / 2e9 + raw / 8e9, 1e-9);
  // Dequantizing is part of that decode, not a second step on the device.
  EXPECT_EQ(cost.dequantSeconds(int4z, raw), 0.0);
  // int8 has no rate of its own: the rates for any data.
  CodecSpec int8z = int4z;
  int8z.quant = CodecSpec::Quant::Int8;
  const double quantized8 = raw * cost.quantizedBytes(Form::KV, int8z, 1, 1) /
                            cost.rawBytes(Form::KV, 1, 1);
  EXPECT_NEAR(cost.hostDecodeSeconds(int8z, quantized8),
              quantized8 / 1e9 + raw / 4e9, 1e-9);
  // Without a lossless stage, the device step dequantizes, on one core.
  CodecSpec int4 = int4z;
  int4.lossless = CodecSpec::Lossless::None;
  EXPECT_NEAR(cost.dequantSeconds(int4, raw), raw / 8e9, 1e-9);
}

TEST(CodecProfile, DefaultsCoverTheSpaceAndRoundTrip) {
  CodecProfile profile = CodecProfile::defaults();
  EXPECT_GT(profile.entries().size(), 60u);
  CodecSpec c;
  c.quant = CodecSpec::Quant::Int8;
  c.lossless = CodecSpec::Lossless::Zstd;
  ASSERT_NE(profile.find(c), nullptr);
  EXPECT_LT(profile.ratio(c), 0.6);
  EXPECT_GT(profile.quality(c), 0.0);
  EXPECT_EQ(profile.quality(CodecSpec()), 0.0);
  StatusOr<CodecProfile> again = CodecProfile::parse(profile.print());
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->print(), profile.print());
}

// FP8 is priced from its registry row: int8's bytes, its own rates where a
// target gives them, and an error estimate that does not grow with the
// group as integer levels' does.
TEST(CodecProfile, Fp8IsPricedFromItsRegistryRow) {
  CodecSpec fp8 = *parseCodecSpec("fp8/g32"), int8 = *parseCodecSpec("int8/g32");
  CostModel cost(llama2_7b(), target("cpu-2core"), CodecProfile::defaults());
  EXPECT_DOUBLE_EQ(cost.quantizedBytes(Form::KV, fp8, 10, 2),
                   cost.quantizedBytes(Form::KV, int8, 10, 2));
  CodecProfile profile = CodecProfile::defaults();
  ASSERT_NE(profile.find(fp8), nullptr);
  EXPECT_GT(profile.quality(fp8), profile.quality(int8));
  EXPECT_EQ(profile.quality(*parseCodecSpec("fp8/g128")), profile.quality(fp8));
  EXPECT_GT(profile.quality(*parseCodecSpec("int8/g128")),
            profile.quality(int8));
  // A rate on fp8 prices fp8's dequantization, not int8's.
  TargetDesc t = target("cpu-2core");
  t.codecs = {{CodecStage::Quant, CodecSpec::Quant::Fp8, 1, 2.0},
              {CodecStage::Quant, CodecSpec::Quant::Int8, 1, 8.0}};
  CostModel rated(llama2_7b(), t, CodecProfile());
  EXPECT_NEAR(rated.dequantSeconds(fp8, 1e9), 1e9 / 2e9, 1e-9);
  EXPECT_NEAR(rated.dequantSeconds(int8, 1e9), 1e9 / 8e9, 1e-9);
  // Without one, the registry's default for fp8.
  const CodecStageInfo *row = findCodecStage(StageKind::Quant, "fp8");
  ASSERT_NE(row, nullptr);
  t.codecs.clear();
  CostModel defaults(llama2_7b(), t, CodecProfile());
  EXPECT_NEAR(defaults.dequantSeconds(fp8, 1e9),
              1e9 / (row->defaultDecodeGBs * 1e9), 1e-9);
}

TEST(CodecProfile, RejectsBadProfiles) {
  EXPECT_FALSE(CodecProfile::parse("{}").isOk());
  StatusOr<CodecProfile> bad = CodecProfile::parse(
      R"({"schema": "kvc-codec-profile/1", "entries": [{"quant": "int3",
          "ratio": 0.5, "quality": 0.1}]})");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("entries[0]"), std::string::npos);
}

TEST(CodecProfile, KeepsTheMeasuredNextTokenQuality) {
  StatusOr<CodecProfile> profile = CodecProfile::parse(
      R"({"schema": "kvc-codec-profile/1", "entries": [{"quant": "int4",
          "ratio": 0.16, "quality": 0.03, "kl": 0.002, "agreement": 0.97}]})");
  ASSERT_TRUE(profile.isOk()) << profile.status().toString();
  CodecSpec int4 = *parseCodecSpec("int4"), int8 = *parseCodecSpec("int8");
  EXPECT_DOUBLE_EQ(profile->kl(int4), 0.002);
  EXPECT_TRUE(std::isinf(profile->kl(int8))); // Not measured.
  EXPECT_EQ(profile->kl(*parseCodecSpec("zstd")), 0.0);
  StatusOr<CodecProfile> again = CodecProfile::parse(profile->print());
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->print(), profile->print());
  EXPECT_EQ(again->entries()[0].agreement, 0.97);
  // The whole codec's measured rates travel with it too (profile-codecs'
  // table prints them; the planner prices stages).
  StatusOr<CodecProfile> rates = CodecProfile::parse(
      R"({"schema": "kvc-codec-profile/1", "entries": [{"quant": "int4",
          "ratio": 0.16, "quality": 0.03, "codec_encode_gbs": 1.5,
          "codec_decode_gbs": 2.5}]})");
  ASSERT_TRUE(rates.isOk()) << rates.status().toString();
  StatusOr<CodecProfile> ratesAgain = CodecProfile::parse(rates->print());
  ASSERT_TRUE(ratesAgain.isOk()) << ratesAgain.status().toString();
  EXPECT_EQ(ratesAgain->entries()[0].codecEncodeGBs, 1.5);
  EXPECT_EQ(ratesAgain->entries()[0].codecDecodeGBs, 2.5);
  // Both budgets apply; an infinite KL budget ignores the measure.
  EXPECT_TRUE(profile->allows(int4, 0.05, 0.01));
  EXPECT_FALSE(profile->allows(int4, 0.05, 0.001));
  EXPECT_FALSE(profile->allows(int4, 0.01, 0.01));
  EXPECT_TRUE(profile->allows(int8, 1.0, INFINITY));
  EXPECT_FALSE(profile->allows(int8, 1.0, 1.0));
  EXPECT_FALSE(CodecProfile::parse(
                   R"({"schema": "kvc-codec-profile/1", "entries": [{
                       "quant": "int4", "ratio": 0.16, "quality": 0.03,
                       "kl": -1}]})")
                   .isOk());
  EXPECT_FALSE(CodecProfile::parse(
                   R"({"schema": "kvc-codec-profile/1", "entries": [{
                       "quant": "int4", "ratio": 0.16, "quality": 0.03,
                       "agreement": 1.5}]})")
                   .isOk());
}

TEST(CodecProfile, RestoreErrorBoundIsTheWorstCodecPlusBf16Rounding) {
  const CodecProfile &profile = CodecProfile::defaults();
  CodecSpec raw, int8 = *parseCodecSpec("int8"), int2 = *parseCodecSpec("int2");
  EXPECT_DOUBLE_EQ(profile.restoreErrorBound({}), 1.0 / 256);
  EXPECT_DOUBLE_EQ(profile.restoreErrorBound({raw, raw}), 1.0 / 256);
  EXPECT_GT(profile.quality(int2), profile.quality(int8));
  EXPECT_DOUBLE_EQ(profile.restoreErrorBound({int8, raw, int2}),
                   profile.quality(int2) + 1.0 / 256);
}

} // namespace
