//===- Pipelines.cpp - kvc pass pipelines ---------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Conversion/KernelGen.h"
#include "kvc/Conversion/Passes.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace kvc::compiler;

/// What both pipelines run once their plans are chosen: per-chunk dataflow,
/// fused kernels, tasks with predicted times and, for the target's GPU chip
/// or `gpuChip` ("none": no kernels), the kernels as PTX.
void kvc::compiler::buildLoweringPipeline(
    OpPassManager &pm, const kvc::planning::PlanOptions &options,
    std::shared_ptr<const PlanningContext> given) {
  pm.addPass(
      createKVCExpandPass(toPassOptions<KVCExpandPassOptions>(options), given));
  pm.addPass(createKVCFusePass());
  pm.addPass(createKVCSchedulePass(
      toPassOptions<KVCSchedulePassOptions>(options), given));
  pm.addPass(createKVCEstimatePass(
      toPassOptions<KVCEstimatePassOptions>(options), given));
  // No chip: the target's, which the module says. "none" leaves the module
  // as it is; the pass is not added, nor the GPU dialects it loads.
  if (options.gpuChip == "none")
    return;
  KVCGenerateKernelsPassOptions kernels;
  kernels.chip = options.gpuChip;
  pm.addPass(createKVCGenerateKernelsPass(kernels));
}

kvc::planning::PlanOptions RestorePipelineOptions::planOptions() const {
  kvc::planning::PlanOptions options;
  // kvc-plan checks the name; an unknown one leaves the list empty here.
  options.strategies.clear();
  if (std::optional<kvc::planning::Strategy> each =
          kvc::planning::parseStrategy(strategy))
    options.strategies.push_back(*each);
  options.chunkTokens = chunkTokens;
  options.stagingMiB = stagingMiB;
  options.layerWise = layerWise;
  options.candidates = candidates;
  options.codecProfile = codecProfile;
  options.gpuChip = gpuChip;
  return options;
}

void RestorePipelineOptions::wrap(const kvc::planning::PlanOptions &options,
                                  kvc::planning::Strategy plan) {
  strategy = kvc::planning::strategyName(plan);
  chunkTokens = options.chunkTokens;
  stagingMiB = options.stagingMiB;
  layerWise = options.layerWise;
  candidates = options.candidates;
  codecProfile = options.codecProfile;
  gpuChip = options.gpuChip;
}

kvc::planning::PlanOptions SavePipelineOptions::planOptions() const {
  // Saves keep their layout's chunks: no chunk-tokens choice to pass.
  kvc::planning::PlanOptions options;
  options.stagingMiB = stagingMiB;
  options.layerWise = layerWise;
  options.codecProfile = codecProfile;
  options.gpuChip = gpuChip;
  return options;
}

void kvc::compiler::buildRestorePipeline(
    OpPassManager &pm, const RestorePipelineOptions &options) {
  const kvc::planning::PlanOptions planning = options.planOptions();
  auto plan = toPassOptions<KVCPlanPassOptions>(planning);
  plan.report = options.report;
  plan.strategy = options.strategy;
  plan.allowSloMiss = options.allowSloMiss;
  pm.addPass(createKVCPlanPass(plan));
  buildLoweringPipeline(pm, planning);
}

void kvc::compiler::buildSavePipeline(OpPassManager &pm,
                                      const SavePipelineOptions &options) {
  const kvc::planning::PlanOptions planning = options.planOptions();
  pm.addPass(createKVCSelectCodecPass(
      toPassOptions<KVCSelectCodecPassOptions>(planning)));
  buildLoweringPipeline(pm, planning);
}

namespace {
struct KernelsToPTXOptions : public PassPipelineOptions<KernelsToPTXOptions> {
  PassOptions::Option<std::string> chip{
      *this, "chip", llvm::cl::desc("The GPU architecture (sm_90: H100, H200)"),
      llvm::cl::init("sm_90")};
};
} // namespace

void kvc::compiler::registerKVCPipelines() {
  PassPipelineRegistration<KernelsToPTXOptions>(
      "kvc-kernels-to-ptx",
      "Lowers kvc-lower-kernels' functions to PTX: maps their parallel loops "
      "to blocks and threads, outlines gpu.modules, converts them to NVVM and "
      "serializes each into a gpu.binary holding PTX text",
      [](OpPassManager &pm, const KernelsToPTXOptions &options) {
        buildKernelsToPTXPipeline(pm, options.chip);
      });
  PassPipelineRegistration<>(
      "kvc-kernels-to-llvm",
      "Lowers kvc-lower-kernels' functions for the host: their parallel "
      "loops become sequential loops in the LLVM dialect (what the unit tests "
      "run with MLIR's ExecutionEngine)",
      buildKernelsToLLVMPipeline);
  PassPipelineRegistration<RestorePipelineOptions>(
      "kvc-restore-pipeline",
      "Plans every kvc.restore jointly and lowers it to scheduled tasks with "
      "predicted times (kvc-plan, kvc-expand, kvc-fuse, kvc-schedule, "
      "kvc-estimate), and its fused kernels to PTX for the target's GPU chip "
      "or gpu-chip",
      buildRestorePipeline);
  PassPipelineRegistration<SavePipelineOptions>(
      "kvc-save-pipeline",
      "Chooses every kvc.save's codec and lowers it to scheduled tasks with "
      "predicted times (kvc-select-codec, kvc-expand, kvc-fuse, "
      "kvc-schedule, kvc-estimate), and its save kernels to PTX for the "
      "target's GPU chip or gpu-chip",
      buildSavePipeline);
}
