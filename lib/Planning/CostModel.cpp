//===- CostModel.cpp - Seconds for each step of a plan --------------------===//

#include "kvc/Planning/CostModel.h"

#include <cmath>

namespace kvc::planning {

namespace {
/// The per-core rate assumed when neither the profile nor the target gives
/// one: the registry's default of the stage the rate key names (for
/// quantization, of the quantization it holds on).
double defaultRate(CodecStage stage, bool decode, CodecSpec::Quant on) {
  const CodecStageInfo *row = nullptr;
  if (stage == CodecStage::Quant)
    row = findCodecStage(StageKind::Quant, int(on));
  for (const CodecStageInfo &candidate : codecStages())
    if (!row && candidate.rate == stage)
      row = &candidate;
  if (!row)
    return 1.0;
  return decode ? row->defaultDecodeGBs : row->defaultEncodeGBs;
}

/// Quantized bytes per raw byte: bits/16 plus a 16-bit scale and zero per
/// group.
double quantRatio(const CodecSpec &codec) {
  if (codec.quant == CodecSpec::Quant::None)
    return 1.0;
  return codec.bits() / 16.0 + 2.0 / double(codec.group);
}

/// Sum of (p + 1) for p in [0, n): n (n + 1) / 2.
double triangle(int64_t n) { return 0.5 * double(n) * double(n + 1); }
} // namespace

CostModel::CostModel(ModelConfig model, TargetDesc target,
                     CodecProfile profile)
    : model_(std::move(model)), target_(std::move(target)),
      profile_(std::move(profile)) {
  double hidden = double(model_.hiddenSize);
  double qDim = double(model_.numHeads * model_.headDim);
  double kvDim = double(model_.numKvHeads * model_.headDim);
  double ffn = double(model_.intermediateSize);
  // Q, K, V, O projections and the three SwiGLU matrices.
  linearFlops_ =
      2.0 * (hidden * qDim + 2.0 * hidden * kvDim + qDim * hidden +
             3.0 * hidden * ffn);
  const ComputeDesc &c = target_.compute;
  peakFlops_ = c.denseTflops * 1e12 * c.restoreShare * c.gemmPeakFraction;
}

double CostModel::attentionFlops(int64_t t0, int64_t t1) const {
  double perKey = 4.0 * double(model_.numHeads * model_.headDim);
  return perKey * (triangle(t1) - triangle(t0));
}

double CostModel::prefillFlops(int64_t t0, int64_t t1, int64_t layers) const {
  return double(layers) *
         (linearFlops_ * double(t1 - t0) + attentionFlops(t0, t1));
}

double CostModel::projectFlops(int64_t tokens, int64_t layers) const {
  return 2.0 * double(tokens) * double(layers) * double(model_.hiddenSize) *
         2.0 * double(model_.numKvHeads * model_.headDim);
}

double CostModel::gemmEfficiency(int64_t rows) const {
  double half = target_.compute.gemmHalfTokens;
  return double(rows) / (double(rows) + half);
}

double CostModel::computeSeconds(double flops, int64_t rows) const {
  if (flops <= 0)
    return 0;
  return flops / (peakFlops_ * gemmEfficiency(rows));
}

double CostModel::prefillSeconds(int64_t t0, int64_t t1,
                                 int64_t layers) const {
  return prefillSeconds(t0, t1, layers, t1 - t0);
}

double CostModel::prefillSeconds(int64_t t0, int64_t t1, int64_t layers,
                                 int64_t rows) const {
  const ComputeDesc &c = target_.compute;
  if (c.attentionTflops <= 0)
    return computeSeconds(prefillFlops(t0, t1, layers), rows);
  double linear = double(layers) * linearFlops_ * double(t1 - t0);
  double attention = double(layers) * attentionFlops(t0, t1);
  return computeSeconds(linear, rows) +
         attention / (c.attentionTflops * 1e12 * c.restoreShare);
}

double CostModel::kvWrittenSeconds(int64_t t0, int64_t t1) const {
  double hidden = double(model_.hiddenSize);
  double qDim = double(model_.numHeads * model_.headDim);
  double kvDim = double(model_.numKvHeads * model_.headDim);
  return computeSeconds(2.0 * hidden * (qDim + 2.0 * kvDim) * double(t1 - t0),
                        t1 - t0);
}

double CostModel::dequantSeconds(const CodecSpec &codec,
                                 double rawBytes) const {
  if (codec.quant == CodecSpec::Quant::None)
    return 0;
  const ComputeDesc &c = target_.compute;
  if (c.kind == ComputeDesc::Kind::CPU)
    return codec.lossless != CodecSpec::Lossless::None
               ? 0
               : rawBytes /
                     (stageRate(CodecStage::Quant, true, codec.quant) * 1e9);
  // Read the integers, write the elements.
  return rawBytes * (1.0 + codec.bits() / 16.0) / (c.memGBs * 1e9);
}

double CostModel::untransformSeconds(const CodecSpec &codec,
                                     double rawBytes) const {
  if (codec.transform == CodecSpec::Transform::None)
    return 0;
  const ComputeDesc &c = target_.compute;
  if (c.kind == ComputeDesc::Kind::CPU)
    return codec.lossless != CodecSpec::Lossless::None
               ? 0
               : rawBytes / (stageRate(CodecStage::Hadamard, true) * 1e9);
  return 2.0 * rawBytes / (c.memGBs * 1e9);
}

double CostModel::scatterSeconds(double rawBytes) const {
  // Read the chunk, write the cache blocks.
  return 2.0 * rawBytes / (target_.compute.memGBs * 1e9);
}

double CostModel::rawBytes(Form form, int64_t tokens, int64_t layers) const {
  double perTokenLayer = form == Form::KV
                             ? double(model_.kvBytesPerTokenLayer())
                             : double(model_.hiddenBytesPerTokenLayer());
  return double(tokens) * double(layers) * perTokenLayer;
}

double CostModel::quantizedBytes(Form form, const CodecSpec &codec,
                                 int64_t tokens, int64_t layers) const {
  return rawBytes(form, tokens, layers) * quantRatio(codec);
}

double CostModel::storedBytes(Form form, const CodecSpec &codec,
                              int64_t tokens, int64_t layers) const {
  return rawBytes(form, tokens, layers) * profile_.ratio(codec);
}

double CostModel::encodedBytes(Form form, const CodecSpec &codec,
                               int64_t tokens, int64_t layers) const {
  if (codec.lossless != CodecSpec::Lossless::None)
    return storedBytes(form, codec, tokens, layers);
  return quantizedBytes(form, codec, tokens, layers);
}

double CostModel::readGBs(const TierDesc &tier) {
  return tier.throttleGBs > 0 ? std::min(tier.readGBs, tier.throttleGBs)
                              : tier.readGBs;
}

double CostModel::readSeconds(const TierDesc &tier, double bytes) const {
  double laneBandwidth = readGBs(tier) * 1e9 / double(tier.lanes);
  return tier.latencyUs * 1e-6 + bytes / laneBandwidth;
}

double CostModel::readCheckedSeconds(const TierDesc &tier, double bytes) const {
  const double lanes = double(tier.lanes);
  const double shared = lanes / (readGBs(tier) * 1e9);
  const double alone = lanes / (tier.readGBs * 1e9) + readCheckSeconds(1);
  return tier.latencyUs * 1e-6 + bytes * std::max(shared, alone);
}

double CostModel::stageRate(CodecStage stage, bool decode,
                            CodecSpec::Quant on) const {
  const CodecRateDesc *any = nullptr;
  for (const CodecRateDesc &rate : target_.codecs) {
    if (rate.stage != stage)
      continue;
    if (rate.on == on)
      return decode ? rate.decodeGBs : rate.encodeGBs;
    if (!rate.on)
      any = &rate;
  }
  if (any)
    return decode ? any->decodeGBs : any->encodeGBs;
  return defaultRate(stage, decode, on);
}

double CostModel::losslessRate(const CodecSpec &codec, bool decode) const {
  const CodecProfileEntry *entry = profile_.find(codec);
  double measured = !entry ? 0 : decode ? entry->decodeGBs : entry->encodeGBs;
  return measured > 0
             ? measured
             : stageRate(codec.losslessStage()->rate, decode, codec.quant);
}

double CostModel::hostDecodeSeconds(const CodecSpec &codec,
                                    double quantizedBytes) const {
  if (codec.lossless == CodecSpec::Lossless::None)
    return 0;
  double seconds = quantizedBytes / (losslessRate(codec, true) * 1e9);
  if (target_.compute.kind != ComputeDesc::Kind::CPU)
    return seconds / double(std::max<int64_t>(target_.host.cores, 1));
  // The CPU backend decodes a chunk completely, on one thread.
  double raw = quantizedBytes / quantRatio(codec);
  if (codec.quant != CodecSpec::Quant::None)
    seconds += raw / (stageRate(CodecStage::Quant, true, codec.quant) * 1e9);
  if (codec.transform != CodecSpec::Transform::None)
    seconds += raw / (stageRate(CodecStage::Hadamard, true) * 1e9);
  return seconds;
}

double CostModel::hostEncodeSeconds(const CodecSpec &codec,
                                    double rawBytes) const {
  double cores = double(target_.host.cores);
  double seconds = 0;
  if (codec.transform != CodecSpec::Transform::None)
    seconds += rawBytes / (stageRate(CodecStage::Hadamard, false) * 1e9);
  if (codec.quant != CodecSpec::Quant::None)
    seconds +=
        rawBytes / (stageRate(CodecStage::Quant, false, codec.quant) * 1e9);
  if (codec.lossless != CodecSpec::Lossless::None)
    seconds +=
        rawBytes * quantRatio(codec) / (losslessRate(codec, false) * 1e9);
  return seconds / cores;
}

double CostModel::h2dSeconds(double bytes) const {
  return target_.link.latencyUs * 1e-6 + bytes / (target_.link.h2dGBs * 1e9);
}

double CostModel::uploadCheckSeconds(double storedBytes) const {
  return target_.host.checkGBs > 0 ? storedBytes / (target_.host.checkGBs * 1e9)
                                   : 0;
}

double CostModel::readCheckSeconds(double storedBytes) const {
  return target_.host.readCheckGBs > 0
             ? storedBytes / (target_.host.readCheckGBs * 1e9)
             : 0;
}

double CostModel::d2hSeconds(double bytes) const {
  return target_.link.latencyUs * 1e-6 + bytes / (target_.link.d2hGBs * 1e9);
}

double CostModel::writeSeconds(const TierDesc &tier, double bytes) const {
  double laneBandwidth = tier.writeGBs * 1e9 / double(tier.lanes);
  return tier.latencyUs * 1e-6 + bytes / laneBandwidth;
}

double CostModel::networkSeconds(double bytes) const {
  double nic = target_.host.nicGBs;
  return nic > 0 ? bytes / (nic * 1e9) : 0;
}

} // namespace kvc::planning
