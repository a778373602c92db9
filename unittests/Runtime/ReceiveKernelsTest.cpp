//===- ReceiveKernelsTest.cpp - A receive plan's generated kernels -------===//
//
// A transfer's receive plan run by a backend that launches generated
// kernels (HostKernelBackend.h), its sender in a thread at the other end of
// an in-process link: the plan's scatters launch the restore kernels they
// name, as a restore's do.
//
//===----------------------------------------------------------------------===//

#include "HostKernelBackend.h"

#include "kvc/Runtime/Net/Transfer.h"

#include <condition_variable>
#include <deque>
#include <thread>

namespace kvc::exec_test {
namespace {

CodecSpec codec(const char *text) { return *parseCodecSpec(text); }

/// One end of an in-process link: it sends into `out` and receives from
/// `in` (the other end's `out`).
class MemoryLink final : public Link {
public:
  struct Queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::string> messages;
    bool closed = false;
  };
  MemoryLink(std::shared_ptr<Queue> in, std::shared_ptr<Queue> out)
      : in_(std::move(in)), out_(std::move(out)) {}

  /// Two ends of one link.
  static std::pair<MemoryLink, MemoryLink> pair() {
    auto a = std::make_shared<Queue>(), b = std::make_shared<Queue>();
    return {MemoryLink(a, b), MemoryLink(b, a)};
  }
  Status send(std::string_view message) override {
    std::lock_guard<std::mutex> lock(out_->mutex);
    out_->messages.emplace_back(message);
    out_->ready.notify_all();
    return Status::ok();
  }
  StatusOr<std::string> receive(Milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(in_->mutex);
    if (!in_->ready.wait_for(lock, timeout, [&] {
          return !in_->messages.empty() || in_->closed;
        }))
      return Status(StatusCode::Unavailable, "memory link: timed out");
    if (in_->messages.empty())
      return Status(StatusCode::Unavailable, "memory link: the peer hung up");
    std::string message = std::move(in_->messages.front());
    in_->messages.pop_front();
    return message;
  }
  std::string describe() const override { return "memory"; }
  /// Hangs up: the peer's receives fail once it has read what was sent.
  void close() {
    std::lock_guard<std::mutex> lock(out_->mutex);
    out_->closed = true;
    out_->ready.notify_all();
  }

private:
  std::shared_ptr<Queue> in_, out_;
};

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
