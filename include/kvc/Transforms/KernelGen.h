//===- KernelGen.h - Fused restore kernels as loop nests --------*- C++ -*-===//
//
// kvc-lower-kernels turns each load-side kvc.kernel (dequant -> untransform
// -> scatter and its sub-chains) into a function whose body is a loop nest
// specialized for one plan: the model's KV width, the codec, the chunk's
// tokens and layers and the paged cache's block size are constants, so
// every byte offset, group index and alignment is known when the code is
// generated. The same function lowers to PTX (kvc-kernels-to-ptx) and to
// host LLVM (buildKernelsToLLVMPipeline), which is how CI checks it against
// the runtime's decoder without a GPU.
//
// A kernel function's arguments (its ABI, recorded in the plan bundle):
//
//   payload      memref<?xi8>   the chunk after its lossless stage, as the
//                               runtime's codecs lay it out (16-byte aligned)
//   key_cache    memref<?xi8>   [layers][layer_rows][kv_heads * head_dim]
//   value_cache  memref<?xi8>   bf16, the same shape (vLLM's flash layout
//                               with a layer stride of layer_rows rows)
//   block_table  memref<?xi32>  logical block -> physical block
//   first_token  index          the chunk's first token in the request
//   first_layer  index          the chunk's first layer in the cache
//   layer_rows   index          rows of one layer's cache (blocks * block size)
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TRANSFORMS_KERNELGEN_H
#define KVC_TRANSFORMS_KERNELGEN_H

#include "kvc/Dialect/KVC/IR/KVCOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"

#include <string>

namespace mlir::kvc {

/// What one generated restore kernel is specialized for.
struct RestoreKernelSpec {
  int64_t tokens = 0;
  int64_t layers = 0;
  int64_t kvHeads = 0;
  int64_t headDim = 0;
  int64_t blockSize = 16;
  /// Element type of unquantized stored values (bf16, f16 or f32).
  Type storage;
  /// Null for raw chunks.
  CodecAttr codec;
  /// Threads per block of the GPU launch.
  int64_t threads = 256;

  int64_t width() const { return kvHeads * headDim; }
  bool hadamard() const;
  /// 0 when unquantized.
  int64_t bits() const;
  /// Values one work item produces: a head row under Hadamard, else 8.
  int64_t valuesPerItem() const;
  /// Work items of the whole chunk (one thread each).
  int64_t items() const;
  /// Bytes of the payload the kernel reads.
  int64_t payloadBytes() const;
  /// A symbol naming the specialization, e.g.
  /// kvc_restore_int4_kc_vt_g32_t256_l32_h8x128_b16.
  std::string symbolName() const;

  /// The spec as the `kvc.entry` dictionary of its function, and back.
  DictionaryAttr toAttr(MLIRContext *context) const;
  static FailureOr<RestoreKernelSpec> fromAttr(DictionaryAttr attr);

  /// Whether `kernel` is a load-side chain: [dequant] [untransform] scatter.
  static bool isRestoreKernel(KernelOp kernel);
  /// The spec of a load-side kernel in a module whose #kvc.model is
  /// `model`; fails with a diagnostic on the kernel when its chain or shape
  /// has no generated form.
  static FailureOr<RestoreKernelSpec> get(KernelOp kernel, ModelAttr model,
                                          int64_t blockSize, int64_t threads);
};

/// Names of a kernel function's arguments, in order.
ArrayRef<StringRef> restoreKernelArgNames();

/// Builds the kernel function for `spec` at the builder's insertion point.
func::FuncOp buildRestoreKernel(OpBuilder &builder, Location loc,
                                const RestoreKernelSpec &spec);

/// kernel functions -> gpu.launch -> gpu.module -> NVVM -> gpu.binary (PTX).
void buildKernelsToPTXPipeline(OpPassManager &pm, StringRef chip);

/// kernel functions -> host LLVM dialect, callable through C interfaces.
void buildKernelsToLLVMPipeline(OpPassManager &pm);

} // namespace mlir::kvc

#endif // KVC_TRANSFORMS_KERNELGEN_H
