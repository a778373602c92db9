//===- KVCAttrs.cpp - Attributes of the kvc dialect -----------------------===//

#include "kvc/Dialect/KVC/IR/KVCAttrs.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Support/Format.h"
#include "kvc/Support/KernelChips.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"


using namespace mlir;
using namespace kvc::compiler;

#include "kvc/Dialect/KVC/IR/KVCEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "kvc/Dialect/KVC/IR/KVCAttrs.cpp.inc"

void KVCDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "kvc/Dialect/KVC/IR/KVCAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Parameter parsers and printers
//===----------------------------------------------------------------------===//

FailureOr<llvm::APFloat> kvc::compiler::parseF64(AsmParser &parser) {
  // Whole numbers may be written without a dot (`rope_theta = 10000`).
  int64_t integer = 0;
  OptionalParseResult parsedInteger = parser.parseOptionalInteger(integer);
  if (parsedInteger.has_value()) {
    if (failed(*parsedInteger))
      return failure();
    return llvm::APFloat(static_cast<double>(integer));
  }
  double value;
  if (parser.parseFloat(value))
    return failure();
  return llvm::APFloat(value);
}

std::string kvc::compiler::formatF64(double value) {
  std::string text = kvc::formatNumber(value);
  // MLIR's float literals need a dot before an exponent: 1e-05 -> 1.0e-05.
  size_t exponent = text.find('e');
  if (exponent != std::string::npos && text.find('.') == std::string::npos)
    text.insert(exponent, ".0");
  return text;
}

void kvc::compiler::printF64(AsmPrinter &printer, const llvm::APFloat &value) {
  printer << formatF64(value.convertToDouble());
}

FailureOr<RangeAttr> kvc::compiler::parseRangeBody(AsmParser &parser) {
  int64_t begin = 0, end = 0;
  if (parser.parseInteger(begin) || parser.parseKeyword("to") ||
      parser.parseInteger(end))
    return failure();
  return RangeAttr::get(parser.getContext(), begin, end);
}

void kvc::compiler::printRangeBody(AsmPrinter &printer, RangeAttr range) {
  printer << range.getBegin() << " to " << range.getEnd();
}

ParseResult kvc::compiler::parseRange(OpAsmParser &parser, RangeAttr &range) {
  FailureOr<RangeAttr> parsed = parseRangeBody(parser);
  if (failed(parsed))
    return failure();
  range = *parsed;
  return success();
}

void kvc::compiler::printRange(OpAsmPrinter &printer, Operation *,
                               RangeAttr range) {
  printRangeBody(printer, range);
}

LogicalResult
kvc::compiler::verifyRange(function_ref<InFlightDiagnostic()> emitError,
                           StringRef field, RangeAttr range, int64_t limit,
                           StringRef limitName) {
  int64_t begin = range.getBegin(), end = range.getEnd();
  if (begin < 0)
    return emitError() << field << " range " << begin << " to " << end
                       << " starts below 0";
  if (end == begin)
    return emitError() << field << " range " << begin << " to " << end
                       << " is empty";
  if (end < begin)
    return emitError() << field << " range " << begin << " to " << end
                       << " is reversed";
  if (limit > 0 && end > limit)
    return emitError() << field << " range " << begin << " to " << end
                       << " exceeds the model's " << limitName << " ("
                       << limit << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

namespace {
/// Fails with "`field` must be positive" unless `value > 0`.
LogicalResult requirePositive(function_ref<InFlightDiagnostic()> emitError,
                              StringRef field, double value) {
  if (value > 0)
    return success();
  return emitError() << field << " must be positive, got " << formatF64(value);
}
} // namespace

LogicalResult ModelAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                StringRef name, int64_t layers, int64_t hidden,
                                int64_t heads, int64_t kvHeads, int64_t headDim,
                                int64_t ffn, int64_t vocab,
                                int64_t maxPositions, llvm::APFloat ropeTheta,
                                Type dtype, StringRef fingerprint,
                                llvm::APFloat rmsNormEps) {
  std::pair<StringRef, int64_t> sizes[] = {
      {"layers", layers}, {"hidden", hidden},     {"heads", heads},
      {"kv_heads", kvHeads}, {"head_dim", headDim}, {"ffn", ffn},
      {"vocab", vocab},   {"max_positions", maxPositions}};
  for (auto [field, value] : sizes)
    if (failed(requirePositive(emitError, field, value)))
      return failure();
  if (heads % kvHeads != 0)
    return emitError() << "kv_heads (" << kvHeads
                       << ") must divide heads (" << heads << ")";
  if (heads * headDim != hidden)
    return emitError() << "heads * head_dim (" << heads << " * " << headDim
                       << ") must equal hidden (" << hidden << ")";
  if (failed(requirePositive(emitError, "rope_theta",
                             ropeTheta.convertToDouble())))
    return failure();
  if (!dtype.isBF16() && !dtype.isF16() && !dtype.isF32())
    return emitError() << "dtype must be bf16, f16 or f32, got " << dtype;
  return requirePositive(emitError, "rms_norm_eps",
                         rmsNormEps.convertToDouble());
}

