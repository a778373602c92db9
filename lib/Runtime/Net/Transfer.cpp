//===- Transfer.cpp - KV from a prefill node to a decode node -------------===//

#include "kvc/Runtime/Net/Transfer.h"

#include "../Desc/Json.h"
#include "kvc/Runtime/Base/BoundedQueue.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/HandOver.h"
#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Save/SavePlan.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace kvc {

using namespace json_detail;

namespace {

constexpr std::string_view kMagic = "KVCT";
constexpr int64_t kProtocolVersion = 1;

enum class Kind : char {
  Hello = 'H',
  Accept = 'A',
  Refuse = 'R',
  Chunk = 'C',
  End = 'E',
  Receipt = 'P',
};

const char *kindName(Kind kind) {
  switch (kind) {
  case Kind::Hello:
    return "hello";
  case Kind::Accept:
    return "accept";
  case Kind::Refuse:
    return "refuse";
  case Kind::Chunk:
    return "chunk";
  case Kind::End:
    return "end";
  case Kind::Receipt:
    return "receipt";
  }
  return "?";
}

std::string message(Kind kind, std::string_view body) {
  std::string out;
  out.reserve(kMagic.size() + 1 + body.size());
  out.append(kMagic);
  out.push_back(char(kind));
  out.append(body);
  return out;
}

Status sendJson(Link &link, Kind kind, const Json &body) {
  return link.send(message(kind, body.dump()));
}

/// A message's kind and body; DataLoss for bytes that are no message.
StatusOr<std::pair<Kind, std::string_view>> parse(std::string_view bytes) {
  if (bytes.size() <= kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic)
    return dataLoss("transfer: a message without the protocol's magic");
  Kind kind = Kind(bytes[kMagic.size()]);
  switch (kind) {
  case Kind::Hello:
  case Kind::Accept:
  case Kind::Refuse:
  case Kind::Chunk:
  case Kind::End:
  case Kind::Receipt:
    return std::make_pair(kind, bytes.substr(kMagic.size() + 1));
  }
  return dataLoss("transfer: a message of unknown kind");
}

/// The next message, which must be of `want` (a refusal is reported as
/// the peer's words).
StatusOr<Json> receiveJson(Link &link, Kind want, Milliseconds timeout) {
  KVC_ASSIGN_OR_RETURN(bytes, link.receive(timeout));
  KVC_ASSIGN_OR_RETURN(parsed, parse(bytes));
  auto [kind, body] = parsed;
  KVC_ASSIGN_OR_RETURN(json, parseJson(body));
  if (kind == Kind::Refuse && want != Kind::Refuse) {
    std::string reason;
    (void)readString(json, "refuse", "reason", reason, Presence::Optional);
    return failedPrecondition("transfer refused by " + link.describe() + ": " +
                              reason);
  }
  if (kind != want)
    return dataLoss(std::string("transfer: expected a ") + kindName(want) +
                    " message, got a " + kindName(kind));
  KVC_RETURN_IF_ERROR(expectObject(json, kindName(kind)));
  return json;
}

/// Sends the session's last message, then waits (briefly) for the peer to
/// read it and hang up: a link closed first would drop it unread.
void sendLast(Link &link, Kind kind, const Json &body, Milliseconds timeout) {
  if (sendJson(link, kind, body).isOk())
    (void)link.receive(std::min(timeout, Milliseconds(2000)));
}

/// The last prefix key of a request: names the request and tenant.
std::string requestKey(const ChunkObjects &objects,
                       const std::vector<int32_t> &tokens) {
  return toHex(
      objects.keys().keys(tokens.data(), int64_t(tokens.size())).back());
}

} // namespace

//===----------------------------------------------------------------------===//
// Sender
//===----------------------------------------------------------------------===//

StatusOr<SendOptions> sendOptionsFor(const BundlePlan &plan,
                                     const ChunkObjects &objects,
                                     int64_t tokens, SendOptions base) {
  KVC_ASSIGN_OR_RETURN(sent,
                       planObjects(plan, objects, tokens, StepKind::Send));
  if (sent.forms != std::vector<Form>{Form::KV})
    return invalidArgument("plan " + plan.name +
                           " sends hidden states; a transfer sends KV");
  base.codec = sent.codec;
  base.plan = &plan;
  if (base.prefillTokens == 0 && plan.prefillStep)
    base.prefillTokens = *plan.prefillStep;
  return base;
}

