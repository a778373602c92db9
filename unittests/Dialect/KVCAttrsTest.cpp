//===- KVCAttrsTest.cpp - Tests for kvc attributes and types --------------===//

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Transforms/Descriptions.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace kvc::compiler;

namespace {

class KVCAttrsTest : public ::testing::Test {
protected:
  KVCAttrsTest() { context.loadDialect<KVCDialect>(); }

  /// Parses `text` as an attribute; null on error.
  Attribute parse(StringRef text) { return parseAttribute(text, &context); }

  /// Parses `text`, which must fail, and returns the first diagnostic.
  std::string diagnosticOf(StringRef text) {
    std::string message;
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
      if (message.empty())
        message = diag.str();
      return success();
    });
    EXPECT_FALSE(parse(text));
    return message;
  }

  MLIRContext context;
};

TEST_F(KVCAttrsTest, ModelFromConfigMatchesImportedShape) {
  kvc::ModelConfig config;
  config.name = "tiny";
  config.numLayers = 4;
  config.hiddenSize = 256;
  config.numHeads = 8;
  config.numKvHeads = 2;
  config.headDim = 32;
  config.intermediateSize = 688;
  config.vocabSize = 1000;
  config.maxPositions = 2048;
  config.ropeTheta = 500000;
  config.dtype = kvc::DType::F16;
  ASSERT_TRUE(config.validate().isOk());
  ModelAttr model = getModelAttr(&context, config);
  EXPECT_EQ(model.getName(), "tiny");
  EXPECT_EQ(model.getKvHeads(), 2);
  EXPECT_TRUE(model.getDtype().isF16());
  EXPECT_EQ(model.getRopeTheta().convertToDouble(), 500000.0);
  EXPECT_EQ(model.getElementBytes(), 2);
  // 2 (K and V) * 2 KV heads * 32 dims * 2 bytes.
  EXPECT_EQ(model.getKVBytesPerTokenLayer(), 256);
  EXPECT_EQ(model.getHiddenBytesPerTokenLayer(), 512);
  // The runtime computes the same sizes from the same config.
  EXPECT_EQ(model.getKVBytesPerTokenLayer(), config.kvBytesPerTokenLayer());
  EXPECT_EQ(model.getHiddenBytesPerTokenLayer(),
            config.hiddenBytesPerTokenLayer());
}

TEST_F(KVCAttrsTest, ModelPrintsAndParsesBack) {
  Attribute attr = parse(
      "#kvc.model<name = \"m\", layers = 2, hidden = 64, heads = 4, "
      "kv_heads = 1, head_dim = 16, ffn = 128, vocab = 10, "
      "max_positions = 64, rope_theta = 1.0e-05, dtype = bf16>");
  ASSERT_TRUE(attr);
  std::string text;
  llvm::raw_string_ostream os(text);
  attr.print(os);
  EXPECT_NE(text.find("rope_theta = 1.0e-05"), std::string::npos) << text;
  EXPECT_EQ(parse(text), attr);
}

TEST_F(KVCAttrsTest, ModelVerifierRejectsInconsistentHeads) {
  EXPECT_EQ(diagnosticOf("#kvc.model<name = \"m\", layers = 2, hidden = 64, "
                         "heads = 4, kv_heads = 3, head_dim = 16, ffn = 128, "
                         "vocab = 10, max_positions = 64, rope_theta = 10000, "
                         "dtype = bf16>"),
            "kv_heads (3) must divide heads (4)");
}

TEST_F(KVCAttrsTest, TargetFromDescriptionFindsTiersAndRates) {
  kvc::StatusOr<kvc::TargetDesc> desc = kvc::loadTargetDesc(
      std::string(KVC_SOURCE_DIR) + "/targets/a100-40gb.json");
  ASSERT_TRUE(desc.isOk()) << desc.status().toString();
  TargetAttr target = getTargetAttr(&context, *desc);
  EXPECT_EQ(target.getName(), "a100-40gb");
  EXPECT_EQ(target.getCompute().getKind(), ComputeKind::gpu);
  TierAttr ssd = target.findTier("ssd");
  ASSERT_TRUE(ssd);
  EXPECT_EQ(ssd.getKind(), TierKind::disk);
  EXPECT_EQ(ssd.getLanes(), 4);
  EXPECT_DOUBLE_EQ(ssd.getReadGbs().convertToDouble(), 27.6);
  EXPECT_FALSE(target.findTier("tape"));
  ASSERT_FALSE(target.getCodecs().empty());
  auto deflate = cast<CodecRateAttr>(target.getCodecs()[0]);
  EXPECT_EQ(deflate.getStage(), CodecStage::deflate);
  EXPECT_EQ(deflate.getOn(), CodecData::any);
  EXPECT_DOUBLE_EQ(deflate.getDecodeGbs().convertToDouble(), 0.3125);
}

