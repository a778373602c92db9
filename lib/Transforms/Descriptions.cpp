//===- Descriptions.cpp - Descriptions as attributes and back -------------===//

#include "kvc/Transforms/Descriptions.h"

#include "kvc/Support/EnumNames.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace kvc::compiler;

namespace {
/// The schema's enum names are the IR's keywords; map one to the other.
template <typename E>
E symbolize(std::optional<E> (*symbolizeFn)(StringRef), const char *name) {
  std::optional<E> value = symbolizeFn(name);
  assert(value && "schema and dialect enums out of sync");
  return *value;
}

/// The inverse: the runtime enumerator whose name is `name`.
template <typename E>
E fromName(const char *(*nameOf)(E), int count, StringRef name) {
  std::optional<E> value = kvc::enumFromName(nameOf, count, name);
  assert(value && "schema and dialect enums out of sync");
  return *value;
}

/// The codec stage enumerator the codec registry knows by `name`.
template <typename E>
E fromStage(std::optional<E> (*parse)(std::string_view), StringRef name) {
  std::optional<E> value = parse(name);
  assert(value && "codec registry and dialect enums out of sync");
  return *value;
}

Type getElementType(MLIRContext *context, kvc::DType dtype) {
  Builder b(context);
  switch (dtype) {
  case kvc::DType::BF16:
    return b.getBF16Type();
  case kvc::DType::F16:
    return b.getF16Type();
  case kvc::DType::F32:
    return b.getF32Type();
  }
  llvm_unreachable("unknown dtype");
}

llvm::APFloat f64(double value) { return llvm::APFloat(value); }
double f64(const llvm::APFloat &value) { return value.convertToDouble(); }
} // namespace

ModelAttr kvc::compiler::getModelAttr(MLIRContext *context,
                                      const kvc::ModelConfig &config,
                                      StringRef fingerprint) {
  return ModelAttr::get(
      context, config.name, config.numLayers, config.hiddenSize,
      config.numHeads, config.numKvHeads, config.headDim,
      config.intermediateSize, config.vocabSize, config.maxPositions,
      f64(config.ropeTheta), getElementType(context, config.dtype), fingerprint,
      f64(config.rmsNormEps));
}

kvc::ModelConfig kvc::compiler::getModelConfig(ModelAttr model) {
  kvc::ModelConfig config;
  config.name = model.getName().str();
  config.modelType = "llama";
  config.numLayers = model.getLayers();
  config.hiddenSize = model.getHidden();
  config.numHeads = model.getHeads();
  config.numKvHeads = model.getKvHeads();
  config.headDim = model.getHeadDim();
  config.intermediateSize = model.getFfn();
  config.vocabSize = model.getVocab();
  config.maxPositions = model.getMaxPositions();
  config.ropeTheta = f64(model.getRopeTheta());
  config.rmsNormEps = f64(model.getRmsNormEps());
  Type dtype = model.getDtype();
  config.dtype = dtype.isBF16()  ? kvc::DType::BF16
                 : dtype.isF16() ? kvc::DType::F16
                                 : kvc::DType::F32;
  return config;
}

TargetAttr kvc::compiler::getTargetAttr(MLIRContext *context,
                                        const kvc::TargetDesc &target) {
  const kvc::ComputeDesc &c = target.compute;
  auto compute =
      ComputeAttr::get(context,
                       symbolize<ComputeKind>(symbolizeComputeKind,
                                              kvc::computeKindName(c.kind)),
                       c.name, f64(c.denseTflops), f64(c.memGBs), f64(c.memGiB),
                       f64(c.restoreShare), f64(c.gemmPeakFraction),
                       f64(c.gemmHalfTokens), f64(c.attentionTflops), c.chip);
  auto host =
      HostAttr::get(context, target.host.cores, f64(target.host.dramGiB),
                    f64(target.host.nicGBs), f64(target.host.handoffUs),
                    f64(target.host.checkGBs), f64(target.host.readCheckGBs));
  auto link = LinkAttr::get(context, f64(target.link.h2dGBs),
                            f64(target.link.d2hGBs),
                            f64(target.link.latencyUs));
  SmallVector<Attribute> tiers, codecs;
  for (const kvc::TierDesc &t : target.tiers)
    tiers.push_back(TierAttr::get(
        context, t.name,
        symbolize<TierKind>(symbolizeTierKind, kvc::tierKindName(t.kind)),
        f64(t.readGBs), f64(t.writeGBs), f64(t.latencyUs), t.lanes,
        f64(t.throttleGBs)));
  for (const kvc::CodecRateDesc &r : target.codecs)
    codecs.push_back(CodecRateAttr::get(
        context, fromVocabulary(r.stage),
        r.on ? symbolize<CodecData>(symbolizeCodecData,
                                    kvc::codecDataName(*r.on))
             : CodecData::any,
        f64(r.encodeGBs), f64(r.decodeGBs)));
  return TargetAttr::get(context, target.name, compute, host, link,
                         ArrayAttr::get(context, tiers),
                         ArrayAttr::get(context, codecs));
}

