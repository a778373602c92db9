//===- ChunkCodec.cpp - Encoding KV and hidden-state chunks ---------------===//

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include "kvc/Runtime/Base/Half.h"

#include <libdeflate.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace kvc {

const char *chunkFormName(ChunkForm form) {
  return form == ChunkForm::KV ? "kv" : "hidden";
}

ChunkShape chunkShape(const ModelConfig &model, ChunkForm form, int64_t tokens,
                      int64_t firstLayer, int64_t layers) {
  ChunkShape shape;
  shape.form = form;
  shape.tokens = tokens;
  shape.layers = layers;
  shape.width = form == ChunkForm::KV ? model.numKvHeads * model.headDim
                                      : model.hiddenSize;
  shape.headDim = model.headDim;
  shape.firstLayer = firstLayer;
  shape.modelLayers = model.numLayers;
  return shape;
}

namespace {

Status dataLoss(const std::string &message) {
  return Status(StatusCode::DataLoss, message);
}

bool isPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/// The Hadamard block of a matrix row.
int64_t hadamardBlock(const ChunkShape &shape) {
  if (shape.form == ChunkForm::KV)
    return shape.headDim;
  int64_t block = 1;
  while (block < 256 && shape.width % (block * 2) == 0)
    block *= 2;
  return block;
}

/// Bits of matrix `m`: the layer's bin, or the codec's width.
int matrixBits(const CodecSpec &codec, const ChunkShape &shape, int64_t m) {
  int64_t layer = shape.firstLayer + m / shape.matricesPerLayer();
  return codec.bitsOfLayer(layer, std::max(shape.modelLayers, shape.layers));
}

/// Quantization axis of matrix `m`: K on keyAxis, V and hidden on valueAxis.
CodecSpec::Axis matrixAxis(const CodecSpec &codec, const ChunkShape &shape,
                           int64_t m) {
  bool isKey = shape.form == ChunkForm::KV && m % 2 == 0;
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
  int64_t groupOf(int64_t r, int64_t c) const {
    int64_t cols = shape.width;
    if (axis == CodecSpec::Axis::Token)
      return r * ((cols + size - 1) / size) + c / size;
    return (r / size) * cols + c;
  }
  /// Calls fn(group, row-major index) for every value in packed order.
  template <typename Fn> void forEach(Fn fn) const {
    for (int64_t r = 0; r < shape.tokens; ++r)
      for (int64_t c = 0; c < shape.width; ++c)
        fn(groupOf(r, c), r * shape.width + c);
  }
};

void quantizeMatrix(const float *x, const CodecSpec &codec,
                    const ChunkShape &shape, int64_t m, std::string &out) {
  CodecSpec::Axis axis = matrixAxis(codec, shape, m);
  Grouping g = grouping(codec, shape, axis);
  int bits = matrixBits(codec, shape, m);
  const int levels = (1 << bits) - 1;
  GroupWalk walk{shape, axis, g.size};
  std::vector<float> lo(g.count, INFINITY), hi(g.count, -INFINITY);
  walk.forEach([&](int64_t group, int64_t i) {
    lo[group] = std::min(lo[group], x[i]);
    hi[group] = std::max(hi[group], x[i]);
  });
  // Parameters as fp16, and quantization against the rounded ones so that
  // encoder and decoder agree exactly.
  std::vector<float> scale(g.count), minimum(g.count);
  size_t params = out.size();
  out.resize(params + g.count * 4);
  for (int64_t k = 0; k < g.count; ++k) {
    uint16_t mn = floatToF16(lo[k]);
    float range = hi[k] - f16ToFloat(mn);
    uint16_t sc = floatToF16(range > 0 ? range / float(levels) : 1.0f);
    if (f16ToFloat(sc) <= 0)
      sc = floatToF16(6.1e-5f); // Smallest normal: keep it invertible.
    scale[k] = f16ToFloat(sc);
    minimum[k] = f16ToFloat(mn);
    std::memcpy(&out[params + 4 * k], &sc, 2);
    std::memcpy(&out[params + 4 * k + 2], &mn, 2);
  }
  size_t packed = out.size();
  out.resize(packed + packedBytes(shape.tokens * shape.width, bits), '\0');
  uint8_t *dst = reinterpret_cast<uint8_t *>(&out[packed]);
  int64_t n = 0;
  const int perByte = 8 / bits;
  walk.forEach([&](int64_t group, int64_t i) {
    float q = std::nearbyint((x[i] - minimum[group]) / scale[group]);
    uint32_t v = uint32_t(std::clamp(q, 0.0f, float(levels)));
    dst[n / perByte] |= uint8_t(v << ((n % perByte) * bits));
    ++n;
  });
}

void dequantizeMatrix(const uint8_t *src, const CodecSpec &codec,
                      const ChunkShape &shape, int64_t m, float *out) {
  CodecSpec::Axis axis = matrixAxis(codec, shape, m);
  Grouping g = grouping(codec, shape, axis);
  int bits = matrixBits(codec, shape, m);
  const uint32_t mask = (1u << bits) - 1;
  const int perByte = 8 / bits;
  std::vector<float> scale(g.count), minimum(g.count);
  for (int64_t k = 0; k < g.count; ++k) {
    uint16_t sc, mn;
    std::memcpy(&sc, src + 4 * k, 2);
    std::memcpy(&mn, src + 4 * k + 2, 2);
    scale[k] = f16ToFloat(sc);
    minimum[k] = f16ToFloat(mn);
  }
  const uint8_t *packed = src + 4 * g.count;
  int64_t n = 0;
  GroupWalk{shape, axis, g.size}.forEach([&](int64_t group, int64_t i) {
    uint32_t v = (packed[n / perByte] >> ((n % perByte) * bits)) & mask;
    out[i] = minimum[group] + scale[group] * float(v);
    ++n;
  });
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

} // namespace

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
  if (codec.transform == CodecSpec::Transform::Hadamard) {
    int64_t block = hadamardBlock(shape);
    if (!isPowerOfTwo(block) || block < 2 || shape.width % block)
      return unimplemented("hadamard needs rows in power-of-two blocks; " +
                           std::string(chunkFormName(shape.form)) +
                           " rows of " + std::to_string(shape.width) +
                           " values have blocks of " + std::to_string(block));
  }
  if (codec.quant != CodecSpec::Quant::None) {
    if (codec.group <= 0)
      return invalidArgument("quantization group must be positive");
    for (int b : codec.layerBits)
      if (b != 2 && b != 4 && b != 8)
        return invalidArgument("layer-group bins must be 2, 4 or 8 bits, got " +
                               std::to_string(b));
  }
  return Status::ok();
}

