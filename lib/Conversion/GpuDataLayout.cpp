//===- GpuDataLayout.cpp - kvc-gpu-data-layout ----------------------------===//
//
// gpu-module-to-binary translates a gpu.module to LLVM IR under LLVM's
// default data layout and only then sets the target's, so the alignment
// the translation gives an unaligned load is the default's (an i64: 4
// bytes) and NVPTX splits it. Giving the module its target machine's layout
// first makes the translation align loads as the target does.
//
//===----------------------------------------------------------------------===//

#include "kvc/Conversion/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Target/LLVM/NVVM/Utils.h"

#include "llvm/IR/DataLayout.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Target/TargetMachine.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCGPUDATALAYOUTPASS
#include "kvc/Conversion/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;

namespace {

struct KVCGpuDataLayoutPass
    : public kvc::compiler::impl::KVCGpuDataLayoutPassBase<
          KVCGpuDataLayoutPass> {
  void runOnOperation() override {
    gpu::GPUModuleOp module = getOperation();
    NVVM::NVVMTargetAttr target;
    if (ArrayAttr targets = module.getTargetsAttr())
      for (Attribute attr : targets)
        if ((target = dyn_cast<NVVM::NVVMTargetAttr>(attr)))
          break;
    if (!target) {
      module.emitError("has no #nvvm.target to take a data layout from (run "
                       "nvvm-attach-target first)");
      return signalPassFailure();
    }
    NVVM::SerializeGPUModuleBase::init();
    std::string error;
    const llvm::Target *llvmTarget =
        llvm::TargetRegistry::lookupTarget(target.getTriple().str(), error);
    if (!llvmTarget) {
      module.emitError() << "cannot create the target " << target.getTriple()
                         << ": " << error;
      return signalPassFailure();
    }
    // Asked for a chip it does not know, NVPTX only warns, and the runtime
    // refuses the PTX later: refuse it here.
    std::unique_ptr<llvm::MCSubtargetInfo> subtarget(
        llvmTarget->createMCSubtargetInfo(target.getTriple(), "", ""));
    if (!subtarget || !subtarget->isCPUStringValid(target.getChip())) {
      module.emitError() << "targets chip \"" << target.getChip()
                         << "\", which NVPTX does not know (sm_90: H100, "
                            "H200)";
      return signalPassFailure();
    }
    std::unique_ptr<llvm::TargetMachine> machine(
        llvmTarget->createTargetMachine(target.getTriple(), target.getChip(),
                                        target.getFeatures(), {}, {}));
    if (!machine) {
      module.emitError() << "cannot create a target machine for "
                         << target.getTriple() << " " << target.getChip();
      return signalPassFailure();
    }
    module->setAttr(
        LLVM::LLVMDialect::getDataLayoutAttrName(),
        StringAttr::get(&getContext(),
                        machine->createDataLayout().getStringRepresentation()));
  }
};

} // namespace
