//===- TransferTest.cpp - KV transfers between processes ------------------===//
//
// The sender runs in a child process (forked before either side touches
// UCX), the receiver here; they meet on loopback. Faults are the child's:
// it dies, corrupts a message, speaks for another model, or falls silent.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Net/Transfer.h"
#include "ForwardingDevice.h"
#include "TestModel.h"
#include "kvc/Host/Session.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Net/CodecController.h"
#include "kvc/Runtime/Save/SavePlan.h"
#include "kvc/Testing/MemoryLink.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <random>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace kvc {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kTokens = 512;

std::vector<int32_t> requestTokens(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(kTokens);
  for (int32_t &t : tokens)
    t = int32_t(rng() % 512);
  return tokens;
}

/// A link that does something to the sender's messages first.
class FaultyLink : public Link {
public:
  /// `fault(index, message)` sees each message before it is sent.
  FaultyLink(std::unique_ptr<Link> inner,
             std::function<void(int, std::string &)> fault)
      : inner_(std::move(inner)), fault_(std::move(fault)) {}

  Status send(std::string_view message) override {
    std::string copy(message);
    fault_(sent_++, copy);
    return inner_->send(copy);
  }
  StatusOr<std::string> receive(Milliseconds timeout) override {
    return inner_->receive(timeout);
  }
  std::string describe() const override { return inner_->describe(); }

private:
  std::unique_ptr<Link> inner_;
  std::function<void(int, std::string &)> fault_;
  int sent_ = 0;
};

/// A link that records where each chunk it receives starts (its token and
/// layer), in order.
class RecordingLink : public Link {
public:
  RecordingLink(std::unique_ptr<Link> inner,
                std::vector<std::pair<int64_t, int64_t>> &order)
      : inner_(std::move(inner)), order_(order) {}

  Status send(std::string_view message) override {
    return inner_->send(message);
  }
  StatusOr<std::string> receive(Milliseconds timeout) override {
    StatusOr<std::string> message = inner_->receive(timeout);
    if (message.isOk() && message->size() > 5 && (*message)[4] == 'C')
      if (StatusOr<ChunkHeader> header =
              readChunkHeader(std::string_view(*message).substr(5));
          header.isOk())
        order_.emplace_back(header->tokenBegin, header->layerBegin);
    return message;
  }
  std::string describe() const override { return inner_->describe(); }

private:
  std::unique_ptr<Link> inner_;
  std::vector<std::pair<int64_t, int64_t>> &order_;
};

/// Where each of `objects`' objects for `tokens` starts (token, layer),
/// token-major, or layer-major when `layerWise`.
std::vector<std::pair<int64_t, int64_t>>
objectOrder(const ChunkObjects &objects, const std::vector<int32_t> &tokens,
            bool layerWise) {
  std::vector<std::pair<int64_t, int64_t>> order;
  for (const ChunkRef &ref : objects.refs(tokens.data(), int64_t(tokens.size()),
                                          Form::KV, CodecSpec()))
    order.emplace_back(ref.tokenBegin, ref.layerBegin);
  if (layerWise)
    std::stable_sort(
        order.begin(), order.end(),
        [](const auto &a, const auto &b) { return a.second < b.second; });
  return order;
}

/// A transfer's two plans as kvc-expand shapes them, over the objects of
/// `objects`' layout in objectOrder's order: the sender's gather, compress
/// (a codec with a lossless stage) and send to "decode", beside a prefill
/// of the whole request in one step when layer-wise; the receiver's recv
/// from "prefill", copy to the device and scatter.
std::pair<BundlePlan, BundlePlan>
transferPlans(const ChunkObjects &objects, const std::vector<int32_t> &tokens,
              const CodecSpec &codec, bool layerWise) {
  const int64_t n = int64_t(tokens.size());
  const int64_t layers = objects.model().numLayers;
  std::pair<BundlePlan, BundlePlan> plans;
  auto &[sender, receiver] = plans;
  sender.name = "t_send";
  receiver.name = "t_recv";
  for (BundlePlan *plan : {&sender, &receiver}) {
    plan->tokens = {0, n};
    plan->layers = {0, layers};
  }
  const StoreLayout &layout = objects.layout();
  if (layerWise)
    sender.prefillStep =
        (n + layout.chunkTokens - 1) / layout.chunkTokens * layout.chunkTokens;
  auto add = [](BundlePlan &plan, Resource resource,
                std::vector<BundleStep> steps, bool chained) {
    BundleTask task;
    task.id = int64_t(plan.tasks.size());
    task.resource = resource;
    if (chained)
      task.after = task.inputs = {task.id - 1};
    task.steps = std::move(steps);
    plan.tasks.push_back(std::move(task));
  };
  for (auto [t, l] : objectOrder(objects, tokens, layerWise)) {
    BundleStep box;
    box.tokens = {t, std::min(n, t + layout.chunkTokens)};
    box.layers = {l, std::min(layers, l + layout.layerGroup)};
    auto step = [&](StepKind kind, const CodecSpec &as) {
      BundleStep out = box;
      out.kind = kind;
      out.codec = as;
      return out;
    };
    add(sender, Resource::Compute, {step(StepKind::Gather, {})}, false);
    if (codec.lossless != CodecSpec::Lossless::None)
      add(sender, Resource::Decode, {step(StepKind::Compress, codec)}, true);
    BundleStep send = step(StepKind::Send, codec);
    send.node = "decode";
    add(sender, Resource::Net, {send}, true);
    BundleStep recv = step(StepKind::Recv, codec);
    recv.node = "prefill";
    add(receiver, Resource::Net, {recv}, false);
    add(receiver, Resource::H2D, {step(StepKind::TransferToDevice, codec)},
        true);
    add(receiver, Resource::Compute, {step(StepKind::Scatter, {})}, true);
  }
  return plans;
}

