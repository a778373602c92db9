//===- AttachDescriptions.cpp - kvc-import-model, kvc-attach-target -------===//
//
// Both passes read a description file through the runtime's parser, convert
// it to an attribute and attach it to the module.
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCATTACHTARGETPASS
#define GEN_PASS_DEF_KVCIMPORTMODELPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;

namespace {

/// The body of both passes: reads the file at the `path` option through
/// `DerivedT::load`, converts it with `DerivedT::convert` and attaches it to
/// the module as `DerivedT::kAttrName`.
template <typename DerivedT, template <typename> class GeneratedBaseT>
struct AttachDescriptionPass : public GeneratedBaseT<DerivedT> {
  using GeneratedBaseT<DerivedT>::GeneratedBaseT;

  /// Lets `--kvc-foo=PATH` stand for `--kvc-foo=path=PATH`.
  LogicalResult initializeOptions(
      StringRef options,
      function_ref<LogicalResult(const Twine &)> errorHandler) override {
    std::string withKey = options.str();
    if (!options.empty() && !options.contains('='))
      withKey = "path=" + withKey;
    return Pass::initializeOptions(withKey, errorHandler);
  }

  void runOnOperation() override {
    ModuleOp module = this->getOperation();
    StringRef arg = this->getArgument();
    if (this->path.empty()) {
      emitError(module.getLoc())
          << arg << " needs a path: --" << arg << "=FILE.json";
      return this->signalPassFailure();
    }
    auto desc = DerivedT::load(this->path);
    if (!desc.isOk()) {
      emitError(module.getLoc()) << desc.status().message();
      return this->signalPassFailure();
    }
    module->setAttr(DerivedT::kAttrName,
                    DerivedT::convert(module.getContext(), *desc));
  }
};

struct KVCImportModelPass
    : public AttachDescriptionPass<KVCImportModelPass,
                                   mlir::kvc::impl::KVCImportModelPassBase> {
  using AttachDescriptionPass::AttachDescriptionPass;
  static constexpr StringLiteral kAttrName = KVCDialect::kModelAttrName;
  static constexpr auto load = ::kvc::loadModelConfig;
  static ModelAttr convert(MLIRContext *context,
                           const ::kvc::ModelConfig &config) {
    return getModelAttr(context, config);
  }
};

struct KVCAttachTargetPass
    : public AttachDescriptionPass<KVCAttachTargetPass,
                                   mlir::kvc::impl::KVCAttachTargetPassBase> {
  using AttachDescriptionPass::AttachDescriptionPass;
  static constexpr StringLiteral kAttrName = KVCDialect::kTargetAttrName;
  static constexpr auto load = ::kvc::loadTargetDesc;
  static constexpr auto convert = getTargetAttr;
};

} // namespace
