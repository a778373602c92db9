//===- Passes.h - kvc passes ------------------------------------*- C++ -*-===//

#ifndef KVC_TRANSFORMS_PASSES_H
#define KVC_TRANSFORMS_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::kvc {

#define GEN_PASS_DECL
#include "kvc/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "kvc/Transforms/Passes.h.inc"

} // namespace mlir::kvc

#endif // KVC_TRANSFORMS_PASSES_H
