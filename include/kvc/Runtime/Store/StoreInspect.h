//===- StoreInspect.h - What a store holds, checked -------------*- C++ -*-===//
//
// For an operator (kvc-run store stat|verify|gc): every object of a tier
// read and checked as a restore would check it (magic, header and payload
// checksums, length, the seal under a deployment key, and that the object
// is filed under the name its header claims), and summed per model and
// encoding. Keys are salted digests, so tenants cannot be told apart from
// the objects alone.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_STORE_STOREINSPECT_H
#define KVC_RUNTIME_STORE_STOREINSPECT_H

#include "kvc/Runtime/Store/Tier.h"

#include <map>
#include <string>
#include <vector>

namespace kvc {

struct StoreReport {
  struct Sizes {
    int64_t objects = 0, bytes = 0;
  };
  /// Per model fingerprint (hex), and per "<form> <encoding>" within it.
  std::map<std::string, Sizes> models;
  std::map<std::string, std::map<std::string, Sizes>> encodings;
  /// Layout records (ChunkStore::recordLayout).
  Sizes layouts;
  /// Objects that fail their checks, and why.
  struct Failed {
    std::string name, why;
  };
  std::vector<Failed> failed;
  /// Failed objects removed (inspectStore's removeFailed).
  int64_t removed = 0;
};

/// Reads every object of `tier` and checks it; with `removeFailed`, removes
/// those that fail. Unavailable when the tier cannot be read.
StatusOr<StoreReport> inspectStore(Tier &tier, bool removeFailed = false);

} // namespace kvc

#endif // KVC_RUNTIME_STORE_STOREINSPECT_H
