//===- KernelGen.h - Fused kernels as loop nests ----------------*- C++ -*-===//
//
// kvc-lower-kernels turns each kvc.kernel whose chain has a generated form
// into a function whose body is a loop nest specialized for one plan: the
// model's KV width, the codec, the chunk's tokens and layers and the paged
// cache's block size are constants, so every byte offset, group index and
// alignment is known when the code is generated. Three kinds:
//
//   restore       [dequant] [untransform] scatter of stored KV;
//   rope_scatter  project -> scatter: the epilogue after the runtime's K/V
//                 projection GEMM (RoPE on K, bf16 rounding, scatter);
//   save          gather [transform] [quant]: KV from the cache, encoded as
//                 the runtime's codecs store it (before a lossless stage);
//   rms_norm      the prologue of a project -> scatter kernel: RMSNorm of
//                 the hidden states into the bf16 input of the runtime's
//                 K/V GEMM, in RmsNorm.h's summation order.
//
// The same function lowers to PTX (kvc-kernels-to-ptx) and to host LLVM
// (buildKernelsToLLVMPipeline), which is how CI checks it against the
// runtime's own code without a GPU.
//
// A kernel function's arguments (its ABI, recorded in the plan bundle):
//
//   payload      memref<?xi8>   restore: the chunks after their lossless
//                               stage, as the runtime's codecs lay them out
//                               (save: the same, written);
//                               rope_scatter: the projections' f32 output,
//                               per layer K then V, [tokens][kv width]
//   key_cache    memref<?xi8>   [layers][layer_rows][kv_heads * head_dim]
//                               (read by a save kernel)
//   value_cache  memref<?xi8>   bf16, the same shape (vLLM's flash layout
//                               with a layer stride of layer_rows rows)
//   block_table  memref<?xi32>  logical block -> physical block
//   chunks       memref<?xi64>  the launch's chunks, 3 values each: the
//                               chunk's first payload byte (a multiple of
//                               16), its first token in the request and
//                               first layer in the cache (KernelAbi.h's
//                               KernelChunk); blockIdx.y picks one
//   layer_rows   index          rows of one layer's cache (blocks * block size)
//   rope_table   memref<?xi8>   rope_scatter only: the model's RoPE table,
//                               f32 [position][head_dim] (Rope.h), indexed
//                               by first_token + token
//
// An rms_norm kernel's:
//
//   hidden       memref<?xi8>   the chunk's hidden states, [layers][tokens]
//                               [hidden] of the storage type
//   norm_weights memref<?xi8>   f32 [model layers][hidden]: each layer's
//                               input_layernorm weight
//   normed       memref<?xi8>   bf16 [layers][tokens][hidden], written
//   first_layer  index          the chunk's first layer in the model
//
//===----------------------------------------------------------------------===//

#ifndef KVC_CONVERSION_KERNELGEN_H
#define KVC_CONVERSION_KERNELGEN_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Runtime/Device/Kernel.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"

#include <optional>
#include <string>

namespace kvc::compiler {

/// What a generated kernel computes: the bundle's vocabulary, whose names
/// (bundleKernelKindName) and argument lists (bundleKernelArgNames, in the
/// order of a kernel function's parameters) the runtime validates.
using KernelKind = kvc::BundleKernel::Kind;

/// What one generated kernel is specialized for.
struct KernelSpec {
  KernelKind kind = KernelKind::Restore;
  int64_t tokens = 0;
  int64_t layers = 0;
  int64_t kvHeads = 0;
  int64_t headDim = 0;
  int64_t blockSize = 16;
  /// Element type of unquantized stored values (bf16, f16 or f32; f32 for
  /// rope_scatter, the projection's output).
  Type storage;
  /// The stored chunk's codec, without a lossless stage; null for raw
  /// chunks and rope_scatter.
  CodecAttr codec;
  /// Threads per block of the GPU launch.
  int64_t threads = 256;
  /// rms_norm: the model's hidden size and RMSNorm epsilon.
  int64_t hidden = 0;
  double eps = 0;
  /// The host form, which kvc-kernels-to-llvm can lower: under Hadamard a
  /// restore thread transforms a whole head row (a save item holds one),
  /// where the GPU form spreads the row over a warp's lanes (rowLanes() of
  /// a restore, head_dim / 8 / rowPieces() of a save) that exchange values
  /// through gpu.shuffle; and it rounds to bf16 in integer ops, where the
  /// GPU form uses arith.truncf (cvt.rn.bf16.f32). The forms differ in
  /// nothing else.
  bool host = false;
  /// Lanes a per-channel group of a GPU-form save is split among, where
  /// kvc-lower-kernels' group-lanes option sets them; 0: groupLanes()
  /// chooses.
  int64_t groupLanesOption = 0;
  /// Tokens of a per-channel group's part that a GPU-form save lane loads,
  /// transforms and holds in registers for its encoding, where its part is
  /// no longer; a longer part is scanned twice, up to 8 tokens' loads at a
  /// time (kvc-lower-kernels' held-tokens option; the default in the host
  /// form). A spec names it only where it is not the default.
  static constexpr int64_t kDefaultHeldTokens = 8;
  int64_t heldTokens = kDefaultHeldTokens;
  /// At most this many items a GPU-form restore thread of a quantized
  /// chunk computes (kvc-lower-kernels' restore-items option): each holds
  /// its 8 values and their channels' parameters in registers until its
  /// store. A spec names it only where it is not the default.
  static constexpr int64_t kDefaultRestoreItems = 4;
  int64_t restoreItems = kDefaultRestoreItems;
  /// Tokens' loads a GPU-form save lane issues at most before their use
  /// when it scans a per-channel group's part twice (kvc-lower-kernels'
  /// scan-loads option): each 16-byte load, widened to 8 floats, is held
  /// until the lane has reduced (or encoded) it. A spec names it only where
  /// it is not the default.
  static constexpr int64_t kDefaultScanLoads = 8;
  int64_t scanLoads = kDefaultScanLoads;

