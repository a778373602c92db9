//===- KVCDialect.cpp - The kvc dialect -----------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCDialect.h"

#include "kvc/Dialect/KVC/IR/KVCOps.h"

#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace kvc::compiler;

#include "kvc/Dialect/KVC/IR/KVCDialect.cpp.inc"

namespace {
/// Prints long descriptions once, at the top, as `#model`, `#target`, `#src`.
struct KVCOpAsmDialectInterface : public OpAsmDialectInterface {
  using OpAsmDialectInterface::OpAsmDialectInterface;

  AliasResult getAlias(Attribute attr, raw_ostream &os) const override {
    if (isa<ModelAttr>(attr)) {
      os << "model";
      return AliasResult::FinalAlias;
    }
    if (isa<TargetAttr>(attr)) {
      os << "target";
      return AliasResult::FinalAlias;
    }
    if (isa<SourceAttr>(attr)) {
      os << "src";
      return AliasResult::FinalAlias;
    }
    return AliasResult::NoAlias;
  }
};
} // namespace

void KVCDialect::initialize() {
  registerAttributes();
  registerTypes();
  addOperations<
#define GET_OP_LIST
#include "kvc/Dialect/KVC/IR/KVCOps.cpp.inc"
      >();
  addInterfaces<KVCOpAsmDialectInterface>();
}

LogicalResult KVCDialect::verifyOperationAttribute(Operation *op,
                                                   NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == kModelAttrName) {
    if (!isa<ModelAttr>(attr.getValue()))
      return op->emitError("'") << name << "' expects a #kvc.model, got "
                                << attr.getValue();
    return success();
  }
  if (name == kTargetAttrName) {
    if (!isa<TargetAttr>(attr.getValue()))
      return op->emitError("'") << name << "' expects a #kvc.target, got "
                                << attr.getValue();
    return success();
  }
  if (name == kTimeAttrName) {
    auto times = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (!times || times.size() != 2 || times[0] < 0 || times[0] > times[1])
      return op->emitError("'")
             << name << "' expects array<i64: start, finish> with 0 <= start "
                        "<= finish, got "
             << attr.getValue();
    return success();
  }
  if (name == kBytesAttrName) {
    auto bytes = dyn_cast<IntegerAttr>(attr.getValue());
    if (!bytes || !bytes.getType().isInteger(64) || bytes.getInt() < 0)
      return op->emitError("'") << name << "' expects a non-negative i64, got "
                                << attr.getValue();
    if (!isa<FetchOp>(op))
      return op->emitError("'") << name << "' belongs on kvc.fetch";
    return success();
  }
  if (name == kEntryAttrName) {
    if (isa<KernelOp>(op) ? isa<FlatSymbolRefAttr>(attr.getValue())
                          : isa<DictionaryAttr>(attr.getValue()))
      return success();
    return op->emitError("'")
           << name
           << "' names the generated function on a kvc.kernel and holds "
              "that function's specialization elsewhere, got "
           << attr.getValue();
  }
  if (name == kPrologueAttrName) {
    if (isa<KernelOp>(op) && isa<FlatSymbolRefAttr>(attr.getValue()))
      return success();
    return op->emitError("'") << name
                              << "' names a generated function on a "
                                 "kvc.kernel, got "
                              << attr.getValue();
  }
  return op->emitError("unknown kvc attribute '") << name << "'";
}
