//===- RedisTier.h - The redis:// tier --------------------------*- C++ -*-===//

#ifndef KVC_LIB_RUNTIME_STORE_REDISTIER_H
#define KVC_LIB_RUNTIME_STORE_REDISTIER_H

#include "kvc/Runtime/Store/Tier.h"

namespace kvc {

/// Connects to `hostPortDb` ("HOST:PORT[/DB]"); `url` names it in messages.
StatusOr<std::unique_ptr<Tier>> openRedisTier(const std::string &url,
                                              const std::string &hostPortDb);

} // namespace kvc

#endif // KVC_LIB_RUNTIME_STORE_REDISTIER_H
