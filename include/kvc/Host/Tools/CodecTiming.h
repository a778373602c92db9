//===- CodecTiming.h - Per-core rates of a codec's stages -------*- C++ -*-===//
//
// What `calibrate` and `profile-codecs` time a codec with: objects shaped as
// a store holds them (one layer of 256 tokens), decoded to bf16 as the CPU
// device decodes them, on one core, each decode of a timed pass reading
// and writing memory out of the cache, as in a restore.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_TOOLS_CODECTIMING_H
#define KVC_HOST_TOOLS_CODECTIMING_H

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Model/ModelCompute.h"

#include <vector>

namespace kvc {

/// KV of a model as a store holds it: one object per layer.
struct KVObjects {
  struct Object {
    ChunkShape shape;
    std::vector<float> values;
  };
  DType dtype = DType::BF16; ///< The model's, what raw objects store.
  std::vector<Object> objects;
  double rawBytes() const; ///< Of all objects, in `dtype`.
};

/// The first `tokens` tokens' KV of `cache`, one object per layer.
KVObjects kvObjects(const ModelCompute &model, const ModelCompute::Cache &cache,
                    int64_t tokens);

/// Per-core rates in GB/s; 0 where a stage is absent.
struct CodecRates {
  /// Every stage, in GB/s of raw bytes (decoding to bf16).
  double encodeGBs = 0, decodeGBs = 0;
  /// The lossless stage alone, in GB/s of the bytes it codes.
  double losslessEncodeGBs = 0, losslessDecodeGBs = 0;
};

/// Times encoding and decoding every object of `kv` with `codec`.
StatusOr<CodecRates> timeCodec(const KVObjects &kv, const CodecSpec &codec);

} // namespace kvc

#endif // KVC_HOST_TOOLS_CODECTIMING_H
