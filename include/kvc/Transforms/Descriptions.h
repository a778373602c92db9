//===- Descriptions.h - Model and target descriptions as attributes -*- C++ -*-===//
//
// Converts the runtime's parsed descriptions (kvc/Runtime/Desc) into the
// dialect's #kvc.model and #kvc.target, so that config.json and the target
// schema have one parser each, shared by compiler and runtime.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_DESCRIPTIONS_H
#define KVC_TRANSFORMS_DESCRIPTIONS_H

#include "kvc/Dialect/KVC/IR/KVCAttrs.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Desc/TargetDesc.h"

namespace mlir::kvc {

/// Returns the #kvc.model of `config` (already validated by its parser).
ModelAttr getModelAttr(MLIRContext *context, const ::kvc::ModelConfig &config);

/// Returns the #kvc.target of `target` (already validated by its parser).
TargetAttr getTargetAttr(MLIRContext *context,
                         const ::kvc::TargetDesc &target);

} // namespace mlir::kvc

#endif // KVC_TRANSFORMS_DESCRIPTIONS_H
