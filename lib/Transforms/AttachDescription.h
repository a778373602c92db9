//===- AttachDescription.h - A pass that attaches a description -*- C++ -*-===//
//
// Private to lib/Transforms. What kvc-import-model and kvc-attach-target
// share: each reads a description file through the runtime's parser,
// converts it to an attribute and attaches it to the module.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_TRANSFORMS_ATTACHDESCRIPTION_H
#define KVC_LIB_TRANSFORMS_ATTACHDESCRIPTION_H

#include "kvc/Support/MLIR.h"

#include "kvc/Runtime/Base/Status.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace kvc::compiler {

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
    kvc::StatusOr<Attribute> attr =
        DerivedT::convert(module.getContext(), *desc, this->path);
    if (!attr.isOk()) {
      emitError(module.getLoc()) << attr.status().message();
      return this->signalPassFailure();
    }
    module->setAttr(DerivedT::kAttrName, *attr);
  }
};

} // namespace kvc::compiler

#endif // KVC_LIB_TRANSFORMS_ATTACHDESCRIPTION_H
