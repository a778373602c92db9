//===- CompilerHook.h - The compiler as a server's planner ------*- C++ -*-===//
//
// The PlanHook of a host that links the compiler (KVCTransforms: MLIR and
// LLVM): each plan compiled in-process by compileRestore with the hook's
// options. Header-only, so that KVCHost itself stays free of the compiler;
// a host without it passes bundles compiled ahead (bundleHook, Connector.h).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_COMPILERHOOK_H
#define KVC_HOST_COMPILERHOOK_H

#include "kvc/Host/Session.h"
#include "kvc/Transforms/CompileRestore.h"

#include <functional>

namespace kvc::host {

/// Compiles each request with compileRestore, or a plan chosen already with
/// compileChosen (named after its strategy); `warn` receives the
/// compiler's warnings (a fused kernel left to the runtime, and why).
inline PlanHook
compilerPlanHook(std::function<void(const std::string &)> warn = {}) {
  return [warn](const ModelCompute &model, const TargetDesc &target,
                const planning::Request &request, const PlanOptions &options,
                const PricedPlan *chosen) {
    CompileRestoreOptions compile;
    compile.plan = options;
    std::vector<std::string> warnings;
    compile.warnings = &warnings;
    StatusOr<PlanBundle> bundle =
        chosen
            ? compileChosen(model.config(), model.fingerprint(), chosen->cost,
                            request, planning::strategyName(chosen->strategy),
                            *chosen->evaluation, compile)
            : compileRestore(model.config(), model.fingerprint(), target,
                             request, compile);
    if (warn)
      for (const std::string &warning : warnings)
        warn(warning);
    return bundle;
  };
}

} // namespace kvc::host

#endif // KVC_HOST_COMPILERHOOK_H
