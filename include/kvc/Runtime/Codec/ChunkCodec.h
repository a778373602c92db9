//===- ChunkCodec.h - Encoding KV and hidden-state chunks -------*- C++ -*-===//
//
// A chunk's values are matrices of `tokens` x `width`, layer-major: for KV,
// K then V of each layer (width = kv_heads * head_dim); for hidden states,
// one matrix per layer (width = hidden). Encoding composes KVServe's stages,
// each its own unit:
//
//   transform (orthonormal Hadamard over blocks of head_dim)
//   -> quantization (asymmetric int8/int4/int2 levels, or symmetric FP8
//      E4M3 codes; per-token groups along the channels or
//      per-channel groups along the tokens, K and V on their own axes as
//      KIVI; an fp16 scale and offset per group; layer bins of integer
//      widths as CacheGen)
//   -> lossless coder (deflate via libdeflate, zstd, lz4)
//
// Unquantized values are stored in the model's dtype. Decoding knows every
// size in advance from the shape and the codec, so truncated or corrupt
// input is an error (DataLoss), never a crash or a short buffer.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_CODEC_CHUNKCODEC_H
#define KVC_RUNTIME_CODEC_CHUNKCODEC_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Support/Vocabulary.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

struct ChunkShape {
  Form form = Form::KV;
  int64_t tokens = 0;
  int64_t layers = 0;
  int64_t width = 0;    ///< kv_heads * head_dim, or hidden.
  int64_t headDim = 0;  ///< Hadamard block of KV rows.
  int64_t firstLayer = 0; ///< Model layer of the chunk's first layer (bins).
  int64_t modelLayers = 0; ///< All layers of the model (bins).

  int64_t matricesPerLayer() const { return form == Form::KV ? 2 : 1; }
  int64_t matrices() const { return layers * matricesPerLayer(); }
  int64_t numel() const { return matrices() * tokens * width; }
};

/// The shape of `form` over `tokens` x [firstLayer, firstLayer + layers).
ChunkShape chunkShape(const ModelConfig &model, Form form, int64_t tokens,
                      int64_t firstLayer, int64_t layers);

/// Checks that `codec` applies to `shape` (Hadamard blocks a power of two,
/// supported bins).
Status checkCodec(const CodecSpec &codec, const ChunkShape &shape);

/// The f16 bits of the scale a quantization group gets when its range
/// divided by the levels underflows f16 (6.1e-5), so the scale stays
/// invertible.
constexpr uint16_t kTinyQuantScale = 0x03FF;

/// Encodes `shape.numel()` values.
StatusOr<std::string> encodeChunk(const float *values, const ChunkShape &shape,
                                  const CodecSpec &codec, DType storage);

/// Decodes into `out` (shape.numel() floats); DataLoss on malformed input.
Status decodeChunk(std::string_view bytes, const ChunkShape &shape,
                   const CodecSpec &codec, DType storage, float *out);

/// Undoes the lossless stage alone: `out` gets encodeChunk's bytes before
/// that stage (the quantized or plain elements), which a generated restore
/// kernel reads on the device; DataLoss unless they are exactly as many as
/// the shape and codec make.
Status decompressChunk(std::string_view bytes, const ChunkShape &shape,
                       const CodecSpec &codec, DType storage, std::string &out);

/// How many of decompressChunk's `payload` numbers are NaN or infinite: its
/// values, or a quantized payload's scales and minimums (any one of which
/// makes its group decode to non-finite values). 0 for a finite chunk.
int64_t payloadNonFinite(std::string_view payload, const ChunkShape &shape,
                         const CodecSpec &codec, DType storage);

/// The widest vectors payloadNonFinite's scan uses: the CPU's widest
/// (AVX-512BW, else AVX2, else none) unless limited, which tests do to run
/// each on a CPU that has them all.
enum class ScanVectors { Widest, Avx2, None };
void limitScanVectors(ScanVectors widest);

/// Applies the lossless stage alone to `payload`, encodeChunk's bytes
/// before that stage (what a generated save kernel writes): encodeChunk's
/// result for the same values. DataLoss unless the payload is exactly as
/// long as the shape and codec make it.
StatusOr<std::string> compressPayload(std::string_view payload,
                                      const ChunkShape &shape,
                                      const CodecSpec &codec, DType storage);

/// Decodes into `out` (shape.numel() bf16 values, what the paged cache
/// holds), equal to rounding decodeChunk's floats. The executor's hot paths
/// go straight to bf16: quantized, untransformed chunks through a vector
/// loop per group, raw bf16 chunks by a copy; others decode to fp32 first.
Status decodeChunkToBf16(std::string_view bytes, const ChunkShape &shape,
                         const CodecSpec &codec, DType storage, uint16_t *out);
/// The same into `rows`: row r of matrix m (shape.width values) at
/// rows[m * shape.tokens + r], as a paged cache's blocks hold them.
Status decodeChunkToBf16Rows(std::string_view bytes, const ChunkShape &shape,
                             const CodecSpec &codec, DType storage,
                             const std::vector<uint16_t *> &rows);

//===--- Stages, exposed for tests and benchmarks ------------------------===//

/// In place, over consecutive blocks of `block` values (a power of two).
void hadamard(float *values, int64_t count, int64_t block);

/// The lossless stage alone.
StatusOr<std::string> compressBytes(std::string_view raw,
                                    CodecSpec::Lossless coder);
Status decompressBytes(std::string_view packed, CodecSpec::Lossless coder,
                       std::string &out, size_t expectedSize);

} // namespace kvc

#endif // KVC_RUNTIME_CODEC_CHUNKCODEC_H
