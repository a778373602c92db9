//===- ReceiveKernelsTest.cpp - A receive plan's generated kernels -------===//
//
// A transfer's receive plan run by a backend that launches generated
// kernels (HostKernelBackend.h), its sender in a thread at the other end of
// an in-process link: the plan's scatters launch the restore kernels they
// name, as a restore's do.
//
//===----------------------------------------------------------------------===//

#include "HostKernelBackend.h"

#include "MemoryLink.h"
#include "kvc/Runtime/Net/Transfer.h"

#include <thread>

namespace kvc::exec_test {
namespace {

CodecSpec codec(const char *text) { return *parseCodecSpec(text); }

// A transfer's receive plan launches the restore kernels its tasks name,
// as a restore's does: each chunk crosses to the device encoded and the
// kernel decodes and scatters it; without the kernel table the runtime
// decodes them. Both caches are the sender's KV within its codec's bound.
TEST_F(KernelLaunchTest, AReceivePlanLaunchesTheKernelsItNames) {
  const int64_t layers = model_->config().numLayers;
  const CodecSpec int8 = codec("int8+zstd");
  // Chunks of 64 tokens x every layer, each one object of the transfer.
  PlanBundle bundle =
      *withKernels(makePlan({0, 0, 64}, layers), model_->config(), int8);
  BundlePlan &plan = bundle.plans.front();
  for (BundleTask &task : plan.tasks)
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch) {
        step.kind = StepKind::Recv;
        step.node = "prefill";
        step.tier.clear();
      }
  ChunkObjects objects(model_->config(), model_->fingerprint(), "",
                       {64, layers});
  for (bool kernels : {true, false}) {
    SCOPED_TRACE(kernels ? "with the kernel table" : "without");
    auto [sending, receiving] = MemoryLink::pair();
    StatusOr<SendStats> sent = Status(StatusCode::Internal, "not sent");
    std::thread sender([&, &sending = sending] {
      SendOptions options;
      options.codec = int8;
      sent = sendContext(*model_, objects, tokens_, sending, options);
      sending.close();
    });
    StatusOr<ReceiveOptions> options =
        receiveOptionsFor(plan, objects, kTokens);
    ASSERT_TRUE(options.isOk()) << options.status().toString();
    if (kernels)
      options->kernels = &bundle.kernels;
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<ReceiveMetrics> metrics =
        receiveContext(receiving, objects, targetFor(table), *options);
    sender.join();
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    ASSERT_TRUE(metrics->planRun.has_value());
    EXPECT_EQ(metrics->received, (kTokens + 63) / 64);
    EXPECT_TRUE(metrics->fallbacks.empty());
    EXPECT_EQ(metrics->planRun->kernelChunks,
              kernels ? (kTokens + 63) / 64 : 0);
    EXPECT_TRUE(metrics->planRun->kernelsNotLaunched.empty());
    EXPECT_LT(relativeError(table), 0.05);
    cache_->release(table);
  }
}

} // namespace
} // namespace kvc::exec_test
