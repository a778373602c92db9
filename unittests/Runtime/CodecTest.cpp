//===- CodecTest.cpp - Round trips and robustness of the chunk codecs -----===//

#include "kvc/Planning/CodecProfile.h"
#include "kvc/Runtime/Base/Float8.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Codec/CodecQuality.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#include "TestModel.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace kvc;

namespace kvc::planning {
/// How a failing case names its codec (gtest's default is a hex dump).
void PrintTo(const CodecProfileEntry &entry, std::ostream *os) {
  *os << entry.codec.str() << " (ratio " << entry.ratio << ", quality "
      << entry.quality << ")";
}
} // namespace kvc::planning

namespace {

/// KV and hidden states of a real (random-weight) model, 96 tokens, 4 layers.
struct Sample {
  ModelConfig config;
  std::vector<float> kv, hidden;
  ChunkShape kvShape, hiddenShape;
};

const Sample &sample() {
  static Sample s = [] {
    std::string dir =
        kvc::test::generateTestModel("codec-test-model", 3, 4, 256);
    auto model = std::move(*LlamaModel::load(dir));
    Sample out;
    out.config = model->config();
    std::mt19937_64 rng(5);
    std::vector<int32_t> tokens(96);
    for (int32_t &t : tokens)
      t = int32_t(rng() % 512);
    LlamaModel::Cache cache = model->newCache();
    std::vector<std::vector<float>> hidden(4);
    EXPECT_TRUE(model
                    ->prefill(cache, tokens.data(), 96,
                              [&](const LayerSnapshot &snap) {
                                hidden[snap.layer].assign(
                                    snap.hidden, snap.hidden + 96 * 256);
                              })
                    .isOk());
    for (int l = 0; l < 4; ++l) {
      out.kv.insert(out.kv.end(), cache.k[l].begin(), cache.k[l].end());
      out.kv.insert(out.kv.end(), cache.v[l].begin(), cache.v[l].end());
      out.hidden.insert(out.hidden.end(), hidden[l].begin(), hidden[l].end());
    }
    out.kvShape = chunkShape(out.config, Form::KV, 96, 0, 4);
    out.hiddenShape = chunkShape(out.config, Form::Hidden, 96, 0, 4);
    return out;
  }();
  return s;
}

/// Every composition of the planner's codec space.
class EveryCodec
    : public ::testing::TestWithParam<planning::CodecProfileEntry> {};

TEST_P(EveryCodec, RoundTripsWithinItsStatedBound) {
  const Sample &s = sample();
  const planning::CodecProfileEntry &entry = GetParam();
  for (auto [values, shape] : {std::pair{&s.kv, s.kvShape},
                               std::pair{&s.hidden, s.hiddenShape}}) {
    StatusOr<std::string> bytes =
        encodeChunk(values->data(), shape, entry.codec, DType::BF16);
    ASSERT_TRUE(bytes.isOk()) << bytes.status().toString();
    std::vector<float> out(shape.numel());
    Status decoded =
        decodeChunk(*bytes, shape, entry.codec, DType::BF16, out.data());
    ASSERT_TRUE(decoded.isOk()) << decoded.toString();
    double error = relativeL2(out, *values);
    if (entry.codec.quant == CodecSpec::Quant::None) {
      // Lossless up to bf16 storage.
      EXPECT_LT(error, 1.0 / 256) << entry.codec.str();
    } else {
      // The profile's stated error bounds the measured one, and attention
      // outputs for sample queries (keys of the chunk) change less.
      EXPECT_LE(error, entry.quality)
          << entry.codec.str() << " on " << name(shape.form);
      if (shape.form == Form::KV) {
        std::vector<float> queries;
        for (int64_t t : {3, 40, 77})
          queries.insert(queries.end(), values->begin() + t * shape.width,
                         values->begin() + t * shape.width + shape.headDim);
        double attention =
            relativeL2(sampleAttention(out, shape, queries),
                       sampleAttention(*values, shape, queries));
        EXPECT_LE(attention, entry.quality) << entry.codec.str();
      }
    }
    // Truncation is always detected (every size is known in advance).
    for (size_t cut : {size_t(0), bytes->size() / 2, bytes->size() - 1}) {
      Status truncated = decodeChunk(std::string_view(*bytes).substr(0, cut),
                                     shape, entry.codec, DType::BF16,
                                     out.data());
      EXPECT_EQ(truncated.code(), StatusCode::DataLoss) << entry.codec.str();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, EveryCodec,
    ::testing::ValuesIn(planning::CodecProfile::defaults().entries()),
    [](const ::testing::TestParamInfo<planning::CodecProfileEntry> &info) {
      std::string name = info.param.codec.str();
      for (char &c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)))
          c = '_';
      return name;
    });

TEST(Codec, CorruptionNeverCrashes) {
  const Sample &s = sample();
  std::mt19937_64 rng(9);
  for (const char *spec : {"int4+deflate", "hadamard+int8/g64+zstd", "int2+lz4",
                           "deflate", "int4/bins8-4-2"}) {
    CodecSpec codec = *parseCodecSpec(spec);
    std::string bytes = *encodeChunk(s.kv.data(), s.kvShape, codec, DType::BF16);
    std::vector<float> out(s.kvShape.numel());
    for (int trial = 0; trial < 200; ++trial) {
      std::string corrupt = bytes;
      for (int flips = 0; flips < 4; ++flips)
        corrupt[rng() % corrupt.size()] ^= char(1 + rng() % 255);
      // Either an error or some values: never a crash or an overrun.
      (void)decodeChunk(corrupt, s.kvShape, codec, DType::BF16, out.data());
    }
  }
}

// What a generated kernel would read is checked for non-finite numbers
// first: a plain payload's values, a quantized one's scales and minimums
// (one NaN scale makes its whole group NaN on the device).
TEST(Codec, PayloadsCountTheirNonFiniteNumbers) {
  const Sample &s = sample();
  for (const char *spec : {"raw", "hadamard", "int8+zstd", "int4/k=token",
                           "hadamard+int2/g16", "fp8/g64"}) {
    CodecSpec codec = *parseCodecSpec(spec);
    std::string bytes = *encodeChunk(s.kv.data(), s.kvShape, codec, DType::BF16);
    std::string payload;
    ASSERT_TRUE(
        decompressChunk(bytes, s.kvShape, codec, DType::BF16, payload).isOk());
    EXPECT_EQ(payloadNonFinite(payload, s.kvShape, codec, DType::BF16), 0)
        << spec;
    // The first 16-bit number: a value (bf16 NaN) or a scale (f16 NaN).
    const uint16_t nan = codec.quant == CodecSpec::Quant::None ? 0x7FC0 : 0x7E00;
    std::memcpy(payload.data(), &nan, 2);
    EXPECT_EQ(payloadNonFinite(payload, s.kvShape, codec, DType::BF16), 1)
        << spec;
  }
  // E4M3 codes have a NaN of their own (either sign): the last code of the
  // chunk, then one of the first matrix.
  CodecSpec fp8 = *parseCodecSpec("fp8");
  std::string payload;
  ASSERT_TRUE(decompressChunk(*encodeChunk(s.kv.data(), s.kvShape, fp8,
                                           DType::BF16),
                              s.kvShape, fp8, DType::BF16, payload)
                  .isOk());
  payload.back() = char(0xFF);
  EXPECT_EQ(payloadNonFinite(payload, s.kvShape, fp8, DType::BF16), 1);
  const int64_t groups = (s.kvShape.width / 32) * 96; // Channels x tokens/32.
  payload[4 * groups] = char(0x7F);
  EXPECT_EQ(payloadNonFinite(payload, s.kvShape, fp8, DType::BF16), 2);
}

// Plain values of every storage type, NaN and infinity among the largest
// finite numbers, at the ends of the blocks the count works in (4096
// values) and of an unaligned payload: each counted once, and only they.
TEST(Codec, PlainPayloadsCountEveryNonFiniteValue) {
  ChunkShape shape;
  shape.form = Form::Hidden;
  shape.layers = 1;
  shape.tokens = 3;
  shape.width = 4099; // 12297 values: three blocks and a part.
  const int64_t n = shape.numel();
  const std::vector<int64_t> at = {0, 4095, 4096, 8191, 12288, n - 1};
  struct Case {
    DType dtype;
    std::vector<uint32_t> nonFinite, finite;
  };
  for (const Case &c :
       {Case{DType::BF16, {0x7FC0, 0xFF80, 0x7F80}, {0x7F7F, 0xFF7F, 0x3F80}},
        Case{DType::F16, {0x7E00, 0xFC00, 0x7C00}, {0x7BFF, 0xFBFF, 0x3C00}},
        Case{DType::F32,
             {0x7FC00000u, 0xFF800000u, 0x7F800001u},
             {0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u}}}) {
    const int64_t size = dtypeBytes(c.dtype);
    std::string payload(size_t(n * size + 1), '\0');
    std::string_view view(payload.data() + 1, size_t(n * size)); // Unaligned.
    auto put = [&](int64_t i, uint32_t bits) {
      std::memcpy(payload.data() + 1 + i * size, &bits, size_t(size));
    };
    // Each scan the CPU has: the widest, AVX2's, the portable loop.
    for (ScanVectors scan :
         {ScanVectors::Widest, ScanVectors::Avx2, ScanVectors::None}) {
      limitScanVectors(scan);
      for (int64_t i = 0; i < n; ++i)
        put(i, c.finite[size_t(i) % c.finite.size()]);
      EXPECT_EQ(payloadNonFinite(view, shape, CodecSpec(), c.dtype), 0)
          << dtypeName(c.dtype) << " scan " << int(scan);
      for (std::size_t k = 0; k < at.size(); ++k)
        put(at[k], c.nonFinite[k % c.nonFinite.size()]);
      EXPECT_EQ(payloadNonFinite(view, shape, CodecSpec(), c.dtype),
                int64_t(at.size()))
          << dtypeName(c.dtype) << " scan " << int(scan);
      // One alone, anywhere in a block: the scan, not the count, finds it.
      for (int64_t i : at) {
        for (int64_t j = 0; j < n; ++j)
          put(j, c.finite[size_t(j) % c.finite.size()]);
        put(i, c.nonFinite[0]);
        EXPECT_EQ(payloadNonFinite(view, shape, CodecSpec(), c.dtype), 1)
            << dtypeName(c.dtype) << " scan " << int(scan) << " at " << i;
      }
    }
    limitScanVectors(ScanVectors::Widest);
  }
}

// FP8 E4M3 as OCP defines it (and CUDA's __nv_fp8_e4m3, torch's
// float8_e4m3fn): every code's value, and every float rounded to the nearest
// code with ties to even, saturating at 448.
TEST(Codec, E4m3CodesAreOcpFp8) {
  EXPECT_EQ(e4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(e4m3ToFloat(0xB8), -1.0f);
  EXPECT_EQ(e4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(e4m3ToFloat(0x08), 0x1p-6f);  // The smallest normal.
  EXPECT_EQ(e4m3ToFloat(0x07), 7 * 0x1p-9f); // The largest subnormal.
  EXPECT_EQ(e4m3ToFloat(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0xFF)));
  EXPECT_TRUE(std::signbit(e4m3ToFloat(0x80)));
  // Increasing over the positive codes; each code its own value's code.
  for (int code = 0; code < 0x7F; ++code) {
    EXPECT_EQ(floatToE4m3(e4m3ToFloat(uint8_t(code))), code);
    EXPECT_EQ(floatToE4m3(e4m3ToFloat(uint8_t(code | 0x80))), code | 0x80);
    if (code) {
      EXPECT_LT(e4m3ToFloat(uint8_t(code - 1)), e4m3ToFloat(uint8_t(code)));
    }
  }
  // Between two neighbours: below the midpoint the lower, above it the
  // upper, at it the even one.
  for (int code = 0; code + 1 < 0x7F; ++code) {
    const float lo = e4m3ToFloat(uint8_t(code)),
                hi = e4m3ToFloat(uint8_t(code + 1)), mid = (lo + hi) / 2;
    EXPECT_EQ(floatToE4m3(std::nextafter(mid, lo)), code) << code;
    EXPECT_EQ(floatToE4m3(std::nextafter(mid, hi)), code + 1) << code;
    EXPECT_EQ(floatToE4m3(mid), code % 2 ? code + 1 : code) << code;
    EXPECT_EQ(floatToE4m3(-mid), (code % 2 ? code + 1 : code) | 0x80) << code;
  }
  // Saturation, and NaN.
  for (float big : {448.0f, 464.0f, 1e4f, INFINITY})
    EXPECT_EQ(floatToE4m3(big), 0x7E) << big;
  EXPECT_EQ(floatToE4m3(-INFINITY), 0xFE);
  EXPECT_EQ(floatToE4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(floatToE4m3(0x1p-11f), 0x00); // Below half the smallest step.
}

// FP8 keeps a value's relative precision whatever the group's spread: a
// group holding an outlier loses what integer levels lose, not the rest.
TEST(Codec, Fp8KeepsSmallValuesBesideAnOutlier) {
  ChunkShape shape;
  shape.form = Form::Hidden;
  shape.tokens = 4;
  shape.layers = 1;
  shape.width = 32;
  shape.headDim = 32;
  shape.modelLayers = 1;
  std::vector<float> values(shape.numel());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (float &v : values)
    v = normal(rng);
  for (int64_t t = 0; t < shape.tokens; ++t)
    values[t * shape.width] = 40.0f; // One outlier per per-token group.
  auto errorOf = [&](const char *spec) {
    CodecSpec codec = *parseCodecSpec(spec);
    std::vector<float> out(shape.numel());
    EXPECT_TRUE(decodeChunk(*encodeChunk(values.data(), shape, codec,
                                         DType::F32),
                            shape, codec, DType::F32, out.data())
                    .isOk());
    std::vector<float> small, smallRef;
    for (size_t i = 0; i < values.size(); ++i)
      if (i % shape.width) {
        small.push_back(out[i]);
        smallRef.push_back(values[i]);
      }
    return relativeL2(small, smallRef);
  };
  EXPECT_LT(errorOf("fp8/v=token"), 0.1);
  EXPECT_GT(errorOf("int8/v=token"), 1.0);
}

TEST(Codec, KIVIAxesAndBinsChangeTheEncoding) {
  const Sample &s = sample();
  CodecSpec perChannelK = *parseCodecSpec("int4/k=channel/v=token");
  CodecSpec perTokenK = *parseCodecSpec("int4/k=token/v=token");
  std::vector<float> a(s.kvShape.numel()), b(s.kvShape.numel());
  ASSERT_TRUE(decodeChunk(*encodeChunk(s.kv.data(), s.kvShape, perChannelK,
                                       DType::BF16),
                          s.kvShape, perChannelK, DType::BF16, a.data())
                  .isOk());
  ASSERT_TRUE(decodeChunk(*encodeChunk(s.kv.data(), s.kvShape, perTokenK,
                                       DType::BF16),
                          s.kvShape, perTokenK, DType::BF16, b.data())
                  .isOk());
  EXPECT_NE(relativeL2(a, s.kv), relativeL2(b, s.kv));
  // CacheGen bins: 8 bits for the first half of the layers, 2 for the rest;
  // the error lands in the later layers.
  CodecSpec bins = *parseCodecSpec("int4/bins8-2");
  std::vector<float> c(s.kvShape.numel());
  std::string bytes = *encodeChunk(s.kv.data(), s.kvShape, bins, DType::BF16);
  ASSERT_TRUE(decodeChunk(bytes, s.kvShape, bins, DType::BF16, c.data()).isOk());
  size_t half = c.size() / 2;
  std::vector<float> early(c.begin(), c.begin() + half),
      late(c.begin() + half, c.end()),
      earlyRef(s.kv.begin(), s.kv.begin() + half),
      lateRef(s.kv.begin() + half, s.kv.end());
  EXPECT_LT(relativeL2(early, earlyRef) * 10, relativeL2(late, lateRef));
}

TEST(Codec, HadamardIsItsOwnInverse) {
  std::vector<float> x(256), y;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  for (float &v : x)
    v = normal(rng);
  y = x;
  hadamard(y.data(), 256, 64);
  EXPECT_GT(relativeL2(y, x), 0.1);
  hadamard(y.data(), 256, 64);
  EXPECT_LT(relativeL2(y, x), 1e-6);
}

TEST(Codec, SpecsParseAndPrint) {
  for (const char *spec :
       {"raw", "int8/g32", "hadamard+int4/g64+zstd", "int2/g128+lz4", "deflate",
        "int4/g32/bins8-4-2", "int4/g64/k=token", "int8/g32/v=channel",
        "hadamard+int2/g32/bins4-2/k=token/v=channel", "fp8/g32",
        "hadamard+fp8/g64/k=token+zstd"}) {
    StatusOr<CodecSpec> codec = parseCodecSpec(spec);
    ASSERT_TRUE(codec.isOk()) << spec;
    EXPECT_EQ(codec->str(), spec);
  }
  // Axes print where they differ from KIVI's, so codecs that encode
  // differently never print alike.
  EXPECT_EQ(parseCodecSpec("int4/k=channel/v=token")->str(), "int4/g32");
  EXPECT_NE(parseCodecSpec("int4/k=token")->str(),
            parseCodecSpec("int4")->str());
  EXPECT_FALSE(parseCodecSpec("int3").isOk());
  EXPECT_FALSE(parseCodecSpec("int4/bins8-3").isOk());
  EXPECT_EQ(parseCodecSpec("fp8/bins8-4").status().message(),
            "codec \"fp8/bins8-4\": fp8 has no layer bins (they are "
            "integer widths) (codec strings: docs/data-plane.md)");
  EXPECT_FALSE(parseCodecSpec("zstd/g32").isOk());
  // Errors name the part at fault and where the grammar is written.
  EXPECT_EQ(parseCodecSpec("gzip").status().message(),
            "codec \"gzip\": unknown stage \"gzip\" (codec strings: "
            "docs/data-plane.md)");
  EXPECT_EQ(parseCodecSpec("int8+int4").status().message(),
            "codec \"int8+int4\": two quantization stages (codec strings: "
            "docs/data-plane.md)");
  EXPECT_FALSE(parseCodecSpec("zstd+lz4").isOk());
  EXPECT_FALSE(parseCodecSpec("hadamard+hadamard").isOk());
}

} // namespace

namespace {

TEST(Codec, DecodeToBf16MatchesDecode) {
  const Sample &s = sample();
  for (const char *spec : {"int8", "int4", "int2/g64", "int4/k=token+zstd",
                           "int4/bins8-2", "hadamard+int4", "deflate", "raw",
                           "fp8", "fp8/k=token/v=channel+lz4"})
    for (DType storage : {DType::BF16, DType::F16, DType::F32}) {
      CodecSpec codec = *parseCodecSpec(spec);
      std::string bytes = *encodeChunk(s.kv.data(), s.kvShape, codec, storage);
      std::vector<float> ref(s.kvShape.numel());
      ASSERT_TRUE(
          decodeChunk(bytes, s.kvShape, codec, storage, ref.data()).isOk());
      std::vector<uint16_t> fast(s.kvShape.numel());
      ASSERT_TRUE(
          decodeChunkToBf16(bytes, s.kvShape, codec, storage, fast.data())
              .isOk());
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_EQ(fast[i], floatToBf16(ref[i]))
            << spec << " from " << dtypeName(storage) << " at " << i;
      EXPECT_EQ(decodeChunkToBf16(std::string_view(bytes).substr(1),
                                  s.kvShape, codec, storage, fast.data())
                    .code(),
                StatusCode::DataLoss)
          << spec;
    }
}

// Widths and groups that leave rows and groups starting inside a byte, or
// with fewer than 16 values left: every path of the vector kernels.
TEST(Codec, DecodeToBf16MatchesDecodeOnAwkwardShapes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int64_t width : {1, 7, 23, 40, 100}) {
    ChunkShape shape;
    shape.tokens = 37;
    shape.layers = 2;
    shape.width = width;
    shape.headDim = width;
    shape.modelLayers = 2;
    std::vector<float> values(shape.numel());
    for (float &v : values)
      v = normal(rng);
    for (const char *spec :
         {"int8/g24", "int4/g24", "int2/g20", "int4/g7", "int2/g5/k=token",
          "int4/g33/v=channel", "int4/g17", "int2/g18", "fp8/g24",
          "fp8/g5/k=token"}) {
      StatusOr<CodecSpec> parsed = parseCodecSpec(spec);
      ASSERT_TRUE(parsed.isOk()) << spec;
      CodecSpec codec = *parsed;
      std::string bytes =
          *encodeChunk(values.data(), shape, codec, DType::BF16);
      std::vector<float> ref(shape.numel());
      ASSERT_TRUE(
          decodeChunk(bytes, shape, codec, DType::BF16, ref.data()).isOk());
      std::vector<uint16_t> fast(shape.numel());
      ASSERT_TRUE(
          decodeChunkToBf16(bytes, shape, codec, DType::BF16, fast.data())
              .isOk());
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_EQ(fast[i], floatToBf16(ref[i]))
            << spec << " width " << width << " at " << i;
    }
  }
}

} // namespace
