//===- ChunkCodec.cpp - Encoding KV and hidden-state chunks ---------------===//
//
// The transform and quantization stages and the chunk-level encode and
// decode over them (the lossless stage is Lossless.cpp's). Quantization is
// written once, per matrix, for both axes and every bit width. Decoding
// straight to bf16 (decodeChunkToBf16) has vectorized paths (AVX2, AVX-512,
// chosen at run time) equal bit for bit to decoding to f32 and rounding
// (CodecTest.DecodeToBf16MatchesDecode), as the generated kernels are
// (KernelJitTest).
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include "AffineBf16.h"

#include "kvc/Runtime/Base/Float8.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Support/Hadamard.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <memory>
#include <type_traits>
#include <vector>

namespace kvc {

ChunkShape chunkShape(const ModelConfig &model, Form form, int64_t tokens,
                      int64_t firstLayer, int64_t layers) {
  ChunkShape shape;
  shape.form = form;
  shape.tokens = tokens;
  shape.layers = layers;
  shape.width =
      form == Form::KV ? model.numKvHeads * model.headDim : model.hiddenSize;
  shape.headDim = model.headDim;
  shape.firstLayer = firstLayer;
  shape.modelLayers = model.numLayers;
  return shape;
}

namespace {

/// The Hadamard block of a matrix row.
int64_t hadamardBlock(const ChunkShape &shape) {
  return kvc::hadamardBlock(shape.form, shape.width, shape.headDim);
}

/// Bits of matrix `m`: the layer's bin, or the codec's width.
int matrixBits(const CodecSpec &codec, const ChunkShape &shape, int64_t m) {
  int64_t layer = shape.firstLayer + m / shape.matricesPerLayer();
  return codec.bitsOfLayer(layer, std::max(shape.modelLayers, shape.layers));
}

/// Quantization axis of matrix `m`: K on keyAxis, V and hidden on valueAxis.
CodecSpec::Axis matrixAxis(const CodecSpec &codec, const ChunkShape &shape,
                           int64_t m) {
  bool isKey = shape.form == Form::KV && m % 2 == 0;
  return isKey ? codec.keyAxis : codec.valueAxis;
}

/// Groups of one matrix: `count` groups of up to `size` values.
struct Grouping {
  int64_t size, count;
};
Grouping grouping(const CodecSpec &codec, const ChunkShape &shape,
                  CodecSpec::Axis axis) {
  int64_t along = axis == CodecSpec::Axis::Token ? shape.width : shape.tokens;
  int64_t across = axis == CodecSpec::Axis::Token ? shape.tokens : shape.width;
  int64_t size = std::min<int64_t>(codec.group, along);
  return {size, across * ((along + size - 1) / size)};
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) void halfsToFloatsF16c(const uint16_t *in,
                                                       int64_t n, float *out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i *>(in + i))));
  for (; i < n; ++i)
    out[i] = f16ToFloat(in[i]);
}
#endif

/// The scales and minimums (offsets, for E4M3 codes) of a matrix's `count`
/// groups, stored as pairs of f16 at `src` (F16C where the CPU has it: the portable conversion costs
/// as much as dequantizing a group of int4 values).
struct QuantParams {
  std::vector<float> scale, minimum;

  QuantParams(const uint8_t *src, int64_t count)
      : scale(count), minimum(count) {
    std::vector<uint16_t> halfs(2 * count);
    std::memcpy(halfs.data(), src, 4 * count);
    std::vector<float> pairs(2 * count);
#if defined(__x86_64__)
    static const bool f16c = __builtin_cpu_supports("f16c");
    if (f16c)
      halfsToFloatsF16c(halfs.data(), 2 * count, pairs.data());
    else
#endif
      for (int64_t i = 0; i < 2 * count; ++i)
        pairs[i] = f16ToFloat(halfs[i]);
    for (int64_t k = 0; k < count; ++k) {
      scale[k] = pairs[2 * k];
      minimum[k] = pairs[2 * k + 1];
    }
  }
};

