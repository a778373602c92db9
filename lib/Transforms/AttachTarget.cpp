//===- AttachTarget.cpp - kvc-attach-target -------------------------------===//
//
// Attaches a target machine's description to the module as kvc.target.
//
//===----------------------------------------------------------------------===//

#include "AttachDescription.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCATTACHTARGETPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

namespace {

struct KVCAttachTargetPass
    : public AttachDescriptionPass<
          KVCAttachTargetPass, kvc::compiler::impl::KVCAttachTargetPassBase> {
  using AttachDescriptionPass::AttachDescriptionPass;
  static constexpr StringLiteral kAttrName = KVCDialect::kTargetAttrName;
  static constexpr auto load = kvc::loadTargetDesc;
  static kvc::StatusOr<Attribute>
  convert(MLIRContext *context, const kvc::TargetDesc &target, StringRef) {
    return Attribute(getTargetAttr(context, target));
  }
};

} // namespace
