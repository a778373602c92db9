//===- KVCEnums.td - Enumerations of the kvc dialect -------*- tablegen -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCENUMS_TD
#define KVC_DIALECT_KVC_IR_KVCENUMS_TD

include "mlir/IR/EnumAttr.td"
include "kvc/Dialect/KVC/IR/KVCDialect.td"

class KVC_Enum<string name, string summary, list<I32EnumAttrCase> cases>
    : I32EnumAttr<name, summary, cases> {
  let cppNamespace = "::kvc::compiler";
  let genSpecializedAttr = 0;
}

class KVC_EnumAttr<KVC_Enum enumInfo, string mnemonic>
    : EnumAttr<KVC_Dialect, enumInfo, mnemonic>;

def KVC_Form : KVC_Enum<"Form", "what a chunk holds", [
  I32EnumAttrCase<"kv", 0>,
  I32EnumAttrCase<"hidden", 1>]>;
def KVC_FormAttr : KVC_EnumAttr<KVC_Form, "form">;

def KVC_Space : KVC_Enum<"Space", "where a chunk's bytes live", [
  I32EnumAttrCase<"host", 0>,
  I32EnumAttrCase<"device", 1>]>;

def KVC_Method : KVC_Enum<"Method", "how a segment obtains its KV", [
  I32EnumAttrCase<"compute", 0>,
  I32EnumAttrCase<"load_kv", 1>,
  I32EnumAttrCase<"load_hidden", 2>]>;
def KVC_MethodAttr : KVC_EnumAttr<KVC_Method, "method">;

def KVC_Transform : KVC_Enum<"Transform", "an orthogonal transform", [
  I32EnumAttrCase<"none", 0>,
  I32EnumAttrCase<"hadamard", 1>]>;

// The codec stages' cases are the codec registry's names and CodecSpec's
// enumerators (kvc/Support/CodecRegistry.h; KVCVocabularyTest checks both).
def KVC_Quant : KVC_Enum<"Quant", "quantization", [
  I32EnumAttrCase<"none", 0>,
  I32EnumAttrCase<"int8", 1>,
  I32EnumAttrCase<"int4", 2>,
  I32EnumAttrCase<"int2", 3>,
  I32EnumAttrCase<"fp8", 4>]>;

def KVC_QuantAxis : KVC_Enum<"QuantAxis", "what one quantization scale spans", [
  I32EnumAttrCase<"token", 0>,
  I32EnumAttrCase<"channel", 1>]>;

def KVC_Lossless : KVC_Enum<"Lossless", "a lossless coder", [
  I32EnumAttrCase<"none", 0>,
  I32EnumAttrCase<"deflate", 1>,
  I32EnumAttrCase<"zstd", 2>,
  I32EnumAttrCase<"lz4", 3>]>;

def KVC_ComputeKind : KVC_Enum<"ComputeKind", "a compute device", [
  I32EnumAttrCase<"gpu", 0>,
  I32EnumAttrCase<"cpu", 1>]>;

def KVC_TierKind : KVC_Enum<"TierKind", "a storage tier", [
  I32EnumAttrCase<"dram", 0>,
  I32EnumAttrCase<"disk", 1>,
  I32EnumAttrCase<"remote", 2>]>;

def KVC_CodecStage : KVC_Enum<"CodecStage", "a codec stage with a measured rate", [
  I32EnumAttrCase<"deflate", 0>,
  I32EnumAttrCase<"zstd", 1>,
  I32EnumAttrCase<"lz4", 2>,
  I32EnumAttrCase<"quant", 3>,
  I32EnumAttrCase<"hadamard", 4>]>;

def KVC_CodecData : KVC_Enum<"CodecData", "the data a codec stage's rate holds for", [
  I32EnumAttrCase<"any", 0>,
  I32EnumAttrCase<"raw", 1>,
  I32EnumAttrCase<"int8", 2>,
  I32EnumAttrCase<"int4", 3>,
  I32EnumAttrCase<"int2", 4>,
  I32EnumAttrCase<"fp8", 5>]>;

def KVC_Resource : KVC_Enum<"Resource", "a resource that runs tasks", [
  I32EnumAttrCase<"io", 0>,
  I32EnumAttrCase<"decode", 1>,
  I32EnumAttrCase<"h2d", 2>,
  I32EnumAttrCase<"d2h", 3>,
  I32EnumAttrCase<"compute", 4>,
  I32EnumAttrCase<"net", 5>]>;
def KVC_ResourceAttr : KVC_EnumAttr<KVC_Resource, "resource">;

#endif // KVC_DIALECT_KVC_IR_KVCENUMS_TD
