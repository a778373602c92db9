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

/// Lets `--kvc-foo=PATH` stand for `--kvc-foo=path=PATH`.
std::string withPathKey(StringRef options) {
  if (!options.empty() && !options.contains('='))
    return ("path=" + options).str();
  return options.str();
}

/// Loads `path` with `load` and attaches `convert(value)` as `attrName`.
template <typename LoadFn, typename ConvertFn>
LogicalResult attachDescription(ModuleOp module, StringRef passArg,
                                const std::string &path, StringRef attrName,
                                LoadFn load, ConvertFn convert) {
  if (path.empty())
    return emitError(module.getLoc())
           << passArg << " needs a path: --" << passArg << "=FILE.json";
  auto desc = load(path);
  if (!desc.isOk())
    return emitError(module.getLoc()) << desc.status().message();
  module->setAttr(attrName, convert(module.getContext(), *desc));
  return success();
}

struct KVCImportModelPass
    : public mlir::kvc::impl::KVCImportModelPassBase<KVCImportModelPass> {
  using Base::Base;

  LogicalResult initializeOptions(
      StringRef options,
      function_ref<LogicalResult(const Twine &)> errorHandler) override {
    return Base::initializeOptions(withPathKey(options), errorHandler);
  }

  void runOnOperation() override {
    if (failed(attachDescription(getOperation(), getArgument(), path,
                                 KVCDialect::kModelAttrName,
                                 ::kvc::loadModelConfig, getModelAttr)))
      signalPassFailure();
  }
};

struct KVCAttachTargetPass
    : public mlir::kvc::impl::KVCAttachTargetPassBase<KVCAttachTargetPass> {
  using Base::Base;

  LogicalResult initializeOptions(
      StringRef options,
      function_ref<LogicalResult(const Twine &)> errorHandler) override {
    return Base::initializeOptions(withPathKey(options), errorHandler);
  }

  void runOnOperation() override {
    if (failed(attachDescription(getOperation(), getArgument(), path,
                                 KVCDialect::kTargetAttrName,
                                 ::kvc::loadTargetDesc, getTargetAttr)))
      signalPassFailure();
  }
};

} // namespace
