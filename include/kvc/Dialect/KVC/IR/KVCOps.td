//===- KVCOps.td - Operations of the kvc dialect -----------*- tablegen -*-===//
//
// The four levels of a movement plan: intent, strategy, dataflow and exec.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVC_IR_KVCOPS_TD
#define KVC_DIALECT_KVC_IR_KVCOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "kvc/Dialect/KVC/IR/KVCDialect.td"
include "kvc/Dialect/KVC/IR/KVCAttrs.td"
include "kvc/Dialect/KVC/IR/KVCTypes.td"
include "kvc/Dialect/KVC/IR/KVCInterfaces.td"

class KVC_Op<string mnemonic, list<Trait> traits = []>
    : Op<KVC_Dialect, mnemonic, traits>;

/// A #kvc.source operand printed in full (`#kvc.source<...>` or its alias)
/// rather than stripped, so that long sources read as `#src`.
def KVC_SourceArg : Attr<CPred<"::llvm::isa<::kvc::compiler::SourceAttr>($_self)">,
                         "a #kvc.source attribute"> {
  let storageType = "::kvc::compiler::SourceAttr";
  let returnType = "::kvc::compiler::SourceAttr";
  let convertFromStorage = "$_self";
}
def KVC_SourceArrayArg : TypedArrayAttrBase<KVC_SourceArg,
                                            "an array of #kvc.source">;

//===----------------------------------------------------------------------===//
// Intent
//===----------------------------------------------------------------------===//

class KVC_IntentOp<string mnemonic, list<Trait> traits = []>
    : KVC_Op<mnemonic, traits # [Symbol]> {
  let hasVerifier = 1;
}