int64_t packedBytes(int64_t values, int bits) {
  return (values * bits + 7) / 8;
}

/// Bytes of the quantized payload of one matrix.
int64_t quantizedMatrixBytes(const CodecSpec &codec, const ChunkShape &shape,
                             int64_t m) {
  Grouping g = grouping(codec, shape, matrixAxis(codec, shape, m));
  return g.count * 4 + packedBytes(shape.tokens * shape.width,
                                   matrixBits(codec, shape, m));
}

/// The groups of a matrix. Values are packed row-major in both layouts (so
/// a row decodes with one contiguous loop); groups differ: per-token groups
/// are `size` consecutive channels of a row, per-channel groups `size`
/// consecutive tokens of a channel, numbered block-major (token block, then
/// channel).
struct GroupWalk {
  const ChunkShape &shape;
  CodecSpec::Axis axis;
  int64_t size;
  /// Calls fn(group, row-major index) for every value in packed order
  /// (row-major). Token-axis groups are runs of `size` columns of a row,
  /// channel-axis groups runs of `size` rows of a column.
  template <typename Fn> void forEach(Fn fn) const {
    const int64_t cols = shape.width;
    if (axis == CodecSpec::Axis::Token) {
      const int64_t perRow = (cols + size - 1) / size;
      for (int64_t r = 0; r < shape.tokens; ++r)
        for (int64_t g = 0, c0 = 0; c0 < cols; ++g, c0 += size)
          for (int64_t c = c0, end = std::min(cols, c0 + size); c < end; ++c)
            fn(r * perRow + g, r * cols + c);
      return;
    }
    for (int64_t r = 0; r < shape.tokens; ++r) {
      const int64_t base = (r / size) * cols;
      for (int64_t c = 0; c < cols; ++c)
        fn(base + c, r * cols + c);
    }
  }
};

/// The code kind of `codec`'s quantization.
CodeKind codesOf(const CodecSpec &codec) {
  return codec.quantStage()->codes;
}

/// A group's f16 (scale, offset) for its extremes: the minimum and the
/// range over the levels (Levels), or 0 and the largest magnitude over
/// E4M3's largest value (symmetric, so that values near zero keep E4M3's
/// relative precision beside a group's outlier). Encoder and decoder use
/// the rounded ones.
std::pair<uint16_t, uint16_t> groupParams(CodeKind codes, int levels,
                                          float lo, float hi) {
  // The minimum plus 0: a zero minimum is +0 whichever zero the scan met
  // first.
  const uint16_t offset =
      codes == CodeKind::E4M3 ? uint16_t(0) : floatToF16(lo + 0.0f);
  const float spread =
      codes == CodeKind::E4M3
          ? std::max(std::fabs(lo), std::fabs(hi)) / kE4m3Max
          : (hi - f16ToFloat(offset)) / float(levels);
  uint16_t scale = floatToF16(spread > 0 ? spread : 1.0f);
  if (f16ToFloat(scale) <= 0)
    scale = kTinyQuantScale; // Keep it invertible.
  return {scale, offset};
}

