//===- KVCAttrs.td - Attributes of the kvc dialect ---------*- tablegen -*-===//
//
// Descriptions of models (#kvc.model) and machines (#kvc.target), codecs
// (#kvc.codec), stored sources (#kvc.source) and ranges (#kvc.range).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVC_IR_KVCATTRS_TD
#define KVC_DIALECT_KVC_IR_KVCATTRS_TD

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "kvc/Dialect/KVC/IR/KVCDialect.td"
include "kvc/Dialect/KVC/IR/KVCEnums.td"

class KVC_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<KVC_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

/// A real number printed in its shortest round-trip form (`12.5`, `1e-05`).
class KVC_F64Parameter<string desc, string default = "">
    : APFloatParameter<desc> {
  let parser = "::kvc::compiler::parseF64($_parser)";
  let printer = "::kvc::compiler::printF64($_printer, $_self)";
  let defaultValue = !if(!empty(default), "",
                         "::llvm::APFloat(" # default # ")");
}

/// A half-open range printed as `a to b`.
def KVC_RangeParameter
    : AttrParameter<"::kvc::compiler::RangeAttr", "a half-open range `a to b`"> {
  let parser = "::kvc::compiler::parseRangeBody($_parser)";
  let printer = "::kvc::compiler::printRangeBody($_printer, $_self)";
}

//===----------------------------------------------------------------------===//
// #kvc.range
//===----------------------------------------------------------------------===//

def KVC_RangeAttr : KVC_Attr<"Range", "range"> {
  let summary = "A half-open range of tokens or layers";
  let description = [{
    `[begin, end)`, written `begin to end` as `affine.for` bounds are.
    Ops and attributes check that it is non-empty and inside the model,
    naming the field (`tokens`, `layers`) in their diagnostics.

    ```mlir
    module attributes {doc.example = #kvc.range<0 to 4096>} {}
    ```
  }];
  let parameters = (ins "int64_t":$begin, "int64_t":$end);
  let assemblyFormat = "`<` $begin `to` $end `>`";
  let extraClassDeclaration = [{
    int64_t size() const { return getEnd() - getBegin(); }
    bool contains(int64_t point) const {
      return getBegin() <= point && point < getEnd();
    }
    bool contains(RangeAttr other) const {
      return getBegin() <= other.getBegin() && other.getEnd() <= getEnd();
    }
  }];
}

//===----------------------------------------------------------------------===//
// #kvc.model
//===----------------------------------------------------------------------===//

def KVC_ModelAttr : KVC_Attr<"Model", "model"> {
  let summary = "A Llama-family model's architecture";
  let description = [{
    The shape facts planning needs: layer count, hidden size, attention heads
    and KV heads (GQA when fewer), head dimension, MLP width, vocabulary,
    the longest context, RoPE base, the element type of weights and KV, and
    RMSNorm's epsilon (1e-5 when not written).
    `kvc-opt --kvc-import-model=PATH/config.json` builds it from a Hugging
    Face config. `fingerprint` identifies the weights when known; stores
    refuse chunks whose fingerprint differs.

    ```mlir
    module attributes {kvc.model = #kvc.model<name = "llama-2-7b",
        layers = 32, hidden = 4096, heads = 32, kv_heads = 32, head_dim = 128,
        ffn = 11008, vocab = 32000, max_positions = 4096, rope_theta = 10000,
        dtype = f16>} {}
    ```
  }];
  let parameters = (ins
    StringRefParameter<"model name">:$name,
    "int64_t":$layers,
    "int64_t":$hidden,
    "int64_t":$heads,
    "int64_t":$kv_heads,
    "int64_t":$head_dim,
    "int64_t":$ffn,
    "int64_t":$vocab,
    "int64_t":$max_positions,
    KVC_F64Parameter<"RoPE base frequency">:$rope_theta,
    "::mlir::Type":$dtype,
    StringRefParameter<"weights fingerprint", "\"\"">:$fingerprint,
    KVC_F64Parameter<"RMSNorm epsilon", "1e-5">:$rms_norm_eps
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Bytes per element of weights, KV and hidden states.
    int64_t getElementBytes() const;
    /// Bytes of K and V for one token in one layer.
    int64_t getKVBytesPerTokenLayer() const {
      return 2 * getKvHeads() * getHeadDim() * getElementBytes();
    }
    /// Bytes of the hidden state entering one layer, for one token.
    int64_t getHiddenBytesPerTokenLayer() const {
      return getHidden() * getElementBytes();
    }
  }];
}

//===----------------------------------------------------------------------===//
// #kvc.target and its parts
//===----------------------------------------------------------------------===//

