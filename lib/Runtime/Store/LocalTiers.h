//===- LocalTiers.h - What the local tiers' files share ---------*- C++ -*-===//
//
// Private to lib/Runtime/Store: the file:// tier's opener (FileTier.cpp),
// which the scheme table in Tier.cpp names, and what it shares with the
// mem:// tier there.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_STORE_LOCALTIERS_H
#define KVC_LIB_RUNTIME_STORE_LOCALTIERS_H

#include "kvc/Runtime/Store/Tier.h"

#include <memory>
#include <string>

namespace kvc {

/// The file:// tier at `url`'s absolute path (?capacity_mb bounds it); a
/// reader's (TierAccess::Existing) must exist, a writer's must be creatable.
StatusOr<std::unique_ptr<Tier>> openFileTier(TierUrl &url);

/// The error of a read of `name`, which the tier `url` does not hold.
Status missingObject(const std::string &url, const std::string &name);

} // namespace kvc

#endif // KVC_LIB_RUNTIME_STORE_LOCALTIERS_H
