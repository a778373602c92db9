//===- SavePlan.h - Running compiled save plans -----------------*- C++ -*-===//
//
// Executes a save plan (kvc-opt --kvc-save-pipeline, or savePlanFor): the
// plan's tasks become a TaskGraph on shared ResourcePools, lanes as the plan
// says, as a restore's do (Executor.h), and each task's steps run on the
// object its chain carries:
//
//   gather, transfer_to_host
//                   the snapshot: the object's values copied out of the
//                   save's source to host fp32
//   transform, quant
//                   done by the host's encode
//   compress        encodes the object (ChunkObjects::encode: transform,
//                   quantization, lossless stage, header and checksums)
//   store           writes it to the step's tier unless a readable copy is
//                   stored already (ChunkStore::putEncoded); encodes it
//                   first when the plan has no compress step
//   send            hands it, encoded, to the target's sender (a transfer's
//                   send plan: Transfer.h puts it on the link)
//
// Sources: a paged cache (PagedCacheSource: a server saving a request it
// holds, Device::readBack, or the cache a prefill node's prefill fills,
// where generated save kernels encode on the device), or a prefill's
// hand-over (PrefillSnapshots: K, V and hidden states on the host as each
// layer group is computed; HCache's hidden states exist only there). HCache's
// two stages: the gathers copy out of the source (stage one), and once the last
// has run the source may be released while the encodes and writes go on (stage
// two; SaveRunOptions::snapshotted). A source still being filled is saved while
// it fills, each gather waiting for its object, so the save overlaps the
// prefill. A failed save removes the objects it wrote (SaveJournal).
//
// The plan must store (or send) every object of the layout once, in one
// encoding (planObjects' check, Saver.h).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_SAVE_SAVEPLAN_H
#define KVC_RUNTIME_SAVE_SAVEPLAN_H

#include "kvc/Runtime/Base/HandOver.h"
#include "kvc/Runtime/Device/TaskGraph.h"
#include "kvc/Runtime/Exec/LayerProgress.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/ModelRunner.h"
#include "kvc/Runtime/Save/Saver.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace kvc {

/// Where a save plan's gathers read an object's values: a paged cache, or
/// the objects a prefill hands over. Thread-safe.
class SaveSource {
public:
  virtual ~SaveSource();
  /// Whether it can give objects of `form`.
  virtual bool holds(Form form) const = 0;
  /// Whether it can give every object of `objects` for `tokens` tokens
  /// (checked once, before the first gather).
  virtual Status check(const ChunkObjects &, int64_t /*tokens*/) const {
    return Status::ok();
  }
  /// The values of `ref` (ChunkObjects::shape, fp32) into `out`, once they
  /// exist (a source still being filled waits for them).
  virtual Status gather(const ChunkObjects &objects, const ChunkRef &ref,
                        std::vector<float> &out) = 0;
  /// Whether gatherPayloads can run the generated save kernel `kernel`: ok,
  /// or why not.
  virtual Status canGatherPayload(const BundleKernel &kernel) const {
    (void)kernel;
    return unimplemented("the source launches no save kernels");
  }
  /// The objects `refs` name as `kernel` encodes them where the values are
  /// (their payloads before the lossless stage), once they exist, in as
  /// few launches as the values already there allow; returns how many.
  virtual StatusOr<int64_t> gatherPayloads(const BundleKernel &kernel,
                                           const ChunkObjects &objects,
                                           const std::vector<ChunkRef> &refs,
                                           std::vector<std::string> &payloads) {
    (void)objects, (void)refs, (void)payloads;
    return SaveSource::canGatherPayload(kernel);
  }
};

/// The KV of a request in a paged cache, read back through `device`.
/// With `filling`, the cache's progress while a prefill still fills it in
/// token order: each gather first waits until its layers hold its tokens,
/// and fails with the prefill's error.
class PagedCacheSource final : public SaveSource {
public:
  PagedCacheSource(Device &device, const PagedKVCache &cache,
                   const BlockTable &table,
                   const LayerProgress *filling = nullptr)
      : device_(device), cache_(cache), table_(table), filling_(filling) {}
  bool holds(Form form) const override { return form == Form::KV; }
  /// The cache holds the model's KV and the table the request's tokens.
  Status check(const ChunkObjects &objects, int64_t tokens) const override;
  Status gather(const ChunkObjects &objects, const ChunkRef &ref,
                std::vector<float> &out) override;
  /// Through the device's save kernels (Device::launchSave).
  Status canGatherPayload(const BundleKernel &kernel) const override;
  StatusOr<int64_t> gatherPayloads(const BundleKernel &kernel,
                                   const ChunkObjects &objects,
                                   const std::vector<ChunkRef> &refs,
                                   std::vector<std::string> &payloads) override;

private:
  /// Waits until a filling cache holds `ref`'s tokens and layers.
  Status waitFor(const ChunkRef &ref) const;
  /// Whether the cache holds them now.
  bool holds(const ChunkRef &ref) const;

