//===- CodecRegistry.cpp - One row per stage of the codec space -----------===//

#include "kvc/Support/CodecRegistry.h"

namespace kvc {

namespace {

/// A lossless coder's row: lossless, host-only, its own rate key.
CodecStageInfo coder(std::string_view name, int enumerator, CodecStage rate,
                     double encodeGBs, double decodeGBs,
                     const double (&ratioOn)[4]) {
  CodecStageInfo row{name, StageKind::Lossless, enumerator, /*lossy=*/false};
  row.rate = rate;
  row.defaultEncodeGBs = encodeGBs;
  row.defaultDecodeGBs = decodeGBs;
  row.deviceDecode = row.deviceEncode = false;
  for (int i = 0; i < 4; ++i)
    row.ratioOn[i] = ratioOn[i];
  return row;
}

/// A quantization's row, keyed for rates as "quant" on itself.
CodecStageInfo quant(std::string_view name, int enumerator, int bits,
                     CodeKind codes, double error32, bool grows,
                     double encodeGBs, double decodeGBs, bool deviceEncode) {
  CodecStageInfo row{name, StageKind::Quant, enumerator, /*lossy=*/true};
  row.bits = bits;
  row.codes = codes;
  row.rate = CodecStage::Quant;
  row.defaultEncodeGBs = encodeGBs;
  row.defaultDecodeGBs = decodeGBs;
  row.deviceDecode = true;
  row.deviceEncode = deviceEncode;
  row.error32 = error32;
  row.errorGrowsWithGroup = grows;
  return row;
}

std::vector<CodecStageInfo> rows() {
  // Default rates: ShadowServe Table 1 (deflate, lz4 decode), lzbench (the
  // encoders, zstd); quantization and Hadamard as kvc's CPU codecs run.
  // Quantization errors: a group's range over 2^bits - 1 levels has a
  // uniform rounding error of a step / sqrt(12), for near-Gaussian groups
  // (range ~4.1 sigma over 32 values) with a margin; E4M3's three mantissa
  // bits round each value to within 2^-4 of itself, ~0.03 in L2 over
  // near-Gaussian values whatever the group.
  CodecStageInfo hadamard{"hadamard", StageKind::Transform, 1,
                          /*lossy=*/false};
  hadamard.rate = CodecStage::Hadamard;
  hadamard.defaultEncodeGBs = hadamard.defaultDecodeGBs = 2.0;
  hadamard.deviceDecode = hadamard.deviceEncode = true;
  return {
      hadamard,
      quant("int8", 1, 8, CodeKind::Levels, 0.006, true, 4.0, 4.0, true),
      quant("int4", 2, 4, CodeKind::Levels, 0.09, true, 4.0, 4.0, true),
      quant("int2", 3, 2, CodeKind::Levels, 0.45, true, 4.0, 4.0, true),
      quant("fp8", 4, 8, CodeKind::E4M3, 0.035, false, 4.0, 4.0,
            /*deviceEncode=*/false),
      coder("deflate", 1, CodecStage::Deflate, 0.12, 0.3125,
            {0.80, 0.82, 0.90, 0.94}),
      coder("zstd", 2, CodecStage::Zstd, 0.51, 1.38, {0.78, 0.80, 0.88, 0.92}),
      coder("lz4", 3, CodecStage::Lz4, 0.78, 2.325, {0.92, 0.95, 0.98, 1.00}),
  };
}

} // namespace

const std::vector<CodecStageInfo> &codecStages() {
  static const std::vector<CodecStageInfo> table = rows();
  return table;
}

const CodecStageInfo *findCodecStage(StageKind kind, int enumerator) {
  for (const CodecStageInfo &row : codecStages())
    if (row.kind == kind && row.enumerator == enumerator)
      return &row;
  return nullptr;
}

const CodecStageInfo *findCodecStage(StageKind kind, std::string_view name) {
  for (const CodecStageInfo &row : codecStages())
    if (row.kind == kind && row.name == name)
      return &row;
  return nullptr;
}

int countStages(StageKind kind) {
  int count = 0;
  for (const CodecStageInfo &row : codecStages())
    count += row.kind == kind;
  return count;
}

int ratioColumn(int bits) {
  return bits >= 16 ? 0 : bits >= 8 ? 1 : bits >= 4 ? 2 : 3;
}

} // namespace kvc
