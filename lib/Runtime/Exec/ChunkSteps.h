//===- ChunkSteps.h - One chunk's journey into the cache --------*- C++ -*-===//
//
// Private to lib/Runtime/Exec. The steps a loaded or computed chunk takes,
// shared by both restore paths (compiled plans, Cake's dynamic walk):
//
//   fetch      reads the stored objects covering the chunk's box (host)
//   decode     checks and decodes them to the chunk's layout (host); for a
//              chunk a generated kernel decodes, only their lossless stage
//   toDevice   the device's upload; frees the host staging
//   project    the model runner's hidden states -> K, V
//   compute    the model runner's prefill of the box into the paged cache
//   scatter    the device's write of K and V into the paged cache, or its
//              launch of the chunk's generated kernel (one launch for
//              chunks of one kernel scattered together); counts the box's
//              layers as written (LayerProgress)
//
// A chunk's host buffers are a staging slot's (the plan's, or a spare),
// reused across chunks and rounds (ShadowServe's bounded staging): held from
// the fetch to the upload, and the slot's device buffers from the upload to
// the scatter. A slot decodes into the device's host memory
// (Device::hostMemory: pinned, on CUDA), which the upload reads in place.
// Errors are values; the caller decides which ones a recompute recovers.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_EXEC_CHUNKSTEPS_H
#define KVC_LIB_RUNTIME_EXEC_CHUNKSTEPS_H

#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Exec/LayerProgress.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/ModelRunner.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace kvc::exec_detail {

/// 16-bit words per element of `dtype`.
inline int64_t wordsPer(DType dtype) { return dtype == DType::F32 ? 2 : 1; }

/// Buffers for one chunk in flight, allocated on first use and reused by
/// every chunk routed through the slot. `busy` and `deviceBusy` turn a plan
/// that would refill either side early into an error instead of a race.
struct StagingSlot {
  /// Decodes into `memory` (the device's host memory; null: the heap's).
  /// Takes fetch buffers kept by earlier restores' slots, and gives its own
  /// back (keptFetchBytes): a fresh buffer's pages fault in as it is read
  /// into, at about the cost of the read on a VM.
  explicit StagingSlot(HostMemory *memory);
  ~StagingSlot();
  StagingSlot(const StagingSlot &) = delete;
  StagingSlot &operator=(const StagingSlot &) = delete;

  std::atomic<bool> busy{false}, deviceBusy{false};
  /// One of ChunkSteps' spares (a chunk whose plan gave it no slot), and
  /// whether it is among the free ones. Guarded by ChunkSteps' mutex.
  bool spare = false, free = false;
  std::vector<std::pair<ChunkRef, std::string>> objects;
  HostWords data;
  std::unique_ptr<DeviceBuffer> device, projected;
};

/// Bytes of fetch buffers kept for the next restores' staging slots (at
/// most 512 MiB).
std::size_t keptFetchBytes();

