//===- TargetDescTest.cpp - Tests for hardware descriptions ---------------===//

#include "kvc/Runtime/Desc/TargetDesc.h"

#include <gtest/gtest.h>

using namespace kvc;

namespace {

std::string targetPath(const std::string &name) {
  return std::string(KVC_SOURCE_DIR) + "/targets/" + name + ".json";
}

class ShippedTargets : public ::testing::TestWithParam<const char *> {};

TEST_P(ShippedTargets, ParseValidateAndRoundTrip) {
  StatusOr<TargetDesc> target = loadTargetDesc(targetPath(GetParam()));
  ASSERT_TRUE(target.isOk()) << target.status().toString();
  EXPECT_EQ(target->name, GetParam());
  EXPECT_FALSE(target->tiers.empty());
  EXPECT_NE(target->findTier("dram"), nullptr);
  // Printing and re-parsing yields the same description.
  StatusOr<TargetDesc> again = parseTargetDesc(printTargetDesc(*target));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(printTargetDesc(*again), printTargetDesc(*target));
}

INSTANTIATE_TEST_SUITE_P(Targets, ShippedTargets,
                         ::testing::Values("a100-40gb", "a100-80gb",
                                           "h100-sxm", "h200", "l40s",
                                           "cpu-2core"));

TEST(TargetDesc, A100HasFourSsdLanes) {
  StatusOr<TargetDesc> target = loadTargetDesc(targetPath("a100-40gb"));
  ASSERT_TRUE(target.isOk()) << target.status().toString();
  const TierDesc *ssd = target->findTier("ssd");
  ASSERT_NE(ssd, nullptr);
  EXPECT_EQ(ssd->kind, TierDesc::Kind::Disk);
  EXPECT_EQ(ssd->lanes, 4);
  EXPECT_DOUBLE_EQ(target->compute.denseTflops, 312);
  EXPECT_EQ(target->findTier("tape"), nullptr);
}

// Whether kvc-run calibrate measured a target: absent (every shipped
// target), true, round-tripped, and anything but a boolean refused.
TEST(TargetDesc, SaysWhetherItWasCalibrated) {
  StatusOr<TargetDesc> estimated = loadTargetDesc(targetPath("cpu-2core"));
  ASSERT_TRUE(estimated.isOk());
  EXPECT_FALSE(estimated->calibrated);
  TargetDesc measured = *estimated;
  measured.calibrated = true;
  StatusOr<TargetDesc> again = parseTargetDesc(printTargetDesc(measured));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_TRUE(again->calibrated);
  std::string text = printTargetDesc(measured);
  std::size_t at = text.find("true");
  ASSERT_NE(at, std::string::npos);
  EXPECT_FALSE(parseTargetDesc(text.replace(at, 4, "\"yes\"")).isOk());
}

// A hand-off between lanes: 0 when absent (every shipped target), printed
// and read back when measured.
TEST(TargetDesc, CarriesTheHandoffBetweenLanes) {
  StatusOr<TargetDesc> shipped = loadTargetDesc(targetPath("cpu-2core"));
  ASSERT_TRUE(shipped.isOk());
  EXPECT_EQ(shipped->host.handoffUs, 0);
  EXPECT_EQ(printTargetDesc(*shipped).find("handoff_us"), std::string::npos);
  TargetDesc measured = *shipped;
  measured.host.handoffUs = 70.5;
  StatusOr<TargetDesc> again = parseTargetDesc(printTargetDesc(measured));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->host.handoffUs, 70.5);
}

/// A valid description with `field` (a JSON pointer) replaced by `value`.
std::string mutated(const char *pointer, const char *value) {
  StatusOr<TargetDesc> base = loadTargetDesc(targetPath("cpu-2core"));
  EXPECT_TRUE(base.isOk());
  std::string text = printTargetDesc(*base);
  // Splice by textual replacement of the first occurrence of the key line.
  std::string key = std::string("\"") + pointer + "\": ";
  std::size_t at = text.find(key);
  EXPECT_NE(at, std::string::npos) << pointer;
  std::size_t end = text.find_first_of(",\n", at);
  return text.substr(0, at + key.size()) + value + text.substr(end);
}

struct BadTarget {
  const char *name;
  std::string json;
  const char *message;
};

/// How a failing case names itself (gtest's default is a hex dump).
void PrintTo(const BadTarget &c, std::ostream *os) { *os << c.name; }

class TargetErrors : public ::testing::TestWithParam<BadTarget> {};

TEST_P(TargetErrors, RejectedWithFieldName) {
  StatusOr<TargetDesc> target = parseTargetDesc(GetParam().json);
  ASSERT_FALSE(target.isOk());
  EXPECT_EQ(target.status().code(), StatusCode::InvalidArgument);
  EXPECT_NE(target.status().message().find(GetParam().message),
            std::string::npos)
      << target.status().toString();
}

