//===- Kernel.h - A generated kernel a device launches ----------*- C++ -*-===//
//
// What a plan bundle's kernel table holds for each generated kernel (the
// compiler's kvc-lower-kernels and kvc-kernels-to-ptx), and what a backend
// loads and launches (KernelAbi.h): below the executor and the bundle
// format, so that a backend names no type of the layers that use it.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_KERNEL_H
#define KVC_RUNTIME_DEVICE_KERNEL_H

#include "kvc/Runtime/Desc/CodecSpec.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

/// A generated kernel (kvc-lower-kernels, kvc-kernels-to-ptx): its
/// executable (a format and its binary), its launch shape and argument ABI,
/// and what it is specialized for.
struct BundleKernel {
  /// What the kernel computes: `Restore` decodes a stored KV payload into
  /// the cache; `RopeScatter` is the epilogue of a hidden-state projection
  /// (its payload is the K/V GEMM's f32 output; it applies RoPE to K);
  /// `Save` gathers KV from the cache and encodes it into the payload as
  /// the runtime's codecs store it (before their lossless stage); `RmsNorm`
  /// is a projection's prologue (RmsNorm.h), normalizing hidden states
  /// into the bf16 input of the K/V GEMM.
  enum class Kind { Restore, RopeScatter, Save, RmsNorm };

  /// The symbol tasks name in `entry`.
  std::string name;
  Kind kind = Kind::Restore;
  /// The entry point to launch (a PTX .entry).
  std::string function;
  /// The executable: `binary` in `format` for the device `target` names.
  /// Formats: "ptx" (PTX text; target "sm_80", "sm_90", ...). A backend
  /// launches the formats it loads (Device::canLaunch says why not).
  std::string format = "ptx";
  std::string target;
  std::string binary;
  /// Blocks and threads per block, x y z, for one chunk: constants, the
  /// chunk's shape being part of the specialization. A kernel that
  /// addresses the cache runs grid[1] (1 here) times the chunks of its
  /// launch's chunk table (KernelAbi.h).
  std::array<int64_t, 3> grid{1, 1, 1}, block{1, 1, 1};
  /// The kernel's parameters in order, by name (KernelGen.h): buffers
  /// ("payload", "key_cache", "value_cache", "block_table", "chunks", for
  /// RopeScatter "rope_table"; for RmsNorm "hidden", "norm_weights",
  /// "normed") each pass as the five values of an MLIR memref descriptor
  /// (base, aligned base, offset, size, stride), integers ("layer_rows";
  /// RmsNorm's "first_layer") as one 64-bit value.
  std::vector<std::string> args;
  /// The specialization.
  int64_t tokens = 0, layers = 0, kvHeads = 0, headDim = 0, blockSize = 0;
  /// RmsNorm: the model's hidden size (the row it normalizes) and the
  /// epsilon it adds to the mean square.
  int64_t hidden = 0;
  double eps = 0;
  /// "bf16", "f16" or "f32": unquantized stored values ("f32" for
  /// RopeScatter, whose payload holds the projection's output; for RmsNorm
  /// the hidden states' type).
  std::string storage = "bf16";
  /// The payload's codec (no lossless stage: decompressed on the host).
  CodecSpec codec;
  /// Bytes of the payload the kernel reads or writes (RmsNorm: of the
  /// hidden states it reads).
  int64_t payloadBytes = 0;
};

/// The executable formats a bundle may carry: "ptx".
bool isKernelFormat(std::string_view format);

/// "restore", "rope_scatter", "save" or "rms_norm".
const char *bundleKernelKindName(BundleKernel::Kind kind);
/// The kind bundleKernelKindName() names `name`, if any.
std::optional<BundleKernel::Kind> parseBundleKernelKind(std::string_view name);

/// The kernel of `kernels` named `name`, if any.
const BundleKernel *findKernel(const std::vector<BundleKernel> &kernels,
                               std::string_view name);

/// The argument names a kernel of `kind` takes, each once, in the order of
/// the generated function's parameters (KernelGen.h).
const std::vector<std::string> &bundleKernelArgNames(BundleKernel::Kind kind);

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_KERNEL_H
