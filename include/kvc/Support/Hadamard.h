//===- Hadamard.h - The blocks a Hadamard rotation works in -----*- C++ -*-===//
//
// One rule for every layer that meets a Hadamard codec: the runtime's codec
// rotating and unrotating rows, the dialect's verifiers refusing a source,
// save or transfer whose model it cannot rotate, and the codec choice
// leaving such codecs out. KV rows rotate head by head; hidden-state rows in
// the largest power of two, up to 256, that divides them.
//
// Part of kvc's support library: no LLVM, no MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_SUPPORT_HADAMARD_H
#define KVC_SUPPORT_HADAMARD_H

#include "kvc/Support/Vocabulary.h"

namespace kvc {

/// The block rows of `width` values of `form` rotate in (`headDim` for KV).
inline int64_t hadamardBlock(Form form, int64_t width, int64_t headDim) {
  if (form == Form::KV)
    return headDim;
  int64_t block = 1;
  while (block < 256 && width % (block * 2) == 0)
    block *= 2;
  return block;
}

/// Whether a Hadamard codec can rotate such rows: in blocks of a power of
/// two, at least 2, that divide the row.
inline bool hadamardRotates(Form form, int64_t width, int64_t headDim) {
  const int64_t block = hadamardBlock(form, width, headDim);
  return block >= 2 && (block & (block - 1)) == 0 && width % block == 0;
}

} // namespace kvc

#endif // KVC_SUPPORT_HADAMARD_H