def KVC_ComputeAttr : KVC_Attr<"Compute", "compute"> {
  let summary = "The device that computes";
  let description = [{
    Dense bf16 (GPU) or fp32 (CPU) rate in TFLOP/s, memory bandwidth in GB/s
    and capacity in GiB, and the share of the device a restore may use
    (Cake's GPU utilization), in (0, 1]. A GEMM of m rows reaches
    `gemm_peak_fraction * m / (m + gemm_half_tokens)` of the dense rate
    (defaults 0.75 and 128). `attention_tflops`, when positive, is the rate
    of the attention FLOPs (scores and weighted values), which on backends
    without fused attention kernels is far below the GEMM rate; 0 (the
    default) prices them like GEMMs. `chip`, on a GPU, names the architecture
    the restore and save pipelines generate kernels for by default
    (`"sm_90"`); empty (the default), they generate none unless told a chip.
  }];
  let parameters = (ins
    EnumParameter<KVC_ComputeKind>:$kind,
    StringRefParameter<"device name">:$name,
    KVC_F64Parameter<"TFLOP/s">:$dense_tflops,
    KVC_F64Parameter<"GB/s">:$mem_gbs,
    KVC_F64Parameter<"GiB">:$mem_gib,
    KVC_F64Parameter<"share in (0, 1]">:$restore_share,
    KVC_F64Parameter<"share of peak large GEMMs reach", "0.75">:$gemm_peak_fraction,
    KVC_F64Parameter<"rows at half efficiency", "128.0">:$gemm_half_tokens,
    KVC_F64Parameter<"attention TFLOP/s (0: as GEMMs)", "0.0">:$attention_tflops,
    StringRefParameter<"GPU architecture of the generated kernels", "\"\"">:$chip
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def KVC_HostAttr : KVC_Attr<"Host", "host"> {
  let summary = "The host that runs IO and codec threads";
  let parameters = (ins
    "int64_t":$cores,
    KVC_F64Parameter<"GiB">:$dram_gib,
    KVC_F64Parameter<"GB/s">:$nic_gbs,
    KVC_F64Parameter<"us a task waits to start after a task on another "
                     "resource releases it", "0.0">:$handoff_us,
    KVC_F64Parameter<"GB/s of stored objects an upload checks and copies "
                     "out on the host where no decode step did (0: not "
                     "priced)", "0.0">:$check_gbs,
    KVC_F64Parameter<"GB/s one fetch lane checks of a raw object it has "
                     "just read into a CPU's cache (0: not priced)",
                     "0.0">:$read_check_gbs
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def KVC_LinkAttr : KVC_Attr<"Link", "link"> {
  let summary = "The host<->device link";
  let parameters = (ins
    KVC_F64Parameter<"GB/s">:$h2d_gbs,
    KVC_F64Parameter<"GB/s">:$d2h_gbs,
    KVC_F64Parameter<"us">:$latency_us
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def KVC_TierAttr : KVC_Attr<"Tier", "tier"> {
  let summary = "A storage tier";
  let description = [{
    Aggregate read and write bandwidth in GB/s over `lanes` independent
    devices or connections, and the latency of one request in microseconds.
  }];
  let parameters = (ins
    StringRefParameter<"tier name">:$name,
    EnumParameter<KVC_TierKind>:$kind,
    KVC_F64Parameter<"GB/s">:$read_gbs,
    KVC_F64Parameter<"GB/s">:$write_gbs,
    KVC_F64Parameter<"us">:$latency_us,
    DefaultValuedParameter<"int64_t", "1">:$lanes,
    KVC_F64Parameter<"GB/s a store's own throttle holds its reads to over "
                     "all lanes (0: none)", "0.0">:$throttle_gbs
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def KVC_CodecRateAttr : KVC_Attr<"CodecRate", "codec_rate"> {
  let summary = "Per-core throughput of one codec stage";
  let description = [{
    `on` names the data the rate holds for: the quantization of a lossless
    coder's input (`raw`: unquantized elements) or the quant stage's width;
    `any` (the default, not printed) holds for every codec without a rate
    of its own.
  }];
  let parameters = (ins
    EnumParameter<KVC_CodecStage>:$stage,
    DefaultValuedParameter<"CodecData", "CodecData::any">:$on,
    KVC_F64Parameter<"GB/s of raw data">:$encode_gbs,
    KVC_F64Parameter<"GB/s of raw data">:$decode_gbs
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def KVC_TargetAttr : KVC_Attr<"Target", "target"> {
  let summary = "A machine's description";
  let description = [{
    What the planner knows about a machine. `kvc-opt
    --kvc-attach-target=targets/X.json` builds it from the JSON schema of
    docs/targets.md. `tiers` holds `#kvc.tier` and `codecs` `#kvc.codec_rate`
    attributes; tier names are unique.

    ```mlir
    module attributes {kvc.target = #kvc.target<name = "tiny",
        compute = <kind = cpu, name = "cpu", dense_tflops = 0.3, mem_gbs = 10,
                   mem_gib = 24, restore_share = 1>,
        host = <cores = 2, dram_gib = 24, nic_gbs = 0>,
        link = <h2d_gbs = 10, d2h_gbs = 10, latency_us = 1>,
        tiers = [#kvc.tier<name = "dram", kind = dram, read_gbs = 10,
                           write_gbs = 10, latency_us = 1>],
        codecs = [#kvc.codec_rate<stage = deflate, encode_gbs = 0.1,
                                  decode_gbs = 0.3>]>} {}
    ```
  }];
  let parameters = (ins
    StringRefParameter<"target name">:$name,
    "ComputeAttr":$compute,
    "HostAttr":$host,
    "LinkAttr":$link,
    "::mlir::ArrayAttr":$tiers,
    DefaultValuedParameter<"::mlir::ArrayAttr",
                           "::mlir::ArrayAttr::get($_ctxt, {})">:$codecs
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Returns the tier named `name`, or null.
    TierAttr findTier(::llvm::StringRef name) const;
  }];
}

//===----------------------------------------------------------------------===//
// #kvc.codec and #kvc.source
//===----------------------------------------------------------------------===//

def KVC_CodecAttr : KVC_Attr<"Codec", "codec"> {
  let summary = "How stored bytes are encoded";
  let description = [{
    A point of KVServe's strategy space: an orthogonal `transform`,
    `quant`ization (integer levels or FP8, a row each of kvc's codec
    registry) with the scale axis of keys and of values and the `group`
    size along that axis (KIVI quantizes keys per channel and values per
    token), then a `lossless` coder. Every field defaults to "do nothing";
    raw data carries no codec at all, so `#kvc.codec<>` is rejected.
    Quantization parameters are only written when `quant` is set.

    ```mlir
    module attributes {doc.example = #kvc.codec<transform = hadamard,
        quant = int4, key_axis = channel, value_axis = token, group = 64,
        lossless = deflate>} {}
    ```
  }];
  let parameters = (ins
    DefaultValuedParameter<"Transform", "Transform::none">:$transform,
    DefaultValuedParameter<"Quant", "Quant::none">:$quant,
    DefaultValuedParameter<"QuantAxis", "QuantAxis::channel">:$key_axis,
    DefaultValuedParameter<"QuantAxis", "QuantAxis::token">:$value_axis,
    DefaultValuedParameter<"int64_t", "32">:$group,
    DefaultValuedParameter<"Lossless", "Lossless::none">:$lossless
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Bits per stored element before lossless coding (16 when unquantized).
    int64_t getBits() const;
    /// The codec registry's row of the quantization; null when unquantized.
    const ::kvc::CodecStageInfo *getQuantStage() const;
    /// The same codec with one stage removed or replaced; returns null (raw)
    /// when nothing is left.
    CodecAttr withTransform(Transform transform) const;
    CodecAttr withQuant(Quant quant) const;
    CodecAttr withLossless(Lossless lossless) const;
    /// Builds a codec, or null when every stage is none.
    static CodecAttr getOrRaw(::mlir::MLIRContext *context, Transform transform,
                              Quant quant, QuantAxis keyAxis,
                              QuantAxis valueAxis, int64_t group,
                              Lossless lossless);
  }];
}

def KVC_SourceAttr : KVC_Attr<"Source", "source"> {
  let summary = "Stored KV or hidden states a plan may load";
  let description = [{
    A range of tokens and layers stored in a `tier` of the target, as KV or
    as hidden states (the inputs of layers), encoded with `codec` (absent
    for raw data). Each stored object holds `token_group` consecutive tokens
    and `layer_group` consecutive layers (default 1 each), grouped from token
    and layer 0 (LMCache-style chunked prefixes; HCache's chunk-based storage
    keeps several layers per object): a load reads whole objects, so planners
    only split tokens and layers where objects begin.

    ```mlir
    module attributes {doc.example = #kvc.source<tier = "ssd", form = hidden,
        codec = <quant = int8, lossless = zstd>, tokens = 0 to 4096,
        layers = 0 to 32, token_group = 256, layer_group = 4>} {}
    ```
  }];
  let parameters = (ins
    StringRefParameter<"tier name">:$tier,
    EnumParameter<KVC_Form>:$form,
    OptionalParameter<"CodecAttr">:$codec,
    KVC_RangeParameter:$tokens,
    KVC_RangeParameter:$layers,
    DefaultValuedParameter<"int64_t", "1",
                           "tokens per stored object">:$token_group,
    DefaultValuedParameter<"int64_t", "1",
                           "layers per stored object">:$layer_group
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif // KVC_DIALECT_KVC_IR_KVCATTRS_TD
