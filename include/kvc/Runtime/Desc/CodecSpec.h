//===- CodecSpec.h - One point of the codec strategy space ------*- C++ -*-===//
//
// KVServe's modular codec space: an orthogonal transform, quantization
// (integer levels or FP8, with the scale axis of K and of V and a group size,
// as KIVI), then a lossless coder. The runtime's codecs, the planner's
// profile table and the dialect's #kvc.codec all describe a codec with these
// fields; what each stage is and does is its row in the codec registry
// (kvc/Support/CodecRegistry.h), which the enumerators index.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DESC_CODECSPEC_H
#define KVC_RUNTIME_DESC_CODECSPEC_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Support/CodecRegistry.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

struct CodecSpec {
  enum class Transform { None, Hadamard };
  enum class Quant { None, Int8, Int4, Int2, Fp8 };
  enum class Axis { Token, Channel };
  enum class Lossless { None, Deflate, Zstd, Lz4 };

  Transform transform = Transform::None;
  Quant quant = Quant::None;
  Axis keyAxis = Axis::Channel; ///< KIVI: keys per channel...
  Axis valueAxis = Axis::Token; ///< ...values per token.
  int64_t group = 32;
  Lossless lossless = Lossless::None;
  /// CacheGen's layer bins: when not empty, the layers are split into
  /// as many equal groups, group i quantized to layerBits[i] bits (8, 4 or
  /// 2, integer levels), overriding `quant`'s width (which must still be an
  /// integer quantization).
  std::vector<int> layerBits;

  /// No stage applied: the bytes are plain elements.
  bool isRaw() const {
    return transform == Transform::None && quant == Quant::None &&
           lossless == Lossless::None;
  }
  /// The registry's rows of its stages; null where a stage is "none".
  const CodecStageInfo *transformStage() const;
  const CodecStageInfo *quantStage() const;
  const CodecStageInfo *losslessStage() const;

  /// Bits per element after quantization (16 when unquantized; the mean
  /// over layers with layer bins).
  int bits() const;
  /// Bits of layer `layer` of `layers`.
  int bitsOfLayer(int64_t layer, int64_t layers) const;
  /// "raw", or the applied stages joined by '+': "hadamard+int4/g64+deflate";
  /// parseCodecSpec reads it back as an equal codec.
  std::string str() const;

  bool operator==(const CodecSpec &other) const;
  bool operator!=(const CodecSpec &other) const { return !(*this == other); }
};

/// Parses what CodecSpec::str() prints, plus axis options: "raw", "int8",
/// "hadamard+int4/g64+zstd", "int4/k=channel/v=token", "int4/bins8-4-2",
/// "fp8/g64". Every stage name is a row of the codec registry.
StatusOr<CodecSpec> parseCodecSpec(const std::string &text);

/// The stages' names ("none" for None), from the registry.
const char *transformName(CodecSpec::Transform transform);
const char *quantName(CodecSpec::Quant quant);
const char *axisName(CodecSpec::Axis axis);
const char *losslessName(CodecSpec::Lossless lossless);
/// The enumerator a name names ("none" included), or nothing.
std::optional<CodecSpec::Transform> parseTransform(std::string_view name);
std::optional<CodecSpec::Quant> parseQuant(std::string_view name);
std::optional<CodecSpec::Lossless> parseLossless(std::string_view name);

} // namespace kvc

#endif // KVC_RUNTIME_DESC_CODECSPEC_H