def KVC_RestoreOp : KVC_IntentOp<"restore"> {
  let summary = "Makes a request's KV cache resident on the device";
  let description = [{
    The KV of `tokens` (every layer of the model) must end up in the paged
    cache. `from` lists what is stored; anything not stored is recomputed
    from tokens. Optional `slo_ms` bounds the restore time, `max_error`
    the relative error a lossy source may add and `max_kl` the KL divergence
    (nats) of the next-token distribution it may add, as the codec profile
    measured it on the model. Optional `forward_tokens` is the server's
    forward pass after the restore (the new tokens it prefills, 1 for a
    first decode step), which waits for each layer of the restore in turn:
    the planning passes then choose the plan whose first token (the end of
    that pass) comes first rather than the one that restores fastest. The
    planning passes replace it with a `kvc.plan` of the same name.

    ```mlir
    kvc.restore @chat tokens 0 to 8192 from [
        #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 8192,
                    layers = 0 to 32>,
        #kvc.source<tier = "dram", form = kv,
                    codec = <quant = int8, lossless = deflate>,
                    tokens = 0 to 4096, layers = 0 to 32>]
        {slo_ms = 200.0 : f64, forward_tokens = 512 : i64}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, KVC_RangeAttr:$tokens,
                       KVC_SourceArrayArg:$sources,
                       OptionalAttr<F64Attr>:$slo_ms,
                       OptionalAttr<F64Attr>:$max_error,
                       OptionalAttr<F64Attr>:$max_kl,
                       OptionalAttr<I64Attr>:$forward_tokens);
  let assemblyFormat = [{
    $sym_name `tokens` custom<Range>($tokens) `from` $sources attr-dict
  }];
}

/// The layout of the objects a save writes or a transfer sends: tokens and
/// layers per object (kvc-run's `--chunk-tokens` and `--layer-group`).
defvar objectLayoutDecl = [{
  int64_t getObjectTokens() { return getChunkTokens().value_or(256); }
  int64_t getObjectLayers() { return getLayerGroup().value_or(4); }
}];

def KVC_SaveOp : KVC_IntentOp<"save"> {
  let summary = "Saves a context's KV and/or hidden states to a tier";
  let description = [{
    After a prefill of `tokens`, write the chosen forms to tier `to`,
    encoded with `codec` (chosen by `kvc-select-codec` when absent; raw data
    when it stays absent). Objects hold `chunk_tokens` tokens (default 256)
    of `layer_group` layers (default 4): the store layout restores read
    with (kvc-run's `--chunk-tokens` and `--layer-group`).

    ```mlir
    kvc.save @doc tokens 0 to 4096 kv hidden to "ssd"
        codec <quant = int8, lossless = zstd> {layer_group = 1 : i64}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, KVC_RangeAttr:$tokens,
                       UnitAttr:$kv, UnitAttr:$hidden, StrAttr:$tier,
                       OptionalAttr<KVC_CodecAttr>:$codec,
                       OptionalAttr<F64Attr>:$slo_ms,
                       OptionalAttr<F64Attr>:$max_error,
                       OptionalAttr<I64Attr>:$chunk_tokens,
                       OptionalAttr<I64Attr>:$layer_group);
  let extraClassDeclaration = objectLayoutDecl;
  let assemblyFormat = [{
    $sym_name `tokens` custom<Range>($tokens) (`kv` $kv^)? (`hidden` $hidden^)?
    `to` $tier (`codec` $codec^)? attr-dict
  }];
}

def KVC_TransferOp : KVC_IntentOp<"transfer"> {
  let summary = "Moves a request's KV from a prefill node to a decode node";
  let description = [{
    Disaggregated serving: node `from` (default "prefill") prefills `tokens`
    and sends their KV over the network to node `to`, encoded with `codec`
    (chosen by `kvc-select-codec` under the `slo_ms` and `max_error`
    budgets when absent; raw data when it stays absent), in objects of
    `chunk_tokens` tokens (default 256) x `layer_group` layers (default 4),
    the layout of a store's objects. `kvc-expand` makes it two plans:
    `<name>_send` for the sender, `<name>_recv` for the receiver.

    ```mlir
    kvc.transfer @req tokens 0 to 2048 from "prefill-0" to "decode-0"
        {slo_ms = 50.0 : f64, max_error = 0.02 : f64}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, KVC_RangeAttr:$tokens,
                       OptionalAttr<StrAttr>:$from_node,
                       StrAttr:$node, OptionalAttr<KVC_CodecAttr>:$codec,
                       OptionalAttr<F64Attr>:$slo_ms,
                       OptionalAttr<F64Attr>:$max_error,
                       OptionalAttr<I64Attr>:$chunk_tokens,
                       OptionalAttr<I64Attr>:$layer_group);
  let extraClassDeclaration = objectLayoutDecl # [{
    /// The node that prefills and sends.
    StringRef getSenderNode() { return getFromNode().value_or("prefill"); }
  }];
  let assemblyFormat = [{
    $sym_name `tokens` custom<Range>($tokens) (`from` $from_node^)? `to` $node
    (`codec` $codec^)? attr-dict
  }];
}

//===----------------------------------------------------------------------===//
// Strategy
//===----------------------------------------------------------------------===//

def KVC_PlanOp : KVC_Op<"plan", [Symbol, NoTerminator, SingleBlock]> {
  let summary = "How one request's KV is obtained";
  let description = [{
    A plan covers `tokens` x `layers`. At the strategy level its body holds
    `kvc.segment`s and nothing else; after `kvc-expand`, dataflow ops whose
    `kvc.scatter`s write the cache; after `kvc-schedule`, tasks. At every
    level the segments (or the scattered chunks) must tile the plan exactly:
    no overlap and no gap; and no step makes a chunk outside the plan. A
    save plan (what `kvc-expand` makes of a `kvc.save`) scatters nothing:
    the chunks its `kvc.store`s write must tile it, form by form; so must a
    transfer sender's `kvc.send`s. A plan that gathers (a save, a sender)
    runs beside the prefill that computes what it gathers: `prefill_step`
    is the tokens the prefill computes a step, which `kvc-expand` chooses
    (the whole request for a layer-wise plan, else one object's tokens) and
    the runtime follows. Planning passes record the `strategy` that chose
    the plan and `kvc-estimate` its simulated time in microseconds.

    ```mlir
    kvc.plan @cake tokens 0 to 512 layers 0 to 2 {
      %c = kvc.chunk_compute tokens 0 to 256 layers 0 to 2
          : !kvc.chunk<kv x bf16, tokens 0 to 256, layers 0 to 2, device>
      kvc.scatter %c : !kvc.chunk<kv x bf16, tokens 0 to 256, layers 0 to 2, device>
      %f = kvc.fetch #kvc.source<tier = "ssd", form = kv,
                                 codec = <quant = int4, lossless = deflate>,
                                 tokens = 0 to 512, layers = 0 to 2>
          tokens 256 to 512 layers 0 to 2
          : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                       codec <quant = int4, lossless = deflate>>
      %d = kvc.decompress %f
          : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                       codec <quant = int4, lossless = deflate>>
          -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                        codec <quant = int4>>
      %q = kvc.dequant %d
          : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host,
                       codec <quant = int4>>
          -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host>
      %g = kvc.transfer_to_device %q
          : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, host>
          -> !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device>
      kvc.scatter %g : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 2, device>
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, KVC_RangeAttr:$tokens,
                       KVC_RangeAttr:$layers,
                       OptionalAttr<StrAttr>:$strategy,
                       OptionalAttr<I64Attr>:$prefill_step,
                       OptionalAttr<I64Attr>:$predicted_us);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name `tokens` custom<Range>($tokens) `layers` custom<Range>($layers)
    (`strategy` $strategy^)? (`prefill_step` $prefill_step^)?
    (`predicted` $predicted_us^ `us`)?
    attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
}

def KVC_SegmentOp : KVC_Op<"segment", [HasParent<"PlanOp">]> {
  let summary = "One method for a block of tokens x layers";
  let description = [{
    `compute` recomputes the KV from tokens; `load_kv` loads stored KV;
    `load_hidden` loads hidden states and projects them to K and V. Loads
    name their `source`, which must hold the segment's form and ranges.
    A `compute` segment that starts above layer 0 needs the hidden states
    entering its first layer: from a `compute` segment of the same tokens
    that ends there, or from a hidden-state `source`.

    ```mlir
    kvc.plan @hcache tokens 0 to 1024 layers 0 to 32 {
      kvc.segment compute tokens 0 to 1024 layers 0 to 4
      kvc.segment load_hidden tokens 0 to 1024 layers 4 to 32
          from #kvc.source<tier = "ssd", form = hidden, tokens = 0 to 1024,
                           layers = 0 to 32>
    }
    ```
  }];
  let arguments = (ins KVC_MethodAttr:$method, KVC_RangeAttr:$tokens,
                       KVC_RangeAttr:$layers,
                       OptionalAttr<KVC_SourceArg>:$source);
  let assemblyFormat = [{
    `` $method `tokens` custom<Range>($tokens) `layers` custom<Range>($layers)
    (`from` $source^)? attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Dataflow
//===----------------------------------------------------------------------===//

/// A per-chunk step; `resources` are the Resource cases that can run it.
class KVC_DataflowOp<string mnemonic, list<string> resources, bit fusible,
                     list<Trait> traits = []>
    : KVC_Op<mnemonic, traits # [KVC_DataflowOpInterface]> {
  defvar resourceList = !interleave(
      !foreach(r, resources, "::kvc::compiler::Resource::" # r), ", ");
  let extraClassDeclaration = [{
    bool canRunOn(::kvc::compiler::Resource resource) {
      for (::kvc::compiler::Resource r : {}] # resourceList # [{})
        if (r == resource)
          return true;
      return false;
    }
    bool isFusible() { return }] # !if(fusible, "true", "false") # [{; }
  }];
}

/// A step that changes one stage of a chunk's encoding or its space and
/// keeps everything else; `stage` names the detail::Stage it checks.
class KVC_StageOp<string mnemonic, string stage, list<string> resources,
                  bit fusible = 1>
    : KVC_DataflowOp<mnemonic, resources, fusible, [Pure]> {
  let arguments = (ins KVC_ChunkType:$input);
  let results = (outs KVC_ChunkType:$result);
  let assemblyFormat = [{
    $input attr-dict `:` custom<Chunk>(type($input)) `->`
    custom<Chunk>(type($result))
  }];
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::verify() {
      return ::kvc::compiler::detail::verifyStageOp(
          getOperation(), ::kvc::compiler::detail::Stage::}] # stage # [{);
    }
  }];
}

def KVC_FetchOp : KVC_DataflowOp<"fetch", ["io"], 0> {
  let summary = "Reads a chunk of a stored source into host memory";
  let description = [{
    The result keeps the source's form and codec and lives on the host;
    its ranges are the op's, which must lie inside the source's.

    ```mlir
    func.func @example() -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 8, host> {
      %h = kvc.fetch #kvc.source<tier = "dram", form = hidden,
                                 tokens = 0 to 4096, layers = 0 to 32>
          tokens 0 to 64 layers 0 to 8
          : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 8, host>
      return %h : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 8, host>
    }
    ```
  }];
  let arguments = (ins KVC_SourceArg:$source, KVC_RangeAttr:$tokens,
                       KVC_RangeAttr:$layers);
  let results = (outs KVC_ChunkType:$result);
  let assemblyFormat = [{
    $source `tokens` custom<Range>($tokens) `layers` custom<Range>($layers)
    attr-dict `:` custom<Chunk>(type($result))
  }];
  let hasVerifier = 1;
}

def KVC_DecompressOp : KVC_StageOp<"decompress", "Decompress",
                                   ["decode", "compute"]> {
  let summary = "Undoes the lossless coder";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = zstd>>) {
      %d = kvc.decompress %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <lossless = zstd>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      return
    }
    ```
  }];
}

def KVC_DequantOp : KVC_StageOp<"dequant", "Dequant", ["decode", "compute"]> {
  let summary = "Turns quantized integers back into the element type";
  let description = [{
    The input must be quantized and no longer losslessly coded.

    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>) {
      %d = kvc.dequant %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      return
    }
    ```
  }];
}