void quantizeMatrix(const float *x, const CodecSpec &codec,
                    const ChunkShape &shape, int64_t m, std::string &out) {
  CodecSpec::Axis axis = matrixAxis(codec, shape, m);
  Grouping g = grouping(codec, shape, axis);
  int bits = matrixBits(codec, shape, m);
  const CodeKind codes = codesOf(codec);
  const int levels = (1 << bits) - 1;
  GroupWalk walk{shape, axis, g.size};
  std::vector<float> lo(g.count, INFINITY), hi(g.count, -INFINITY);
  walk.forEach([&](int64_t group, int64_t i) {
    lo[group] = std::min(lo[group], x[i]);
    hi[group] = std::max(hi[group], x[i]);
  });
  // Parameters as fp16, and quantization against the rounded ones so that
  // encoder and decoder agree exactly. The generated save kernels
  // (KernelGen.h) compute the same operations in the same order for
  // integer levels, so a change here is a change there: the minimum plus 0,
  // the reciprocal of the scale, and the scaled value clamped, then rounded
  // to nearest even.
  std::vector<float> inverse(g.count), offset(g.count);
  size_t params = out.size();
  out.resize(params + g.count * 4);
  for (int64_t k = 0; k < g.count; ++k) {
    auto [sc, off] = groupParams(codes, levels, lo[k], hi[k]);
    inverse[k] = 1.0f / f16ToFloat(sc);
    offset[k] = f16ToFloat(off);
    std::memcpy(&out[params + 4 * k], &sc, 2);
    std::memcpy(&out[params + 4 * k + 2], &off, 2);
  }
  size_t packed = out.size();
  out.resize(packed + packedBytes(shape.tokens * shape.width, bits), '\0');
  uint8_t *dst = reinterpret_cast<uint8_t *>(&out[packed]);
  if (codes == CodeKind::E4M3) {
    int64_t n = 0;
    walk.forEach([&](int64_t group, int64_t i) {
      float scaled = (x[i] - offset[group]) * inverse[group];
      // A NaN encodes as the offset, as a NaN encodes as the minimum below.
      dst[n++] = std::isnan(scaled) ? 0 : floatToE4m3(scaled);
    });
    return;
  }
  int64_t n = 0;
  const int perByte = 8 / bits;
  walk.forEach([&](int64_t group, int64_t i) {
    float scaled = (x[i] - offset[group]) * inverse[group];
    // max(0, NaN) is 0: a NaN encodes as the minimum, as on a GPU.
    float q = std::nearbyint(std::min(std::max(0.0f, scaled), float(levels)));
    uint32_t v = uint32_t(q);
    dst[n / perByte] |= uint8_t(v << ((n % perByte) * bits));
    ++n;
  });
}

/// The values of the 256 E4M3 codes.
const float *e4m3Values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values;
    for (int code = 0; code < 256; ++code)
      values[code] = e4m3ToFloat(uint8_t(code));
    return values;
  }();
  return table.data();
}

void dequantizeMatrix(const uint8_t *src, const CodecSpec &codec,
                      const ChunkShape &shape, int64_t m, float *out) {
  CodecSpec::Axis axis = matrixAxis(codec, shape, m);
  Grouping g = grouping(codec, shape, axis);
  const int bits = matrixBits(codec, shape, m);
  const QuantParams params(src, g.count);
  const std::vector<float> &scale = params.scale, &minimum = params.minimum;
  const uint8_t *packed = src + 4 * g.count;
  if (codesOf(codec) == CodeKind::E4M3) {
    const float *value = e4m3Values();
    int64_t n = 0;
    GroupWalk{shape, axis, g.size}.forEach([&](int64_t group, int64_t i) {
      out[i] = minimum[group] + scale[group] * value[packed[n++]];
    });
    return;
  }
  // With the width a constant, the unpacking's divisions become shifts.
  auto walk = [&](auto bitsConstant) {
    constexpr int kBits = decltype(bitsConstant)::value;
    constexpr int kPerByte = 8 / kBits;
    constexpr uint32_t kMask = (1u << kBits) - 1;
    int64_t n = 0;
    GroupWalk{shape, axis, g.size}.forEach([&](int64_t group, int64_t i) {
      uint32_t v = (packed[n / kPerByte] >> ((n % kPerByte) * kBits)) & kMask;
      out[i] = minimum[group] + scale[group] * float(v);
      ++n;
    });
  };
  // checkCodec admits 8, 4 and 2 bits only.
  assert(bits == 8 || bits == 4 || bits == 2);
  if (bits == 8)
    walk(std::integral_constant<int, 8>{});
  else if (bits == 4)
    walk(std::integral_constant<int, 4>{});
  else
    walk(std::integral_constant<int, 2>{});
}

