//===- CompileRestore.h - The compiler as a call --------------*- C++ -*-===//
//
// Plans a restore in-process, for hosts that plan at request time (kvc-run
// restore and compare --strategy): the request becomes one `kvc.restore` per
// strategy, kvc-restore-pipeline plans and schedules each for the model and
// target, and the result comes back as the plan bundle the executor runs,
// exactly what `kvc-opt --kvc-restore-pipeline --kvc-emit-bundle` writes.
// A host that priced the request with the planner already (the Connector's
// decide) compiles the plan it chose with compileChosen: lowered and
// scheduled on its cost model, searched for once.
// The interface names no MLIR type, so a caller's translation unit stays
// free of MLIR headers; linking it brings in the compiler (MLIR, LLVM).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_COMPILERESTORE_H
#define KVC_TRANSFORMS_COMPILERESTORE_H

#include "kvc/Planning/Plan.h"
#include "kvc/Planning/Planner.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Desc/TargetDesc.h"
#include "kvc/Runtime/Exec/PlanBundle.h"

#include <memory>
#include <string>
#include <vector>

namespace kvc {

struct CompileRestoreOptions {
  /// As kvc-restore-pipeline's options (which wrap them): one plan per
  /// strategy, named after it, whose kernels the bundle's table shares;
  /// no strategies: every one the request's sources allow.
  planning::PlanOptions plan;
  /// When set, receives the compiler's warnings: a fused kernel that has no
  /// generated form for this model or codec, whose steps the runtime runs.
  std::vector<std::string> *warnings = nullptr;
};

/// Compiles `request` for `model` (whose weights' fingerprint the bundle
/// records) on `target`. Errors carry the compiler's diagnostics.
StatusOr<PlanBundle> compileRestore(const ModelConfig &model,
                                    const std::string &fingerprint,
                                    const TargetDesc &target,
                                    const planning::Request &request,
                                    const CompileRestoreOptions &options);

/// Compiles `chosen`, the plan a planner over `cost` (the model's and the
/// target's) chose for `request`, as the bundle's one plan `name`: the
/// lowering of kvc-restore-pipeline after kvc-plan, on `cost` itself (no
/// search, no cost model or codec profile built again). `options.plan`
/// gives the chunking, staging, layer-wise loads and GPU chip `chosen` was
/// priced with; its strategies and codec profile are not read.
StatusOr<PlanBundle>
compileChosen(const ModelConfig &model, const std::string &fingerprint,
              std::shared_ptr<const planning::CostModel> cost,
              const planning::Request &request, const std::string &name,
              const planning::Evaluation &chosen,
              const CompileRestoreOptions &options);

} // namespace kvc

#endif // KVC_TRANSFORMS_COMPILERESTORE_H
