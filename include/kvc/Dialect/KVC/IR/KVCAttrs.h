//===- KVCAttrs.h - Attributes of the kvc dialect ---------------*- C++ -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCATTRS_H
#define KVC_DIALECT_KVC_IR_KVCATTRS_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Support/CodecRegistry.h"

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"

#include "kvc/Dialect/KVC/IR/KVCEnums.h.inc"

namespace kvc::compiler {
class RangeAttr;
class CodecAttr;
} // namespace kvc::compiler

#define GET_ATTRDEF_CLASSES
#include "kvc/Dialect/KVC/IR/KVCAttrs.h.inc"

namespace kvc::compiler {

/// The shortest text that parses back to `value` as an MLIR float or integer.
std::string formatF64(double value);

/// Parameter parsers and printers used by the ODS formats.
FailureOr<llvm::APFloat> parseF64(AsmParser &parser);
void printF64(AsmPrinter &printer, const llvm::APFloat &value);
FailureOr<RangeAttr> parseRangeBody(AsmParser &parser);
void printRangeBody(AsmPrinter &printer, RangeAttr range);

/// `custom<Range>` in op formats: `a to b`.
ParseResult parseRange(OpAsmParser &parser, RangeAttr &range);
void printRange(OpAsmPrinter &printer, Operation *op, RangeAttr range);

/// `custom<Chunk>` in op formats: chunk types printed in full
/// (`!kvc.chunk<...>`), where ODS would print them stripped (`<...>`).
ParseResult parseChunk(OpAsmParser &parser, Type &type);
ParseResult parseChunk(OpAsmParser &parser, SmallVectorImpl<Type> &types);
void printChunk(OpAsmPrinter &printer, Operation *op, Type type);
void printChunk(OpAsmPrinter &printer, Operation *op, TypeRange types);

/// Checks that `range` is non-empty, starts at 0 or later and, when `limit`
/// is positive, ends at or before it. Diagnostics name `field` ("tokens").
LogicalResult verifyRange(function_ref<InFlightDiagnostic()> emitError,
                          StringRef field, RangeAttr range, int64_t limit = 0,
                          StringRef limitName = "");

} // namespace kvc::compiler

#endif // KVC_DIALECT_KVC_IR_KVCATTRS_H