def KVC_UntransformOp : KVC_StageOp<"untransform", "Untransform",
                                    ["decode", "compute"]> {
  let summary = "Applies the inverse of the orthogonal transform";
  let description = [{
    The input must be transformed, dequantized and decompressed.

    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>) {
      %d = kvc.untransform %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      return
    }
    ```
  }];
}

def KVC_TransferToDeviceOp : KVC_StageOp<"transfer_to_device", "ToDevice",
                                         ["h2d"], 0> {
  let summary = "Copies a chunk from host to device memory";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
      %d = kvc.transfer_to_device %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      return
    }
    ```
  }];
}

def KVC_TransferToHostOp : KVC_StageOp<"transfer_to_host", "ToHost",
                                       ["d2h"], 0> {
  let summary = "Copies a chunk from device to host memory";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>) {
      %d = kvc.transfer_to_host %c
          : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, device>
          -> !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 1, host>
      return
    }
    ```
  }];
}

def KVC_TransformOp : KVC_StageOp<"transform", "Transform",
                                  ["decode", "compute"]> {
  let summary = "Applies an orthogonal transform before quantization";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>) {
      %t = kvc.transform %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <transform = hadamard>>
      return
    }
    ```
  }];
}

def KVC_QuantOp : KVC_StageOp<"quant", "Quant", ["decode", "compute"]> {
  let summary = "Quantizes a chunk to integers with scales";
  let description = [{
    The result type names the quantization. The input must not be
    quantized or losslessly coded yet.

    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>) {
      %q = kvc.quant %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int4, group = 64>>
      return
    }
    ```
  }];
}

def KVC_CompressOp : KVC_StageOp<"compress", "Compress", ["decode", "compute"]> {
  let summary = "Applies a lossless coder";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>) {
      %z = kvc.compress %c
          : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8>>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host, codec <quant = int8, lossless = deflate>>
      return
    }
    ```
  }];
}

