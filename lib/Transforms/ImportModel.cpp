//===- ImportModel.cpp - kvc-import-model ---------------------------------===//
//
// Attaches a model's description (its config.json, and the fingerprint of
// the weights beside it) to the module as kvc.model.
//
//===----------------------------------------------------------------------===//

#include "AttachDescription.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "kvc/Runtime/Model/LlamaModel.h"

#include <filesystem>

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCIMPORTMODELPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;

namespace {

struct KVCImportModelPass
    : public AttachDescriptionPass<
          KVCImportModelPass, kvc::compiler::impl::KVCImportModelPassBase> {
  using AttachDescriptionPass::AttachDescriptionPass;
  static constexpr StringLiteral kAttrName = KVCDialect::kModelAttrName;
  static constexpr auto load = kvc::loadModelConfig;
  /// The model, named by its fingerprint when its weights sit beside its
  /// config.json (as a checkpoint directory holds them): a bundle compiled
  /// for it is then refused for any other model.
  static kvc::StatusOr<Attribute> convert(MLIRContext *context,
                                          const kvc::ModelConfig &config,
                                          StringRef path) {
    const std::string dir =
        std::filesystem::path(path.str()).parent_path().string();
    kvc::StatusOr<std::string> fingerprint = kvc::modelFingerprint(dir);
    if (fingerprint.isOk())
      return Attribute(getModelAttr(context, config, *fingerprint));
    if (fingerprint.status().code() != kvc::StatusCode::NotFound)
      return fingerprint.status();
    return Attribute(getModelAttr(context, config));
  }
};

} // namespace