/// A chunk on its way. Layout of `data` and of the device buffer: per layer
/// of `layers`, K then V ([tokens][kvDim] each) for KV, or the layer's
/// input hidden states ([tokens][hidden]), in 16-bit words of the form's
/// element type (ChunkSteps::dtypeOf): bf16 for KV, as the paged cache
/// holds it; the model's own dtype for hidden states, which the projection
/// reads exactly.
struct ChunkValue {
  Form form = Form::KV;
  BundleRange tokens, layers;
  std::string tier;
  /// The stored encoding the plan loads.
  CodecSpec codec;
  /// The stored objects as read (`objects[0, objectCount)`) and whether
  /// they still await decoding into `data`.
  std::vector<std::pair<ChunkRef, std::string>> objects;
  std::size_t objectCount = 0;
  bool encoded = false;
  /// Per object, whether it was read in place (Tier::getInto): its header
  /// in `objects`, its payload already at its place in `data`, awaiting
  /// only its checks, or in the paged cache's rows (`intoCache`), checked
  /// by the fetch as it landed.
  std::vector<bool> landed;
  /// Whether the fetch read the chunk's objects in place (into `data`, or
  /// into the cache's rows: `intoCache`), so that `objects` hold headers.
  bool readInPlace = false;
  /// Whether the chunk goes straight into the paged cache's rows: read
  /// there and checked as it lands (ChunkSteps::fetchIntoCache) or
  /// decoded there (decodeIntoCache). Nothing is left to upload or
  /// scatter.
  bool intoCache = false;
  HostWords data;
  /// The chunk on the device once uploaded: the slot's buffer, or its own.
  DeviceBuffer *device = nullptr;
  std::unique_ptr<DeviceBuffer> ownDevice;
  /// The staging slot whose host buffers `objects` and `data` are while
  /// held, and the one whose device buffers hold the chunk after the upload.
  StagingSlot *slot = nullptr;
  StagingSlot *deviceSlot = nullptr;
  /// The generated restore kernel that decodes and scatters the chunk on
  /// the device, when the device launches it (null: the runtime's own
  /// decode and scatter).
  const BundleKernel *kernel = nullptr;
  /// The generated projection that writes the chunk's K and V into the
  /// cache from its hidden states (ModelRunner::launchProject), when the
  /// runner launches it: an RmsNorm prologue and a RopeScatter epilogue
  /// (null: the runner's project, then the device's scatter).
  const BundleKernel *prologue = nullptr, *epilogue = nullptr;
  /// Whether `data`, then the device buffer, holds the stored payload for
  /// `kernel` (the objects after their lossless stage, back to back)
  /// instead of decoded elements.
  bool payload = false;
  /// Why the chunk will be recomputed instead ("" while it is fine), and
  /// the store's fault that said so.
  std::string fault;
  ChunkFault faultKind = ChunkFault::None;
  /// Its objects a check found damaged (a checksum, a length, values), for
  /// RestoreOptions::removeDamaged.
  std::vector<ChunkRef> damaged;
  /// Computed chunks are in the paged cache already: their prefill wrote
  /// each layer's KV there as it went, as a server's attention writes a
  /// prefill chunk's KV into its cache, and their scatter has nothing left
  /// to copy.
  bool inCache = false;
  /// The plan step working on the chunk (set where the executor runs one),
  /// whose host traffic ChunkSteps counts, and what its steps moved.
  StepKind step = StepKind::Fetch;
  HostTraffic traffic;

  ChunkBox box() const {
    return {tokens.begin, tokens.end, layers.begin, layers.end};
  }
};

/// What one restore reads and writes, and the steps over it. Thread-safe
/// for distinct chunks.
class ChunkSteps {
public:
  /// Computes through `runner` when given, else through a runner of
  /// `model` the device makes.
  ChunkSteps(Device &device, const ModelCompute &model, ModelRunner *runner,
             const std::map<std::string, ChunkStore *> &stores,
             const std::vector<int32_t> &tokens, PagedKVCache &cache,
             const BlockTable &table, LayerProgress *progress,
             int64_t resident = 0);

  /// The stored objects of `form` in `codec` for the request on `tier`.
  const std::vector<ChunkRef> &refs(const std::string &tier, Form form,
                                    const CodecSpec &codec);

  /// Reads the objects covering the chunk, into `slot`'s buffers when given.
  Status fetch(ChunkValue &value, StagingSlot *slot);
  /// Decodes the fetched objects into `data`: their payload for the
  /// chunk's kernel when they tile its box, else its elements.
  Status decode(ChunkValue &value);
  /// Decodes first when needed; a chunk already uploaded stays.
  Status toDevice(ChunkValue &value);
  Status project(ChunkValue &value);
  /// Prefills the box's tokens through layers [0, box.layerEnd).
  Status compute(ChunkValue &value);
  Status scatter(ChunkValue &value);
  /// Scatters `values`, chunks a generated kernel decodes in one launch
  /// (they name the same one; Internal otherwise) and the others one by one.
  Status scatter(const std::vector<ChunkValue *> &values);
  /// Prefills `box` exactly into the cache (Cake's front, a chunk that
  /// failed to load) and counts it as written.
  Status computeBox(const ChunkBox &box);
  /// Waits until what the device was given for the cache is in it
  /// (Device::settle): the restore's end, or a walk that paces itself by
  /// what is done.
  Status settle() const { return device_.settle(cache_); }

