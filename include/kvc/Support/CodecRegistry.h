//===- CodecRegistry.h - One row per stage of the codec space ---*- C++ -*-===//
//
// Everything kvc knows about a codec stage, in one row: its name (the
// codec strings' word, the dialect's enum case, a target's rate key), what
// kind of stage it is, whether it loses information, how wide its codes
// are and how they map to values, where it may run, what the cost model
// assumes of it before anything is measured, and the stage whose rates a
// target gives for it. Parsing and printing codecs (CodecSpec), the
// codec profile's enumeration and estimates, calibration's sweep, the cost
// model's rates, the targets' schema, kernel generation's eligibility and
// the dialect's enum check (KVCVocabularyTest) all read these rows; the
// data plane implements each code kind once (ChunkCodec.cpp, Lossless.cpp,
// the kernel emitters) and picks it from the row.
//
// Adding a stage is a row here plus its enumerator in CodecSpec and the
// dialect's enum; a new kind of code also its encoder and decoder
// (docs/architecture.md, "Where to add").
//
//===----------------------------------------------------------------------===//

#ifndef KVC_SUPPORT_CODECREGISTRY_H
#define KVC_SUPPORT_CODECREGISTRY_H

#include "kvc/Support/Vocabulary.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvc {

/// The kinds of stage, in the order encoding applies them.
enum class StageKind : uint8_t { Transform, Quant, Lossless };

/// How a quantization stage's codes stand for values. Both keep one f16
/// pair (scale, offset) per group: a value is offset + scale * code(q).
enum class CodeKind : uint8_t {
  /// Unsigned integers 0 .. 2^bits - 1, asymmetric: the offset is the
  /// group's minimum, the scale its range over 2^bits - 1 (KIVI).
  Levels,
  /// OCP FP8 E4M3 ("fn": finite only, at most 448 in magnitude),
  /// symmetric: the offset is 0, the scale the group's largest magnitude
  /// over 448, so values near zero keep E4M3's relative precision.
  E4M3,
};

struct CodecStageInfo {
  /// The word in codec strings, the dialect's enum case, a rate's `on`.
  std::string_view name;
  StageKind kind;
  /// Its enumerator in CodecSpec's enum of its kind (never 0, "none").
  int enumerator;
  bool lossy;
  /// Quantization: bits per code (also how layer bins name it).
  int bits = 0;
  CodeKind codes = CodeKind::Levels;
  /// The stage a target's codec rates are keyed by; a quantization's rates
  /// also say which quantization they hold `on`.
  CodecStage rate = CodecStage::Quant;
  /// Per-core GB/s the cost model assumes until a target or a measured
  /// profile says otherwise.
  double defaultEncodeGBs = 1, defaultDecodeGBs = 1;
  /// Where it may run: a generated restore kernel decodes it on the device,
  /// a generated save kernel encodes it there (else the host does).
  bool deviceDecode = false, deviceEncode = false;
  /// Quantization: relative L2 error on near-Gaussian groups of 32 values,
  /// the cost model's estimate (CodecTest checks it bounds kvc's models'),
  /// and whether it grows with the group (a range split into levels does; a
  /// float code's relative error does not).
  double error32 = 0;
  bool errorGrowsWithGroup = false;
  /// A lossless coder: output bytes per input byte on elements of 16, 8, 4
  /// and 2 bits (entropy per bit rises as elements narrow).
  double ratioOn[4] = {1, 1, 1, 1};
};

/// Every stage, transforms first, then quantizations, then lossless
/// coders, each kind in its enumerators' order.
const std::vector<CodecStageInfo> &codecStages();

/// The stage of `kind` with CodecSpec enumerator `enumerator`, or null for
/// "none" (0) and unknown enumerators.
const CodecStageInfo *findCodecStage(StageKind kind, int enumerator);
/// The stage named `name` of `kind`, or null.
const CodecStageInfo *findCodecStage(StageKind kind, std::string_view name);

/// How many stages of `kind` there are: CodecSpec's enum of that kind has
/// one more enumerator ("none").
int countStages(StageKind kind);

/// The ratioOn column of elements of `bits` bits (16, 8, 4, 2).
int ratioColumn(int bits);

} // namespace kvc

#endif // KVC_SUPPORT_CODECREGISTRY_H
