//===- KVCTypes.cpp - Types of the kvc dialect ----------------------------===//

#include "kvc/Dialect/KVC/IR/KVCTypes.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace kvc::compiler;

#define GET_TYPEDEF_CLASSES
#include "kvc/Dialect/KVC/IR/KVCTypes.cpp.inc"

void KVCDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "kvc/Dialect/KVC/IR/KVCTypes.cpp.inc"
      >();
}

LogicalResult ChunkType::verify(function_ref<InFlightDiagnostic()> emitError,
                                Form, Type elementType, RangeAttr tokens,
                                RangeAttr layers, Space, CodecAttr) {
  if (!elementType.isBF16() && !elementType.isF16() && !elementType.isF32())
    return emitError() << "chunk element type must be bf16, f16 or f32, got "
                       << elementType;
  if (failed(verifyRange(emitError, "tokens", tokens)) ||
      failed(verifyRange(emitError, "layers", layers)))
    return failure();
  return success();
}

ChunkType ChunkType::withSpace(Space space) const {
  return get(getContext(), getForm(), getElementType(), getTokens(),
             getLayers(), space, getCodec());
}

ChunkType ChunkType::withCodec(CodecAttr codec) const {
  return get(getContext(), getForm(), getElementType(), getTokens(),
             getLayers(), getSpace(), codec);
}

ParseResult kvc::compiler::parseChunk(OpAsmParser &parser, Type &type) {
  ChunkType chunk;
  if (parser.parseType(chunk))
    return failure();
  type = chunk;
  return success();
}

ParseResult kvc::compiler::parseChunk(OpAsmParser &parser,
                                      SmallVectorImpl<Type> &types) {
  return parser.parseCommaSeparatedList(
      [&] { return parseChunk(parser, types.emplace_back()); });
}

void kvc::compiler::printChunk(OpAsmPrinter &printer, Operation *, Type type) {
  printer.printType(type);
}

void kvc::compiler::printChunk(OpAsmPrinter &printer, Operation *op,
                               TypeRange types) {
  llvm::interleaveComma(types, printer,
                        [&](Type type) { printChunk(printer, op, type); });
}