  /// Gives the chunk's held buffers back (after a fault).
  void release(ChunkValue &value);

  /// Records why a kernel did not run (once per distinct line).
  void kernelNotLaunched(const std::string &why);
  /// The model's runner on the restore's device.
  ModelRunner &runner() const { return *runner_; }

  double flops() const;
  int64_t kernelLaunches() const;
  int64_t kernelChunks() const;
  std::vector<std::string> kernelsNotLaunched() const;
  int64_t exactContextBytes() const { return prefill_->exactContextBytes(); }
  std::map<std::string, int64_t> bytesRead() const;
  HostTraffic traffic() const;
  /// The same, by the plan step that moved it (ChunkValue::step).
  std::map<StepKind, HostTraffic> trafficByStep() const;

  /// Removes `value`'s damaged objects from their store, so that a later
  /// save writes them again (RestoreOptions::removeDamaged); what it did,
  /// for the chunk's fault ("" when none was damaged).
  std::string removeDamaged(ChunkValue &value);

private:
  /// `status`, the check of `ref`'s object; damage noted on `value`.
  static Status noteDamage(ChunkValue &value, const ChunkRef &ref,
                           Status status);
  /// Whether `refs`, in token then layer order, hold exactly the chunk's
  /// tokens and its layers back to back.
  bool tiles(const ChunkValue &value,
             const std::vector<const ChunkRef *> &refs) const;
  /// Whether the chunk's objects can be read in place: raw, in the chunk's
  /// own element type, tiling its box, from a tier that reads in place.
  bool readsInPlace(const ChunkValue &value, ChunkStore &store,
                    const std::vector<const ChunkRef *> &covering);
  /// Whether the host writes the chunk's K and V into the paged cache's
  /// rows itself, by its read or its decode: a cache in host memory in
  /// bf16, the chunk above the server's resident tokens, no generated
  /// kernel.
  bool writesCacheRows(const ChunkValue &value) const;
  /// Decodes objects that tile the chunk straight into the cache's rows
  /// (dequantized, decompressed, or copied out of a raw object read whole);
  /// the chunk is in the cache then.
  Status decodeIntoCache(ChunkValue &value);
  /// Reads `ref` into the chunk's next object: its header there, its
  /// payload into `payload`; read whole instead when its size is not what
  /// the two make, for the decode to say why. The object's index.
  StatusOr<std::size_t> readInto(ChunkValue &value, ChunkStore &store,
                                 const ChunkRef &ref,
                                 const std::vector<ByteSpan> &payload,
                                 HostTraffic &traffic);
  /// Reads the chunk's K and V objects straight into the paged cache's
  /// rows when the cache is in host memory in bf16 and they read in place
  /// (the chunk above the server's resident tokens): each byte once, no
  /// staging, no scatter, each object checked (checksum, non-finite
  /// values) as it lands. False (nothing read) when not.
  StatusOr<bool> fetchIntoCache(ChunkValue &value, ChunkStore &store,
                                const std::vector<const ChunkRef *> &covering,
                                HostTraffic &traffic);
  /// The cache rows of `ref`'s payload, in its order: per layer, K's then
  /// V's rows of its tokens.
  StatusOr<std::vector<ByteSpan>> cacheRows(const ChunkRef &ref);
  /// Reads them in place into the staging's `data`, where decode would
  /// put them; false (nothing read) when they do not read in place.
  StatusOr<bool> fetchInPlace(ChunkValue &value, ChunkStore &store,
                              const std::vector<const ChunkRef *> &covering,
                              HostTraffic &traffic);
  /// Settles a chunk read into the cache, its objects checked as they
  /// landed: why an object read whole (of another size) fails; else the
  /// chunk is in the cache.
  Status checkInCache(ChunkValue &value);
  /// Counts `traffic` for the restore, the chunk's step and the chunk.
  void account(ChunkValue &value, const HostTraffic &traffic);
  /// Counts the chunk's K and V as delivered to the cache by the device.
  void accountScatter(ChunkValue &value);
  /// Bytes of `box`'s K and V in the cache.
  int64_t cacheBytes(const ChunkBox &box) const;
  DType dtypeOf(Form form) const;
  int64_t width(Form form) const;
  Status decodeElements(ChunkValue &value);
  /// The chunk's payload for `value.kernel` from its objects in `order`.
  Status decodePayload(ChunkValue &value,
                       const std::vector<std::size_t> &order);
  void releaseSlot(ChunkValue &value);
  /// Counts `box` as written, settled before it completes a layer.
  Status written(const ChunkBox &box);
  void releaseDevice(ChunkValue &value);
  /// A free spare slot, made when none is.
  StagingSlot *takeSpare();
  /// Frees `slot` if it is a spare whose host and device sides are free.
  void freeSpare(StagingSlot &slot);