StatusOr<SendStats> sendContext(const LlamaModel &model,
                                const ChunkObjects &objects,
                                const std::vector<int32_t> &tokens, Link &link,
                                const SendOptions &options) {
  if (tokens.empty())
    return invalidArgument("transfer: no tokens to send");
  if (options.plan && options.chooser)
    return invalidArgument("transfer: a compiled plan sends the encoding it "
                           "chose; it takes no chooser");
  if (!options.plan && options.kernels)
    return invalidArgument("transfer: a kernel table is a compiled plan's; "
                           "the sender has none");
  const StoreLayout &layout = objects.layout();
  const int64_t chunks = int64_t(
      objects.refs(tokens.data(), int64_t(tokens.size()), Form::KV, CodecSpec())
          .size());
  Json hello = {{"protocol", kProtocolVersion},
                {"model", objects.fingerprint()},
                {"request", requestKey(objects, tokens)},
                {"tokens", int64_t(tokens.size())},
                {"chunk_tokens", layout.chunkTokens},
                {"layer_group", layout.layerGroup},
                {"chunks", chunks}};
  KVC_RETURN_IF_ERROR(sendJson(link, Kind::Hello, hello));
  KVC_RETURN_IF_ERROR(
      receiveJson(link, Kind::Accept, options.timeout).status());
  SendStats stats;
  std::mutex statsMutex, sendMutex;
  // Puts an encoded chunk on the link, one at a time (its send time is the
  // link's), and counts it.
  auto sendChunk = [&](const ChunkRef &ref, std::string_view object,
                       double encodeSeconds) -> Status {
    std::string chunk = message(Kind::Chunk, object);
    double sendSeconds = 0;
    {
      std::lock_guard<std::mutex> serial(sendMutex);
      Clock::time_point start = Clock::now();
      KVC_RETURN_IF_ERROR(link.send(chunk));
      sendSeconds = secondsSince(start);
    }
    if (options.chooser)
      options.chooser->sent(ref.codec,
                            size_t(objects.shape(ref).numel()) *
                                dtypeBytes(objects.model().dtype),
                            chunk.size(), encodeSeconds, sendSeconds);
    std::lock_guard<std::mutex> lock(statsMutex);
    stats.chunks += 1;
    stats.bytes += int64_t(chunk.size());
    stats.sendSeconds += sendSeconds;
    stats.chunksPerCodec[ref.codec.str()] += 1;
    return Status::ok();
  };
  SaveOptions stream;
  stream.forms = {Form::KV};
  stream.codec = options.codec;
  stream.bufferBytes = options.bufferBytes;
  stream.computed = options.computed;
  stream.prefillTokens = options.prefillTokens;
  stream.device = options.device;
  // One engine: a compiled send plan, or the one a compiler would write
  // for the layout, its encodes and sends on the writers' lanes, at most
  // the buffers' worth of objects between a gather and its send.
  BundlePlan own;
  if (!options.plan) {
    SavePlanShape shape = savePlanShape(model.config(), layout, options.writers,
                                        options.bufferBytes);
    shape.to = StepKind::Send;
    if (options.chooser) {
      // Encodes beside the sends, each choosing its codec at most four
      // objects a lane ahead of its send: late enough that the choice
      // hears how the link did with the sends before it.
      shape.encodeOnLanes = true;
      shape.window = 4 * shape.lanes;
    }
    own = savePlanFor(objects, int64_t(tokens.size()), {Form::KV},
                      options.codec, "peer", shape);
  }
  SaveRunOptions run;
  run.tracePath = options.tracePath;
  run.kernels = options.kernels;
  run.chooser = options.chooser;
  Clock::time_point start = Clock::now();
  StatusOr<SaveMetrics> sent = sendDuringPrefill(
      deviceOr(options.device), model, objects, tokens,
      options.plan ? *options.plan : own, sendChunk, stream, run);
  StatusOr<SaveStats> streamed = SaveStats();
  if (sent.isOk()) {
    streamed = saveStats(*sent);
    streamed->totalSeconds = secondsSince(start); // The sender's setup too.
    if (options.plan)
      stats.planRun = *sent;
  } else {
    streamed = sent.status();
  }
  // The receiver recomputes whatever a failed prefill did not send; the end
  // tells it not to wait for more.
  Json end = {{"chunks", stats.chunks}};
  if (!streamed.isOk())
    end["error"] = streamed.status().toString();
  Status ended = sendJson(link, Kind::End, end);
  KVC_RETURN_IF_ERROR(streamed.status());
  KVC_RETURN_IF_ERROR(ended);
  stats.stream = *streamed;
  KVC_ASSIGN_OR_RETURN(receipt,
                       receiveJson(link, Kind::Receipt, options.timeout));
  KVC_RETURN_IF_ERROR(readInt(receipt, "receipt", "received", stats.received,
                              Presence::Required));
  KVC_RETURN_IF_ERROR(readInt(receipt, "receipt", "recomputed",
                              stats.recomputed, Presence::Required));
  return stats;
}