StatusOr<std::string> compressBytes(std::string_view raw,
                                    CodecSpec::Lossless coder) {
  std::string out;
  switch (coder) {
  case CodecSpec::Lossless::None:
    return std::string(raw);
  case CodecSpec::Lossless::Deflate: {
    std::unique_ptr<libdeflate_compressor, void (*)(libdeflate_compressor *)>
        c(libdeflate_alloc_compressor(1), libdeflate_free_compressor);
    out.resize(libdeflate_deflate_compress_bound(c.get(), raw.size()));
    size_t n = libdeflate_deflate_compress(c.get(), raw.data(), raw.size(),
                                           out.data(), out.size());
    if (n == 0)
      return Status(StatusCode::Internal, "deflate failed");
    out.resize(n);
    return out;
  }
  case CodecSpec::Lossless::Zstd: {
    out.resize(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 1);
    if (ZSTD_isError(n))
      return Status(StatusCode::Internal,
                    std::string("zstd: ") + ZSTD_getErrorName(n));
    out.resize(n);
    return out;
  }
  case CodecSpec::Lossless::Lz4: {
    out.resize(LZ4_compressBound(int(raw.size())));
    int n = LZ4_compress_default(raw.data(), out.data(), int(raw.size()),
                                 int(out.size()));
    if (n <= 0)
      return Status(StatusCode::Internal, "lz4 failed");
    out.resize(n);
    return out;
  }
  }
  return Status(StatusCode::Internal, "unknown coder");
}