/// A sender process: forked first, it connects once the receiver says its
/// port and runs `body` on the link; its exit code is what `body` returns.
class SenderProcess {
public:
  explicit SenderProcess(std::function<int(std::unique_ptr<Link>)> body) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[1]);
      int port = 0;
      if (::read(fds[0], &port, sizeof port) != sizeof port)
        ::_exit(90);
      StatusOr<std::unique_ptr<Link>> link =
          connectUcx("127.0.0.1", port, 5000ms);
      ::_exit(link.isOk() ? body(std::move(*link)) : 91);
    }
    ::close(fds[0]);
    portPipe_ = fds[1];
  }

  ~SenderProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  /// Tells the child where to connect.
  void connectTo(int port) {
    EXPECT_EQ(::write(portPipe_, &port, sizeof port), ssize_t(sizeof port));
    ::close(portPipe_);
  }

  /// The child's exit code (-signal when killed).
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

  void kill() { ::kill(pid_, SIGKILL); }

private:
  pid_t pid_ = -1;
  int portPipe_ = -1;
  bool reaped_ = false;
};

class TransferTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    modelDir_ = new std::string(test::generateTestModel("transfer", 1));
    otherDir_ = new std::string(test::generateTestModel("transfer-other", 2));
  }
  static void TearDownTestSuite() {
    delete modelDir_;
    delete otherDir_;
  }

  void SetUp() override {
    model_ = *LlamaModel::load(*modelDir_);
    tokens_ = requestTokens(7);
  }

  /// The sender's side, in the child: prefills the request with the model
  /// in `dir` and sends it.
  static int send(const std::string &dir, std::unique_ptr<Link> link,
                  SendOptions options = {},
                  std::function<void(int, std::string &)> fault = {},
                  StoreLayout layout = {128, 1}) {
    std::unique_ptr<LlamaModel> model = *LlamaModel::load(dir);
    ChunkObjects objects(model->config(), model->fingerprint(), "", layout);
    if (fault)
      link = std::make_unique<FaultyLink>(std::move(link), fault);
    StatusOr<SendStats> stats =
        sendContext(*model, objects, requestTokens(7), *link, options);
    if (!stats.isOk()) {
      // In the test's log: why the sender's exit code is what it is.
      std::fprintf(stderr, "sender: %s\n", stats.status().toString().c_str());
      return stats.status().code() == StatusCode::FailedPrecondition ? 3 : 4;
    }
    return int(stats->recomputed);
  }

  /// Receives from `sender` into a fresh cache; records in `order` the
  /// token and layer each chunk message starts at, as they arrive.
  StatusOr<ReceiveMetrics>
  receive(SenderProcess &sender, ReceiveOptions options = {},
          std::vector<std::pair<int64_t, int64_t>> *order = nullptr) {
    KVC_ASSIGN_OR_RETURN(listener, listenUcx("127.0.0.1", 0));
    sender.connectTo(listener->port());
    KVC_ASSIGN_OR_RETURN(accepted, listener->accept(5000ms));
    std::unique_ptr<Link> link = std::move(accepted);
    if (order)
      link = std::make_unique<RecordingLink>(std::move(link), *order);
    KVC_ASSIGN_OR_RETURN(
        into, host::destinationFor(cpuDevice(), *model_, tokens_, nullptr, {}));
    destination_ = std::move(into);
    ChunkObjects local(model_->config(), model_->fingerprint(), "", {});
    return receiveContext(*link, local, destination_->target, options);
  }

  /// The two ways to receive what send() sends (raw, objects of 128
  /// tokens x 1 layer), by name: writing each chunk as it arrives, and
  /// running a receive plan.
  std::vector<std::pair<std::string, ReceiveOptions>> receivers() {
    ChunkObjects objects(model_->config(), model_->fingerprint(), "", {128, 1});
    receivePlan_ = transferPlans(objects, tokens_, CodecSpec(), false).second;
    StatusOr<ReceiveOptions> planned =
        receiveOptionsFor(receivePlan_, objects, int64_t(tokens_.size()));
    EXPECT_TRUE(planned.isOk()) << planned.status().toString();
    return {
        {"as chunks arrive", {}},
        {"by a receive plan", planned.isOk() ? *planned : ReceiveOptions()}};
  }

  /// The received cache against a full prefill, held to `codecs`' bound.
  void expectVerified(const std::vector<CodecSpec> &codecs) {
    StatusOr<RestoreError> error = restoreError(
        *model_, tokens_, *destination_->cache, destination_->table);
    ASSERT_TRUE(error.isOk()) << error.status().toString();
    Status verified =
        host::checkVerification(*error, host::verifyBound(codecs));
    EXPECT_TRUE(verified.isOk()) << verified.toString();
  }

  static std::string *modelDir_, *otherDir_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<int32_t> tokens_;
  std::unique_ptr<host::Destination> destination_;
  BundlePlan receivePlan_;
};

