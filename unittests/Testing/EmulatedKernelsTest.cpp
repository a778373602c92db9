//===- EmulatedKernelsTest.cpp - A bundle's kernels without a GPU ---------===//
//
// The kernels kvc-opt generated for the executor's tests
// (exec-kernels.json), each checked on the case kvc-kernel-bench draws for
// it (caseFor; a restore also over 16 chunks in one launch), with its PTX
// run by the PTX interpreter: the checks GpuKernels.BitExactOnTheGpu runs
// on a GPU, through the same KernelDevice seam.
//
//===----------------------------------------------------------------------===//

#include "kvc/Testing/KernelDevice.h"

#include <gtest/gtest.h>

namespace {

using namespace kvc::testing;

TEST(EmulatedKernelsTest, TheExecutorsKernelsEqualTheRuntime) {
#ifndef KVC_EXEC_KERNELS
  GTEST_SKIP() << "built without the compiler: no generated kernels";
#else
  kvc::StatusOr<kvc::PlanBundle> bundle = kvc::readPlanBundle(KVC_EXEC_KERNELS);
  ASSERT_TRUE(bundle) << bundle.status().message();
  ASSERT_FALSE(bundle->kernels.empty());
  for (const kvc::BundleKernel &kernel : bundle->kernels) {
    SCOPED_TRACE(kernel.name);
    kvc::StatusOr<std::unique_ptr<PtxDevice>> device = PtxDevice::make(kernel);
    ASSERT_TRUE(device) << device.status().message();
    const bool restore = kernel.kind == kvc::BundleKernel::Kind::Restore;
    for (int64_t chunks : {1, 16}) {
      if (chunks > 1 && !restore)
        continue;
      kvc::StatusOr<KernelCase> c = caseFor(kernel, chunks);
      ASSERT_TRUE(c) << c.status().message();
      auto onDevice = CaseOnDevice::make(**device, kernel, *c);
      ASSERT_TRUE(onDevice) << onDevice.status().message();
      kvc::StatusOr<CacheErrors> errors = (*onDevice)->check();
      ASSERT_TRUE(errors) << errors.status().message();
      EXPECT_TRUE(errors->ok()) << chunks << " chunks: " << errors->str();
      EXPECT_GT((*device)->stats().stores, 0u);
    }
  }
#endif
}

} // namespace
