//===- KVCOps.h - Operations of the kvc dialect -----------------*- C++ -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCOPS_H
#define KVC_DIALECT_KVC_IR_KVCOPS_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCAttrs.h"
#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Dialect/KVC/IR/KVCTypes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "kvc/Dialect/KVC/IR/KVCInterfaces.h.inc"

namespace kvc::compiler {

/// Returns the `kvc.model` of the closest enclosing op that has one, or null.
ModelAttr lookupModel(Operation *op);
/// Returns the `kvc.target` of the closest enclosing op that has one, or null.
TargetAttr lookupTarget(Operation *op);

namespace detail {
/// The one thing a stage op changes about its chunk.
enum class Stage {
  Decompress,
  Compress,
  Dequant,
  Quant,
  Untransform,
  Transform,
  ToDevice,
  ToHost,
};
/// Shared verifier of the stage ops (see KVC_StageOp in KVCOps.td).
LogicalResult verifyStageOp(Operation *op, Stage stage);
} // namespace detail

} // namespace kvc::compiler

#define GET_OP_CLASSES
#include "kvc/Dialect/KVC/IR/KVCOps.h.inc"

#endif // KVC_DIALECT_KVC_IR_KVCOPS_H