  Device &device_;
  const PagedKVCache &cache_;
  const BlockTable &table_;
  const LayerProgress *filling_;
};

/// The objects a prefill hands over as it computes them (streamContext's
/// sink): K, V and hidden states, each kept until a gather takes it. Holds
/// at most `bufferBytes` while no gather waits for an object still to come
/// (a plan that gathers in another order than the prefill computes never
/// deadlocks; it only holds more).
class PrefillSnapshots final : public SaveSource {
public:
  explicit PrefillSnapshots(size_t bufferBytes) : kept_(bufferBytes) {}
  bool holds(Form) const override { return true; }
  Status canGatherPayload(const BundleKernel &) const override {
    return unimplemented("the prefill hands its objects over on the host");
  }
  Status gather(const ChunkObjects &objects, const ChunkRef &ref,
                std::vector<float> &out) override;
  /// Keeps `count` values of the object `ref` names (whatever its codec);
  /// after finish(), drops them.
  void put(const ChunkRef &ref, const float *values, size_t count);
  /// The prefill (or the save) ended with `status`: gathers of objects not
  /// handed over fail with its error (or say they were never computed).
  void finish(const Status &status);

private:
  HandOver<std::tuple<Form, int64_t, int64_t>, std::vector<float>> kept_;
};

/// What one save reads and writes.
/// Chooses each object's encoding at its encode step, over the plan's
/// (KVServe's controller for a transfer's sender: CodecController.h), and
/// hears how each went. Called from the save's lanes.
class CodecChooser {
public:
  virtual ~CodecChooser() = default;
  /// The encoding of the object `ref` holding `values` (its shape, fp32).
  virtual CodecSpec choose(const ChunkObjects &objects, const ChunkRef &ref,
                           const float *values) = 0;
  /// An object of `rawBytes` (its raw encoding's size) went out as `bytes`
  /// encoded with `codec`: its encoding took `encodeSeconds`, its send on
  /// the link `sendSeconds`.
  virtual void sent(const CodecSpec &codec, size_t rawBytes, size_t bytes,
                    double encodeSeconds, double sendSeconds) = 0;
};

/// Where a send plan's sends go: each object as encoded (its ref's codec
/// the encoding it went out in), with the seconds its encode took, from
/// the task that sends it.
using ObjectSender = std::function<Status(
    const ChunkRef &ref, std::string object, double encodeSeconds)>;

struct SaveTarget {
  /// Where the gathers read.
  SaveSource *source = nullptr;
  /// Stores by tier name (the `tier` of the plan's stores).
  std::map<std::string, ChunkStore *> stores;
  /// Where a send plan's sends go (a transfer's sender, Transfer.h), in
  /// the plan's order on its lanes.
  ObjectSender send;
  /// The layout and encoder of a send plan's objects (a store plan's are
  /// its store's).
  const ChunkObjects *objects = nullptr;
  const std::vector<int32_t> *tokens = nullptr;
};

struct SaveRunOptions {
  /// Writes a Chrome trace of the run here when not empty.
  std::string tracePath;
  /// Called once, from a worker, when every gather has copied its object
  /// out of the source: from then on the save reads it no more (a cache's
  /// blocks may be reused). Never called for a save that fails before.
  std::function<void()> snapshotted;
  /// The plan bundle's kernel table: a gather task naming a generated save
  /// kernel has the source encode its object where the values are
  /// (SaveSource::gatherPayloads) when it can, the host's encoder otherwise;
  /// gathers of one kernel that are ready together share a launch.
  const std::vector<BundleKernel> *kernels = nullptr;
  /// Set (by another thread or a signal handler) to stop the save: its next
  /// task fails with saveInterrupted() and the save takes back what it wrote.
  const std::atomic<bool> *cancel = nullptr;
  /// Chooses each object's encoding as it is encoded, instead of the plan's
  /// (a plan whose gathers name save kernels, which encode as they were
  /// generated, refuses one).
  CodecChooser *chooser = nullptr;
};

