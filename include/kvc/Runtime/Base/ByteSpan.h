//===- ByteSpan.h - Caller memory a reader fills ----------------*- C++ -*-===//
//
// A run of bytes a reader writes into: a stored object read in parts, each
// where it is used (Tier::getInto), such as rows of a paged cache's blocks
// (PagedKVCache::hostRows).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_BYTESPAN_H
#define KVC_RUNTIME_BASE_BYTESPAN_H

#include <cstddef>
#include <vector>

namespace kvc {

struct ByteSpan {
  char *data = nullptr;
  std::size_t size = 0;
};

/// The bytes `parts` hold together.
inline std::size_t totalSize(const std::vector<ByteSpan> &parts) {
  std::size_t total = 0;
  for (const ByteSpan &part : parts)
    total += part.size;
  return total;
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_BYTESPAN_H