void storeElements(const float *x, int64_t n, DType dtype, std::string &out) {
  size_t at = out.size();
  out.resize(at + n * dtypeBytes(dtype));
  char *dst = &out[at];
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::F32) {
      std::memcpy(dst + 4 * i, &x[i], 4);
    } else {
      uint16_t b = dtype == DType::BF16 ? floatToBf16(x[i]) : floatToF16(x[i]);
      std::memcpy(dst + 2 * i, &b, 2);
    }
  }
}

void loadElements(const char *src, int64_t n, DType dtype, float *out) {
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&out[i], src + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      out[i] = dtype == DType::BF16 ? bf16ToFloat(b) : f16ToFloat(b);
    }
  }
}

/// Bytes before the lossless stage.
int64_t innerBytes(const CodecSpec &codec, const ChunkShape &shape,
                   DType storage) {
  if (codec.quant == CodecSpec::Quant::None)
    return shape.numel() * dtypeBytes(storage);
  int64_t total = 0;
  for (int64_t m = 0; m < shape.matrices(); ++m)
    total += quantizedMatrixBytes(codec, shape, m);
  return total;
}

/// The bytes before the lossless stage: `bytes` themselves when there is
/// none, else inflated into `scratch`; DataLoss unless as many as expected.
StatusOr<std::string_view> innerOf(std::string_view bytes,
                                   const ChunkShape &shape,
                                   const CodecSpec &codec, DType storage,
                                   std::string &scratch) {
  const int64_t expected = innerBytes(codec, shape, storage);
  if (codec.lossless == CodecSpec::Lossless::None) {
    if (int64_t(bytes.size()) != expected)
      return dataLoss("payload of " + std::to_string(bytes.size()) +
                      " bytes, expected " + std::to_string(expected));
    return bytes;
  }
  KVC_RETURN_IF_ERROR(
      decompressBytes(bytes, codec.lossless, scratch, size_t(expected)));
  return std::string_view(scratch);
}

} // namespace

Status decompressChunk(std::string_view bytes, const ChunkShape &shape,
                       const CodecSpec &codec, DType storage,
                       std::string &out) {
  KVC_RETURN_IF_ERROR(checkCodec(codec, shape));
  if (codec.lossless != CodecSpec::Lossless::None)
    return innerOf(bytes, shape, codec, storage, out).status();
  KVC_ASSIGN_OR_RETURN(inner, innerOf(bytes, shape, codec, storage, out));
  out.assign(inner);
  return Status::ok();
}

namespace {

/// Whether any of `n` raw values at `at` (unaligned) has all of `mask`'s bits
/// set: 16-bit words (`Bits` 16) or 32-bit ones. A restore scans every value
/// it loads and nearly never finds one, so the scan only says whether: 32
/// words a compare with AVX-512BW (AVX2: 16), 64-byte loads of a block the
/// checksum has just brought into the CPU's cache.
template <int Bits>
__attribute__((target("avx512bw"))) bool
anyAllSetAvx512(const char *at, int64_t n, uint32_t mask) {
  constexpr int64_t kLanes = 512 / Bits;
  const __m512i m = Bits == 16 ? _mm512_set1_epi16(short(mask))
                               : _mm512_set1_epi32(int(mask));
  uint64_t hits = 0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m512i v = _mm512_and_si512(_mm512_loadu_si512(at + i * (Bits / 8)), m);
    hits |= Bits == 16 ? uint64_t(_mm512_cmpeq_epi16_mask(v, m))
                       : uint64_t(_mm512_cmpeq_epi32_mask(v, m));
  }
  for (; i < n; ++i) {
    uint32_t word = 0;
    std::memcpy(&word, at + i * (Bits / 8), Bits / 8);
    hits |= (word & mask) == mask;
  }
  return hits != 0;
}

