//===- KVCVocabulary.h - The dialect's enums as kvc's own -------*- C++ -*-===//
//
// The dialect's ODS enumerations whose words are kvc's shared vocabulary
// (kvc/Support/Vocabulary.h), converted to and from it. The enumerators
// have the same values; KVCAttrsTest checks that they have the same names.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_DIALECT_KVC_IR_KVCVOCABULARY_H
#define KVC_DIALECT_KVC_IR_KVCVOCABULARY_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCAttrs.h"
#include "kvc/Support/Vocabulary.h"

namespace kvc::compiler {

static_assert(int(Form::kv) == int(kvc::Form::KV) &&
              int(Form::hidden) == int(kvc::Form::Hidden));
static_assert(int(Resource::io) == int(kvc::Resource::IO) &&
              int(Resource::decode) == int(kvc::Resource::Decode) &&
              int(Resource::h2d) == int(kvc::Resource::H2D) &&
              int(Resource::d2h) == int(kvc::Resource::D2H) &&
              int(Resource::compute) == int(kvc::Resource::Compute) &&
              int(Resource::net) == int(kvc::Resource::Net));
static_assert(int(CodecStage::deflate) == int(kvc::CodecStage::Deflate) &&
              int(CodecStage::zstd) == int(kvc::CodecStage::Zstd) &&
              int(CodecStage::lz4) == int(kvc::CodecStage::Lz4) &&
              int(CodecStage::quant) == int(kvc::CodecStage::Quant) &&
              int(CodecStage::hadamard) == int(kvc::CodecStage::Hadamard));

inline kvc::Form toVocabulary(Form form) {
  return static_cast<kvc::Form>(form);
}
inline kvc::Resource toVocabulary(Resource resource) {
  return static_cast<kvc::Resource>(resource);
}
inline kvc::CodecStage toVocabulary(CodecStage stage) {
  return static_cast<kvc::CodecStage>(stage);
}
inline Form fromVocabulary(kvc::Form form) { return static_cast<Form>(form); }
inline Resource fromVocabulary(kvc::Resource resource) {
  return static_cast<Resource>(resource);
}
inline CodecStage fromVocabulary(kvc::CodecStage stage) {
  return static_cast<CodecStage>(stage);
}

} // namespace kvc::compiler

#endif // KVC_DIALECT_KVC_IR_KVCVOCABULARY_H
