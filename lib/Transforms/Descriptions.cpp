//===- Descriptions.cpp - Model and target descriptions as attributes -----===//

#include "kvc/Transforms/Descriptions.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::kvc;

namespace {
/// The schema's enum names are the IR's keywords; map one to the other.
template <typename E>
E symbolize(std::optional<E> (*symbolizeFn)(StringRef), const char *name) {
  std::optional<E> value = symbolizeFn(name);
  assert(value && "schema and dialect enums out of sync");
  return *value;
}

Type getElementType(MLIRContext *context, ::kvc::DType dtype) {
  Builder b(context);
  switch (dtype) {
  case ::kvc::DType::BF16:
    return b.getBF16Type();
  case ::kvc::DType::F16:
    return b.getF16Type();
  case ::kvc::DType::F32:
    return b.getF32Type();
  }
  llvm_unreachable("unknown dtype");
}

llvm::APFloat f64(double value) { return llvm::APFloat(value); }
} // namespace

ModelAttr mlir::kvc::getModelAttr(MLIRContext *context,
                                  const ::kvc::ModelConfig &config) {
  return ModelAttr::get(context, config.name, config.numLayers,
                        config.hiddenSize, config.numHeads, config.numKvHeads,
                        config.headDim, config.intermediateSize,
                        config.vocabSize, config.maxPositions,
                        f64(config.ropeTheta),
                        getElementType(context, config.dtype),
                        /*fingerprint=*/"");
}

TargetAttr mlir::kvc::getTargetAttr(MLIRContext *context,
                                    const ::kvc::TargetDesc &target) {
  const ::kvc::ComputeDesc &c = target.compute;
  auto compute = ComputeAttr::get(
      context,
      symbolize<ComputeKind>(symbolizeComputeKind,
                             ::kvc::computeKindName(c.kind)),
      c.name, f64(c.denseTflops), f64(c.memGBs), f64(c.memGiB),
      f64(c.restoreShare));
  auto host = HostAttr::get(context, target.host.cores,
                            f64(target.host.dramGiB), f64(target.host.nicGBs));
  auto link = LinkAttr::get(context, f64(target.link.h2dGBs),
                            f64(target.link.d2hGBs),
                            f64(target.link.latencyUs));
  SmallVector<Attribute> tiers, codecs;
  for (const ::kvc::TierDesc &t : target.tiers)
    tiers.push_back(TierAttr::get(
        context, t.name,
        symbolize<TierKind>(symbolizeTierKind, ::kvc::tierKindName(t.kind)),
        f64(t.readGBs), f64(t.writeGBs), f64(t.latencyUs), t.lanes));
  for (const ::kvc::CodecRateDesc &r : target.codecs)
    codecs.push_back(CodecRateAttr::get(
        context,
        symbolize<CodecStage>(symbolizeCodecStage,
                              ::kvc::codecStageName(r.stage)),
        f64(r.encodeGBs), f64(r.decodeGBs)));
  return TargetAttr::get(context, target.name, compute, host, link,
                         ArrayAttr::get(context, tiers),
                         ArrayAttr::get(context, codecs));
}
