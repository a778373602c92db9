//===- LowerKernels.cpp - kvc-lower-kernels and the kernel pipelines ------===//
//
// kvc-lower-kernels gives each kvc.kernel of a generated kind (KernelGen.h)
// its function, built by buildKernel (KernelEmitter.cpp: the loop nest and
// restore items; KernelSaveEmitter.cpp: save items and the RMSNorm
// prologue; KernelSpec.cpp: the constants a kernel is specialized on). The
// pipelines here lower those functions to PTX (map parallel loops, outline
// into gpu kernels, the target's data layout, NVVM, gpu-module-to-binary) or
// to LLVM for the host.
//
//===----------------------------------------------------------------------===//

#include "kvc/Conversion/KernelGen.h"
#include "kvc/Conversion/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/SCFToGPU/SCFToGPUPass.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Transforms/Passes.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCLOWERKERNELSPASS
#include "kvc/Conversion/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

//===----------------------------------------------------------------------===//
// Pipelines
//===----------------------------------------------------------------------===//

void kvc::compiler::buildKernelsToPTXPipeline(OpPassManager &pm,
                                              StringRef chip) {
  pm.addNestedPass<func::FuncOp>(createGpuMapParallelLoopsPass());
  pm.addNestedPass<func::FuncOp>(createParallelLoopToGpuPass());
  pm.addNestedPass<func::FuncOp>(createLowerAffinePass());
  // Constants move into the launch, so the kernel's parameters are the
  // function's arguments alone (bundleKernelArgNames(), in use order).
  pm.addPass(createGpuLauchSinkIndexComputationsPass());
  pm.addPass(createGpuKernelOutliningPass());
  GpuNVVMAttachTargetOptions target;
  target.chip = chip.str();
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));
  OpPassManager &gpu = pm.nest<gpu::GPUModuleOp>();
  gpu.addPass(createKVCGpuDataLayoutPass());
  gpu.addPass(createConvertSCFToCFPass());
  gpu.addPass(createConvertVectorToLLVMPass());
  gpu.addPass(createConvertGpuOpsToNVVMOps());
  gpu.addPass(createCanonicalizerPass());
  gpu.addPass(createCSEPass());
  gpu.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void kvc::compiler::buildKernelsToLLVMPipeline(OpPassManager &pm) {
  pm.addPass(createConvertSCFToCFPass());
  pm.addPass(createConvertVectorToLLVMPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void kvc::compiler::registerKernelDialects(DialectRegistry &registry) {
  registry.insert<KVCDialect, arith::ArithDialect, cf::ControlFlowDialect,
                  func::FuncDialect, gpu::GPUDialect, LLVM::LLVMDialect,
                  math::MathDialect, memref::MemRefDialect, NVVM::NVVMDialect,
                  scf::SCFDialect, vector::VectorDialect>();
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerBuiltinDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
}

//===----------------------------------------------------------------------===//
// kvc-lower-kernels
//===----------------------------------------------------------------------===//

namespace {

struct KVCLowerKernelsPass
    : public kvc::compiler::impl::KVCLowerKernelsPassBase<KVCLowerKernelsPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto model = module->getAttrOfType<ModelAttr>(KVCDialect::kModelAttrName);
    SymbolTable symbols(module);
    OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
    // Kernels without a generated form, by name and reason: the first, and
    // how many.
    struct Ungenerated {
      KernelOp first;
      std::string why;
      int64_t count;
    };
    SmallVector<Ungenerated> ungenerated;
    WalkResult result = module.walk([&](KernelOp kernel) {
      // Other chains stay for the runtime to run step by step.
      if (!KernelSpec::kindOf(kernel))
        return WalkResult::advance();
      FailureOr<KernelSpec> spec =
          KernelSpec::get(kernel, model,
                          {blockSize, threads, host, groupLanes, heldTokens,
                           restoreItems, scanLoads});
      if (failed(spec))
        return WalkResult::interrupt();
      if (std::string why = spec->unsupported(); !why.empty()) {
        auto same = llvm::find_if(ungenerated, [&](Ungenerated &u) {
          return u.first.getKernelName() == kernel.getKernelName() &&
                 u.why == why;
        });
        if (same == ungenerated.end())
          ungenerated.push_back({kernel, why, 1});
        else
          ++same->count;
        return WalkResult::advance();
      }
      auto generate = [&](const KernelSpec &generated) {
        std::string name = generated.symbolName();
        if (!symbols.lookup(name)) {
          func::FuncOp func = buildKernel(builder, kernel.getLoc(), generated);
          func->setAttr(KVCDialect::kEntryAttrName,
                        generated.toAttr(builder.getContext()));
          symbols.insert(func);
        }
        return FlatSymbolRefAttr::get(builder.getContext(), name);
      };
      kernel->setAttr(KVCDialect::kEntryAttrName, generate(*spec));
      if (spec->kind == KernelKind::RopeScatter) {
        // The projection's RMSNorm, before the runtime's GEMM.
        FailureOr<KernelSpec> norm = KernelSpec::prologue(kernel, model, *spec);
        if (failed(norm))
          return WalkResult::interrupt();
        kernel->setAttr(KVCDialect::kPrologueAttrName, generate(*norm));
      }
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      return signalPassFailure();
    // One warning per kind of kernel left to the runtime, on its first.
    for (Ungenerated &u : ungenerated) {
      InFlightDiagnostic warning = u.first.emitWarning("kernel \"")
                                   << u.first.getKernelName() << "\"";
      if (u.count > 1)
        warning << " (and " << u.count - 1 << " more like it)";
      warning << " has no generated form, so the runtime runs its steps: "
              << u.why;
    }
  }
};

} // namespace
