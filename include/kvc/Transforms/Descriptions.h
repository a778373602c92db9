//===- Descriptions.h - Descriptions as attributes and back -----*- C++ -*-===//
//
// Converts between the runtime's parsed descriptions (kvc/Runtime/Desc), which
// the planning library consumes, and the dialect's attributes, so that
// config.json and the target schema have one parser each and the planner one
// input format.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_DESCRIPTIONS_H
#define KVC_TRANSFORMS_DESCRIPTIONS_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCAttrs.h"
#include "kvc/Dialect/KVC/IR/KVCVocabulary.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Desc/TargetDesc.h"

namespace kvc::compiler {

/// Returns the #kvc.model of `config` (already validated by its parser),
/// with the weights' `fingerprint` when known.
ModelAttr getModelAttr(MLIRContext *context, const kvc::ModelConfig &config,
                       StringRef fingerprint = "");
/// Returns the architecture a #kvc.model describes.
kvc::ModelConfig getModelConfig(ModelAttr model);

/// Returns the #kvc.target of `target` (already validated by its parser).
TargetAttr getTargetAttr(MLIRContext *context, const kvc::TargetDesc &target);
/// Returns the machine a #kvc.target describes.
kvc::TargetDesc getTargetDesc(TargetAttr target);

/// Codecs: a null CodecAttr is raw data.
CodecAttr getCodecAttr(MLIRContext *context, const kvc::CodecSpec &codec);
kvc::CodecSpec getCodecSpec(CodecAttr codec);

} // namespace kvc::compiler

#endif // KVC_TRANSFORMS_DESCRIPTIONS_H
