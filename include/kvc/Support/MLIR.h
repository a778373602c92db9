//===- MLIR.h - MLIR's names in the compiler's namespace --------*- C++ -*-===//
//
// The compiler (the kvc dialect, its passes and kernel generation) lives in
// kvc::compiler, beside the runtime's kvc:: it plans for, so that neither
// shadows the other. MLIR's names are imported into it, as CIRCT imports
// them into circt:: (circt/Support/LLVM.h), so compiler code reads as it
// would inside mlir::. Include it first in every compiler header.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_SUPPORT_MLIR_H
#define KVC_SUPPORT_MLIR_H

#include "kvc/Support/MLIR.h"

namespace mlir {}

namespace kvc::compiler {
using namespace ::mlir;
} // namespace kvc::compiler

#endif // KVC_SUPPORT_MLIR_H
