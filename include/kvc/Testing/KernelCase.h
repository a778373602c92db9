//===- KernelCase.h - Checking a generated kernel ---------------*- C++ -*-===//
//
// One test case of a generated kernel (KernelGen.h), for whatever runs it:
// the host JIT in the unit tests, the CUDA driver in kvc-kernel-bench. It
// draws random KV and a paged cache (a shuffled block table with spare
// blocks, a chunk starting mid-block, layers after the first) and computes
// with the runtime's own code what the kernel must produce:
//
//   restore       payload: the chunk encoded by the runtime's codecs;
//                 cache: decodeChunkToBf16's values;
//   rope_scatter  payload: f32 projections (and the RoPE table of Rope.h);
//                 cache: applyRope, then bf16 rounding;
//   save          cache: the chunk's values (bf16) in their rows;
//                 payload: encodeChunk's bytes of those values;
//   rms_norm      payload: hidden states of the storage type, and the
//                 layers' norm weights; normed: rmsNorm (RmsNorm.h) of
//                 them, rounded to bf16.
//
// check() compares a cache with what it must hold, bit for bit, and finds
// writes outside the chunk's rows (which hold kPoison); checkPayload() a
// save kernel's payload, byte for byte. Links only the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TESTING_KERNELCASE_H
#define KVC_TESTING_KERNELCASE_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Device/KernelAbi.h"
#include "kvc/Runtime/Exec/PlanBundle.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kvc::testing {

/// What a kernel is specialized for, in the runtime's terms.
struct KernelShape {
  int64_t tokens = 0, layers = 0, kvHeads = 0, headDim = 0, blockSize = 16;
  /// Without a lossless stage: the kernel reads the decompressed payload.
  CodecSpec codec;
  DType storage = DType::BF16;
  /// rms_norm: the rows' width and RMSNorm's epsilon.
  int64_t hidden = 0;
  float eps = 1e-5f;

  int64_t width() const { return kvHeads * headDim; }
  ChunkShape chunkShape() const;
};

/// How the kernel's output differs from the runtime's.
struct CacheErrors {
  int64_t mismatches = 0; ///< Written, but not the decoder's value.
  int64_t unwritten = 0;  ///< Still the poison.
  int64_t clobbered = 0;  ///< Written outside the chunk's rows.
  int64_t payload = 0;    ///< Save: payload bytes unlike the encoder's.
  bool ok() const {
    return !mismatches && !unwritten && !clobbered && !payload;
  }
  std::string str() const;
};

class KernelCase {
public:
  /// A restore kernel's case whose first chunk starts at token
  /// `firstToken` of the request and layer `firstLayer` of the cache; `seed`
  /// draws the KV and the table. A launch over `chunks` > 1 chunks covers
  /// two layer groups: chunk i at tokens firstToken + (i / 2) * tokens,
  /// layers firstLayer + (i % 2) * layers, their payloads in the reverse
  /// order, 16 bytes apart.
  static StatusOr<KernelCase> make(const KernelShape &shape, int64_t firstToken,
                                   int64_t firstLayer, uint32_t seed,
                                   int64_t chunks = 1);
  /// A rope_scatter kernel's case (the shape's codec and storage unused),
  /// rotating as Llama 3.1 does (base 500000, its long-context scaling).
  static StatusOr<KernelCase> makeRopeScatter(const KernelShape &shape,
                                              int64_t firstToken,
                                              int64_t firstLayer,
                                              uint32_t seed);

  /// A save kernel's case: the chunk's values, rounded to bf16, are in the
  /// cache (fillCache); payload() is what the kernel must write.
  static StatusOr<KernelCase> makeSave(const KernelShape &shape,
                                       int64_t firstToken, int64_t firstLayer,
                                       uint32_t seed);

  /// An rms_norm kernel's case: the chunk's hidden states are payload(),
  /// the weights of layers 0 .. firstLayer + layers normWeights().
  static StatusOr<KernelCase> makeRmsNorm(const KernelShape &shape,
                                          int64_t firstLayer, uint32_t seed);

