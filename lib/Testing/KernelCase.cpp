//===- KernelCase.cpp - Checking a generated kernel -----------------------===//

#include "kvc/Testing/KernelCase.h"

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Runtime/Model/Rope.h"

#include <algorithm>
#include <cstring>
#include <numeric>

using namespace kvc;
using namespace kvc::testing;

ChunkShape KernelShape::chunkShape() const {
  ChunkShape shape;
  shape.form = Form::KV;
  shape.tokens = tokens;
  shape.layers = layers;
  shape.width = width();
  shape.headDim = headDim;
  shape.modelLayers = layers;
  return shape;
}

std::string CacheErrors::str() const {
  return std::to_string(mismatches) + " wrong, " + std::to_string(unwritten) +
         " unwritten, " + std::to_string(clobbered) + " clobbered, " +
         std::to_string(payload) + " payload bytes wrong";
}

std::vector<float> KernelCase::drawValues(const ChunkShape &chunk,
                                                 std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(chunk.numel());
  for (int64_t i = 0; i < chunk.numel(); ++i)
    values[i] = normal(rng) * (i % chunk.width % 37 == 0 ? 8.0f : 1.0f);
  return values;
}

void KernelCase::drawTable(std::mt19937 &rng) {
  // Twice the blocks the chunks need plus spares, shuffled.
  const int64_t B = shape_.blockSize;
  int64_t end = 0;
  for (const KernelChunk &c : chunks_)
    end = std::max(end, c.firstToken + shape_.tokens);
  const int64_t tableBlocks = (end + B - 1) / B;
  const int64_t numBlocks = 2 * tableBlocks + 3;
  std::vector<int32_t> blocks(numBlocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  table_.assign(blocks.begin(), blocks.begin() + tableBlocks);
  layerRows_ = numBlocks * B;
}

StatusOr<KernelCase> KernelCase::forKind(BundleKernel::Kind kind,
                                         const KernelShape &shape,
                                         int64_t firstToken, int64_t firstLayer,
                                         uint32_t seed, int64_t chunks) {
  switch (kind) {
  case BundleKernel::Kind::Restore:
    return make(shape, firstToken, firstLayer, seed, chunks);
  case BundleKernel::Kind::RopeScatter:
    return makeRopeScatter(shape, firstToken, firstLayer, seed);
  case BundleKernel::Kind::Save:
    return makeSave(shape, firstToken, firstLayer, seed);
  case BundleKernel::Kind::RmsNorm:
    return makeRmsNorm(shape, firstLayer, seed);
  }
  return invalidArgument("unknown kernel kind");
}

StatusOr<KernelCase> KernelCase::make(const KernelShape &shape,
                                      int64_t firstToken, int64_t firstLayer,
                                      uint32_t seed, int64_t chunks) {
  if (shape.codec.lossless != CodecSpec::Lossless::None)
    return invalidArgument(
        "a kernel reads payloads after their lossless stage");
  if (chunks < 1)
    return invalidArgument("a launch over no chunk");
  KernelCase c(shape, firstToken, firstLayer);
  const ChunkShape chunk = shape.chunkShape();
  std::mt19937 rng(seed);
  std::vector<std::string> payloads;
  c.expected_.resize(chunks * chunk.numel());
  for (int64_t i = 0; i < chunks; ++i) {
    std::vector<float> values = drawValues(chunk, rng);
    StatusOr<std::string> payload =
        encodeChunk(values.data(), chunk, shape.codec, shape.storage);
    if (!payload)
      return payload.status();
    KVC_RETURN_IF_ERROR(
        decodeChunkToBf16(*payload, chunk, shape.codec, shape.storage,
                          c.expected_.data() + i * chunk.numel()));
    payloads.push_back(std::move(*payload));
  }
  // The last chunk's payload first, each 16-byte aligned and 16 bytes
  // after the one before.
  c.chunks_.assign(size_t(chunks), {});
  for (int64_t i = chunks - 1; i >= 0; --i) {
    c.chunks_[i] = {int64_t(c.payload_.size()),
                    firstToken + (i / 2) * shape.tokens,
                    firstLayer + (i % 2) * shape.layers};
    c.payload_ += payloads[i];
    if (i)
      c.payload_.resize((c.payload_.size() + 15) / 16 * 16 + 16);
  }
  c.drawTable(rng);
  return c;
}

StatusOr<KernelCase> KernelCase::makeRopeScatter(const KernelShape &shape,
                                                 int64_t firstToken,
                                                 int64_t firstLayer,
                                                 uint32_t seed) {
  ModelConfig model;
  model.headDim = shape.headDim;
  model.ropeTheta = 500000;
  model.ropeScaling = {RopeScaling::Kind::Llama3, 8.0, 1.0, 4.0, 8192};
  const std::vector<float> invFreq = ropeFrequencies(model);
  KernelCase c(shape, firstToken, firstLayer);
  const ChunkShape chunk = shape.chunkShape();
  std::mt19937 rng(seed);
  std::vector<float> values = drawValues(chunk, rng);
  c.payload_.assign(reinterpret_cast<const char *>(values.data()),
                    values.size() * sizeof(float));
  c.ropeTable_.resize((firstToken + shape.tokens) * shape.headDim);
  ropeCosSin(invFreq, 0, firstToken + shape.tokens, c.ropeTable_.data());
  // What the runtime's projection does after its GEMM: RoPE on K, then
  // bf16 rounding of K and V.
  const int64_t matrix = shape.tokens * shape.width();
  for (int64_t l = 0; l < shape.layers; ++l)
    applyRope(values.data() + 2 * l * matrix, shape.tokens, shape.kvHeads,
              shape.headDim, c.ropeTable_.data() + firstToken * shape.headDim);
  c.expected_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    c.expected_[i] = floatToBf16(values[i]);
  c.drawTable(rng);
  return c;
}

StatusOr<KernelCase> KernelCase::makeSave(const KernelShape &shape,
                                          int64_t firstToken,
                                          int64_t firstLayer, uint32_t seed) {
  if (shape.codec.lossless != CodecSpec::Lossless::None)
    return invalidArgument(
        "a kernel writes payloads before their lossless stage");
  KernelCase c(shape, firstToken, firstLayer);
  const ChunkShape chunk = shape.chunkShape();
  std::mt19937 rng(seed);
  std::vector<float> values = drawValues(chunk, rng);
  // What a bf16 cache holds, and what the runtime saves from it.
  c.expected_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    c.expected_[i] = floatToBf16(values[i]);
    values[i] = bf16ToFloat(c.expected_[i]);
  }
  StatusOr<std::string> payload =
      encodeChunk(values.data(), chunk, shape.codec, shape.storage);
  if (!payload)
    return payload.status();
  c.payload_ = std::move(*payload);
  c.saves_ = true;
  c.drawTable(rng);
  return c;
}