INSTANTIATE_TEST_SUITE_P(
    TargetDesc, TargetErrors,
    ::testing::Values(
        BadTarget{"Truncated", "{\"schema\": \"kvc-target/1\"",
                  "invalid JSON: parse error"},
        BadTarget{"WrongSchema", mutated("schema", "\"kvc-target/9\""),
                  "schema: unknown schema"},
        BadTarget{"NegativeBandwidth", mutated("read_gbs", "-1"),
                  "tiers[0].read_gbs: expected a positive number"},
        BadTarget{"ShareAboveOne", mutated("restore_share", "1.5"),
                  "compute.restore_share: expected a share in (0, 1]"},
        BadTarget{"NegativeAttentionRate",
                  mutated("gemm_half_tokens", "128, \"attention_tflops\": -1"),
                  "compute.attention_tflops: expected a non-negative number"},
        BadTarget{"UnknownTierKind", mutated("kind", "\"quantum\""),
                  "compute.kind: unknown value \"quantum\""},
        BadTarget{"CoresAsString", mutated("cores", "\"two\""),
                  "host.cores: expected an integer"},
        BadTarget{"NegativeHandoff",
                  mutated("nic_gbs", "0, \"handoff_us\": -1"),
                  "host.handoff_us: expected a non-negative number"},
        BadTarget{"ZeroLanes", mutated("lanes", "0"),
                  "tiers[0].lanes: expected a positive integer"},
        BadTarget{"ChipOnACpu",
                  mutated("gemm_half_tokens", "128, \"chip\": \"sm_90\""),
                  "compute.chip: a cpu has no GPU architecture, got sm_90"},
        BadTarget{"UnknownChip",
                  mutated("kind", "\"gpu\", \"chip\": \"sm_70\""),
                  "compute.chip: unknown architecture \"sm_70\" (expected "
                  "sm_80, sm_86, sm_89, sm_90 or sm_90a)"}),
    [](const ::testing::TestParamInfo<BadTarget> &info) {
      return std::string(info.param.name);
    });

TEST(TargetDesc, DuplicateTierNames) {
  StatusOr<TargetDesc> target = loadTargetDesc(targetPath("cpu-2core"));
  ASSERT_TRUE(target.isOk());
  target->tiers[1].name = "dram";
  Status status = target->validate();
  EXPECT_EQ(status.code(), StatusCode::InvalidArgument);
  EXPECT_NE(status.message().find("tiers[1].name: duplicate tier \"dram\""),
            std::string::npos)
      << status.toString();
}

TEST(TargetDesc, CodecRatesNameTheDataTheyHoldFor) {
  StatusOr<TargetDesc> target = loadTargetDesc(targetPath("cpu-2core"));
  ASSERT_TRUE(target.isOk());
  // One rate per stage and data: "zstd on int4" beside "zstd" for any data.
  target->codecs.push_back(
      {CodecStage::Zstd, CodecSpec::Quant::Int4, 0.5, 2.5});
  ASSERT_TRUE(target->validate().isOk()) << target->validate().toString();
  StatusOr<TargetDesc> again = parseTargetDesc(printTargetDesc(*target));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->codecs.back().on, CodecSpec::Quant::Int4);
  EXPECT_FALSE(again->codecs.front().on);
  target->codecs.push_back(target->codecs.back());
  Status status = target->validate();
  EXPECT_NE(status.message().find("duplicate stage \"zstd\" on int4"),
            std::string::npos)
      << status.toString();
  // Data a rate cannot hold for is named.
  StatusOr<TargetDesc> bad = parseTargetDesc(R"({"schema": "kvc-target/1",
      "name": "x", "compute": {"kind": "cpu", "name": "c", "dense_tflops": 1,
      "mem_gbs": 1, "mem_gib": 1, "restore_share": 1},
      "host": {"cores": 1, "dram_gib": 1, "nic_gbs": 0},
      "link": {"h2d_gbs": 1, "d2h_gbs": 1, "latency_us": 0},
      "tiers": [{"name": "dram", "kind": "dram", "read_gbs": 1,
                 "write_gbs": 1, "latency_us": 0}],
      "codecs": [{"stage": "zstd", "on": "int3", "encode_gbs": 1,
                  "decode_gbs": 1}]})");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("codecs[0].on: unknown value \"int3\""),
            std::string::npos)
      << bad.status().toString();
}

// A GPU target names the chip its kernels are generated for, and keeps it
// through printing; the shipped H100 target's is sm_90.
TEST(TargetDesc, GpuTargetsNameTheirChip) {
  StatusOr<TargetDesc> h100 = loadTargetDesc(targetPath("h100-sxm"));
  ASSERT_TRUE(h100.isOk()) << h100.status().toString();
  EXPECT_EQ(h100->compute.chip, "sm_90");
  StatusOr<TargetDesc> again = parseTargetDesc(printTargetDesc(*h100));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->compute.chip, "sm_90");
  StatusOr<TargetDesc> cpu = loadTargetDesc(targetPath("cpu-2core"));
  ASSERT_TRUE(cpu.isOk());
  EXPECT_EQ(cpu->compute.chip, "");
}

TEST(TargetDesc, MissingSection) {
  StatusOr<TargetDesc> target = parseTargetDesc(
      R"({"schema": "kvc-target/1", "name": "x", "compute": {}})");
  ASSERT_FALSE(target.isOk());
  EXPECT_NE(target.status().message().find("compute.kind: missing required"),
            std::string::npos)
      << target.status().toString();
}

} // namespace