//===----------------------------------------------------------------------===//
// Receiver
//===----------------------------------------------------------------------===//

namespace {

/// An arrived chunk waiting for a decoder: its message, kept whole.
struct Arrival {
  size_t index = 0; ///< Into the expected objects.
  ChunkRef ref;
  std::string message;
  std::string_view object() const {
    return std::string_view(message).substr(kMagic.size() + 1);
  }
  size_t bytes() const { return message.size(); }
};

/// The hello checked against this node: the layout to receive with, or why
/// the transfer is refused.
StatusOr<StoreLayout> checkHello(const Json &hello, const ChunkObjects &local,
                                 const std::vector<int32_t> &tokens) {
  int64_t protocol = 0, count = 0;
  std::string model, request;
  StoreLayout layout;
  KVC_RETURN_IF_ERROR(
      readInt(hello, "hello", "protocol", protocol, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readString(hello, "hello", "model", model, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readString(hello, "hello", "request", request, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readInt(hello, "hello", "tokens", count, Presence::Required));
  KVC_RETURN_IF_ERROR(readInt(hello, "hello", "chunk_tokens",
                              layout.chunkTokens, Presence::Required));
  KVC_RETURN_IF_ERROR(readInt(hello, "hello", "layer_group", layout.layerGroup,
                              Presence::Required));
  auto refuse = [](std::string why) {
    return failedPrecondition(std::move(why));
  };
  if (protocol != kProtocolVersion)
    return refuse("the sender speaks protocol " + std::to_string(protocol) +
                  ", this node " + std::to_string(kProtocolVersion));
  if (model != local.fingerprint())
    return Status(StatusCode::FailedPrecondition,
                  "the KV is of model " + model.substr(0, 12) +
                      ", this node serves " + local.fingerprint().substr(0, 12),
                  int(ChunkFault::WrongModel));
  if (count != int64_t(tokens.size()))
    return refuse("the sender has " + std::to_string(count) +
                  " tokens, this request " + std::to_string(tokens.size()));
  if (layout.chunkTokens <= 0 || layout.layerGroup <= 0)
    return refuse("chunks of " + std::to_string(layout.chunkTokens) +
                  " tokens x " + std::to_string(layout.layerGroup) + " layers");
  ChunkObjects objects(local.model(), local.fingerprint(), local.salt(),
                       layout);
  if (request != requestKey(objects, tokens))
    return Status(StatusCode::FailedPrecondition,
                  "the KV is of another request or tenant (prefix key " +
                      request.substr(0, 12) + ")",
                  int(ChunkFault::WrongKey));
  return layout;
}

template <typename Box> std::string describeBox(const Box &ref) {
  return "kv tokens " + std::to_string(ref.tokenBegin) + " to " +
         std::to_string(ref.tokenEnd) + ", layers " +
         std::to_string(ref.layerBegin) + " to " + std::to_string(ref.layerEnd);
}

ChunkBox boxOf(const ChunkRef &ref) {
  return {ref.tokenBegin, ref.tokenEnd, ref.layerBegin, ref.layerEnd};
}

/// Why a chunk the sender never sent is missing, with why the stream broke
/// off (`lost`) when it did.
std::string notReceived(const std::string &lost) {
  return lost.empty() ? "not received" : "not received (" + lost + ")";
}

/// "256 tokens x 4 layers".
std::string describeLayout(const StoreLayout &layout) {
  return std::to_string(layout.chunkTokens) + " tokens x " +
         std::to_string(layout.layerGroup) + " layers";
}

/// Where the reader puts what arrives: each chunk of the request that
/// arrived first, whole, or why an expected chunk will not be written.
struct ChunkHandler {
  std::function<void(Arrival)> deliver;
  std::function<void(size_t index, std::string why)> refuse;
};

/// Reads the sender's messages until its end, its loss or a timeout
/// (`metrics.lost` says which), handing each chunk of `expected` that
/// arrived first to `handler` (in the options' encoding, when they name
/// one); a message that fails its checks is recorded in `metrics` and its
/// chunk left missing. Counts the bytes and encodings that arrived.
void readChunks(Link &link, const ChunkObjects &objects,
                const std::vector<ChunkRef> &expected,
                const ReceiveOptions &options, ReceiveMetrics &metrics,
                const ChunkHandler &handler) {
  std::vector<bool> arrived(expected.size(), false);
  for (;;) {
    StatusOr<std::string> bytes = link.receive(options.timeout);
    if (!bytes.isOk()) {
      metrics.lost = bytes.status().message();
      break;
    }
    StatusOr<std::pair<Kind, std::string_view>> parsed = parse(*bytes);
    if (!parsed.isOk()) {
      metrics.lost = parsed.status().message();
      break; // No message boundary can be trusted after garbage.
    }
    auto [kind, body] = *parsed;
    if (kind == Kind::End) {
      std::string error;
      if (auto end = parseJson(body); end.isOk())
        (void)readString(*end, "end", "error", error, Presence::Optional);
      if (!error.empty())
        metrics.lost = "the sender failed: " + error;
      break;
    }
    if (kind != Kind::Chunk) {
      metrics.lost =
          std::string("an unexpected ") + kindName(kind) + " message";
      break;
    }
    // The header says which chunk this is (its own checksum holds); the
    // decode checks the rest, so a damaged payload is that chunk's fault.
    StatusOr<ChunkHeader> header = readChunkHeader(body);
    if (!header.isOk()) {
      metrics.rejected.push_back(header.status().toString());
      continue; // Its chunk stays missing: recomputed.
    }
    const ChunkHeader &h = *header;
    const int64_t position = objects.position(h.tokenBegin, h.layerBegin);
    const ChunkRef *match = position >= 0 && position < int64_t(expected.size())
                                ? &expected[size_t(position)]
                                : nullptr;
    if (!match || match->form != h.form || match->tokenBegin != h.tokenBegin ||
        match->tokenEnd != h.tokenEnd || match->layerBegin != h.layerBegin ||
        match->layerEnd != h.layerEnd) {
      metrics.rejected.push_back("a chunk of " + describeBox(h) +
                                 ", which this request does not have");
      continue;
    }
    const size_t index = size_t(position);
    if (arrived[index])
      continue; // A duplicate: the first one counts.
    arrived[index] = true;
    metrics.bytes += int64_t(bytes->size());
    metrics.chunksPerCodec[h.codec.str()] += 1;
    if (options.codec && h.codec != *options.codec) {
      handler.refuse(index, "encoded " + h.codec.str() +
                                ", the plan receives " + options.codec->str());
      continue;
    }
    // The key and codec are checked against what the header claims only
    // through the decode: the ref says which chunk this must be.
    ChunkRef ref = *match;
    ref.codec = h.codec;
    handler.deliver(Arrival{index, ref, std::move(*bytes)});
  }
}

/// Receives into the target as the chunks arrive: decoders decode and
/// scatter each, and what did not arrive intact is recomputed after the
/// stream.
StatusOr<ReceiveMetrics> receiveStreamed(Link &link,
                                         const ChunkObjects &objects,
                                         const std::vector<ChunkRef> &expected,
                                         const RestoreTarget &target,
                                         const ReceiveOptions &options,
                                         Clock::time_point start) {
  Device &device = deviceOr(target.device);
  const std::vector<int32_t> &tokens = *target.tokens;
  LayerProgress *progress = options.progress;
  ReceiveMetrics metrics;
  metrics.chunks = int64_t(expected.size());
  // Per expected object: why it is not in the cache ("" once written),
  // none while nothing of it arrived.
  std::vector<std::optional<std::string>> missing(expected.size());
  std::mutex mutex;
  Status fatal;

  const int decoderCount = std::max(1, options.decoders);
  BoundedQueue<Arrival> queue(options.bufferBytes);
  std::vector<std::thread> decoders;
  // A layer completes once the device has written it (Device::settle).
  auto settle = [&] { return device.settle(*target.cache); };
  SettleOnExit settled(device, *target.cache);
  auto decode = [&] {
    std::unique_ptr<DeviceBuffer> buffer = device.allocate();
    HostWords values(device.hostMemory());
    Arrival arrival;
    while (queue.pop(arrival)) {
      const ChunkRef &ref = arrival.ref;
      values.resizeForOverwrite(objects.shape(ref).numel());
      const ChunkBox box = boxOf(ref);
      Status status = objects.decode(ref, arrival.object(), values.data());
      if (status.isOk())
        status = device.upload(values, /*consume=*/true, *buffer);
      if (status.isOk())
        status = device.scatter(*buffer, box, *target.cache, *target.table);
      if (status.isOk() && progress)
        status =
            progress->add(box.layerBegin, box.layerEnd, box.tokens(), settle);
      queue.done(arrival.bytes());
      std::lock_guard<std::mutex> lock(mutex);
      if (status.isOk()) {
        missing[arrival.index] = "";
        metrics.received += 1;
      } else if (recoverableByRecompute(status)) {
        missing[arrival.index] = status.toString();
      } else if (fatal.isOk()) {
        fatal = status;
      }
    }
  };
  KVC_RETURN_IF_ERROR(
      startWorkers(decoders, decoderCount, decode, [&] { queue.close(); }));

  ChunkHandler handler;
  handler.deliver = [&](Arrival arrival) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      missing[arrival.index] = "arrived, not yet written";
    }
    queue.push(std::move(arrival));
  };
  handler.refuse = [&](size_t index, std::string why) {
    std::lock_guard<std::mutex> lock(mutex);
    missing[index] = std::move(why);
  };
  readChunks(link, objects, expected, options, metrics, handler);
  metrics.streamSeconds = secondsSince(start);
  queue.close();
  for (std::thread &t : decoders)
    t.join();
  if (!fatal.isOk())
    return fatal;

  // What did not arrive intact is recomputed exactly.
  Clock::time_point recompute = Clock::now();
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<PrefillSession> session;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (missing[i] && missing[i]->empty())
      continue;
    if (!session) {
      runner = device.createRunner(*target.model);
      session = runner->prefill(tokens, *target.cache, *target.table);
    }
    const ChunkRef &ref = expected[i];
    const ChunkBox box = boxOf(ref);
    KVC_RETURN_IF_ERROR(session->compute(box));
    if (progress)
      KVC_RETURN_IF_ERROR(
          progress->add(box.layerBegin, box.layerEnd, box.tokens(), settle));
    metrics.fallbacks.push_back(
        describeBox(ref) + " recomputed: " +
        (missing[i] ? *missing[i] : notReceived(metrics.lost)));
  }
  KVC_RETURN_IF_ERROR(settle());
  metrics.fallbackSeconds = secondsSince(recompute);
  return metrics;
}

/// The objects a sender's messages carried, by name, until the receive
/// plan's recv that reads them takes them: the tier of the store a receive
/// plan reads (Executor.h). A read waits for its object's arrival; one
/// whose chunk will not come (refused, or the stream ended) fails with why,
/// as NotFound, so that the executor recomputes it. Holds at most the
/// options' buffer while no recv waits for an object still to come.
class Inbox final : public Tier {
public:
  Inbox(std::string url, size_t bufferBytes)
      : url_(std::move(url)), arrived_(bufferBytes) {}

