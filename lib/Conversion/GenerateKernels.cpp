//===- GenerateKernels.cpp - kvc-generate-kernels -------------------------===//
//
// Which chip a plan's kernels are generated for is known only once the
// target is attached, after the pipeline was built: the pass reads it then
// and runs the lowering to PTX as a dynamic pipeline.
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Conversion/KernelGen.h"
#include "kvc/Conversion/Passes.h"

#include "mlir/Pass/PassManager.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCGENERATEKERNELSPASS
#include "kvc/Conversion/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

namespace {

/// kvc-lower-kernels and kvc-kernels-to-ptx for `chip`.
void buildGeneration(OpPassManager &pm, StringRef chip) {
  pm.addPass(createKVCLowerKernelsPass());
  buildKernelsToPTXPipeline(pm, chip);
}

struct KVCGenerateKernelsPass
    : public kvc::compiler::impl::KVCGenerateKernelsPassBase<
          KVCGenerateKernelsPass> {
  using KVCGenerateKernelsPassBase::KVCGenerateKernelsPassBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    OpPassManager pm(ModuleOp::getOperationName());
    buildGeneration(pm, "sm_90");
    pm.getDependentDialects(registry);
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::string target = chip;
    if (target.empty())
      if (TargetAttr attr = lookupTarget(module))
        target = attr.getCompute().getChip().str();
    if (target.empty() || target == "none")
      return;
    OpPassManager pm(ModuleOp::getOperationName());
    buildGeneration(pm, target);
    if (failed(runPipeline(pm, module)))
      signalPassFailure();
  }
};

} // namespace
