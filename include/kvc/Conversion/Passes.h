//===- Passes.h - kvc's kernel generation passes ----------------*- C++ -*-===//

#ifndef KVC_CONVERSION_PASSES_H
#define KVC_CONVERSION_PASSES_H

#include "kvc/Support/MLIR.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace kvc::compiler {

#define GEN_PASS_DECL
#include "kvc/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "kvc/Conversion/Passes.h.inc"

} // namespace kvc::compiler

#endif // KVC_CONVERSION_PASSES_H
