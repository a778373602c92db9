//===- Kernel.cpp - A generated kernel a device launches ------------------===//

#include "kvc/Runtime/Device/Kernel.h"



namespace kvc {

bool isKernelFormat(std::string_view format) { return format == "ptx"; }

const char *bundleKernelKindName(BundleKernel::Kind kind) {
  switch (kind) {
  case BundleKernel::Kind::Restore:
    return "restore";
  case BundleKernel::Kind::RopeScatter:
    return "rope_scatter";
  case BundleKernel::Kind::Save:
    return "save";
  case BundleKernel::Kind::RmsNorm:
    return "rms_norm";
  }
  return "unknown";
}

std::optional<BundleKernel::Kind> parseBundleKernelKind(std::string_view name) {
  for (BundleKernel::Kind kind :
       {BundleKernel::Kind::Restore, BundleKernel::Kind::RopeScatter,
        BundleKernel::Kind::Save, BundleKernel::Kind::RmsNorm})
    if (name == bundleKernelKindName(kind))
      return kind;
  return std::nullopt;
}

const std::vector<std::string> &
bundleKernelArgNames(BundleKernel::Kind kind) {
  static const std::vector<std::string> restore = {"payload",     "key_cache",
                                                   "value_cache", "block_table",
                                                   "chunks",      "layer_rows"};
  static const std::vector<std::string> ropeScatter = [] {
    std::vector<std::string> names = restore;
    names.push_back("rope_table");
    return names;
  }();
  static const std::vector<std::string> rmsNorm = {"hidden", "norm_weights",
                                                   "normed", "first_layer"};
  switch (kind) {
  case BundleKernel::Kind::RopeScatter:
    return ropeScatter;
  case BundleKernel::Kind::RmsNorm:
    return rmsNorm;
  default:
    // A save kernel writes its payload and reads the cache: the same
    // buffers as a restore.
    return restore;
  }
}

const BundleKernel *findKernel(const std::vector<BundleKernel> &kernels,
                               std::string_view name) {
  for (const BundleKernel &kernel : kernels)
    if (kernel.name == name)
      return &kernel;
  return nullptr;
}

} // namespace kvc
