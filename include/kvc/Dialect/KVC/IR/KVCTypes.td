//===- KVCTypes.td - Types of the kvc dialect --------------*- tablegen -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCTYPES_TD
#define KVC_DIALECT_KVC_IR_KVCTYPES_TD

include "mlir/IR/AttrTypeBase.td"
include "kvc/Dialect/KVC/IR/KVCAttrs.td"

class KVC_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<KVC_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def KVC_ChunkType : KVC_Type<"Chunk", "chunk"> {
  let summary = "A block of KV or hidden states in flight";
  let description = [{
    The value that dataflow ops pass along: `form` (`kv` or `hidden`), the
    logical element type, the token and layer ranges it covers, the memory
    `space` it lives in and, while still encoded, the `codec` of its bytes.
    Each dataflow step changes exactly one of space and codec stages, so
    types spell out the pipeline.

    ```mlir
    func.func private @example(!kvc.chunk<kv x bf16, tokens 0 to 256,
        layers 0 to 32, host, codec <quant = int4, lossless = deflate>>)
    ```
  }];
  let parameters = (ins
    EnumParameter<KVC_Form>:$form,
    "::mlir::Type":$elementType,
    KVC_RangeParameter:$tokens,
    KVC_RangeParameter:$layers,
    EnumParameter<KVC_Space>:$space,
    OptionalParameter<"CodecAttr">:$codec
  );
  let assemblyFormat = [{
    `<` $form `x` $elementType `,` `tokens` $tokens `,` `layers` $layers `,`
    $space (`,` `codec` $codec^)? `>`
  }];
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// True when the bytes are plain elements (no codec stage applied).
    bool isRaw() const { return !getCodec(); }
    /// The same chunk with another space or codec (null = raw).
    ChunkType withSpace(Space space) const;
    ChunkType withCodec(CodecAttr codec) const;
  }];
}

def KVC_TokenType : KVC_Type<"Token", "token"> {
  let summary = "Completion of a task";
  let description = [{
    The first result of every `kvc.task`; later tasks list it in `after` to
    run once the task has finished.
  }];
}

#endif // KVC_DIALECT_KVC_IR_KVCTYPES_TD