kvc::TargetDesc kvc::compiler::getTargetDesc(TargetAttr target) {
  kvc::TargetDesc desc;
  desc.name = target.getName().str();
  ComputeAttr c = target.getCompute();
  desc.compute.kind =
      fromName(kvc::computeKindName, 2, stringifyComputeKind(c.getKind()));
  desc.compute.name = c.getName().str();
  desc.compute.denseTflops = f64(c.getDenseTflops());
  desc.compute.memGBs = f64(c.getMemGbs());
  desc.compute.memGiB = f64(c.getMemGib());
  desc.compute.restoreShare = f64(c.getRestoreShare());
  desc.compute.gemmPeakFraction = f64(c.getGemmPeakFraction());
  desc.compute.gemmHalfTokens = f64(c.getGemmHalfTokens());
  desc.compute.attentionTflops = f64(c.getAttentionTflops());
  desc.compute.chip = c.getChip().str();
  HostAttr h = target.getHost();
  desc.host = {h.getCores(),         f64(h.getDramGib()),
               f64(h.getNicGbs()),   f64(h.getHandoffUs()),
               f64(h.getCheckGbs()), f64(h.getReadCheckGbs())};
  LinkAttr l = target.getLink();
  desc.link = {f64(l.getH2dGbs()), f64(l.getD2hGbs()), f64(l.getLatencyUs())};
  for (Attribute attr : target.getTiers()) {
    auto t = cast<TierAttr>(attr);
    desc.tiers.push_back(
        {t.getName().str(),
         fromName(kvc::tierKindName, 3, stringifyTierKind(t.getKind())),
         f64(t.getReadGbs()), f64(t.getWriteGbs()), f64(t.getLatencyUs()),
         t.getLanes(), f64(t.getThrottleGbs())});
  }
  for (Attribute attr : target.getCodecs()) {
    auto r = cast<CodecRateAttr>(attr);
    std::optional<kvc::CodecSpec::Quant> on;
    if (r.getOn() != CodecData::any)
      on = r.getOn() == CodecData::raw
               ? kvc::CodecSpec::Quant::None
               : fromStage(kvc::parseQuant, stringifyCodecData(r.getOn()));
    desc.codecs.push_back({toVocabulary(r.getStage()), on,
                           f64(r.getEncodeGbs()), f64(r.getDecodeGbs())});
  }
  return desc;
}

CodecAttr kvc::compiler::getCodecAttr(MLIRContext *context,
                                      const kvc::CodecSpec &codec) {
  using S = kvc::CodecSpec;
  return CodecAttr::getOrRaw(
      context,
      symbolize<Transform>(symbolizeTransform,
                           kvc::transformName(codec.transform)),
      symbolize<Quant>(symbolizeQuant, kvc::quantName(codec.quant)),
      codec.keyAxis == S::Axis::Token ? QuantAxis::token : QuantAxis::channel,
      codec.valueAxis == S::Axis::Token ? QuantAxis::token : QuantAxis::channel,
      codec.group,
      symbolize<Lossless>(symbolizeLossless,
                          kvc::losslessName(codec.lossless)));
}

kvc::CodecSpec kvc::compiler::getCodecSpec(CodecAttr codec) {
  kvc::CodecSpec spec;
  if (!codec)
    return spec;
  using S = kvc::CodecSpec;
  spec.transform =
      fromStage(kvc::parseTransform, stringifyTransform(codec.getTransform()));
  spec.quant = fromStage(kvc::parseQuant, stringifyQuant(codec.getQuant()));
  spec.keyAxis = codec.getKeyAxis() == QuantAxis::token ? S::Axis::Token
                                                        : S::Axis::Channel;
  spec.valueAxis = codec.getValueAxis() == QuantAxis::token
                       ? S::Axis::Token
                       : S::Axis::Channel;
  spec.group = codec.getGroup();
  spec.lossless =
      fromStage(kvc::parseLossless, stringifyLossless(codec.getLossless()));
  return spec;
}
