//===- Transfer.h - KV from a prefill node to a decode node -----*- C++ -*-===//
//
// Disaggregated serving's transfer: the prefill node computes a request's
// KV and streams it to the decode node over a Link while it computes, the
// decode node writes each chunk into its paged cache as it arrives.
//
//   sender     a send plan beside the prefill (sendDuringPrefill,
//              SavePlan.h), the one savePlanFor makes for the layout
//              unless a compiled one is given: every KV object (a token
//              chunk x a layer group) is gathered as soon as its layers
//              are computed, encoded on a decode lane (in the codec the
//              options' chooser picks for it, when one is set) and sent on
//              one of `writers` net lanes, overlapping the prefill
//   receiver   checks each message, decodes it, uploads and scatters it,
//              counting its layers in a LayerProgress as a restore does
//
// Every chunk message is the object a store would hold (ChunkFormat.h):
// model fingerprint, prefix key, token and layer range, encoding and
// checksums, so the receiver checks it exactly as a restore checks a read.
// A session opens with a hello the receiver answers: a sender of another
// model, request, tenant or token count is refused, and both sides report
// why. A transfer that breaks off (the sender dies, stops talking past the
// timeout, or sends a chunk that fails its checks) still yields the exact
// cache: the receiver recomputes what did not arrive, and says what.
//
// A compiled transfer (kvc-expand's send and receive plans of a
// kvc.transfer) sets the encoding the sender sends and the layout and
// encoding the receiver accepts (sendOptionsFor, receiveOptionsFor), and
// each end runs its plan's tasks on its lanes, in its order:
//
//   sender     the compiled send plan, run as above (sends put the objects
//              on the link one at a time)
//   receiver   the receive plan in the executor (Executor.h): its recvs
//              read an inbox the link fills, each waiting for its object,
//              and a recv whose object never arrives intact is recomputed
//              as a restore's missing chunk is
//
// Protocol messages are "KVCT", a kind byte and a body: JSON for hello,
// accept, refuse, end and receipt; the object for a chunk.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_NET_TRANSFER_H
#define KVC_RUNTIME_NET_TRANSFER_H

#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Net/Link.h"
#include "kvc/Runtime/Save/SavePlan.h"

#include <map>
#include <optional>

