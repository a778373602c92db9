//===- Passes.h - kvc passes ------------------------------------*- C++ -*-===//

#ifndef KVC_TRANSFORMS_PASSES_H
#define KVC_TRANSFORMS_PASSES_H

#include "kvc/Support/MLIR.h"

#include "kvc/Planning/Planner.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

namespace kvc::compiler {

#define GEN_PASS_DECL
#include "kvc/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "kvc/Transforms/Passes.h.inc"

/// Options of kvc-restore-pipeline, passed to each of its passes: the
/// planner's options (planning::PlanOptions) for one strategy, as pass
/// options, plus the pass's own (report, allow-slo-miss).
struct RestorePipelineOptions
    : public PassPipelineOptions<RestorePipelineOptions> {
  /// These as the planner's options (their one strategy).
  kvc::planning::PlanOptions planOptions() const;
  /// Sets these from `options`, planning `strategy`.
  void wrap(const kvc::planning::PlanOptions &options,
            kvc::planning::Strategy strategy);

  PassOptions::Option<std::string> codecProfile{
      *this, "codec-profile",
      llvm::cl::desc("Codec profile JSON; empty for the built-in estimate")};
  PassOptions::Option<int64_t> chunkTokens{
      *this, "chunk-tokens",
      llvm::cl::desc("Tokens per chunk; 0 chooses from the target"),
      llvm::cl::init(0)};
  PassOptions::Option<int64_t> stagingMiB{
      *this, "staging-mib", llvm::cl::desc("Host staging memory, MiB"),
      llvm::cl::init(256)};
  PassOptions::Option<bool> layerWise{
      *this, "layer-wise",
      llvm::cl::desc("Issue loads layer by layer, as deep as the stored "
                     "objects, so the first layers complete early"),
      llvm::cl::init(false)};
  PassOptions::Option<int> candidates{
      *this, "candidates",
      llvm::cl::desc("Analytic candidates the planner's search times with "
                     "the simulator"),
      llvm::cl::init(4)};
  PassOptions::Option<bool> report{
      *this, "report",
      llvm::cl::desc("Print the baselines beside the chosen plan"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> strategy{
      *this, "strategy",
      llvm::cl::desc("joint, or the baseline to plan: compute, kv, hidden, "
                     "cake or hcache"),
      llvm::cl::init("joint")};
  PassOptions::Option<bool> allowSloMiss{
      *this, "allow-slo-miss",
      llvm::cl::desc("Keep the fastest plan, with a warning, when it misses "
                     "the request's slo_ms (otherwise an error)"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> gpuChip{
      *this, "gpu-chip",
      llvm::cl::desc("Generate the fused kernels as PTX for this GPU "
                     "architecture (sm_90: H100, H200); empty: the target's "
                     "chip, if any; none: no kernels"),
      llvm::cl::init("")};
};

/// kvc-plan, kvc-expand, kvc-fuse, kvc-schedule, kvc-estimate and
/// kvc-generate-kernels (for the target's GPU chip or gpuChip).
void buildRestorePipeline(OpPassManager &pm,
                          const RestorePipelineOptions &options);

/// Options of kvc-save-pipeline: the planner's options that apply to saves
/// (saves keep their layout's chunks and plan no strategy).
struct SavePipelineOptions : public PassPipelineOptions<SavePipelineOptions> {
  kvc::planning::PlanOptions planOptions() const;

  PassOptions::Option<std::string> codecProfile{
      *this, "codec-profile",
      llvm::cl::desc("Codec profile JSON; empty for the built-in estimate")};
  PassOptions::Option<int64_t> stagingMiB{
      *this, "staging-mib", llvm::cl::desc("Host staging memory, MiB"),
      llvm::cl::init(256)};
  PassOptions::Option<bool> layerWise{
      *this, "layer-wise",
      llvm::cl::desc("Issue the objects layer group by layer group, as a "
                     "prefill of the whole request in one step completes "
                     "them (default: chunk by chunk)"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> gpuChip{
      *this, "gpu-chip",
      llvm::cl::desc("Generate the save kernels as PTX for this GPU "
                     "architecture (sm_90: H100, H200); empty: the target's "
                     "chip, if any; none: no kernels"),
      llvm::cl::init("")};
};

/// kvc-select-codec, kvc-expand, kvc-fuse, kvc-schedule, kvc-estimate and
/// kvc-generate-kernels (for the target's GPU chip or gpuChip).
void buildSavePipeline(OpPassManager &pm, const SavePipelineOptions &options);

/// Registers kvc-restore-pipeline and kvc-save-pipeline.
void registerKVCPipelines();

} // namespace kvc::compiler

#endif // KVC_TRANSFORMS_PASSES_H