template <int Bits>
__attribute__((target("avx2"))) bool anyAllSetAvx2(const char *at, int64_t n,
                                                   uint32_t mask) {
  constexpr int64_t kLanes = 256 / Bits;
  const __m256i m = Bits == 16 ? _mm256_set1_epi16(short(mask))
                               : _mm256_set1_epi32(int(mask));
  __m256i hits = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m256i v =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(
                             at + i * (Bits / 8))),
                         m);
    hits = _mm256_or_si256(hits, Bits == 16 ? _mm256_cmpeq_epi16(v, m)
                                            : _mm256_cmpeq_epi32(v, m));
  }
  bool any = !_mm256_testz_si256(hits, hits);
  for (; i < n; ++i) {
    uint32_t word = 0;
    std::memcpy(&word, at + i * (Bits / 8), Bits / 8);
    any |= (word & mask) == mask;
  }
  return any;
}

std::atomic<ScanVectors> scanLimit{ScanVectors::Widest};

template <int Bits> bool anyAllSet(const char *at, int64_t n, uint32_t mask) {
  static const bool avx512 = __builtin_cpu_supports("avx512bw");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  const ScanVectors limit = scanLimit.load(std::memory_order_relaxed);
  if (avx512 && limit == ScanVectors::Widest)
    return anyAllSetAvx512<Bits>(at, n, mask);
  if (avx2 && limit != ScanVectors::None)
    return anyAllSetAvx2<Bits>(at, n, mask);
  uint32_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t word = 0;
    std::memcpy(&word, at + i * (Bits / 8), Bits / 8);
    hits |= uint32_t((word & mask) == mask);
  }
  return hits != 0;
}

/// How many of `n` raw values at `at` (unaligned) are NaN or infinite: 16-bit
/// floats whose exponent bits are all set, or 32-bit ones. A block at a
/// time: whether it holds any (anyAllSet), and only then how many, counted
/// in a loop the compiler vectorizes (values copied into an aligned buffer,
/// a 32-bit counter per block).
int64_t countNonFinite(const char *at, int64_t n, DType storage) {
  constexpr int64_t kBlock = 4096;
  const int64_t size = dtypeBytes(storage);
  alignas(64) uint32_t words[kBlock];
  alignas(64) uint16_t halves[kBlock];
  const uint16_t exponent = storage == DType::F16 ? 0x7C00 : 0x7F80;
  int64_t count = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    uint32_t block = 0;
    if (size == 4) {
      if (!anyAllSet<32>(at + 4 * begin, m, 0x7F800000u))
        continue;
      std::memcpy(words, at + 4 * begin, size_t(m) * 4);
      for (int64_t i = 0; i < m; ++i)
        block += uint32_t((words[i] & 0x7F800000u) == 0x7F800000u);
    } else {
      if (!anyAllSet<16>(at + 2 * begin, m, exponent))
        continue;
      std::memcpy(halves, at + 2 * begin, size_t(m) * 2);
      for (int64_t i = 0; i < m; ++i)
        block += uint32_t((halves[i] & exponent) == exponent);
    }
    count += block;
  }
  return count;
}

} // namespace

void limitScanVectors(ScanVectors widest) { scanLimit.store(widest); }