  /// The case of a `kind` kernel: make, makeRopeScatter, makeSave or
  /// makeRmsNorm (which takes no first token and one chunk).
  static StatusOr<KernelCase> forKind(BundleKernel::Kind kind,
                                      const KernelShape &shape,
                                      int64_t firstToken, int64_t firstLayer,
                                      uint32_t seed, int64_t chunks = 1);

  /// A quiet NaN no decoder produces: what the cache holds before a launch.
  static constexpr uint16_t kPoison = 0x7FC1;

  const KernelShape &shape() const { return shape_; }
  /// The kernel's input (the encoded chunks, or the f32 projections), or a
  /// save kernel's expected output.
  const std::string &payload() const { return payload_; }
  /// The launch's chunk table (the kernel's "chunks" argument): one record
  /// per chunk, offsets into payload().
  const std::vector<KernelChunk> &chunks() const { return chunks_; }
  /// rope_scatter: the RoPE table's rows 0 .. firstToken + tokens, f32.
  const std::vector<float> &ropeTable() const { return ropeTable_; }
  /// rms_norm: f32 [layers][hidden], every layer of the model up to the
  /// chunk's last.
  const std::vector<float> &normWeights() const { return normWeights_; }
  /// rms_norm: bf16 values of the normalized chunk.
  int64_t normedValues() const { return int64_t(expected_.size()); }
  /// rms_norm: values of `normed` (normedValues() of them) unlike the
  /// runtime's (mismatches) or still kPoison (unwritten).
  CacheErrors checkNormed(const uint16_t *normed) const;
  /// Logical block -> physical block.
  const std::vector<int32_t> &blockTable() const { return table_; }
  int64_t firstToken() const { return firstToken_; }
  int64_t firstLayer() const { return firstLayer_; }
  /// Rows of one layer of the cache.
  int64_t layerRows() const { return layerRows_; }
  /// bf16 values of the whole key (or value) cache.
  int64_t cacheValues() const;

  /// Whether the kernel writes the payload (a save kernel's case).
  bool saves() const { return saves_; }
  /// Checks the key and value caches after the kernel ran (a save kernel's:
  /// unchanged since fillCache) and a save kernel's `payload`
  /// (payload().size() bytes) against the runtime's encoding.
  CacheErrors check(const uint16_t *keys, const uint16_t *values,
                    const uint8_t *payload = nullptr) const;

  /// Writes the chunk's values into its rows of the key and value caches of
  /// cacheValues() values each, and kPoison everywhere else.
  void fillCache(uint16_t *keys, uint16_t *values) const;

private:
  KernelCase(const KernelShape &shape, int64_t firstToken, int64_t firstLayer)
      : shape_(shape), chunks_{{0, firstToken, firstLayer}},
        firstToken_(firstToken), firstLayer_(firstLayer) {}
  /// Draws the chunk's values: keys with per-channel outliers, values around
  /// zero (KIVI's setting).
  static std::vector<float> drawValues(const ChunkShape &chunk,
                                       std::mt19937 &rng);
  /// Draws the block table and sizes the cache for the chunks' tokens.
  void drawTable(std::mt19937 &rng);
  /// The cache row of token `t` of chunk `c` in its layer `l`.
  int64_t cacheRow(const KernelChunk &c, int64_t l, int64_t t) const;
  /// Layers of the cache: up to the last chunk's end.
  int64_t layerSpan() const;
  /// Where row `t` of K (`kv` 0) or V of layer `l` of chunk `chunk` starts
  /// in expected_.
  int64_t expectedRow(size_t chunk, int64_t l, int kv, int64_t t) const;

  KernelShape shape_;
  std::string payload_;
  /// What the chunks' rows of the cache hold after the kernel, per chunk,
  /// per layer K then V, [tokens][width].
  std::vector<uint16_t> expected_;
  std::vector<int32_t> table_;
  std::vector<float> ropeTable_, normWeights_;
  std::vector<KernelChunk> chunks_;
  int64_t firstToken_ = 0, firstLayer_ = 0, layerRows_ = 0;
  bool saves_ = false;
};

} // namespace kvc::testing

#endif // KVC_TESTING_KERNELCASE_H
