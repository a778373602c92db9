//===- SealedTier.h - Objects sealed under a deployment key -----*- C++ -*-===//
//
// A shared store is writable by every server that reaches it. With a
// deployment key, every object a tier holds carries a MAC under it
// (HMAC-SHA256 over the object's name and bytes, appended as 32 bytes), and
// every read checks it before the bytes are used: an object written
// without the key, altered, or moved to another name is corrupt (recomputed
// and reported, never served), whatever its checksums say.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_STORE_SEALEDTIER_H
#define KVC_LIB_RUNTIME_STORE_SEALEDTIER_H

#include "kvc/Runtime/Store/Tier.h"

namespace kvc {

/// Bytes of the MAC each sealed object ends in.
inline constexpr std::size_t kSealBytes = 32;

/// `inner` with every object sealed under `key` (at least 16 bytes).
StatusOr<std::unique_ptr<Tier>> sealTier(std::unique_ptr<Tier> inner,
                                         std::string key);

/// The deployment key in `path` (its bytes, a trailing newline dropped);
/// the message never holds the key.
StatusOr<std::string> readDeploymentKey(const std::string &path);

} // namespace kvc

#endif // KVC_LIB_RUNTIME_STORE_SEALEDTIER_H