  int64_t width() const { return kvHeads * headDim; }
  bool hadamard() const;
  /// 0 when unquantized.
  int64_t bits() const;
  /// Values of a cache row one work item of the K (or V, `value`) matrix
  /// covers: 8, but in the host form of a save kernel a head row under
  /// Hadamard and whole per-token groups, and in the GPU form rowPieces()
  /// pieces of 8.
  int64_t valuesPerItem(bool value) const;
  /// Pieces of one head row a GPU-form save item holds, head_dim / 8 / P
  /// pieces apart (P under Hadamard with per-token groups; else 1).
  int64_t rowPieces(bool value) const;
  /// Tokens one work item covers: a save kernel's per-channel groups (in
  /// the GPU form shared by groupLanes items); else 1.
  int64_t tokensPerItem(bool value) const;
  /// Consecutive items (lanes) that share one per-channel group of a save
  /// kernel, each scanning its own part of the group's tokens (held in
  /// registers where it is at most heldTokens): groupLanesOption where set,
  /// else chosen; 1 in the host form and for every other layout.
  int64_t groupLanes(bool value) const;
  /// Work items of one K (or V) matrix of a layer.
  int64_t itemsOf(bool value) const;
  /// Work items one GPU thread computes (all loaded before any is stored).
  int64_t itemsPerThread() const;
  /// A Hadamard restore's thread holds items that are pieces of one head
  /// row, rowLanes() pieces apart; the row's other pieces are held by the
  /// rowLanes() - 1 lanes beside it (GPU form; 1 in the host form, whose
  /// thread holds the whole row). 0 for every other kernel, whose thread's
  /// items are independent.
  int64_t rowLanes() const;
  /// Bytes of the payload the kernel reads.
  int64_t payloadBytes() const;
  /// A symbol naming the specialization, e.g.
  /// kvc_restore_int4_kc_vt_g32_t256_l32_h8x128_b16,
  /// kvc_save_raw_bf16_had_t16_l1_h8x128_b16,
  /// kvc_rope_scatter_t256_l32_h8x128_b16 or
  /// kvc_rms_norm_bf16_t256_l32_d4096; a save whose group lanes the option
  /// set says so (kvc_save_int4_kc_vt_g32_gl4_t256_l32_h8x128_b16), and
  /// one whose held tokens it set (_ht16_) or scan loads (_sl4_), a
  /// restore whose items per thread it set (_ri8_).
  std::string symbolName() const;

  /// The spec as the `kvc.entry` dictionary of its function, and back.
  DictionaryAttr toAttr(MLIRContext *context) const;
  static FailureOr<KernelSpec> fromAttr(DictionaryAttr attr);

  /// The kind of `kernel`'s chain, if it has a generated form:
  /// [dequant] [untransform] scatter, project -> scatter, or gather
  /// [transform] [quant] of KV yielding its result.
  static std::optional<KernelKind> kindOf(KernelOp kernel);
  /// kvc-lower-kernels' options, which shape every kernel it generates.
  struct Options {
    int64_t blockSize = 16;
    int64_t threads = 256;
    bool host = false;
    /// 0: groupLanes() chooses.
    int64_t groupLanes = 0;
    int64_t heldTokens = kDefaultHeldTokens;
    int64_t restoreItems = kDefaultRestoreItems;
    int64_t scanLoads = kDefaultScanLoads;
  };
  /// The spec of a kernel of a generated kind in a module whose #kvc.model
  /// is `model`; fails with an error on the kernel when there is no model or
  /// the options cannot shape its code.
  static FailureOr<KernelSpec> get(KernelOp kernel, ModelAttr model,
                                   const Options &options);
  /// Why no generated form covers the spec's chunk (its model's head_dim or
  /// KV width, its codec's groups); empty when one does. Such a kernel's
  /// chain is left to the runtime, which runs its steps.
  std::string unsupported() const;
  /// The rms_norm prologue of a rope_scatter kernel `kernel` of `spec`.
  static FailureOr<KernelSpec> prologue(KernelOp kernel, ModelAttr model,
                                        const KernelSpec &spec);
};

/// Builds the kernel function for `spec` at the builder's insertion point.
func::FuncOp buildKernel(OpBuilder &builder, Location loc,
                                const KernelSpec &spec);

/// kernel functions -> gpu.launch -> gpu.module -> NVVM -> gpu.binary (PTX).
void buildKernelsToPTXPipeline(OpPassManager &pm, StringRef chip);

/// kernel functions -> host LLVM dialect, callable through C interfaces.
void buildKernelsToLLVMPipeline(OpPassManager &pm);

/// The dialects, the NVVM target interface and the LLVM IR translations
/// that kvc-lower-kernels' functions need on their way through both
/// pipelines (without the target interface, nvvm-attach-target crashes).
void registerKernelDialects(DialectRegistry &registry);

} // namespace kvc::compiler

#endif // KVC_CONVERSION_KERNELGEN_H
