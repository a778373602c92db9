//===- Passes.h - kvc's kernel generation passes ----------------*- C++ -*-===//

#ifndef KVC_CONVERSION_PASSES_H
#define KVC_CONVERSION_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::kvc {

#define GEN_PASS_DECL
#include "kvc/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "kvc/Conversion/Passes.h.inc"

} // namespace mlir::kvc

#endif // KVC_CONVERSION_PASSES_H