StatusOr<KernelCase> KernelCase::makeRmsNorm(const KernelShape &shape,
                                             int64_t firstLayer,
                                             uint32_t seed) {
  if (shape.hidden < 8 || shape.hidden % 8)
    return invalidArgument("rms_norm rows are whole 8-value pieces");
  KernelCase c(shape, /*firstToken=*/0, firstLayer);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = shape.layers * shape.tokens, h = shape.hidden;
  // Hidden states with a few large channels, as a trained model's have.
  std::vector<float> x(rows * h);
  for (int64_t i = 0; i < rows * h; ++i)
    x[i] = normal(rng) * (i % h % 61 == 0 ? 20.0f : 1.0f);
  c.payload_.resize(x.size() * dtypeBytes(shape.storage));
  for (size_t i = 0; i < x.size(); ++i) {
    char *at = &c.payload_[i * dtypeBytes(shape.storage)];
    if (shape.storage == DType::F32) {
      std::memcpy(at, &x[i], 4);
      continue;
    }
    uint16_t bits =
        shape.storage == DType::BF16 ? floatToBf16(x[i]) : floatToF16(x[i]);
    std::memcpy(at, &bits, 2);
    x[i] = shape.storage == DType::BF16 ? bf16ToFloat(bits) : f16ToFloat(bits);
  }
  c.normWeights_.resize((firstLayer + shape.layers) * h);
  for (float &w : c.normWeights_)
    w = 1.0f + 0.2f * normal(rng);
  std::vector<float> normed(x.size());
  for (int64_t l = 0; l < shape.layers; ++l)
    rmsNorm(x.data() + l * shape.tokens * h, shape.tokens, h, shape.eps,
            c.normWeights_.data() + (firstLayer + l) * h,
            normed.data() + l * shape.tokens * h);
  c.expected_.resize(normed.size());
  for (size_t i = 0; i < normed.size(); ++i)
    c.expected_[i] = floatToBf16(normed[i]);
  return c;
}

