//===- TransferFuzzer.cpp - Fuzzing a transfer's receiver -----------------===//
//
// Feeds a transfer's receiver (receiveContext, Transfer.h) the messages a
// real sender sent, mutated as a broken or hostile peer might send them: a
// message's bytes flipped, cut or grown (anywhere, or in its first bytes,
// where the kind and the object's header are), a number of a hello or an
// end moved, a message dropped, repeated or moved, one chunk's object sent
// in another's place, the stream cut short. Whatever arrives, the receiver must
// return (no crash, no hang) and, when it succeeds, leave a cache within its
// codec's bound of a full prefill: a chunk it cannot trust is recomputed, never
// written wrong.
//
//   build/fuzz/kvc-transfer-fuzz ITERATIONS
//
// The sender's streams (a small generated model's KV, int8+zstd and
// Hadamard+int4, objects of 32 tokens x 1 layer) are recorded once, through
// the receiver they were sent to; each iteration then queues a mutated copy
// on an in-process link (MemoryLink.h), closes it, and receives it as the
// chunks arrive or by the transfer's receive plan. KVC_FUZZ_SEED draws
// other mutations (Mutations.h). An iteration that crashes or runs past
// kTimeoutSeconds names itself on stderr.
//
//===----------------------------------------------------------------------===//

#include "Mutations.h"

#include "kvc/Host/Session.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Net/Transfer.h"
#include "kvc/Testing/MemoryLink.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace kvc;
using Json = nlohmann::json;