def KVC_ProjectOp : KVC_DataflowOp<"project", ["compute"], 1, [Pure]> {
  let summary = "Projects hidden states to K and V";
  let description = [{
    K = RoPE(W_k RMSNorm(h)) and V = W_v RMSNorm(h) for every token and
    layer of the chunk (HCache). The input must be raw hidden states on the
    device; the result is raw KV of the same ranges.

    ```mlir
    func.func @example(%h: !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 4 to 8, device>) {
      %kv = kvc.project %h
          : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 4 to 8, device>
          -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 4 to 8, device>
      return
    }
    ```
  }];
  let arguments = (ins KVC_ChunkType:$input);
  let results = (outs KVC_ChunkType:$result);
  let assemblyFormat = [{
    $input attr-dict `:` custom<Chunk>(type($input)) `->`
    custom<Chunk>(type($result))
  }];
  let hasVerifier = 1;
}

def KVC_ChunkComputeOp : KVC_DataflowOp<"chunk_compute", ["compute"], 0,
                                        [AttrSizedOperandSegments]> {
  let summary = "Recomputes the KV of a chunk of tokens (chunked prefill)";
  let description = [{
    Runs layers `layers` of the model over tokens `tokens`. Attention needs
    the KV of every earlier token in those layers: the `after` operands must
    cover tokens `0 to begin` of every computed layer. Starting above layer
    0 needs the hidden states entering the first layer (`from`).

    ```mlir
    func.func @example(%p: !kvc.chunk<kv x bf16, tokens 0 to 256, layers 0 to 32, device>) {
      %c = kvc.chunk_compute tokens 256 to 512 layers 0 to 32
          after(%p : !kvc.chunk<kv x bf16, tokens 0 to 256, layers 0 to 32, device>)
          : !kvc.chunk<kv x bf16, tokens 256 to 512, layers 0 to 32, device>
      return
    }
    ```
  }];
  let arguments = (ins KVC_RangeAttr:$tokens, KVC_RangeAttr:$layers,
                       Optional<KVC_ChunkType>:$hidden,
                       Variadic<KVC_ChunkType>:$prefix);
  let results = (outs KVC_ChunkType:$result);
  let assemblyFormat = [{
    `tokens` custom<Range>($tokens) `layers` custom<Range>($layers)
    (`from` $hidden^ `:` custom<Chunk>(type($hidden)))?
    (`after` `(` $prefix^ `:` custom<Chunk>(type($prefix)) `)`)? attr-dict
    `:` custom<Chunk>(type($result))
  }];
  let hasVerifier = 1;
}