CacheErrors KernelCase::checkNormed(const uint16_t *normed) const {
  CacheErrors errors;
  for (size_t i = 0; i < expected_.size(); ++i) {
    if (normed[i] == kPoison && expected_[i] != kPoison)
      ++errors.unwritten;
    else if (normed[i] != expected_[i])
      ++errors.mismatches;
  }
  return errors;
}

int64_t KernelCase::cacheRow(const KernelChunk &c, int64_t l, int64_t t) const {
  const int64_t position = c.firstToken + t, B = shape_.blockSize;
  return (c.firstLayer + l) * layerRows_ + int64_t(table_[position / B]) * B +
         position % B;
}

int64_t KernelCase::layerSpan() const {
  int64_t end = 0;
  for (const KernelChunk &c : chunks_)
    end = std::max(end, c.firstLayer + shape_.layers);
  return end;
}

void KernelCase::fillCache(uint16_t *keys, uint16_t *values) const {
  std::fill_n(keys, cacheValues(), kPoison);
  std::fill_n(values, cacheValues(), kPoison);
  const int64_t width = shape_.width();
  for (size_t i = 0; i < chunks_.size(); ++i)
    for (int64_t l = 0; l < shape_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t t = 0; t < shape_.tokens; ++t)
          std::copy_n(expected_.data() + expectedRow(i, l, kv, t), width,
                      (kv ? values : keys) +
                          cacheRow(chunks_[i], l, t) * width);
}

int64_t KernelCase::cacheValues() const {
  return layerSpan() * layerRows_ * shape_.width();
}

CacheErrors KernelCase::check(const uint16_t *keys, const uint16_t *values,
                              const uint8_t *payload) const {
  CacheErrors errors;
  if (saves_ && payload)
    for (size_t i = 0; i < payload_.size(); ++i)
      errors.payload += payload[i] != uint8_t(payload_[i]);
  const int64_t width = shape_.width();
  std::vector<char> written(cacheValues() / width, 0);
  for (size_t i = 0; i < chunks_.size(); ++i)
    for (int64_t l = 0; l < shape_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t t = 0; t < shape_.tokens; ++t) {
          const int64_t row = cacheRow(chunks_[i], l, t);
          written[row] = 1;
          const uint16_t *got = (kv ? values : keys) + row * width;
          const uint16_t *want = expected_.data() + expectedRow(i, l, kv, t);
          for (int64_t c = 0; c < width; ++c) {
            if (got[c] == kPoison && want[c] != kPoison)
              ++errors.unwritten;
            else if (got[c] != want[c])
              ++errors.mismatches;
          }
        }
  for (int64_t row = 0; row < int64_t(written.size()); ++row)
    if (!written[row])
      for (int64_t c = 0; c < width; ++c)
        errors.clobbered += (keys[row * width + c] != kPoison) +
                            (values[row * width + c] != kPoison);
  return errors;
}

int64_t KernelCase::expectedRow(size_t chunk, int64_t l, int kv,
                                int64_t t) const {
  const int64_t tokens = shape_.tokens, width = shape_.width();
  return ((int64_t(chunk) * shape_.layers + l) * 2 * tokens + kv * tokens + t) *
         width;
}