  const std::string &url() const override { return url_; }
  Status put(const std::string &name, std::string_view bytes) override {
    arrived_.put(name, std::string(bytes), bytes.size());
    return Status::ok();
  }
  /// Keeps an arrived message's object (the message less its framing).
  void deliver(const std::string &name, std::string message) {
    message.erase(0, kMagic.size() + 1);
    const size_t bytes = message.size();
    arrived_.put(name, std::move(message), bytes);
  }
  Status get(const std::string &name, std::string &buffer) override {
    return arrived_.take(name, buffer, notFound(notReceived("")));
  }
  StatusOr<bool> exists(const std::string &) override {
    return unimplemented("an inbox is read by waiting for its objects");
  }
  Status remove(const std::string &) override { return Status::ok(); }
  StatusOr<std::vector<std::string>> list(const std::string &) override {
    return unimplemented("an inbox is read by waiting for its objects");
  }
  /// `name` will not arrive (intact): its read fails with `why`.
  void refuse(const std::string &name, const std::string &why) {
    arrived_.fail(name, notFound(why));
  }
  /// No more arrivals; `lost` says why the stream broke off ("" when the
  /// sender finished).
  void finish(const std::string &lost) {
    arrived_.finish(lost.empty() ? Status::ok() : notFound(notReceived(lost)));
  }

private:
  std::string url_;
  HandOver<std::string, std::string> arrived_;
};

/// Receives into the target by running the compiled receive plan: its
/// recvs read an Inbox the link fills, and the executor recomputes what
/// did not arrive intact.
StatusOr<ReceiveMetrics> receivePlanned(Link &link, const ChunkObjects &objects,
                                        const std::vector<ChunkRef> &expected,
                                        const RestoreTarget &target,
                                        const ReceiveOptions &options,
                                        Clock::time_point start) {
  const BundlePlan &plan = *options.plan;
  Device &device = deviceOr(target.device);
  auto inbox = std::make_shared<Inbox>(link.describe(), options.bufferBytes);
  ChunkStore store(inbox, objects.model(), objects.fingerprint(),
                   objects.salt(), objects.layout());
  RestoreTarget planned = target;
  planned.stores.clear();
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps)
      if (step.kind == StepKind::Recv)
        planned.stores[step.node] = &store;
  KVC_ASSIGN_OR_RETURN(pools, device.createPools(planResources(plan)));
  RestoreOptions restoreOptions;
  restoreOptions.progress = options.progress;
  restoreOptions.tracePath = options.tracePath;
  restoreOptions.kernels = options.kernels;