Status decompressBytes(std::string_view packed, CodecSpec::Lossless coder,
                       std::string &out, size_t expectedSize) {
  out.resize(expectedSize);
  switch (coder) {
  case CodecSpec::Lossless::None:
    if (packed.size() != expectedSize)
      return dataLoss("payload of " + std::to_string(packed.size()) +
                      " bytes, expected " + std::to_string(expectedSize));
    std::memcpy(out.data(), packed.data(), expectedSize);
    return Status::ok();
  case CodecSpec::Lossless::Deflate: {
    thread_local std::unique_ptr<libdeflate_decompressor,
                                 void (*)(libdeflate_decompressor *)>
        d(libdeflate_alloc_decompressor(), libdeflate_free_decompressor);
    size_t actual = 0;
    libdeflate_result r =
        libdeflate_deflate_decompress(d.get(), packed.data(), packed.size(),
                                      out.data(), expectedSize, &actual);
    if (r != LIBDEFLATE_SUCCESS || actual != expectedSize)
      return dataLoss("deflate stream is corrupt or truncated");
    return Status::ok();
  }
  case CodecSpec::Lossless::Zstd: {
    unsigned long long size =
        ZSTD_getFrameContentSize(packed.data(), packed.size());
    if (size != expectedSize)
      return dataLoss("zstd frame is corrupt, truncated or of the wrong size");
    size_t n = ZSTD_decompress(out.data(), expectedSize, packed.data(),
                               packed.size());
    if (ZSTD_isError(n) || n != expectedSize)
      return dataLoss("zstd frame is corrupt or truncated");
    return Status::ok();
  }
  case CodecSpec::Lossless::Lz4: {
    int n = LZ4_decompress_safe(packed.data(), out.data(), int(packed.size()),
                                int(expectedSize));
    if (n < 0 || size_t(n) != expectedSize)
      return dataLoss("lz4 block is corrupt or truncated");
    return Status::ok();
  }
  }
  return dataLoss("unknown lossless coder");
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

/// bf16 of `x`, round to nearest even (finite inputs), branch-free so loops
/// vectorize.
inline uint16_t toBf16(float x) {
  uint32_t w;
  std::memcpy(&w, &x, 4);
  return uint16_t((w + 0x7FFF + ((w >> 16) & 1)) >> 16);
}

template <int Bits>
void dequantMatrixBf16(const uint8_t *src, const Grouping &g,
                       const ChunkShape &shape, CodecSpec::Axis axis,
                       uint16_t *out) {
  const int64_t rows = shape.tokens, cols = shape.width;
  constexpr int perByte = 8 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  const uint8_t *packed = src + 4 * g.count;
  GroupWalk walk{shape, axis, g.size};
  std::vector<float> scale(cols), minimum(cols);
  std::vector<uint8_t> q(cols + perByte);
  // Expands the parameters of row r's groups to one per column: per
  // group for per-token groups, per column for per-channel ones.
  auto loadParams = [&](int64_t r) {
    for (int64_t c0 = 0; c0 < cols;) {
      int64_t k = walk.groupOf(r, c0);
      uint16_t sc, mn;
      std::memcpy(&sc, src + 4 * k, 2);
      std::memcpy(&mn, src + 4 * k + 2, 2);
      float s = f16ToFloat(sc), m = f16ToFloat(mn);
      int64_t span = axis == CodecSpec::Axis::Token
                         ? std::min(g.size, cols - c0)
                         : 1;
      std::fill_n(scale.data() + c0, span, s);
      std::fill_n(minimum.data() + c0, span, m);
      c0 += span;
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    // Per-token groups change every row, per-channel ones every block.
    if (axis == CodecSpec::Axis::Token || r % g.size == 0)
      loadParams(r);
    int64_t n0 = r * cols;
    int64_t c = 0;
    for (; c < cols && (n0 + c) % perByte; ++c)
      q[c] = (packed[(n0 + c) / perByte] >> (((n0 + c) % perByte) * Bits)) &
             mask;
    const uint8_t *bytes = packed + (n0 + c) / perByte;
    int64_t whole = (cols - c) / perByte;
    for (int64_t b = 0; b < whole; ++b)
      for (int k = 0; k < perByte; ++k)
        q[c + b * perByte + k] = (bytes[b] >> (k * Bits)) & mask;
    for (c += whole * perByte; c < cols; ++c)
      q[c] = (packed[(n0 + c) / perByte] >> (((n0 + c) % perByte) * Bits)) &
             mask;
    uint16_t *row = out + r * cols;
    const float *sc = scale.data(), *mn = minimum.data();
    const uint8_t *qs = q.data();
    for (int64_t i = 0; i < cols; ++i)
      row[i] = toBf16(mn[i] + sc[i] * float(qs[i]));
  }
}

} // namespace

Status dequantizeToBf16(std::string_view bytes, const ChunkShape &shape,
                        const CodecSpec &codec, uint16_t *out) {
  if (codec.quant == CodecSpec::Quant::None ||
      codec.transform != CodecSpec::Transform::None) {
    std::vector<float> values(shape.numel());
    KVC_RETURN_IF_ERROR(
        decodeChunk(bytes, shape, codec, DType::BF16, values.data()));
    for (int64_t i = 0; i < shape.numel(); ++i)
      out[i] = floatToBf16(values[i]);
    return Status::ok();
  }
  KVC_RETURN_IF_ERROR(checkCodec(codec, shape));
  std::string inflated;
  std::string_view inner = bytes;
  const int64_t expected = innerBytes(codec, shape, DType::BF16);
  if (codec.lossless != CodecSpec::Lossless::None) {
    KVC_RETURN_IF_ERROR(
        decompressBytes(bytes, codec.lossless, inflated, size_t(expected)));
    inner = inflated;
  } else if (int64_t(bytes.size()) != expected) {
    return dataLoss("payload of " + std::to_string(bytes.size()) +
                    " bytes, expected " + std::to_string(expected));
  }
  const uint8_t *src = reinterpret_cast<const uint8_t *>(inner.data());
  const int64_t perMatrix = shape.tokens * shape.width;
  for (int64_t m = 0; m < shape.matrices(); ++m) {
    CodecSpec::Axis axis = matrixAxis(codec, shape, m);
    Grouping g = grouping(codec, shape, axis);
    uint16_t *dst = out + m * perMatrix;
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
