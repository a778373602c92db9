//===- BackendRegistryTest.cpp - Backends by name -------------------------===//

#include "kvc/Runtime/Device/Registry.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace kvc;

namespace {

TEST(BackendRegistry, TheCpuIsAlwaysThere) {
  StatusOr<Device *> cpu = openDevice("cpu");
  ASSERT_TRUE(cpu) << cpu.status().toString();
  EXPECT_EQ(*cpu, &cpuDevice());
  DeviceOptions bf16;
  bf16.gemm = "bf16";
  EXPECT_EQ(openDevice("cpu", bf16).status().code(),
            StatusCode::InvalidArgument);
}

TEST(BackendRegistry, AnUnknownNameListsTheDriversThere) {
  StatusOr<Device *> none = openDevice("rocm");
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
  registerDriver("test-driver",
                 [&](const DeviceOptions &options) -> StatusOr<Device *> {
                   ++opened;
                   if (options.device != 0)
                     return unavailable("no such device");
                   return &cpuDevice();
                 });
  registerDriver("test-driver", [](const DeviceOptions &) {
    return StatusOr<Device *>(invalidArgument("second registration"));
  });
  std::vector<std::string> names = backendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "test-driver"), names.end());
  StatusOr<Device *> backend = openDevice("test-driver");
  ASSERT_TRUE(backend) << backend.status().toString();
  EXPECT_EQ(*backend, &cpuDevice());
  DeviceOptions other;
  other.device = 3;
  EXPECT_EQ(openDevice("test-driver", other).status().code(),
            StatusCode::Unavailable);
  EXPECT_EQ(opened, 2);
}

} // namespace