  StatusOr<RestoreMetrics> restored =
      internalError("the receive plan has not ended");
  auto run = [&] {
    restored = restore(*pools, plan, planned, restoreOptions);
    // Later arrivals (all of them, if the plan failed) have no recv left to
    // take them: the reader goes on to the sender's end, and drops them.
    inbox->finish("");
  };
  KVC_ASSIGN_OR_RETURN(runner, startThread(run));
  ReceiveMetrics metrics;
  metrics.chunks = int64_t(expected.size());
  ChunkHandler handler;
  handler.deliver = [&](Arrival arrival) {
    inbox->deliver(arrival.ref.name(), std::move(arrival.message));
  };
  handler.refuse = [&](size_t index, const std::string &why) {
    ChunkRef ref = expected[index];
    ref.codec = *options.codec;
    inbox->refuse(ref.name(), why);
  };
  readChunks(link, objects, expected, options, metrics, handler);
  metrics.streamSeconds = secondsSince(start);
  inbox->finish(metrics.lost);
  runner.join();
  if (!restored.isOk())
    return restored.status();
  metrics.fallbacks = restored->fallbacks;
  metrics.fallbackSeconds = restored->fallbackSeconds;
  metrics.received = metrics.chunks - int64_t(metrics.fallbacks.size());
  metrics.planRun = std::move(*restored);
  return metrics;
}

