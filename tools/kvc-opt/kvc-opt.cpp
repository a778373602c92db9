//===- kvc-opt.cpp - The kvc optimizer driver -----------------------------===//
//
// mlir-opt for kvc: the kvc dialect and passes, plus only the upstream
// dialects and passes that kvc's GPU lowering needs (gpu -> NVVM -> PTX).
//
//===----------------------------------------------------------------------===//

#include "kvc/Conversion/KernelGen.h"
#include "kvc/Conversion/Passes.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/SCFToGPU/SCFToGPUPass.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/Support/CommandLine.h"

#include <algorithm>
#include <vector>

int main(int argc, char **argv) {
  // LLVM's backends register their options when the library loads
  // (--aarch64-..., --amdgpu-..., hundreds of them); none concerns kvc, so
  // --help lists only the options MlirOptMain registers from here on
  // (--help-hidden still shows all).
  for (auto &option : llvm::cl::getRegisteredOptions())
    option.second->setHiddenFlag(llvm::cl::Hidden);

  mlir::DialectRegistry registry;
  kvc::compiler::registerKernelDialects(registry);

  kvc::compiler::registerKVCPasses();
  kvc::compiler::registerKVCConversionPasses();
  kvc::compiler::registerKVCPipelines();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerGPUPasses();
  // The upstream passes of kvc's kernel pipelines, to run stage by stage.
  mlir::registerPass([] { return mlir::createConvertGpuOpsToNVVMOps(); });
  mlir::registerPass([] { return mlir::createConvertSCFToCFPass(); });
  mlir::registerPass([] { return mlir::createReconcileUnrealizedCastsPass(); });
  mlir::registerPass([] { return mlir::createParallelLoopToGpuPass(); });
  mlir::registerPass([] { return mlir::createLowerAffinePass(); });
  mlir::registerPass([] { return mlir::createConvertVectorToLLVMPass(); });

  // A diagnostic names its op by location; printing the op after it (MLIR's
  // default) dumps a whole module when the op is one. On request only.
  std::vector<char *> args(argv, argv + argc);
  static char quiet[] = "--mlir-print-op-on-diagnostic=false";
  if (std::none_of(args.begin(), args.end(), [](const char *arg) {
        return llvm::StringRef(arg).starts_with("--mlir-print-op-on-diagnostic");
      }))
    args.insert(args.begin() + 1, quiet);
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      int(args.size()), args.data(), "kvc optimizer driver\n", registry));
}
