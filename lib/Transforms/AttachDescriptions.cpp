//===- AttachDescriptions.cpp - kvc-import-model, kvc-attach-target -------===//
//
// Both passes read a description file through the runtime's parser, convert
// it to an attribute and attach it to the module.
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "kvc/Runtime/Model/LlamaModel.h"

#include <filesystem>

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
    ::kvc::StatusOr<Attribute> attr =
        DerivedT::convert(module.getContext(), *desc, this->path);
    if (!attr.isOk()) {
      emitError(module.getLoc()) << attr.status().message();
      return this->signalPassFailure();
    }
    module->setAttr(DerivedT::kAttrName, *attr);
  }
};

struct KVCImportModelPass
    : public AttachDescriptionPass<KVCImportModelPass,
                                   mlir::kvc::impl::KVCImportModelPassBase> {
  using AttachDescriptionPass::AttachDescriptionPass;
  static constexpr StringLiteral kAttrName = KVCDialect::kModelAttrName;
  static constexpr auto load = ::kvc::loadModelConfig;
  /// The model, named by its fingerprint when its weights sit beside its
  /// config.json (as a checkpoint directory holds them): a bundle compiled
  /// for it is then refused for any other model.
  static ::kvc::StatusOr<Attribute> convert(MLIRContext *context,
                                            const ::kvc::ModelConfig &config,
                                            StringRef path) {
    const std::string dir =
        std::filesystem::path(path.str()).parent_path().string();
    ::kvc::StatusOr<std::string> fingerprint = ::kvc::modelFingerprint(dir);
    if (fingerprint.isOk())
      return Attribute(getModelAttr(context, config, *fingerprint));
    if (fingerprint.status().code() != ::kvc::StatusCode::NotFound)
      return fingerprint.status();
    return Attribute(getModelAttr(context, config));
  }
};

struct KVCAttachTargetPass
    : public AttachDescriptionPass<KVCAttachTargetPass,
                                   mlir::kvc::impl::KVCAttachTargetPassBase> {
  using AttachDescriptionPass::AttachDescriptionPass;
  static constexpr StringLiteral kAttrName = KVCDialect::kTargetAttrName;
  static constexpr auto load = ::kvc::loadTargetDesc;
  static ::kvc::StatusOr<Attribute> convert(MLIRContext *context,
                                            const ::kvc::TargetDesc &target,
                                            StringRef) {
    return Attribute(getTargetAttr(context, target));
  }
};

} // namespace