/// receiveContext, but for its progress's reset and finish (its options
/// name a progress).
StatusOr<ReceiveMetrics> receiveChunks(Link &link, const ChunkObjects &local,
                                       const RestoreTarget &target,
                                       const ReceiveOptions &options) {
  const std::vector<int32_t> &tokens = *target.tokens;
  KVC_ASSIGN_OR_RETURN(hello, receiveJson(link, Kind::Hello, options.timeout));
  Clock::time_point start = Clock::now();
  StatusOr<StoreLayout> layout = checkHello(hello, local, tokens);
  if (layout.isOk() && options.layout &&
      (layout->chunkTokens != options.layout->chunkTokens ||
       layout->layerGroup != options.layout->layerGroup))
    layout = failedPrecondition(
        "the sender streams objects of " + describeLayout(*layout) +
        ", this node's plan receives " + describeLayout(*options.layout));
  if (!layout.isOk()) {
    sendLast(link, Kind::Refuse, {{"reason", layout.status().message()}},
             options.timeout);
    return layout.status().withContext("transfer refused");
  }
  KVC_RETURN_IF_ERROR(sendJson(link, Kind::Accept, Json::object()));

  ChunkObjects objects(local.model(), local.fingerprint(), local.salt(),
                       *layout);
  const std::vector<ChunkRef> expected = objects.refs(
      tokens.data(), int64_t(tokens.size()), Form::KV, CodecSpec());
  StatusOr<ReceiveMetrics> received =
      options.plan
          ? receivePlanned(link, objects, expected, target, options, start)
          : receiveStreamed(link, objects, expected, target, options, start);
  if (!received.isOk()) {
    // The sender hears why in place of its receipt, instead of waiting.
    sendLast(link, Kind::Refuse, {{"reason", received.status().toString()}},
             options.timeout);
    return received.status();
  }
  ReceiveMetrics &metrics = *received;
  metrics.seconds = secondsSince(start);
  metrics.layerReadySeconds =
      options.progress->readySeconds(start, metrics.seconds);
  sendLast(link, Kind::Receipt,
           {{"received", metrics.received},
            {"recomputed", int64_t(metrics.fallbacks.size())}},
           options.timeout);
  return received;
}

} // namespace