namespace {

constexpr unsigned kTimeoutSeconds = 30;

/// What the running iteration is, for the signal handler.
char current[128] = "setting up";

void onFatalSignal(int signal) {
  const char *what = signal == SIGALRM ? "kvc-transfer-fuzz: hung at "
                                       : "kvc-transfer-fuzz: crashed at ";
  (void)!write(2, what, std::strlen(what));
  (void)!write(2, current, std::strlen(current));
  (void)!write(2, "\n", 1);
  _exit(1);
}

/// A link that keeps what it receives.
class RecordingLink final : public Link {
public:
  RecordingLink(Link &inner, std::vector<std::string> &received)
      : inner_(inner), received_(received) {}
  Status send(std::string_view message) override {
    return inner_.send(message);
  }
  StatusOr<std::string> receive(Milliseconds timeout) override {
    StatusOr<std::string> message = inner_.receive(timeout);
    if (message.isOk())
      received_.push_back(*message);
    return message;
  }
  std::string describe() const override { return inner_.describe(); }

private:
  Link &inner_;
  std::vector<std::string> &received_;
};

[[noreturn]] void fail(const std::string &why) {
  std::fprintf(stderr, "kvc-transfer-fuzz: %s: %s\n", current, why.c_str());
  std::exit(1);
}

template <typename T> T orFail(StatusOr<T> value, const char *what) {
  if (!value.isOk())
    fail(std::string(what) + ": " + value.status().toString());
  return std::move(*value);
}

/// The messages a sender sends for `tokens` in `codec`, through a receiver
/// that verifies them.
std::vector<std::string> record(const LlamaModel &model,
                                const ChunkObjects &objects,
                                const std::vector<int32_t> &tokens,
                                const CodecSpec &codec) {
  auto [sending, receiving] = MemoryLink::pair();
  StatusOr<SendStats> sent = internalError("not sent");
  std::thread sender([&, &sending = sending] {
    SendOptions options;
    options.codec = codec;
    sent = sendContext(model, objects, tokens, sending, options);
    sending.close();
  });
  std::vector<std::string> messages;
  RecordingLink recording(receiving, messages);
  auto into = orFail(
      host::destinationFor(cpuDevice(), model, tokens, nullptr, {}), "a cache");
  StatusOr<ReceiveMetrics> received =
      receiveContext(recording, objects, into->target, {});
  sender.join();
  orFail(std::move(sent), "the recorded sender");
  if (orFail(std::move(received), "the recorded receiver").received == 0)
    fail("the recorded receiver received nothing");
  return messages;
}

/// A receive plan as kvc-expand shapes one, reduced to its steps: per object
/// of `objects`' layout, in token order, a recv of `codec` from "prefill",
/// its copy to the device and its scatter.
BundlePlan receivePlan(const ChunkObjects &objects, int64_t tokens,
                       const CodecSpec &codec) {
  const StoreLayout &layout = objects.layout();
  const int64_t layers = objects.model().numLayers;
  BundlePlan plan;
  plan.name = "t_recv";
  plan.tokens = {0, tokens};
  plan.layers = {0, layers};
  for (int64_t t = 0; t < tokens; t += layout.chunkTokens)
    for (int64_t l = 0; l < layers; l += layout.layerGroup)
      for (auto [resource, kind] : {std::pair(Resource::Net, StepKind::Recv),
                                    {Resource::H2D, StepKind::TransferToDevice},
                                    {Resource::Compute, StepKind::Scatter}}) {
        BundleStep step;
        step.kind = kind;
        step.tokens = {t, std::min(tokens, t + layout.chunkTokens)};
        step.layers = {l, std::min(layers, l + layout.layerGroup)};
        if (kind != StepKind::Scatter)
          step.codec = codec;
        if (kind == StepKind::Recv)
          step.node = "prefill";
        BundleTask task;
        task.id = int64_t(plan.tasks.size());
        task.resource = resource;
        if (kind != StepKind::Recv)
          task.after = task.inputs = {task.id - 1};
        task.steps = {step};
        plan.tasks.push_back(std::move(task));
      }
  return plan;
}

/// `message` (a hello or an end: "KVCT", its kind, a JSON object) with
/// one of its numbers moved, so that the edit reaches the checks behind the
/// JSON syntax; other messages stay as they are.
void moveANumber(std::string &message, std::mt19937_64 &rng) {
  constexpr size_t kHeader = 5;
  if (message.size() <= kHeader)
    return;
  Json body = Json::parse(message.substr(kHeader), nullptr,
                          /*allow_exceptions=*/false);
  if (!body.is_object() || body.empty())
    return;
  auto field = std::next(body.begin(), long(rng() % body.size()));
  if (!field->is_number_integer())
    return;
  const int64_t value = field->get<int64_t>();
  const int64_t moved[] = {-1,        0,         value - 1,
                           value + 1, 2 * value, int64_t(1) << 40};
  *field = moved[rng() % std::size(moved)];
  message = message.substr(0, kHeader) + body.dump();
}

/// `messages` with one to three edits.
void mutate(std::vector<std::string> &messages, std::mt19937_64 &rng) {
  for (int m = 0, n = 1 + int(rng() % 3); m < n && !messages.empty(); ++m) {
    const size_t i = rng() % messages.size();
    switch (rng() % 8) {
    case 0:
      fuzz::damage(messages[i], rng);
      break;
    case 1: // The kind byte and the object's header.
      for (int f = 0, k = 1 + int(rng() % 3); f < k; ++f)
        if (!messages[i].empty())
          messages[i][rng() % std::min<size_t>(messages[i].size(), 96)] ^=
              char(1 + rng() % 255);
      break;
    case 2:
      messages.erase(messages.begin() + long(i));
      break;
    case 3:
      messages.insert(messages.begin() + long(i), messages[i]);
      break;
    case 4:
      std::swap(messages[i], messages[rng() % messages.size()]);
      break;
    case 5: // Another message's bytes in this one's place.
      messages[i] = messages[rng() % messages.size()];
      break;
    case 6:
      moveANumber(messages[i], rng);
      break;
    default:
      messages.resize(i);
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvc-transfer-fuzz ITERATIONS\n");
    return 2;
  }
  const long iterations = std::atol(argv[1]);
  for (int signal : {SIGALRM, SIGSEGV, SIGABRT, SIGBUS, SIGFPE})
    std::signal(signal, onFatalSignal);

  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("kvc-transfer-fuzz-" + std::to_string(getpid())))
                              .string();
  GenModelOptions shape;
  shape.layers = 2;
  shape.hidden = 64;
  shape.heads = 4;
  shape.kvHeads = 2;
  shape.ffn = 128;
  shape.vocab = 256;
  shape.maxPositions = 512;
  shape.seed = 3;
  if (Status made = generateModel(dir, shape); !made.isOk())
    fail("the model: " + made.toString());
  std::unique_ptr<LlamaModel> model = orFail(LlamaModel::load(dir), "load");
  std::filesystem::remove_all(dir);
  std::mt19937_64 rng(fuzz::mutationSeed(20261125));
  std::vector<int32_t> tokens(80);
  for (int32_t &token : tokens)
    token = int32_t(rng() % 256);
  const ChunkObjects objects(model->config(), model->fingerprint(), "",
                             {32, 1});
  const ModelCompute::Cache reference =
      orFail(fullPrefill(*cpuDevice().createRunner(*model), tokens),
             "the full prefill");

  // Each stream, and the receive plan of its transfer.
  struct Stream {
    CodecSpec codec;
    std::vector<std::string> messages;
    BundlePlan plan;
    ReceiveOptions planned;
  };
  std::vector<Stream> streams;
  for (const char *text : {"int8+zstd", "hadamard+int4"}) {
    CodecSpec codec = orFail(parseCodecSpec(text), "a codec");
    streams.push_back({codec,
                       record(*model, objects, tokens, codec),
                       receivePlan(objects, int64_t(tokens.size()), codec),
                       {}});
  }
  for (Stream &stream : streams)
    stream.planned =
        orFail(receiveOptionsFor(stream.plan, objects, int64_t(tokens.size())),
               "the receive plan");

  long accepted = 0, recomputing = 0, byPlan = 0;
  for (long i = 0; i < iterations; ++i) {
    const Stream &stream = streams[rng() % streams.size()];
    std::vector<std::string> messages = stream.messages;
    mutate(messages, rng);
    const bool planned = rng() % 2;
    std::snprintf(current, sizeof(current), "iteration %ld (%s, %s)", i,
                  stream.codec.str().c_str(),
                  planned ? "by the receive plan" : "as chunks arrive");
    alarm(kTimeoutSeconds);
    auto [peer, local] = MemoryLink::pair();
    for (const std::string &message : messages)
      (void)peer.send(message);
    peer.close();
    auto into =
        orFail(host::destinationFor(cpuDevice(), *model, tokens, nullptr, {}),
               "a cache");
    ReceiveOptions options = planned ? stream.planned : ReceiveOptions();
    options.timeout = Milliseconds(200);
    StatusOr<ReceiveMetrics> received =
        receiveContext(local, objects, into->target, options);
    alarm(0);
    if (!received.isOk())
      continue;
    ++accepted;
    byPlan += planned;
    recomputing += received->received < received->chunks;
    const RestoreError error =
        orFail(restoreError(*model, reference, int64_t(tokens.size()),
                            *into->cache, into->table),
               "the verification");
    Status verified =
        host::checkVerification(error, host::verifyBound({stream.codec}));
    if (!verified.isOk())
      fail("accepted a stream that left the cache wrong: " +
           verified.toString());
  }
  std::printf("%ld mutated transfers received without a crash or a hang: %ld "
              "completed within their codec's bound (%ld by the receive plan; "
              "%ld recomputing what did not arrive intact), %ld refused\n",
              iterations, accepted, byPlan, recomputing, iterations - accepted);
  if (iterations >= 100 && (byPlan == 0 || byPlan == accepted)) {
    std::fprintf(stderr, "kvc-transfer-fuzz: one of the receivers completed "
                         "no transfer\n");
    return 1;
  }
  return 0;
}