def KVC_ScatterOp : KVC_DataflowOp<"scatter", ["compute"], 1,
                                   [MemoryEffects<[MemWrite]>]> {
  let summary = "Writes a KV chunk into the paged cache";
  let description = [{
    Copies raw KV on the device into the request's blocks of the paged
    cache (vLLM's layout, through the block table).

    ```mlir
    func.func @example(%kv: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device>) {
      kvc.scatter %kv : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, device>
      return
    }
    ```
  }];
  let arguments = (ins KVC_ChunkType:$input);
  let assemblyFormat = "$input attr-dict `:` custom<Chunk>(type($input))";
  let hasVerifier = 1;
}

def KVC_GatherOp : KVC_DataflowOp<"gather", ["compute"], 1,
                                  [MemoryEffects<[MemRead]>]> {
  let summary = "Reads KV from the paged cache or hidden states from the snapshot";
  let description = [{
    The save side's first step: the result is a raw chunk on the device of
    the form, tokens and layers of its type.

    ```mlir
    func.func @example() {
      %h = kvc.gather : !kvc.chunk<hidden x bf16, tokens 0 to 64, layers 0 to 32, device>
      return
    }
    ```
  }];
  let results = (outs KVC_ChunkType:$result);
  let assemblyFormat = "attr-dict `:` custom<Chunk>(type($result))";
  let hasVerifier = 1;
}

def KVC_StoreOp : KVC_DataflowOp<"store", ["io"], 0,
                                 [MemoryEffects<[MemWrite]>]> {
  let summary = "Writes a host chunk to a storage tier";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host, codec <lossless = lz4>>) {
      kvc.store %c to "ssd" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host, codec <lossless = lz4>>
      return
    }
    ```
  }];
  let arguments = (ins KVC_ChunkType:$input, StrAttr:$tier);
  let assemblyFormat = "$input `to` $tier attr-dict `:` custom<Chunk>(type($input))";
  let hasVerifier = 1;
}

def KVC_SendOp : KVC_DataflowOp<"send", ["net"], 0,
                                [MemoryEffects<[MemWrite]>]> {
  let summary = "Sends a host chunk to another node";
  let description = [{
    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host>) {
      kvc.send %c to "decode-0" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host>
      return
    }
    ```
  }];
  let arguments = (ins KVC_ChunkType:$input, StrAttr:$node);
  let assemblyFormat = "$input `to` $node attr-dict `:` custom<Chunk>(type($input))";
  let hasVerifier = 1;
}

