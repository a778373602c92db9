//===- KVCDialect.td - The kvc dialect ---------------------*- tablegen -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCDIALECT_TD
#define KVC_DIALECT_KVC_IR_KVCDIALECT_TD

include "mlir/IR/OpBase.td"

def KVC_Dialect : Dialect {
  let name = "kvc";
  let cppNamespace = "::kvc::compiler";
  let summary = "KV-cache movement plans: restore, save and transfer";
  let description = [{
    The `kvc` dialect expresses how an LLM server makes a request's KV cache
    resident on the device, saves it, or moves it between nodes. It has four
    levels, each lowered into the next by passes:

    * **intent** (`kvc.restore`, `kvc.save`, `kvc.transfer`): what must
      happen, with the stored sources and the service budgets;
    * **strategy** (`kvc.plan` of `kvc.segment`): a method (compute, load KV,
      load hidden states) per token range x layer range;
    * **dataflow** (`kvc.fetch`, `kvc.decompress`, `kvc.dequant`, ...): per
      chunk steps with typed `!kvc.chunk` values that carry form, ranges,
      memory space and encoding;
    * **exec** (`kvc.task`, `kvc.kernel`): resource assignment, dependencies
      and fused device kernels.

    Ranges are half-open and written `a to b` (as `affine.for` bounds), so
    `tokens 0 to 4096` is tokens `[0, 4096)`. A module describes its model
    and machine with the discardable attributes `kvc.model` (a `#kvc.model`)
    and `kvc.target` (a `#kvc.target`); verifiers check ranges, tiers and
    shapes against them when present. `kvc-estimate` marks each step or task
    with `kvc.time_ns = array<i64: start, finish>`, its simulated times, and
    each fetch with `kvc.bytes = N : i64`, the bytes it is priced to read.
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    /// The discardable attribute names that carry descriptions on a module.
    static constexpr ::llvm::StringLiteral kModelAttrName = "kvc.model";
    static constexpr ::llvm::StringLiteral kTargetAttrName = "kvc.target";
    /// `kvc-estimate`'s simulated [start, finish] of a step, nanoseconds.
    static constexpr ::llvm::StringLiteral kTimeAttrName = "kvc.time_ns";
    /// `kvc-estimate`'s bytes a fetch reads from its tier.
    static constexpr ::llvm::StringLiteral kBytesAttrName = "kvc.bytes";
    /// `kvc-lower-kernels`' generated function: a symbol on the kvc.kernel
    /// it implements; on the function, the dictionary of its specialization.
    static constexpr ::llvm::StringLiteral kEntryAttrName = "kvc.entry";
    /// On a project -> scatter kvc.kernel: the generated RMSNorm function
    /// the runtime runs before its K/V GEMM.
    static constexpr ::llvm::StringLiteral kPrologueAttrName = "kvc.prologue";

  private:
    void registerAttributes();
    void registerTypes();
  public:
  }];
}

#endif // KVC_DIALECT_KVC_IR_KVCDIALECT_TD