int64_t ModelAttr::getElementBytes() const {
  return getDtype().getIntOrFloatBitWidth() / 8;
}

LogicalResult ComputeAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                  ComputeKind kind, StringRef,
                                  llvm::APFloat denseTflops,
                                  llvm::APFloat memGbs, llvm::APFloat memGib,
                                  llvm::APFloat restoreShare,
                                  llvm::APFloat gemmPeakFraction,
                                  llvm::APFloat gemmHalfTokens,
                                  llvm::APFloat attentionTflops,
                                  StringRef chip) {
  if (!chip.empty() && kind != ComputeKind::gpu)
    return emitError() << "chip \"" << chip << "\" names a GPU architecture, "
                       << "but the compute is a " << stringifyComputeKind(kind);
  if (!chip.empty() &&
      !kvc::isKernelChip(std::string_view(chip.data(), chip.size())))
    return emitError() << "chip \"" << chip
                       << "\" is no architecture kvc generates kernels for "
                          "(expected "
                       << kvc::kKernelChips << ")";
  if (failed(requirePositive(emitError, "dense_tflops",
                             denseTflops.convertToDouble())) ||
      failed(requirePositive(emitError, "mem_gbs", memGbs.convertToDouble())) ||
      failed(requirePositive(emitError, "mem_gib", memGib.convertToDouble())))
    return failure();
  double share = restoreShare.convertToDouble();
  if (!(share > 0 && share <= 1))
    return emitError() << "restore_share must lie in (0, 1], got "
                       << formatF64(share);
  double peak = gemmPeakFraction.convertToDouble();
  if (!(peak > 0 && peak <= 1))
    return emitError() << "gemm_peak_fraction must lie in (0, 1], got "
                       << formatF64(peak);
  if (gemmHalfTokens.convertToDouble() < 0)
    return emitError() << "gemm_half_tokens must not be negative";
  if (attentionTflops.convertToDouble() < 0)
    return emitError() << "attention_tflops must not be negative";
  return success();
}

LogicalResult HostAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               int64_t cores, llvm::APFloat dramGib,
                               llvm::APFloat nicGbs, llvm::APFloat handoffUs,
                               llvm::APFloat checkGbs,
                               llvm::APFloat readCheckGbs) {
  if (failed(requirePositive(emitError, "cores", cores)) ||
      failed(requirePositive(emitError, "dram_gib", dramGib.convertToDouble())))
    return failure();
  if (nicGbs.convertToDouble() < 0)
    return emitError() << "nic_gbs must not be negative";
  if (handoffUs.convertToDouble() < 0)
    return emitError() << "handoff_us must not be negative";
  if (checkGbs.convertToDouble() < 0)
    return emitError() << "check_gbs must not be negative";
  if (readCheckGbs.convertToDouble() < 0)
    return emitError() << "read_check_gbs must not be negative";
  return success();
}

LogicalResult LinkAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               llvm::APFloat h2dGbs, llvm::APFloat d2hGbs,
                               llvm::APFloat latencyUs) {
  if (failed(requirePositive(emitError, "h2d_gbs", h2dGbs.convertToDouble())) ||
      failed(requirePositive(emitError, "d2h_gbs", d2hGbs.convertToDouble())))
    return failure();
  if (latencyUs.convertToDouble() < 0)
    return emitError() << "latency_us must not be negative";
  return success();
}

LogicalResult TierAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               StringRef name, TierKind, llvm::APFloat readGbs,
                               llvm::APFloat writeGbs, llvm::APFloat latencyUs,
                               int64_t lanes, llvm::APFloat throttleGbs) {
  if (name.empty())
    return emitError() << "tier name must not be empty";
  if (failed(requirePositive(emitError, "read_gbs", readGbs.convertToDouble())) ||
      failed(requirePositive(emitError, "write_gbs",
                             writeGbs.convertToDouble())) ||
      failed(requirePositive(emitError, "lanes", lanes)))
    return failure();
  if (latencyUs.convertToDouble() < 0)
    return emitError() << "latency_us must not be negative";
  if (throttleGbs.convertToDouble() < 0)
    return emitError() << "throttle_gbs must not be negative";
  return success();
}

LogicalResult
CodecRateAttr::verify(function_ref<InFlightDiagnostic()> emitError, CodecStage,
                      CodecData, llvm::APFloat encodeGbs,
                      llvm::APFloat decodeGbs) {
  if (failed(requirePositive(emitError, "encode_gbs",
                             encodeGbs.convertToDouble())) ||
      failed(requirePositive(emitError, "decode_gbs",
                             decodeGbs.convertToDouble())))
    return failure();
  return success();
}

