//===- StoreObjects.h - What a test's tier holds ----------------*- C++ -*-===//

#ifndef KVC_UNITTESTS_RUNTIME_STOREOBJECTS_H
#define KVC_UNITTESTS_RUNTIME_STOREOBJECTS_H

#include "kvc/Runtime/Store/Tier.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvc::test {

/// The chunk objects `tier` holds, in name order: its names less the
/// stores' layout records (recordedLayouts), which no save removes.
inline std::vector<std::string> chunkObjects(Tier &tier) {
  StatusOr<std::vector<std::string>> names = tier.list("");
  EXPECT_TRUE(names) << names.status().toString();
  std::vector<std::string> objects;
  if (names)
    for (const std::string &name : *names)
      if (name.rfind("layouts/", 0) != 0)
        objects.push_back(name);
  return objects;
}

} // namespace kvc::test

#endif // KVC_UNITTESTS_RUNTIME_STOREOBJECTS_H