namespace kvc {

struct SendOptions {
  /// The encoding of every chunk, unless a chooser is set.
  CodecSpec codec;
  /// Chooses each chunk's encoding at its encode step (SaveRunOptions);
  /// not with a compiled plan, which sends the encoding it chose.
  CodecChooser *chooser = nullptr;
  /// The request's KV computed before: sent without a prefill.
  const ModelCompute::Cache *computed = nullptr;
  /// Where the prefill runs (SaveOptions::device); the CPU device when
  /// null.
  Device *device = nullptr;
  /// Tokens per prefill step (SaveOptions::prefillTokens): a step of the
  /// whole request streams layer group by layer group, so the receiver's
  /// first layers complete first. 0: one chunk, or the send plan's
  /// `prefill_step` (sendOptionsFor).
  int64_t prefillTokens = 0;
  /// Without a compiled plan: the lanes the encodes and the sends run on,
  /// and at most `bufferBytes`' worth of objects (fp32) between their
  /// gather and their send; the prefill's hand-over holds at most that
  /// much too.
  int writers = 2;
  size_t bufferBytes = size_t(256) << 20;
  /// How long to wait for the receiver's answers.
  Milliseconds timeout{10000};
  /// The compiled send plan to run (sendOptionsFor), instead of the one
  /// savePlanFor makes for the layout.
  const BundlePlan *plan = nullptr;
  /// Writes the send plan's Chrome trace here when not empty.
  std::string tracePath;
  /// The plan bundle's kernel table: a send plan's gathers that name a
  /// generated save kernel encode on the device, where the device launches
  /// kernels (sendDuringPrefill).
  const std::vector<BundleKernel> *kernels = nullptr;
};

struct SendStats {
  SaveStats stream; ///< The prefill and the send plan beside it.
  int64_t chunks = 0, bytes = 0;
  /// Seconds the link took to take the chunks (sends are serialized).
  double sendSeconds = 0;
  std::map<std::string, int64_t> chunksPerCodec;
  /// The receiver's receipt: chunks it wrote as sent and chunks it
  /// recomputed.
  int64_t received = 0, recomputed = 0;
  /// A send plan's run (its kernels among them), when there was one.
  std::optional<SaveMetrics> planRun;
};

/// The sender of a compiled transfer (kvc-expand's `<name>_send` plan of a
/// kvc.transfer): its encoding and the plan, over `base`'s other options;
/// the plan's prefill step (kvc-expand's: the whole request for a plan that
/// sends layer group by layer group) unless `base` chose one.
/// The plan must send every KV object of `objects`' layout for `tokens`
/// tokens once, in one encoding (planObjects, Saver.h); sendContext runs
/// it, its prefill's snapshots standing for the plan's gathers.
StatusOr<SendOptions> sendOptionsFor(const BundlePlan &plan,
                                     const ChunkObjects &objects,
                                     int64_t tokens, SendOptions base = {});

/// Prefills `tokens` with `model` and streams their KV to the receiver at
/// the other end of `link`, chunked as `objects`' layout says.
StatusOr<SendStats> sendContext(const LlamaModel &model,
                                const ChunkObjects &objects,
                                const std::vector<int32_t> &tokens, Link &link,
                                const SendOptions &options);

struct ReceiveOptions {
  /// How long to wait for the hello, and for each message after it.
  Milliseconds timeout{10000};
  /// Threads decoding and scattering arrived chunks (a plan runs on its
  /// own lanes).
  int decoders = 2;
  /// Host memory for chunks arrived and not yet scattered (not yet taken by
  /// their recv, for a plan).
  size_t bufferBytes = size_t(256) << 20;
  /// Told of every chunk written, as a restore's (Executor.h).
  LayerProgress *progress = nullptr;
  /// A compiled receiver's expectations (receiveOptionsFor): a sender that
  /// streams another layout is refused, and a chunk in another encoding is
  /// dropped and recomputed. Unset: whatever the sender announces.
  std::optional<StoreLayout> layout;
  std::optional<CodecSpec> codec;
  /// The compiled receive plan to run (receiveOptionsFor), instead of the
  /// decoders scattering each chunk as it arrives.
  const BundlePlan *plan = nullptr;
  /// The plan bundle's kernel table: the plan's tasks that name a generated
  /// restore kernel launch it where the device can (RestoreOptions).
  const std::vector<BundleKernel> *kernels = nullptr;
  /// Writes the plan's Chrome trace here when not empty.
  std::string tracePath;
};

/// The receiver of a compiled transfer (kvc-expand's `<name>_recv` plan):
/// the layout and encoding it receives and the plan, over `base`'s other
/// options. The plan must receive every KV object of its layout for
/// `tokens` tokens once, in one encoding (planObjects).
StatusOr<ReceiveOptions> receiveOptionsFor(const BundlePlan &plan,
                                           const ChunkObjects &local,
                                           int64_t tokens,
                                           ReceiveOptions base = {});

struct ReceiveMetrics {
  /// From the hello to the exact cache, recomputes included.
  double seconds = 0;
  /// Until the sender's end (or its loss).
  double streamSeconds = 0;
  double fallbackSeconds = 0;
  int64_t chunks = 0, received = 0, bytes = 0;
  std::map<std::string, int64_t> chunksPerCodec;
  /// Why the stream ended early ("" when the sender finished).
  std::string lost;
  /// Messages dropped because they were no chunk of this request (a
  /// damaged header, a range it does not have), with why.
  std::vector<std::string> rejected;
  /// One line per chunk recomputed instead of received, with why.
  std::vector<std::string> fallbacks;
  /// Per layer, seconds from the hello to when the layer held every token
  /// (the end, for a layer its writes did not complete).
  std::vector<double> layerReadySeconds;
  /// A compiled receiver's run of its plan: busy time per lane, bytes per
  /// peer, the chunks generated kernels wrote.
  std::optional<RestoreMetrics> planRun;
};

/// Receives the KV of `target.tokens` from the sender at the other end of
/// `link` into `target.cache`. `local` names this node's model and tenant
/// (its layout is the sender's, from the hello). A refused transfer is a
/// FailedPrecondition error, after the sender was told why; one that
/// breaks off is recomputed (ReceiveMetrics says what); one that fails
/// after the hello (a receive plan the executor refuses, a device error)
/// tells the sender why in place of its receipt. `target.stores` is
/// unused.
StatusOr<ReceiveMetrics> receiveContext(Link &link, const ChunkObjects &local,
                                        const RestoreTarget &target,
                                        const ReceiveOptions &options = {});

} // namespace kvc

#endif // KVC_RUNTIME_NET_TRANSFER_H
