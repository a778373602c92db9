//===- CompileRestore.h - The compiler as a call --------------*- C++ -*-===//
//
// Plans a restore in-process, for hosts that plan at request time (kvc-run
// restore and compare --strategy): the request becomes one `kvc.restore` per
// strategy, kvc-restore-pipeline plans and schedules each for the model and
// target, and the result comes back as the plan bundle the executor runs,
// exactly what `kvc-opt --kvc-restore-pipeline --kvc-emit-bundle` writes.
// The interface names no MLIR type, so a caller's translation unit stays
// free of MLIR headers; linking it brings in the compiler (MLIR, LLVM).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_COMPILERESTORE_H
#define KVC_TRANSFORMS_COMPILERESTORE_H

#include "kvc/Planning/Plan.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Desc/TargetDesc.h"
#include "kvc/Runtime/Exec/PlanBundle.h"

#include <string>
#include <vector>

namespace kvc {

struct CompileRestoreOptions {
  /// One plan per entry, named after it: "joint" or a baseline that
  /// kvc-plan{strategy} accepts (compute, kv, hidden, cake, hcache).
  std::vector<std::string> strategies = {"joint"};
  /// As kvc-restore-pipeline's options.
  int64_t chunkTokens = 0;
  int64_t stagingMiB = 256;
  bool layerWise = false;
  std::string codecProfile;
  /// As its gpu-chip: each plan's fused kernels generated as PTX for this
  /// GPU architecture (sm_90: H100, H200) into the bundle's kernel table,
  /// which plans of several strategies share; empty: the target's chip, if
  /// it names one; "none": no kernels.
  std::string gpuChip;
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

} // namespace kvc

#endif // KVC_TRANSFORMS_COMPILERESTORE_H