TEST_F(KVCAttrsTest, CodecRatesKeepTheDataTheyHoldFor) {
  kvc::StatusOr<kvc::TargetDesc> desc = kvc::loadTargetDesc(
      std::string(KVC_SOURCE_DIR) + "/targets/a100-40gb.json");
  ASSERT_TRUE(desc.isOk()) << desc.status().toString();
  desc->codecs.push_back(
      {kvc::CodecStage::Zstd, kvc::CodecSpec::Quant::Int4, 0.5, 2.5});
  desc->codecs.push_back(
      {kvc::CodecStage::Zstd, kvc::CodecSpec::Quant::None, 0.25, 1.5});
  TargetAttr target = getTargetAttr(&context, *desc);
  auto int4 = cast<CodecRateAttr>(target.getCodecs()[desc->codecs.size() - 2]);
  EXPECT_EQ(int4.getOn(), CodecData::int4);
  kvc::TargetDesc back = getTargetDesc(target);
  ASSERT_EQ(back.codecs.size(), desc->codecs.size());
  EXPECT_FALSE(back.codecs.front().on);
  EXPECT_EQ(back.codecs[back.codecs.size() - 2].on,
            kvc::CodecSpec::Quant::Int4);
  EXPECT_EQ(back.codecs.back().on, kvc::CodecSpec::Quant::None);
  EXPECT_DOUBLE_EQ(back.codecs.back().decodeGBs, 1.5);
}

TEST_F(KVCAttrsTest, RawCodecIsNull) {
  EXPECT_FALSE(CodecAttr::getOrRaw(&context, Transform::none, Quant::none,
                                   QuantAxis::channel, QuantAxis::token, 32,
                                   Lossless::none));
  CodecAttr codec = CodecAttr::getOrRaw(&context, Transform::hadamard,
                                        Quant::int4, QuantAxis::channel,
                                        QuantAxis::token, 64, Lossless::zstd);
  ASSERT_TRUE(codec);
  EXPECT_EQ(codec.getBits(), 4);
  // Stripping stages one by one ends in raw data.
  CodecAttr noCoder = codec.withLossless(Lossless::none);
  ASSERT_TRUE(noCoder);
  EXPECT_EQ(noCoder.getQuant(), Quant::int4);
  CodecAttr onlyTransform = noCoder.withQuant(Quant::none);
  ASSERT_TRUE(onlyTransform);
  EXPECT_EQ(onlyTransform.getBits(), 16);
  // Dropping quantization resets its parameters, so equal codecs are equal.
  EXPECT_EQ(onlyTransform.getGroup(), 32);
  EXPECT_FALSE(onlyTransform.withTransform(Transform::none));
}

TEST_F(KVCAttrsTest, CodecVerifierRejectsNonPowerOfTwoGroups) {
  EXPECT_EQ(diagnosticOf("#kvc.codec<quant = int8, group = 24>"),
            "group must be a positive power of two, got 24");
}

TEST_F(KVCAttrsTest, RangeContainment) {
  auto range = RangeAttr::get(&context, 256, 512);
  EXPECT_EQ(range.size(), 256);
  EXPECT_TRUE(range.contains(256));
  EXPECT_FALSE(range.contains(512)); // Half-open.
  EXPECT_TRUE(range.contains(RangeAttr::get(&context, 300, 512)));
  EXPECT_FALSE(range.contains(RangeAttr::get(&context, 0, 300)));
}

TEST_F(KVCAttrsTest, ChunkTypeChangesOneThing) {
  Builder b(&context);
  auto tokens = RangeAttr::get(&context, 0, 64);
  auto layers = RangeAttr::get(&context, 0, 2);
  CodecAttr int8 = CodecAttr::getOrRaw(&context, Transform::none, Quant::int8,
                                       QuantAxis::channel, QuantAxis::token,
                                       32, Lossless::none);
  auto host = ChunkType::get(&context, Form::kv, b.getBF16Type(), tokens,
                             layers, Space::host, int8);
  ChunkType device = host.withSpace(Space::device);
  EXPECT_EQ(device.getSpace(), Space::device);
  EXPECT_EQ(device.getCodec(), int8);
  EXPECT_FALSE(host.isRaw());
  EXPECT_TRUE(host.withCodec({}).isRaw());
  EXPECT_EQ(device.withSpace(Space::host), host);
}

TEST_F(KVCAttrsTest, FormatF64IsShortestAndParseable) {
  EXPECT_EQ(formatF64(10000), "10000");
  EXPECT_EQ(formatF64(27.6), "27.6");
  EXPECT_EQ(formatF64(0.3125), "0.3125");
  EXPECT_EQ(formatF64(1e-5), "1.0e-05");
}

} // namespace
