//===- KVCDialect.h - The kvc dialect ---------------------------*- C++ -*-===//

#ifndef KVC_DIALECT_KVC_IR_KVCDIALECT_H
#define KVC_DIALECT_KVC_IR_KVCDIALECT_H

#include "kvc/Support/MLIR.h"

#include "mlir/IR/Dialect.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h.inc"

#endif // KVC_DIALECT_KVC_IR_KVCDIALECT_H