  Device &device_;
  const ModelCompute &model_;
  std::unique_ptr<ModelRunner> ownRunner_;
  ModelRunner *runner_;
  const std::map<std::string, ChunkStore *> &stores_;
  const std::vector<int32_t> &tokens_;
  PagedKVCache &cache_;
  const BlockTable &table_;
  LayerProgress *progress_;
  /// Whatever the restore's outcome, nothing it enqueued writes the
  /// server's blocks after it returns.
  SettleOnExit settled_;
  /// Tokens [0, resident_) are the server's: a loaded chunk across it has
  /// only its rows above it uploaded and written (RestoreOptions::resident).
  int64_t resident_;
  std::unique_ptr<PrefillSession> prefill_;

  mutable std::mutex mutex_; ///< Guards the members below.
  /// By tier, form and codec string.
  std::map<std::tuple<std::string, Form, std::string>, std::vector<ChunkRef>>
      refs_;
  double flops_ = 0;
  std::map<std::string, int64_t> bytesRead_;
  HostTraffic traffic_;
  std::map<StepKind, HostTraffic> trafficByStep_;
  int64_t kernelLaunches_ = 0, kernelChunks_ = 0;
  std::vector<std::string> kernelsNotLaunched_;
  /// Staging for chunks their plan gave no slot, kept for the next such
  /// chunk: a fresh buffer's first touch faults in each of its pages, which
  /// costs more than the read or the copy that fills it (page faults held a
  /// restore's fetch and upload to a third of their rate on the CPU
  /// backend). As many as the chunks in flight at once; freed with the
  /// restore.
  std::deque<StagingSlot> spares_;
  std::vector<StagingSlot *> freeSpares_;
};

/// Whether `target` names what a restore needs: a model, tokens, a cache
/// and a block table, and a runner (when given) of that model on that
/// device.
Status checkTarget(const RestoreTarget &target);

/// kvc::trackProgress over the layers and tokens of a restore of `target`.
template <typename Run>
auto trackProgress(LayerProgress *progress, const RestoreTarget &target,
                   Run run) -> decltype(run(*progress)) {
  return kvc::trackProgress(
      progress, target.model ? target.model->config().numLayers : 0,
      target.tokens ? int64_t(target.tokens->size()) : 0, run);
}

} // namespace kvc::exec_detail

#endif // KVC_LIB_RUNTIME_EXEC_CHUNKSTEPS_H
