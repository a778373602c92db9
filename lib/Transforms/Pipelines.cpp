//===- Pipelines.cpp - kvc pass pipelines ---------------------------------===//

#include "kvc/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::kvc;

void mlir::kvc::buildRestorePipeline(OpPassManager &pm,
                                     const RestorePipelineOptions &options) {
  KVCPlanPassOptions plan;
  plan.codecProfile = options.codecProfile;
  plan.chunkTokens = options.chunkTokens;
  plan.stagingMiB = options.stagingMiB;
  plan.report = options.report;
  plan.strategy = options.strategy;
  pm.addPass(createKVCPlanPass(plan));
  KVCExpandPassOptions expand{options.codecProfile, options.chunkTokens,
                              options.stagingMiB};
  pm.addPass(createKVCExpandPass(expand));
  pm.addPass(createKVCFusePass());
  KVCSchedulePassOptions schedule{options.codecProfile, options.chunkTokens,
                                  options.stagingMiB};
  pm.addPass(createKVCSchedulePass(schedule));
  KVCEstimatePassOptions estimate{options.codecProfile, options.chunkTokens,
                                  options.stagingMiB};
  pm.addPass(createKVCEstimatePass(estimate));
}

void mlir::kvc::registerKVCPipelines() {
  PassPipelineRegistration<RestorePipelineOptions>(
      "kvc-restore-pipeline",
      "Plans every kvc.restore jointly and lowers it to scheduled tasks with "
      "predicted times (kvc-plan, kvc-expand, kvc-fuse, kvc-schedule, "
      "kvc-estimate)",
      buildRestorePipeline);
}
