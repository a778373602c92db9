//===- BackendRegistryTest.cpp - Backends by name -------------------------===//

#include "kvc/Runtime/Backend/Registry.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace kvc;

namespace {

TEST(BackendRegistry, TheCpuIsAlwaysThere) {
  StatusOr<Backend *> cpu = openBackend("cpu");
  ASSERT_TRUE(cpu) << cpu.status().toString();
  EXPECT_EQ(*cpu, &cpuBackend());
  BackendOptions bf16;
  bf16.gemm = "bf16";
  EXPECT_EQ(openBackend("cpu", bf16).status().code(),
            StatusCode::InvalidArgument);
}

TEST(BackendRegistry, AnUnknownNameListsTheDriversThere) {
  StatusOr<Backend *> none = openBackend("rocm");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), StatusCode::InvalidArgument);
  EXPECT_NE(none.status().message().find("no backend \"rocm\" in this build "
                                         "(it has cpu"),
            std::string::npos)
      << none.status().message();
}

// A driver is a registration: its name opens it, with the options given,
// and the first registration of a name stays.
TEST(BackendRegistry, ADriverRegistersByName) {
  int opened = 0;
  registerBackend("test-driver", [&](const BackendOptions &options)
                                     -> StatusOr<Backend *> {
    ++opened;
    if (options.device != 0)
      return Status(StatusCode::Unavailable, "no such device");
    return &cpuBackend();
  });
  registerBackend("test-driver", [](const BackendOptions &) {
    return StatusOr<Backend *>(invalidArgument("second registration"));
  });
  std::vector<std::string> names = backendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "test-driver"), names.end());
  StatusOr<Backend *> backend = openBackend("test-driver");
  ASSERT_TRUE(backend) << backend.status().toString();
  EXPECT_EQ(*backend, &cpuBackend());
  BackendOptions other;
  other.device = 3;
  EXPECT_EQ(openBackend("test-driver", other).status().code(),
            StatusCode::Unavailable);
  EXPECT_EQ(opened, 2);
}

} // namespace
