//===- ReceiveKernelsTest.cpp - A receive plan's generated kernels -------===//
//
// A transfer's receive plan run by a backend that launches generated
// kernels (HostKernelDevice.h), its sender in a thread at the other end of
// an in-process link: the plan's scatters launch the restore kernels they
// name, as a restore's do; and a send plan's gathers the save kernels
// they name.
//
//===----------------------------------------------------------------------===//

#include "HostKernelDevice.h"

#include "kvc/Runtime/Net/Transfer.h"
#include "kvc/Testing/MemoryLink.h"

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
    StatusOr<SendStats> sent = internalError("not sent");
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

// A transfer's send plan on a backend that launches kernels prefills into
// the backend's cache, and its gathers launch the save kernels they name
// there; without the kernel table the prefill hands the objects over to
// the host's encoder. The receiver gets every chunk either way, within the
// codec's bound of the sender's KV.
TEST_F(KernelLaunchTest, ASendPlanLaunchesTheSaveKernelsItNames) {
  const int64_t layers = model_->config().numLayers;
  const int64_t chunks = (kTokens + 63) / 64;
  const CodecSpec int8 = codec("int8+zstd");
  ChunkObjects objects(model_->config(), model_->fingerprint(), "",
                       {64, layers});
  BundlePlan sends = savePlanFor(objects, kTokens, {Form::KV}, int8, "decode");
  for (BundleTask &task : sends.tasks)
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Store)
        step.kind = StepKind::Send;
  StatusOr<PlanBundle> bundle = withSaveKernels(sends, objects, int8);
  ASSERT_TRUE(bundle) << bundle.status().toString();
  for (bool kernels : {true, false}) {
    SCOPED_TRACE(kernels ? "with the kernel table" : "without");
    StatusOr<SendOptions> options =
        sendOptionsFor(bundle->plans.front(), objects, kTokens);
    ASSERT_TRUE(options.isOk()) << options.status().toString();
    options->device = &kernels_;
    if (kernels)
      options->kernels = &bundle->kernels;
    kernels_.saves = 0;
    auto [sending, receiving] = MemoryLink::pair();
    StatusOr<SendStats> sent = internalError("not sent");
    std::thread sender([&, &sending = sending] {
      sent = sendContext(*model_, objects, tokens_, sending, *options);
      sending.close();
    });
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<ReceiveMetrics> metrics =
        receiveContext(receiving, objects, targetFor(table), {});
    sender.join();
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    ASSERT_TRUE(sent->planRun.has_value());
    EXPECT_EQ(sent->planRun->kernelChunks, kernels ? chunks : 0);
    EXPECT_EQ(kernels_.saves, kernels ? chunks : 0);
    EXPECT_EQ(sent->received, chunks);
    EXPECT_EQ(metrics->received, chunks);
    EXPECT_TRUE(metrics->fallbacks.empty());
    EXPECT_LT(relativeError(table), 0.05);
    cache_->release(table);
  }
}

} // namespace
} // namespace kvc::exec_test