def KVC_RecvOp : KVC_DataflowOp<"recv", ["net"], 0,
                                [MemoryEffects<[MemRead]>]> {
  let summary = "Receives a chunk sent by another node into host memory";
  let description = [{
    ```mlir
    func.func @example() {
      %c = kvc.recv from "prefill-0" : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 32, host>
      return
    }
    ```
  }];
  let arguments = (ins StrAttr:$node);
  let results = (outs KVC_ChunkType:$result);
  let assemblyFormat = "`from` $node attr-dict `:` custom<Chunk>(type($result))";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Exec
//===----------------------------------------------------------------------===//

def KVC_TaskOp : KVC_Op<"task", [
    SingleBlockImplicitTerminator<"YieldOp">, RecursiveMemoryEffects]> {
  let summary = "A unit of work on one lane of a resource";
  let description = [{
    Runs its body on lane `lane` of `resource` once the tasks in `after`
    have finished. `slot` names the staging buffer its result occupies
    (`kvc-schedule` bounds their number by the memory budget). The first
    result signals completion; the others are the values the body yields.
    Every step in the body must be able to run on the resource.

    ```mlir
    func.func @example() {
      %t0, %f = kvc.task on io [0] slot 0 {
        %c = kvc.fetch #kvc.source<tier = "dram", form = kv, tokens = 0 to 64,
                                   layers = 0 to 1>
            tokens 0 to 64 layers 0 to 1
            : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
        kvc.yield %c : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      } : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
      %t1, %d = kvc.task on h2d [0] after %t0 {
        %g = kvc.transfer_to_device %f
            : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, host>
            -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
        kvc.yield %g : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      } : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      %t2 = kvc.task on compute [0] after %t1 {
        kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      }
      return
    }
    ```
  }];
  let arguments = (ins KVC_ResourceAttr:$resource, I64Attr:$lane,
                       Variadic<KVC_TokenType>:$deps,
                       OptionalAttr<I64Attr>:$slot);
  let results = (outs KVC_TokenType:$done, Variadic<AnyType>:$values);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `on` `` $resource `[` $lane `]` (`after` $deps^)? (`slot` $slot^)?
    attr-dict-with-keyword $body (`:` type($values)^)?
  }];
  let hasRegionVerifier = 1;
}

def KVC_KernelOp : KVC_Op<"kernel", [
    IsolatedFromAbove, SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "A fused chain of elementwise steps";
  let description = [{
    `kvc-fuse` folds chains such as decompress -> dequant -> untransform ->
    scatter or project -> scatter into one kernel. The body's arguments
    receive the operands; it may only hold fusible steps. `kvc-lower-kernels`
    generates a function for the chains that have a generated form and names
    it in the kernel's `kvc.entry`; `kvc-kernels-to-ptx` lowers that function
    to one GPU kernel.

    ```mlir
    func.func @example(%c: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) {
      kvc.kernel "dequant_scatter" (%c) : (!kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>) -> () {
      ^bb0(%in: !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>):
        %d = kvc.dequant %in
            : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device, codec <quant = int4>>
            -> !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
        kvc.scatter %d : !kvc.chunk<kv x bf16, tokens 0 to 64, layers 0 to 1, device>
      }
      return
    }
    ```
  }];
  let arguments = (ins StrAttr:$kernel_name, Variadic<KVC_ChunkType>:$inputs);
  let results = (outs Variadic<KVC_ChunkType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $kernel_name `(` $inputs `)` `:` functional-type($inputs, $results)
    attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
}

def KVC_YieldOp : KVC_Op<"yield", [Pure, ReturnLike, Terminator,
                                   ParentOneOf<["TaskOp", "KernelOp"]>]> {
  let summary = "Returns values from a task or kernel body";
  let description = [{
    Ends a `kvc.task` or `kvc.kernel` body with the values it returns;
    implicit when there are none.

    ```mlir
    func.func @example(%h: !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>) {
      %done, %kv = kvc.task on compute[0] {
        %p = kvc.project %h
            : !kvc.chunk<hidden x bf16, tokens 0 to 16, layers 0 to 1, device>
            -> !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
        kvc.yield %p : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
      } : !kvc.chunk<kv x bf16, tokens 0 to 16, layers 0 to 1, device>
      return
    }
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let builders = [OpBuilder<(ins), [{ /* nothing to yield */ }]>];
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

#endif // KVC_DIALECT_KVC_IR_KVCOPS_TD
