//===- EmitBundle.h - Plans as a runtime plan bundle ------------*- C++ -*-===//
//
// The writer behind kvc-emit-bundle, for hosts that compile in-process
// (kvc/Transforms/CompileRestore.h): the module's scheduled plans as a plan
// bundle (docs/plan-bundle.md), the one format the runtime reads.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_EMITBUNDLE_H
#define KVC_TRANSFORMS_EMITBUNDLE_H

#include "kvc/Support/MLIR.h"

#include "mlir/IR/BuiltinOps.h"

namespace kvc::compiler {

/// Writes every `kvc.plan` of `module` as one bundle; fails, with a
/// diagnostic and before writing anything, when a plan is not scheduled.
LogicalResult writePlanBundle(ModuleOp module, raw_ostream &os);

} // namespace kvc::compiler

#endif // KVC_TRANSFORMS_EMITBUNDLE_H
