//===- CodecQuality.h - How much a lossy codec changes -----------*- C++ -*-===//
//
// The measures the codec profiler reports and the codec tests bound: the
// relative L2 error of decoded values, and of attention outputs for sample
// queries over a chunk's K and V.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_CODEC_CODECQUALITY_H
#define KVC_RUNTIME_CODEC_CODECQUALITY_H

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include <vector>

namespace kvc {

/// ||a - b|| / ||b||.
double relativeL2(const std::vector<float> &a, const std::vector<float> &b);

/// Softmax attention of head 0 of every layer of a KV chunk (layer-major, K
/// then V) for `queries` (rows of head_dim values): the outputs, query by
/// query, layer by layer.
std::vector<float> sampleAttention(const std::vector<float> &kv,
                                   const ChunkShape &shape,
                                   const std::vector<float> &queries);

} // namespace kvc

#endif // KVC_RUNTIME_CODEC_CODECQUALITY_H