LogicalResult TargetAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 StringRef name, ComputeAttr, HostAttr,
                                 LinkAttr, ArrayAttr tiers, ArrayAttr codecs) {
  if (name.empty())
    return emitError() << "target name must not be empty";
  if (tiers.empty())
    return emitError() << "a target needs at least one tier";
  llvm::StringSet<> names;
  for (Attribute attr : tiers) {
    auto tier = llvm::dyn_cast<TierAttr>(attr);
    if (!tier)
      return emitError() << "tiers must hold #kvc.tier attributes, got "
                         << attr;
    if (!names.insert(tier.getName()).second)
      return emitError() << "duplicate tier \"" << tier.getName() << "\"";
  }
  llvm::SmallSet<std::pair<CodecStage, CodecData>, 8> stages;
  for (Attribute attr : codecs) {
    auto rate = llvm::dyn_cast<CodecRateAttr>(attr);
    if (!rate)
      return emitError() << "codecs must hold #kvc.codec_rate attributes, got "
                         << attr;
    if (!stages.insert({rate.getStage(), rate.getOn()}).second)
      return emitError() << "duplicate codec stage "
                         << stringifyCodecStage(rate.getStage()) << " on "
                         << stringifyCodecData(rate.getOn());
  }
  return success();
}

TierAttr TargetAttr::findTier(StringRef name) const {
  for (Attribute attr : getTiers())
    if (auto tier = llvm::dyn_cast<TierAttr>(attr); tier && tier.getName() == name)
      return tier;
  return {};
}

//===----------------------------------------------------------------------===//
// CodecAttr
//===----------------------------------------------------------------------===//

static constexpr int64_t kDefaultGroup = 32;

LogicalResult CodecAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                Transform transform, Quant quant,
                                QuantAxis keyAxis, QuantAxis valueAxis,
                                int64_t group, Lossless lossless) {
  if (transform == Transform::none && quant == Quant::none &&
      lossless == Lossless::none)
    return emitError() << "codec does nothing: raw data carries no codec";
  if (quant == Quant::none) {
    if (keyAxis != QuantAxis::channel || valueAxis != QuantAxis::token ||
        group != kDefaultGroup)
      return emitError() << "key_axis, value_axis and group need quant";
    return success();
  }
  if (group <= 0 || !llvm::isPowerOf2_64(group))
    return emitError() << "group must be a positive power of two, got "
                       << group;
  return success();
}

int64_t CodecAttr::getBits() const {
  const kvc::CodecStageInfo *stage = getQuantStage();
  return stage ? stage->bits : 16;
}

const kvc::CodecStageInfo *CodecAttr::getQuantStage() const {
  return kvc::findCodecStage(kvc::StageKind::Quant, stringifyQuant(getQuant()));
}

CodecAttr CodecAttr::getOrRaw(MLIRContext *context, Transform transform,
                              Quant quant, QuantAxis keyAxis,
                              QuantAxis valueAxis, int64_t group,
                              Lossless lossless) {
  if (transform == Transform::none && quant == Quant::none &&
      lossless == Lossless::none)
    return {};
  if (quant == Quant::none) {
    keyAxis = QuantAxis::channel;
    valueAxis = QuantAxis::token;
    group = kDefaultGroup;
  }
  return get(context, transform, quant, keyAxis, valueAxis, group, lossless);
}

CodecAttr CodecAttr::withTransform(Transform transform) const {
  return getOrRaw(getContext(), transform, getQuant(), getKeyAxis(),
                  getValueAxis(), getGroup(), getLossless());
}

CodecAttr CodecAttr::withQuant(Quant quant) const {
  return getOrRaw(getContext(), getTransform(), quant, getKeyAxis(),
                  getValueAxis(), getGroup(), getLossless());
}

CodecAttr CodecAttr::withLossless(Lossless lossless) const {
  return getOrRaw(getContext(), getTransform(), getQuant(), getKeyAxis(),
                  getValueAxis(), getGroup(), lossless);
}

//===----------------------------------------------------------------------===//
// SourceAttr
//===----------------------------------------------------------------------===//

LogicalResult SourceAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 StringRef tier, Form, CodecAttr,
                                 RangeAttr tokens, RangeAttr layers,
                                 int64_t tokenGroup, int64_t layerGroup) {
  if (tier.empty())
    return emitError() << "source tier must not be empty";
  if (tokenGroup < 1)
    return emitError() << "source token_group must be at least 1, got "
                       << tokenGroup;
  if (layerGroup < 1)
    return emitError() << "source layer_group must be at least 1, got "
                       << layerGroup;
  if (failed(verifyRange(emitError, "tokens", tokens)) ||
      failed(verifyRange(emitError, "layers", layers)))
    return failure();
  return success();
}