int64_t payloadNonFinite(std::string_view payload, const ChunkShape &shape,
                         const CodecSpec &codec, DType storage) {
  // A 16-bit float is infinite or NaN when its exponent bits are all set.
  auto nonFinite16 = [](const char *at, uint16_t exponent) {
    uint16_t word;
    std::memcpy(&word, at, 2);
    return (word & exponent) == exponent;
  };
  int64_t count = 0;
  if (codec.quant == CodecSpec::Quant::None)
    return countNonFinite(
        payload.data(),
        std::min<int64_t>(shape.numel(),
                          int64_t(payload.size()) / dtypeBytes(storage)),
        storage);
  // Each matrix: its groups' (scale, minimum) pairs of f16, then its codes,
  // of which E4M3's have a NaN (S.1111.111).
  const bool e4m3 = codesOf(codec) == CodeKind::E4M3;
  int64_t offset = 0;
  for (int64_t m = 0; m < shape.matrices(); ++m) {
    const int64_t pairs =
        grouping(codec, shape, matrixAxis(codec, shape, m)).count;
    for (int64_t h = 0; h < 2 * pairs; ++h)
      if (offset + 2 * h + 2 <= int64_t(payload.size()))
        count += nonFinite16(payload.data() + offset + 2 * h, 0x7C00);
    const int64_t end =
        std::min<int64_t>(offset + quantizedMatrixBytes(codec, shape, m),
                          int64_t(payload.size()));
    for (int64_t at = offset + 4 * pairs; e4m3 && at < end; ++at)
      count += (uint8_t(payload[at]) & 0x7F) == 0x7F;
    offset += quantizedMatrixBytes(codec, shape, m);
  }
  return count;
}

void hadamard(float *values, int64_t count, int64_t block) {
  const float norm = 1.0f / std::sqrt(float(block));
  for (int64_t start = 0; start + block <= count; start += block) {
    float *x = values + start;
    for (int64_t len = 1; len < block; len *= 2)
      for (int64_t i = 0; i < block; i += 2 * len)
        for (int64_t j = i; j < i + len; ++j) {
          float a = x[j], b = x[j + len];
          x[j] = a + b;
          x[j + len] = a - b;
        }
    for (int64_t i = 0; i < block; ++i)
      x[i] *= norm;
  }
}

Status checkCodec(const CodecSpec &codec, const ChunkShape &shape) {
  if (!codec.transformStage() && codec.transform != CodecSpec::Transform::None)
    return invalidArgument("unknown transform");
  if (!codec.quantStage() && codec.quant != CodecSpec::Quant::None)
    return invalidArgument("unknown quantization");
  if (!codec.losslessStage() && codec.lossless != CodecSpec::Lossless::None)
    return invalidArgument("unknown lossless coder");
  if (codec.transform == CodecSpec::Transform::Hadamard) {
    int64_t block = hadamardBlock(shape);
    if (!hadamardRotates(shape.form, shape.width, shape.headDim))
      return unimplemented("hadamard needs rows in power-of-two blocks; " +
                           std::string(name(shape.form)) + " rows of " +
                           std::to_string(shape.width) +
                           " values have blocks of " + std::to_string(block));
  }
  if (const CodecStageInfo *quant = codec.quantStage()) {
    if (codec.group <= 0)
      return invalidArgument("quantization group must be positive");
    if (!codec.layerBits.empty() && quant->codes != CodeKind::Levels)
      return invalidArgument("layer bins are integer widths; " +
                             std::string(quant->name) + " has none");
    for (int b : codec.layerBits)
      if (b != 2 && b != 4 && b != 8)
        return invalidArgument("layer bins must be 2, 4 or 8 bits, got " +
                               std::to_string(b));
  }
  return Status::ok();
}

StatusOr<std::string> encodeChunk(const float *values, const ChunkShape &shape,
                                  const CodecSpec &codec, DType storage) {
  KVC_RETURN_IF_ERROR(checkCodec(codec, shape));
  const int64_t perMatrix = shape.tokens * shape.width;
  std::vector<float> work;
  const float *x = values;
  if (codec.transform == CodecSpec::Transform::Hadamard) {
    work.assign(values, values + shape.numel());
    hadamard(work.data(), shape.numel(), hadamardBlock(shape));
    x = work.data();
  }
  std::string inner;
  inner.reserve(innerBytes(codec, shape, storage));
  if (codec.quant == CodecSpec::Quant::None) {
    storeElements(x, shape.numel(), storage, inner);
  } else {
    for (int64_t m = 0; m < shape.matrices(); ++m)
      quantizeMatrix(x + m * perMatrix, codec, shape, m, inner);
  }
  return compressBytes(inner, codec.lossless);
}