std::string *TransferTest::modelDir_ = nullptr;
std::string *TransferTest::otherDir_ = nullptr;

/// Chunks of 128 tokens x 1 layer: 4 x 4 of them.
constexpr int64_t kChunks = 16;

// The sender runs a send plan (the one savePlanFor makes for the layout
// when none was compiled): its trace shows each object's send, and the
// compress a lossy codec adds before it.
TEST_F(TransferTest, DeliversTheCacheAFullPrefillMakes) {
  for (const char *spec : {"raw", "int4+zstd"}) {
    SCOPED_TRACE(spec);
    CodecSpec codec = *parseCodecSpec(spec);
    SendOptions options;
    options.codec = codec;
    options.tracePath = ::testing::TempDir() + "/kvc-send-" +
                        std::string(codec.isRaw() ? "raw" : "int4") + ".json";
    std::remove(options.tracePath.c_str());
    SenderProcess sender([&](std::unique_ptr<Link> link) {
      return send(*modelDir_, std::move(link), options);
    });
    LayerProgress progress;
    ReceiveOptions receiving;
    receiving.progress = &progress;
    StatusOr<ReceiveMetrics> metrics = receive(sender, receiving);
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    EXPECT_EQ(sender.wait(), 0); // Its receipt says nothing was recomputed.
    EXPECT_EQ(metrics->chunks, kChunks);
    EXPECT_EQ(metrics->received, kChunks);
    EXPECT_TRUE(metrics->fallbacks.empty());
    EXPECT_TRUE(metrics->lost.empty()) << metrics->lost;
    EXPECT_EQ(metrics->chunksPerCodec,
              (std::map<std::string, int64_t>{{codec.str(), kChunks}}));
    for (int64_t layer = 0; layer < 4; ++layer)
      EXPECT_TRUE(progress.ready(layer));
    expectVerified({codec});
    std::ifstream in(options.tracePath);
    const std::string trace((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    EXPECT_NE(trace.find("send 0:128 L0"), std::string::npos) << trace;
    EXPECT_EQ(trace.find("compress 0:128 L0") != std::string::npos,
              !codec.isRaw());
  }
}

// What did not arrive intact is recomputed, whether the chunks are written
// as they arrive or by a receive plan (as a restore recomputes a missing or
// corrupt chunk): the cache is exact either way.
TEST_F(TransferTest, RecomputesWhatADeadSenderDidNotSend) {
  for (const auto &[receiver, options] : receivers()) {
    SCOPED_TRACE(receiver);
    SenderProcess sender([&](std::unique_ptr<Link> link) {
      // Dies as a crash would, after the hello and three chunks.
      return send(*modelDir_, std::move(link), {},
                  [](int index, std::string &) {
                    if (index == 4)
                      ::_exit(9);
                  });
    });
    StatusOr<ReceiveMetrics> metrics = receive(sender, options);
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    EXPECT_EQ(sender.wait(), 9);
    EXPECT_FALSE(metrics->lost.empty());
    EXPECT_LE(metrics->received, 3);
    EXPECT_EQ(metrics->received + int64_t(metrics->fallbacks.size()), kChunks);
    ASSERT_FALSE(metrics->fallbacks.empty());
    EXPECT_NE(metrics->fallbacks.back().find("not received ("),
              std::string::npos)
        << metrics->fallbacks.back();
    expectVerified({CodecSpec()});
  }
}

TEST_F(TransferTest, RecomputesACorruptChunk) {
  for (const auto &[receiver, options] : receivers()) {
    SCOPED_TRACE(receiver);
    SenderProcess sender([&](std::unique_ptr<Link> link) {
      // Flips a payload byte of the second chunk (message 2 after the
      // hello).
      return send(*modelDir_, std::move(link), {},
                  [](int index, std::string &message) {
                    if (index == 2)
                      message[message.size() / 2] ^= 0x40;
                  });
    });
    StatusOr<ReceiveMetrics> metrics = receive(sender, options);
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    EXPECT_EQ(sender.wait(), 1); // The receipt: one chunk recomputed.
    EXPECT_EQ(metrics->received, kChunks - 1);
    ASSERT_EQ(metrics->fallbacks.size(), 1u);
    EXPECT_NE(metrics->fallbacks[0].find("checksum"), std::string::npos)
        << metrics->fallbacks[0];
    expectVerified({CodecSpec()});
  }
}

TEST_F(TransferTest, RejectsAMessageWithADamagedHeader) {
  SenderProcess sender([&](std::unique_ptr<Link> link) {
    return send(*modelDir_, std::move(link), {},
                [](int index, std::string &message) {
                  if (index == 3)
                    message[5 + 20] ^= 0x01; // Inside the chunk's header.
                });
  });
  StatusOr<ReceiveMetrics> metrics = receive(sender);
  ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
  EXPECT_EQ(sender.wait(), 1);
  ASSERT_EQ(metrics->rejected.size(), 1u);
  EXPECT_NE(metrics->rejected[0].find("header checksum"), std::string::npos)
      << metrics->rejected[0];
  EXPECT_EQ(metrics->fallbacks.size(), 1u);
  expectVerified({CodecSpec()});
}

TEST_F(TransferTest, RefusesTheKVOfAnotherModel) {
  SenderProcess sender([&](std::unique_ptr<Link> link) {
    return send(*otherDir_, std::move(link));
  });
  StatusOr<ReceiveMetrics> metrics = receive(sender);
  ASSERT_FALSE(metrics.isOk());
  EXPECT_EQ(metrics.status().code(), StatusCode::FailedPrecondition);
  EXPECT_EQ(chunkFault(metrics.status()), ChunkFault::WrongModel);
  EXPECT_EQ(sender.wait(), 3); // The sender was told: refused.
}

// A receiver asking for more decoders than any machine needs is refused
// before it reads the link.
TEST_F(TransferTest, RefusesMoreDecodersThanAnyMachineNeeds) {
  ChunkObjects objects(model_->config(), model_->fingerprint(), "", {128, 1});
  auto [sending, receiving] = MemoryLink::pair();
  StatusOr<std::unique_ptr<host::Destination>> into =
      host::destinationFor(cpuDevice(), *model_, tokens_, nullptr, {});
  ASSERT_TRUE(into.isOk()) << into.status().toString();
  ReceiveOptions options;
  options.decoders = 5000;
  StatusOr<ReceiveMetrics> metrics =
      receiveContext(receiving, objects, (*into)->target, options);
  ASSERT_FALSE(metrics.isOk());
  EXPECT_EQ(metrics.status().message(),
            "transfer: the decoders: 5000 workers (expected 1 to 1024)");
}

TEST_F(TransferTest, ASilentSenderTimesOutAndIsRecomputed) {
  SenderProcess sender([&](std::unique_ptr<Link> link) {
    // Sends the hello and two chunks, then hangs.
    return send(*modelDir_, std::move(link), {}, [](int index, std::string &) {
      if (index == 3)
        ::pause();
    });
  });
  ReceiveOptions options;
  options.timeout = 500ms;
  StatusOr<ReceiveMetrics> metrics = receive(sender, options);
  ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
  EXPECT_NE(metrics->lost.find("timed out"), std::string::npos)
      << metrics->lost;
  EXPECT_EQ(metrics->received + int64_t(metrics->fallbacks.size()), kChunks);
  expectVerified({CodecSpec()});
}

// A compiled transfer's plans set what each end does (a plan that sends
// layer by layer, a prefill of the whole request in one step, unless the
// caller chose the step); a plan of another kind, or one that sends hidden
// states, is refused with why.
TEST_F(TransferTest, CompiledPlansSetTheEncodingAndTheLayout) {
  const StoreLayout layout{128, 1};
  ChunkObjects objects(model_->config(), model_->fingerprint(), "", layout);
  const int64_t n = int64_t(tokens_.size());
  const CodecSpec int8 = *parseCodecSpec("int8");
  // A send plan and a receive plan as kvc-expand shapes them, reduced to
  // their endpoints.
  BundlePlan sender = savePlanFor(objects, n, {Form::KV}, int8, "decode");
  sender.name = "t_send";
  BundlePlan receiver = sender;
  receiver.name = "t_recv";
  for (BundlePlan *plan : {&sender, &receiver})
    for (BundleTask &task : plan->tasks)
      for (BundleStep &step : task.steps)
        if (step.kind == StepKind::Store)
          step.kind = plan == &sender ? StepKind::Send : StepKind::Recv;
        else
          step.kind = plan == &sender ? step.kind : StepKind::Decompress;
  StatusOr<SendOptions> send = sendOptionsFor(sender, objects, n);
  ASSERT_TRUE(send.isOk()) << send.status().toString();
  EXPECT_EQ(send->codec, int8);
  EXPECT_EQ(send->prefillTokens, 0); // The plan names no step: one chunk.
  // The plan's step, unless the caller chose one.
  BundlePlan layerWise = transferPlans(objects, tokens_, int8, true).first;
  layerWise.prefillStep = 384;
  send = sendOptionsFor(layerWise, objects, n);
  ASSERT_TRUE(send.isOk()) << send.status().toString();
  EXPECT_EQ(send->prefillTokens, 384);
  SendOptions chosen;
  chosen.prefillTokens = 128;
  send = sendOptionsFor(layerWise, objects, n, chosen);
  ASSERT_TRUE(send.isOk()) << send.status().toString();
  EXPECT_EQ(send->prefillTokens, 128);
  StatusOr<ReceiveOptions> receive = receiveOptionsFor(receiver, objects, n);
  ASSERT_TRUE(receive.isOk()) << receive.status().toString();
  EXPECT_EQ(receive->codec, std::optional<CodecSpec>(int8));
  ASSERT_TRUE(receive->layout.has_value());
  EXPECT_EQ(receive->layout->chunkTokens, 128);
  EXPECT_EQ(receive->layout->layerGroup, 1);

  EXPECT_EQ(sendOptionsFor(receiver, objects, n).status().message(),
            "plan t_recv has a decompress; it is no send plan");
  EXPECT_EQ(receiveOptionsFor(sender, objects, n).status().message(),
            "plan t_send receives nothing");
  BundlePlan hidden = savePlanFor(objects, n, {Form::Hidden}, int8, "decode");
  for (BundleTask &task : hidden.tasks)
    if (task.steps[0].kind == StepKind::Store)
      task.steps[0].kind = StepKind::Send;
  EXPECT_EQ(sendOptionsFor(hidden, objects, n).status().message(),
            "plan save sends hidden states; a transfer sends KV");
  ChunkObjects wider(model_->config(), model_->fingerprint(), "", {256, 1});
  EXPECT_EQ(sendOptionsFor(sender, wider, n).status().message(),
            "plan t_send sends objects of 128 tokens x 1 layers; the "
            "transfer's are 256 x 1 (compile with its chunk_tokens and "
            "layer_group)");
}

// A send plan's sends run in its order, whatever order the prefill
// completes the objects in: here layer by layer, beside a prefill chunk by
// chunk.
TEST_F(TransferTest, ASendPlanSendsInItsOrder) {
  const StoreLayout layout{128, 1};
  ChunkObjects objects(model_->config(), model_->fingerprint(), "", layout);
  const CodecSpec codec = *parseCodecSpec("int8+zstd");
  auto [sender, receiver] = transferPlans(objects, tokens_, codec, true);
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> sent;
  StatusOr<SaveMetrics> metrics =
      sendDuringPrefill(cpuDevice(), *model_, objects, tokens_, sender,
                        [&](const ChunkRef &ref, std::string object, double) {
                          EXPECT_EQ(ref.codec, codec);
                          KVC_ASSIGN_OR_RETURN(header, readChunkHeader(object));
                          EXPECT_EQ(header.codec, codec);
                          std::lock_guard<std::mutex> lock(mutex);
                          sent.emplace_back(ref.tokenBegin, ref.layerBegin);
                          return Status::ok();
                        });
  ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
  EXPECT_EQ(metrics->written, kChunks);
  EXPECT_EQ(sent, objectOrder(objects, tokens_, /*layerWise=*/true));
  EXPECT_GT(metrics->prefillSeconds, 0);
}

// Both ends of a compiled transfer run their plans: the chunks cross the
// link in the send plan's order (layer-wise), the receive plan writes them
// all, and the cache is a full prefill's within the codec's bound.
TEST_F(TransferTest, CompiledPlansRunAtBothEnds) {
  const StoreLayout layout{128, 1};
  ChunkObjects objects(model_->config(), model_->fingerprint(), "", layout);
  const CodecSpec codec = *parseCodecSpec("int8+zstd");
  auto [sender, receiver] = transferPlans(objects, tokens_, codec, true);
  SenderProcess child([&](std::unique_ptr<Link> link) {
    StatusOr<SendOptions> options =
        sendOptionsFor(sender, objects, int64_t(tokens_.size()));
    return options.isOk()
               ? send(*modelDir_, std::move(link), *options, {}, layout)
               : 5;
  });
  LayerProgress progress;
  ReceiveOptions base;
  base.progress = &progress;
  StatusOr<ReceiveOptions> options =
      receiveOptionsFor(receiver, objects, int64_t(tokens_.size()), base);
  ASSERT_TRUE(options.isOk()) << options.status().toString();
  std::vector<std::pair<int64_t, int64_t>> order;
  StatusOr<ReceiveMetrics> metrics = receive(child, *options, &order);
  ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
  EXPECT_EQ(child.wait(), 0);
  EXPECT_EQ(order, objectOrder(objects, tokens_, /*layerWise=*/true));
  EXPECT_EQ(metrics->received, kChunks);
  EXPECT_TRUE(metrics->fallbacks.empty());
  for (int64_t layer = 0; layer < 4; ++layer)
    EXPECT_TRUE(progress.ready(layer));
  // Layer 0 was written whole before any chunk of a later layer arrived.
  ASSERT_EQ(metrics->layerReadySeconds.size(), 4u);
  EXPECT_LT(metrics->layerReadySeconds[0], metrics->layerReadySeconds[1]);
  EXPECT_LE(metrics->layerReadySeconds[3], metrics->seconds);
  expectVerified({codec});
}

// A receive that fails after accepting (here a receive plan whose scatters
// leave part of the cache unwritten) tells the sender why instead of
// leaving it to wait for a receipt.
TEST_F(TransferTest, AFailedReceiveTellsTheSenderWhy) {
  ChunkObjects objects(model_->config(), model_->fingerprint(), "", {128, 1});
  BundlePlan receiver =
      transferPlans(objects, tokens_, CodecSpec(), false).second;
  receiver.tasks.back().steps.back().layers = {0, 0};
  StatusOr<ReceiveOptions> options =
      receiveOptionsFor(receiver, objects, int64_t(tokens_.size()));
  ASSERT_TRUE(options.isOk()) << options.status().toString();
  SenderProcess sender([&](std::unique_ptr<Link> link) {
    SendOptions sending;
    sending.timeout = 60000ms; // Far past the test's: only the refusal ends it.
    return send(*modelDir_, std::move(link), sending);
  });
  StatusOr<ReceiveMetrics> metrics = receive(sender, *options);
  ASSERT_FALSE(metrics.isOk());
  EXPECT_NE(metrics.status().message().find("unwritten"), std::string::npos)
      << metrics.status().toString();
  EXPECT_EQ(sender.wait(), 3); // FailedPrecondition: refused, with why.
}

// The sender prefills on the backend its options name (a GPU's, on a
// prefill node), whether it streams or runs a send plan.
TEST_F(TransferTest, TheSenderPrefillsOnItsBackend) {
  ChunkObjects objects(model_->config(), model_->fingerprint(), "", {128, 1});
  const BundlePlan plan =
      transferPlans(objects, tokens_, CodecSpec(), false).first;
  for (bool planned : {false, true}) {
    SCOPED_TRACE(planned ? "a send plan" : "streamed");
    CountingDevice counting;
    SendOptions options;
    options.device = &counting;
    if (planned) {
      StatusOr<SendOptions> compiled =
          sendOptionsFor(plan, objects, int64_t(tokens_.size()), options);
      ASSERT_TRUE(compiled.isOk()) << compiled.status().toString();
      options = *compiled;
    }
    auto [sending, receiving] = MemoryLink::pair();
    StatusOr<SendStats> sent = internalError("not sent");
    std::thread sender([&, &sending = sending] {
      sent = sendContext(*model_, objects, tokens_, sending, options);
      sending.close();
    });
    StatusOr<std::unique_ptr<host::Destination>> into =
        host::destinationFor(cpuDevice(), *model_, tokens_, nullptr, {});
    ASSERT_TRUE(into.isOk()) << into.status().toString();
    destination_ = std::move(*into);
    StatusOr<ReceiveMetrics> metrics =
        receiveContext(receiving, objects, destination_->target);
    sender.join();
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    EXPECT_GE(counting.streams.load(), 1);
    EXPECT_EQ(metrics->received, kChunks);
    expectVerified({CodecSpec()});
  }
}

class RecordingChooser : public CodecChooser {
public:
  explicit RecordingChooser(CodecChooser &inner) : inner_(inner) {}
  CodecSpec choose(const ChunkObjects &objects, const ChunkRef &ref,
                   const float *values) override {
    CodecSpec codec = inner_.choose(objects, ref, values);
    std::lock_guard<std::mutex> lock(mutex_);
    chosen.push_back(codec);
    return codec;
  }
  void sent(const CodecSpec &codec, size_t rawBytes, size_t bytes,
            double encodeSeconds, double sendSeconds) override {
    inner_.sent(codec, rawBytes, bytes, encodeSeconds, sendSeconds);
  }
  std::vector<CodecSpec> chosen;

private:
  CodecChooser &inner_;
  std::mutex mutex_;
};

TEST_F(TransferTest, TheControllerSwitchesCodecWhenTheLinkSlowsDown) {
  const CodecSpec raw, int4 = *parseCodecSpec("int4+zstd");
  SenderProcess sender([&](std::unique_ptr<Link> link) {
    // A 250 ms SLO for 32 chunks of 16 KB raw. At 20 MB/s raw chunks (0.8
    // ms each on the wire) meet it with a wide margin, so the controller
    // keeps the exact codec; after the hello, three pings and twenty chunks
    // the link drops to 0.5 MB/s, where the twelve left would take 32 ms
    // each raw and a third of that as int4+zstd: only int4 still meets it.
    // (Margins of several times the SLO: a loaded machine's scheduling
    // noise, milliseconds, does not decide.)
    auto throttled = std::make_unique<ThrottledLink>(std::move(link), 0.02);
    ThrottledLink *throttle = throttled.get();
    CodecControllerOptions slo;
    slo.candidates = {raw, int4};
    slo.chunks = 32;
    slo.sloSeconds = 0.25;
    CodecController controller(slo);
    RecordingChooser recording(controller);
    SendOptions options;
    options.chooser = &recording;
    options.writers = 1;
    int code = send(
        *modelDir_, std::move(throttled), options,
        [&](int index, std::string &) {
          if (index == 24)
            throttle->setGBs(0.0005);
        },
        StoreLayout{64, 1});
    if (code != 0)
      return code;
    // Before the drop the controller chose raw; after it, int4 (until the
    // last few chunks, which raw can meet the SLO with again).
    const std::vector<CodecSpec> &chosen = recording.chosen;
    if (chosen.size() != 32)
      return 6;
    const bool rawEarly = std::find(chosen.begin(), chosen.begin() + 20, raw) !=
                          chosen.begin() + 20;
    const bool int4Late =
        std::find(chosen.begin() + 20, chosen.end(), int4) != chosen.end();
    return rawEarly && int4Late ? 0 : 5;
  });
  StatusOr<ReceiveMetrics> metrics = receive(sender);
  ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
  EXPECT_EQ(sender.wait(), 0);
  EXPECT_GT(metrics->chunksPerCodec[raw.str()], 0);
  EXPECT_GT(metrics->chunksPerCodec[int4.str()], 0);
  expectVerified({raw, int4});
}

/// A controller's inputs: the first chunk of the request, random values.
class CodecControllerTest : public TransferTest {
protected:
  void SetUp() override {
    TransferTest::SetUp();
    objects_ = std::make_unique<ChunkObjects>(
        model_->config(), model_->fingerprint(), "", StoreLayout{128, 1});
    ref_ = objects_->refs(tokens_.data(), kTokens, Form::KV, {}).front();
    values_.resize(size_t(objects_->shape(ref_).numel()));
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float &v : values_)
      v = normal(rng);
    rawBytes_ = values_.size() * 2;
  }

  CodecSpec choose(CodecController &controller) {
    return controller.choose(*objects_, ref_, values_.data());
  }

  std::unique_ptr<ChunkObjects> objects_;
  ChunkRef ref_;
  std::vector<float> values_;
  size_t rawBytes_ = 0;
  const CodecSpec raw_, int4_ = *parseCodecSpec("int4+zstd");
};

TEST_F(CodecControllerTest, WeighsTheLinkAgainstTheCodecs) {
  // The model with measures given: raw costs least where the link is fast,
  // int4 where it is slow; the SLO takes the most accurate codec that
  // meets it.
  CodecController controller({{raw_, int4_}});
  // Before any send: the most compact.
  EXPECT_EQ(choose(controller), int4_);
  controller.sent(int4_, rawBytes_, rawBytes_ / 3, 1e-4, rawBytes_ / 3 / 10e9);
  EXPECT_EQ(choose(controller), raw_);
  EXPECT_NEAR(controller.linkGBs(), 10, 0.1);
  // The link drops to 2 MB/s: one send shows it.
  controller.sent(raw_, rawBytes_, rawBytes_, 1e-5, rawBytes_ / 2e6);
  EXPECT_EQ(choose(controller), int4_);
  EXPECT_LT(controller.linkGBs(), 0.01);

  // An SLO the slow link meets with raw chunks keeps them raw.
  CodecControllerOptions slo;
  slo.candidates = {raw_, int4_};
  slo.chunks = 4;
  slo.sloSeconds = 4 * double(rawBytes_) / 2e6 * 2;
  CodecController relaxed(slo);
  (void)choose(relaxed);
  relaxed.sent(raw_, rawBytes_, rawBytes_, 1e-5, rawBytes_ / 2e6);
  EXPECT_EQ(choose(relaxed), raw_);
}

TEST_F(CodecControllerTest, FitsTheLinkAsACostPerMessageAndPerByte) {
  // A 5 GB/s link whose every message costs 100 us besides its bytes. Time
  // per byte alone would make it look 0.03 GB/s to int4's chunks.
  CodecController controller({{raw_, int4_}});
  const double message = 1e-4, perByte = 1 / 5e9;
  auto send = [&](const CodecSpec &codec, size_t bytes, double delay = 0) {
    controller.sent(codec, rawBytes_, bytes, 1e-5,
                    message + double(bytes) * perByte + delay);
  };
  // The first send most compact, the second least: the link measured at
  // two sizes.
  EXPECT_EQ(choose(controller), int4_);
  send(int4_, rawBytes_ / 3);
  EXPECT_EQ(choose(controller), raw_);
  send(raw_, rawBytes_);
  EXPECT_NEAR(controller.linkGBs(), 5, 0.05);
  EXPECT_NEAR(controller.messageSeconds(), message, 1e-7);
  // A send that a busy machine delayed by 2 ms does not move the fit.
  send(int4_, rawBytes_ / 3);
  send(raw_, rawBytes_);
  send(int4_, rawBytes_ / 3, 2e-3);
  EXPECT_NEAR(controller.linkGBs(), 5, 0.05);
  EXPECT_NEAR(controller.messageSeconds(), message, 1e-7);
  // Every codec pays the message alike: at 5 GB/s int4's bytes save less
  // than its encoding costs.
  EXPECT_EQ(choose(controller), raw_);
}

TEST(Link, AListenerWithoutSendersTimesOut) {
  StatusOr<std::unique_ptr<Listener>> listener = listenUcx("127.0.0.1", 0);
  ASSERT_TRUE(listener.isOk()) << listener.status().toString();
  StatusOr<std::unique_ptr<Link>> link = (*listener)->accept(100ms);
  EXPECT_EQ(link.status().code(), StatusCode::Unavailable);
}

/// Messages sent, nothing received.
class SinkLink : public Link {
public:
  Status send(std::string_view message) override {
    bytes += message.size();
    return Status::ok();
  }
  StatusOr<std::string> receive(Milliseconds) override {
    return unavailable("a sink");
  }
  std::string describe() const override { return "sink"; }
  size_t bytes = 0;
};

TEST(Link, AThrottledLinkSendsNoFasterThanItsRate) {
  auto sink = std::make_unique<SinkLink>();
  SinkLink *inner = sink.get();
  ThrottledLink link(std::move(sink), 0.01); // 10 MB/s.
  const std::string message(250000, 'x');
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(link.send(message).isOk());
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(inner->bytes, 1000000u);
  EXPECT_GE(seconds, 0.099); // 1 MB at 10 MB/s.
  EXPECT_NE(link.describe().find("throttled"), std::string::npos);
}

TEST(Link, ParsesHostAndPort) {
  std::string host;
  int port = 0;
  EXPECT_TRUE(parseHostPort("127.0.0.1:4100", host, port).isOk());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 4100);
  EXPECT_FALSE(parseHostPort("127.0.0.1", host, port).isOk());
  EXPECT_FALSE(parseHostPort("host:70000", host, port).isOk());
  EXPECT_FALSE(parseHostPort("host:x1", host, port).isOk());
}

} // namespace
} // namespace kvc
