//===- Passes.td - kvc's kernel generation passes ----------*- tablegen -*-===//
//
// The passes that turn fused kvc.kernel ops into code: loop nests
// (kvc-lower-kernels), PTX for the target's GPU (kvc-generate-kernels) and
// the NVVM data layout that lowering needs (kvc-gpu-data-layout). Their
// library (lib/Conversion) is mirrored by test/Conversion and
// unittests/Conversion.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_CONVERSION_PASSES_TD
#define KVC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def KVCLowerKernelsPass : Pass<"kvc-lower-kernels", "::mlir::ModuleOp"> {
  let summary = "Generates a loop-nest function for every kvc.kernel of a "
                "generated kind";
  let description = [{
    Turns each `kvc.kernel` of a generated kind — `[dequant] [untransform]
    scatter` on a KV chunk (kind `restore`), `project -> scatter` (kind
    `rope_scatter`: the epilogue after the runtime's K/V projection GEMM,
    which applies RoPE to K from the model's cos/sin table, rounds K and V to
    bf16 and scatters them), or `gather [transform] [quant]` yielding the
    encoded chunk (kind `save`: the same ABI, reading the cache and writing
    the payload as the runtime's encoder would) — into a `func.func`
    specialized for the plan; a `project -> scatter` kernel also gets its
    RMSNorm prologue (kind `rms_norm`, named in `kvc.prologue`), which the
    runtime runs before its K/V GEMM:
    the model's KV
    width, the codec (quantization bits, the axis and group of K's and V's
    scales, Hadamard over head_dim), the chunk's tokens and layers and the
    paged cache's block size are constants. The body is two `scf.parallel`
    loops ((blocks, chunks) x threads: the grid runs once per record of the
    launch's chunk table; each K or V matrix of a layer its own blocks;
    a thread loads all its work items before storing any) of arith, memref
    and vector ops that decode the payload as the runtime's codecs lay it
    out and store bf16 rows into the paged cache through the block table,
    with 16-byte vector accesses (a save kernel the other way round; its
    per-channel items loop over their group's tokens with `scf.for`). Under
    Hadamard, the lanes of a warp that hold one head row exchange values
    with `gpu.shuffle`, and a save kernel reduces per-token groups across
    lanes likewise; `host=true` generates the form `kvc-kernels-to-llvm` can
    lower instead (a head row, or whole groups, per work item). Kernels of
    the same specialization share one function; the kernel op names it in
    `kvc.entry`. The function lowers to
    PTX with `kvc-kernels-to-ptx` and to host LLVM with `kvc-kernels-to-llvm`
    (docs/kernels.md). Kernels of other chains are left alone, and so is a
    kernel whose model or codec has no generated form, with a warning that
    says why (a still-compressed input, a width that is not a multiple of
    32, per-token groups not a multiple of 8, a head_dim that is neither 8
    nor a multiple of 16 under RoPE or not a power of two of at least 8
    under Hadamard, a Hadamard head row wider than a warp; for a save kernel,
    per-token groups that do not tile a row or, in the GPU form, span more
    than a warp's lanes): the runtime runs its steps. Options no kernel can
    take (Hadamard, per-token save groups or an RMSNorm prologue in blocks
    that are not whole warps; group lanes a group cannot split into) fail
    the pass with a message on the kernel.

    Before (a module with `kvc.model`, kv_heads = 2, head_dim = 64):
    ```
    kvc.kernel "dequant_scatter"(%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) -> () {
    ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>):
      %d = kvc.dequant %in : ... -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
    }
    ```
    After:
    ```
    kvc.kernel "dequant_scatter"(%c) : ... {kvc.entry = @kvc_restore_int4_kc_vt_g32_t64_l1_h2x64_b16} { ... }
    func.func @kvc_restore_int4_kc_vt_g32_t64_l1_h2x64_b16(
        %payload: memref<?xi8>, %key_cache: memref<?xi8>, %value_cache: memref<?xi8>,
        %block_table: memref<?xi32>, %chunks: memref<?xi64>,
        %layer_rows: index) attributes {kvc.entry} {
      %n = arith.divui %records, %c3 : index   // the launch's chunks
      scf.parallel (%block, %chunk) = (%c0, %c0) to (%c2, %n) step (%c1, %c1) {
        scf.parallel (%thread) = (%c0) to (%c256) step (%c1) {
          ... // the chunk's record: payload offset, first token, first layer
          scf.if %block_is_v {
            ... // 4 items: load and decode 8 values each, round to bf16
            ... // 4 guarded 16-byte stores
          } else { ... }
        }
      }
      return
    }
    ```
  }];
  let options = [
    Option<"blockSize", "block-size", "int64_t", /*default=*/"16",
           "Tokens per block of the paged KV cache">,
    Option<"threads", "threads", "int64_t", /*default=*/"256",
           "Threads per block of the GPU launch">,
    Option<"host", "host", "bool", /*default=*/"false",
           "Generate the host form (kvc-kernels-to-llvm): under Hadamard a "
           "work item transforms a whole head row instead of a warp's lanes "
           "sharing it through gpu.shuffle">,
    Option<"groupLanes", "group-lanes", "int64_t", /*default=*/"0",
           "Lanes each per-channel group of a GPU-form save is split among "
           "(a power of two dividing the group; a lane holds its tokens "
           "when they are at most held-tokens); 0 chooses. Its kernels' "
           "names say so (_gl4_)">,
    Option<"heldTokens", "held-tokens", "int64_t", /*default=*/"8",
           "Tokens of a per-channel group's part that a GPU-form save lane "
           "holds in registers, loaded and transformed once (1 to 16); a "
           "longer part is scanned twice. Its kernels' names say so "
           "(_ht16_) where it is not 8">,
    Option<"restoreItems", "restore-items", "int64_t", /*default=*/"4",
           "Items (8 values each) a GPU-form restore thread of a quantized "
           "chunk computes at most, all loaded before the first is stored "
           "(1, 2, 4 or 8; fewer where its packed values fill 16 bytes "
           "first). Its kernels' names say so (_ri8_) where it is not 4">,
    Option<"scanLoads", "scan-loads", "int64_t", /*default=*/"8",
           "Tokens' loads a GPU-form save lane issues at most before their "
           "use when it scans its part of a per-channel group twice (1 to "
           "8). Its kernels' names say so (_sl4_) where it is not 8">,
  ];
  let dependentDialects = [
    "::kvc::compiler::KVCDialect", "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect", "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect", "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect"
  ];
}

def KVCGenerateKernelsPass : Pass<"kvc-generate-kernels", "::mlir::ModuleOp"> {
  let summary = "Generates the plans' kernels as PTX for the target's GPU";
  let description = [{
    Runs `kvc-lower-kernels` and `kvc-kernels-to-ptx` for the chip the
    `chip` option names or, when it is empty (the default), for the chip of
    the module's `#kvc.target` (its compute's `chip`, which the shipped GPU
    targets carry: `targets/h100-sxm.json` names `sm_90`). A target without a
    chip (a CPU) and `chip=none` leave the module unchanged. The restore and
    save pipelines end with it, passing their `gpu-chip`, so a plan compiled
    for an H100 target carries its kernels without the chip repeated: each
    generated kernel's `kvc.kernel` names its function (`kvc.entry`), and
    the module holds the `gpu.binary` of that function's PTX for `sm_90`
    (docs/kernels.md shows both).
  }];
  let options = [
    Option<"chip", "chip", "std::string", /*default=*/"\"\"",
           "GPU architecture (sm_90: H100, H200); empty: the target's; none: "
           "no kernels">,
  ];
}

def KVCGpuDataLayoutPass : Pass<"kvc-gpu-data-layout", "::mlir::gpu::GPUModuleOp"> {
  let summary = "Gives a gpu.module its NVVM target's LLVM data layout";
  let description = [{
    Sets `llvm.data_layout` on a `gpu.module` to the data layout of the
    NVPTX target machine its `#nvvm.target` names (triple, chip and
    features). `gpu-module-to-binary` translates the module to LLVM IR
    before it sets the target's layout, so without this a load the LLVM
    dialect leaves unaligned gets LLVM's default ABI alignment: 4 bytes for
    an i64, which NVPTX splits into two 32-bit loads. With the target's
    layout an i64 (a chunk record's field) is one `ld.global.u64`. Fails on
    a module with no `#nvvm.target` (run `nvvm-attach-target` first), and on
    a chip NVPTX does not know (for which it would only warn, and emit PTX
    the runtime refuses).
    `kvc-kernels-to-ptx` runs it on every outlined kernel.

    Before:
    ```mlir
    gpu.module @k [#nvvm.target<chip = "sm_90">] {
    }
    ```
    After:
    ```mlir
    gpu.module @k [#nvvm.target<chip = "sm_90">] attributes {
        llvm.data_layout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"} {
    }
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Output
//===----------------------------------------------------------------------===//

#endif // KVC_CONVERSION_PASSES_TD