StatusOr<std::string> compressPayload(std::string_view payload,
                                      const ChunkShape &shape,
                                      const CodecSpec &codec, DType storage) {
  KVC_RETURN_IF_ERROR(checkCodec(codec, shape));
  const int64_t expected = innerBytes(codec, shape, storage);
  if (int64_t(payload.size()) != expected)
    return dataLoss("chunk payload of " + std::to_string(payload.size()) +
                    " bytes; its shape and codec " + codec.str() + " make " +
                    std::to_string(expected));
  return compressBytes(payload, codec.lossless);
}

Status decodeChunk(std::string_view bytes, const ChunkShape &shape,
                   const CodecSpec &codec, DType storage, float *out) {
  KVC_RETURN_IF_ERROR(checkCodec(codec, shape));
  const int64_t expected = innerBytes(codec, shape, storage);
  std::string inner;
  KVC_RETURN_IF_ERROR(
      decompressBytes(bytes, codec.lossless, inner, size_t(expected)));
  const int64_t perMatrix = shape.tokens * shape.width;
  if (codec.quant == CodecSpec::Quant::None) {
    loadElements(inner.data(), shape.numel(), storage, out);
  } else {
    const uint8_t *src = reinterpret_cast<const uint8_t *>(inner.data());
    for (int64_t m = 0; m < shape.matrices(); ++m) {
      dequantizeMatrix(src, codec, shape, m, out + m * perMatrix);
      src += quantizedMatrixBytes(codec, shape, m);
    }
  }
  if (codec.transform == CodecSpec::Transform::Hadamard)
    hadamard(out, shape.numel(), hadamardBlock(shape)); // Its own inverse.
  return Status::ok();
}

namespace {

using namespace codec_detail;

/// Dequantizes runs of `Bits`-bit values to bf16 with the kernel for this
/// CPU. Runs, or groups, that start inside a byte are unpacked into bytes
/// first and take the 8-bit kernel.
template <int Bits, bool PerValue> class AffineKernel {
public:
  explicit AffineKernel(int64_t maxRun)
      : aligned_(affineToBf16<Bits, PerValue>()),
        bytes_(affineToBf16<8, PerValue>()), q_(Bits == 8 ? 0 : maxRun) {}

  /// Values [first, first + n) of `packed` into `out`.
  void operator()(const uint8_t *packed, int64_t first, int64_t n,
                  const Affine &p, uint16_t *out) {
    if (first * Bits % 8 == 0 && p.group * Bits % 8 == 0)
      return aligned_(packed + first * Bits / 8, n, p, out);
    unpack<Bits>(packed, first, n, q_.data());
    bytes_(q_.data(), n, p, out);
  }

private:
  AffineFn aligned_, bytes_;
  std::vector<uint8_t> q_;
};

template <int Bits>
void dequantMatrixBf16(const uint8_t *src, const Grouping &g,
                       const ChunkShape &shape, CodecSpec::Axis axis,
                       uint16_t *const *out) {
  const int64_t rows = shape.tokens, cols = shape.width;
  const uint8_t *packed = src + 4 * g.count;
  const QuantParams params(src, g.count);
  if (axis == CodecSpec::Axis::Token) {
    // One scale and minimum per run of `g.size` values of a row.
    AffineKernel<Bits, false> perGroup(cols);
    const int64_t perRow = (cols + g.size - 1) / g.size;
    for (int64_t r = 0; r < rows; ++r)
      perGroup(packed, r * cols, cols,
               {&params.scale[r * perRow], &params.minimum[r * perRow], g.size},
               out[r]);
    return;
  }
  // One scale and minimum per column, shared by a block of `g.size` rows.
  AffineKernel<Bits, true> perValue(cols);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t block = (r / g.size) * cols;
    perValue(packed, r * cols, cols,
             {&params.scale[block], &params.minimum[block], 0}, out[r]);
  }
}