StatusOr<ReceiveOptions> receiveOptionsFor(const BundlePlan &plan,
                                           const ChunkObjects &local,
                                           int64_t tokens,
                                           ReceiveOptions base) {
  // The plan's layout: its largest objects (the first chunk's) are whole.
  StoreLayout layout{0, 0};
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps)
      if (step.kind == StepKind::Recv) {
        layout.chunkTokens = std::max(layout.chunkTokens, step.tokens.size());
        layout.layerGroup = std::max(layout.layerGroup, step.layers.size());
      }
  if (layout.chunkTokens <= 0 || layout.layerGroup <= 0)
    return invalidArgument("plan " + plan.name + " receives nothing");
  ChunkObjects objects(local.model(), local.fingerprint(), local.salt(),
                       layout);
  KVC_ASSIGN_OR_RETURN(received,
                       planObjects(plan, objects, tokens, StepKind::Recv));
  if (received.forms != std::vector<Form>{Form::KV})
    return invalidArgument("plan " + plan.name +
                           " receives hidden states; a transfer sends KV");
  base.layout = layout;
  base.codec = received.codec;
  base.plan = &plan;
  return base;
}

StatusOr<ReceiveMetrics> receiveContext(Link &link, const ChunkObjects &local,
                                        const RestoreTarget &target,
                                        const ReceiveOptions &options) {
  if (!target.model || !target.tokens || target.tokens->empty() ||
      !target.cache || !target.table)
    return invalidArgument("transfer: the target needs a model, tokens, a "
                           "cache and a block table");
  if (!options.plan && !options.tracePath.empty())
    return invalidArgument("transfer: a trace is a plan's; the receiver has "
                           "none");
  if (options.plan && !options.codec)
    return invalidArgument("transfer: plan " + options.plan->name +
                           " without the encoding it receives (give the "
                           "options receiveOptionsFor makes)");
  KVC_RETURN_IF_ERROR(
      checkWorkers("transfer: the decoders", std::max(1, options.decoders)));
  return trackProgress(options.progress, local.model().numLayers,
                       int64_t(target.tokens->size()),
                       [&](LayerProgress &progress) {
                         ReceiveOptions tracked = options;
                         tracked.progress = &progress;
                         return receiveChunks(link, local, target, tracked);
                       });
}

} // namespace kvc
