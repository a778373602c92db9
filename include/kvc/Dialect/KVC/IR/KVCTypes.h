//===- KVCTypes.h - Types of the kvc dialect --------------------*- C++ -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCTYPES_H
#define KVC_DIALECT_KVC_IR_KVCTYPES_H

#include "kvc/Support/MLIR.h"

#include "kvc/Dialect/KVC/IR/KVCAttrs.h"

#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "kvc/Dialect/KVC/IR/KVCTypes.h.inc"

#endif // KVC_DIALECT_KVC_IR_KVCTYPES_H
