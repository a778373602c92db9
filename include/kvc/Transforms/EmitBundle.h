//===- EmitBundle.h - Plans as a runtime plan bundle ------------*- C++ -*-===//
//
// The builder and writer behind kvc-emit-bundle: the module's scheduled plans
// as the runtime's plan bundle, built in memory (what an in-process compile,
// kvc/Transforms/CompileRestore.h, hands the runtime) and written as JSON
// (docs/plan-bundle.md), the one format the runtime reads from files.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_EMITBUNDLE_H
#define KVC_TRANSFORMS_EMITBUNDLE_H

#include "kvc/Support/MLIR.h"

#include "kvc/Runtime/Exec/PlanBundle.h"

#include "mlir/IR/BuiltinOps.h"

namespace kvc::compiler {

/// Every `kvc.plan` of `module` as one bundle, with the module's model
/// fingerprint and its generated kernels; fails, with a diagnostic, when a
/// plan is not scheduled or a kernel cannot be described.
FailureOr<kvc::PlanBundle> buildPlanBundle(ModuleOp module);

/// Writes `bundle` as the JSON parsePlanBundle reads.
void writePlanBundle(const kvc::PlanBundle &bundle, raw_ostream &os);

/// buildPlanBundle, then writePlanBundle: nothing written on failure.
LogicalResult writePlanBundle(ModuleOp module, raw_ostream &os);

} // namespace kvc::compiler

#endif // KVC_TRANSFORMS_EMITBUNDLE_H