/// E4M3 codes to bf16: offset + scale * value(code), rounded, through the
/// codes' table (a group's values in order, as dequantizeMatrix).
void e4m3MatrixBf16(const uint8_t *src, const Grouping &g,
                    const ChunkShape &shape, CodecSpec::Axis axis,
                    uint16_t *const *rows) {
  const QuantParams params(src, g.count);
  const uint8_t *codes = src + 4 * g.count;
  const float *value = e4m3Values();
  const int64_t cols = shape.width;
  int64_t n = 0;
  GroupWalk{shape, axis, g.size}.forEach([&](int64_t group, int64_t i) {
    rows[i / cols][i % cols] =
        toBf16(params.minimum[group] + params.scale[group] * value[codes[n++]]);
  });
}

} // namespace

Status decodeChunkToBf16(std::string_view bytes, const ChunkShape &shape,
                         const CodecSpec &codec, DType storage,
                         uint16_t *out) {
  std::vector<uint16_t *> rows(std::size_t(shape.matrices() * shape.tokens));
  for (std::size_t r = 0; r < rows.size(); ++r)
    rows[r] = out + int64_t(r) * shape.width;
  return decodeChunkToBf16Rows(bytes, shape, codec, storage, rows);
}

Status decodeChunkToBf16Rows(std::string_view bytes, const ChunkShape &shape,
                             const CodecSpec &codec, DType storage,
                             const std::vector<uint16_t *> &rows) {
  const int64_t width = shape.width;
  if (int64_t(rows.size()) != shape.matrices() * shape.tokens)
    return internalError("decode: " + std::to_string(rows.size()) +
                         " rows for " +
                         std::to_string(shape.matrices() * shape.tokens));
  const bool quantized = codec.quant != CodecSpec::Quant::None;
  if (codec.transform != CodecSpec::Transform::None ||
      (!quantized && storage != DType::BF16)) {
    std::vector<float> values(shape.numel());
    KVC_RETURN_IF_ERROR(
        decodeChunk(bytes, shape, codec, storage, values.data()));
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (int64_t c = 0; c < width; ++c)
        rows[r][c] = floatToBf16(values[int64_t(r) * width + c]);
    return Status::ok();
  }
  KVC_RETURN_IF_ERROR(checkCodec(codec, shape));
  std::string inflated;
  KVC_ASSIGN_OR_RETURN(inner, innerOf(bytes, shape, codec, storage, inflated));
  if (!quantized) { // bf16 already.
    for (std::size_t r = 0; r < rows.size(); ++r)
      std::memcpy(rows[r], inner.data() + int64_t(r) * width * 2,
                  std::size_t(width) * sizeof(uint16_t));
    return Status::ok();
  }
  const uint8_t *src = reinterpret_cast<const uint8_t *>(inner.data());
  const bool e4m3 = codesOf(codec) == CodeKind::E4M3;
  for (int64_t m = 0; m < shape.matrices(); ++m) {
    CodecSpec::Axis axis = matrixAxis(codec, shape, m);
    Grouping g = grouping(codec, shape, axis);
    uint16_t *const *dst = rows.data() + m * shape.tokens;
    if (e4m3) {
      e4m3MatrixBf16(src, g, shape, axis, dst);
      src += quantizedMatrixBytes(codec, shape, m);
      continue;
    }
    switch (matrixBits(codec, shape, m)) {
    case 8:
      dequantMatrixBf16<8>(src, g, shape, axis, dst);
      break;
    case 4:
      dequantMatrixBf16<4>(src, g, shape, axis, dst);
      break;
    default:
      dequantMatrixBf16<2>(src, g, shape, axis, dst);
      break;
    }
    src += quantizedMatrixBytes(codec, shape, m);
  }
  return Status::ok();
}

} // namespace kvc