struct SaveMetrics {
  double makespanSeconds = 0;
  /// The prefill it ran beside (saveDuringPrefill, sendDuringPrefill),
  /// copies included.
  double prefillSeconds = 0;
  /// A prefill that handed its objects over on the host: the time it
  /// waited for room in its buffers (back-pressure from the save), and the
  /// most its hand-over queue held.
  double stallSeconds = 0;
  size_t peakBufferedBytes = 0;
  /// Seconds from the start until the last gather.
  double snapshotSeconds = 0;
  std::map<std::string, double> busySeconds;
  /// Objects stored (or sent, by a send plan), and found stored already.
  int64_t written = 0, skipped = 0;
  /// Per tier (per peer node, for a send plan).
  std::map<std::string, int64_t> bytesWritten;
  std::optional<double> predictedSeconds;
  /// Objects generated save kernels encoded, the launches that encoded
  /// them (gathers of one kernel ready together share one), and why
  /// kernels did not run (one line per kernel and reason).
  int64_t kernelChunks = 0, kernelLaunches = 0;
  std::vector<std::string> kernelsNotLaunched;
};

/// Saves the objects of `target.tokens` from `target.source` by running
/// `plan`: to `target.stores` for a plan that stores, to `target.send` for
/// one that sends.
StatusOr<SaveMetrics> save(ResourcePools &pools, const BundlePlan &plan,
                           const SaveTarget &target,
                           const SaveRunOptions &options = {});

/// A prefill node's save: prefills `tokens` with `model` on `device`
/// (`stream`'s buffers, prefill steps and progress; its forms and codec are
/// the plan's) while `plan` saves what it computes to `stores`, each gather
/// taking its object as soon as the prefill computed it. Pools come from
/// `device` with the plan's lanes; `run` as save()'s.
///
/// Where the gathers read: a plan of KV only with `run.kernels` holding
/// save kernels, on a device that launches kernels, prefills into a paged
/// cache of the device's (Device::cacheFor, prefillInto, a step of
/// `stream`'s prefill tokens at a time through every layer) and reads it
/// there (PagedCacheSource, waiting for each layer of each step), so that
/// the plan's save kernels encode each object on the device; any other save
/// takes the objects streamContext hands over on the host
/// (PrefillSnapshots, within `stream`'s buffer bytes).
StatusOr<SaveMetrics> saveDuringPrefill(
    Device &device, const LlamaModel &model, const std::vector<int32_t> &tokens,
    const BundlePlan &plan, const std::map<std::string, ChunkStore *> &stores,
    const SaveOptions &stream = {}, const SaveRunOptions &run = {});

/// The sender of a transfer: prefills `tokens` with `model` on `device`
/// (the options, and where the gathers read, as saveDuringPrefill's) while
/// the send `plan` gathers, encodes and sends, through `send`, the objects
/// of `objects`' layout the prefill computes, following the plan's tasks
/// and lanes.
StatusOr<SaveMetrics> sendDuringPrefill(Device &device, const LlamaModel &model,
                                        const ChunkObjects &objects,
                                        const std::vector<int32_t> &tokens,
                                        const BundlePlan &plan,
                                        ObjectSender send,
                                        const SaveOptions &stream = {},
                                        const SaveRunOptions &run = {});

/// How savePlanFor spreads a save: its encodes and stores over `lanes`
/// lanes of their pools (the two-stage saver's writers), and at most
/// `window` objects between their gather and their store (0: no bound):
/// the gather of the i-th object waits for the store of the (i -
/// window)-th, so that a store slower than the prefill holds the prefill
/// back instead of the plan holding every object.
/// A plan that sends (`to` Send) has its objects sent to the peer `tier`
/// names, on net lanes. `encodeOnLanes` gives every object a compress on a
/// decode lane even where the codec is raw: a save whose chooser picks
/// each object's codec (SaveRunOptions::chooser) encodes there, beside the
/// sends, rather than on the lane that sends it.
struct SavePlanShape {
  int64_t lanes = 1;
  int64_t window = 0;
  StepKind to = StepKind::Store;
  bool encodeOnLanes = false;
};

/// A run beside a prefill (saveDuringPrefill, sendDuringPrefill) as the
/// two-stage saver reported it: its total the later end of the prefill and
/// the plan.
SaveStats saveStats(const SaveMetrics &metrics);

/// A save's shape on `writers` lanes with at most `bufferBytes` of objects
/// (fp32, of the model's widest form) between a gather and its store or
/// send: a window of at least one object a lane.
SavePlanShape savePlanShape(const ModelConfig &model, const StoreLayout &layout,
                            int writers, size_t bufferBytes);

/// The save plan a caller without the compiler runs: per object of
/// `objects`' layout for `tokens` tokens and each of `forms`, a gather on
/// the compute lane, a compress on a decode lane (for a codec with a stage
/// past raw) and a store to `tier` on an io lane (or a send to the peer
/// `tier` on a net lane), in the order a prefill completes them.
BundlePlan savePlanFor(const ChunkObjects &objects, int64_t tokens,
                       const std::vector<Form> &forms, const CodecSpec &codec,
                       const std::string &tier,
                       const SavePlanShape &shape = {});

} // namespace kvc

#endif // KVC_RUNTIME_SAVE_SAVEPLAN_H
