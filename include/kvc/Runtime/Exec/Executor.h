//===- Executor.h - Running compiled restore plans --------------*- C++ -*-===//
//
// Executes one plan of a plan bundle for one request: the plan's tasks
// become a TaskGraph on shared ResourcePools (lanes per store tier
// "io:<tier>", "decode", "h2d", "compute"), and each task's steps run on the
// values its input tasks produced, host steps here, device steps on the
// target's Device (the CPU device unless one is given) and the model's
// runner on it:
//
//   fetch               reads the stored objects covering the step's box
//   recv                reads them from the store the target names after
//                       the sending node (a transfer's receive plan: the
//                       receiver's inbox, Transfer.h, where a read waits for
//                       its object to arrive)
//   decompress          checks and decodes them (format, lossless stage,
//                       dequantization and inverse transform: ChunkStore)
//   dequant, untransform
//                       done by the host's decode
//   transfer_to_device  Device::upload
//
// except where the task that scatters a loaded chunk names a generated
// restore kernel (BundleTask::entry, in RestoreOptions::kernels) and the
// device launches it (Device::launchesKernels, canLaunch): there the
// decode undoes only the lossless stage, the upload carries the stored
// payload, and Device::launchRestore dequantizes, untransforms and
// scatters it on the device. A chunk whose stored objects do not tile its
// box exactly is decoded on the host as above.
//
//   project             ModelRunner::project: hidden states -> K, V (HCache)
//   chunk_compute       ModelRunner::prefill of the box's tokens through
//                       its layers
//   scatter             Device::scatter of the box's K and V into the
//                       paged cache; counted in RestoreOptions::progress
//
// A chunk whose objects are missing, corrupt, truncated or from another
// model is not scattered; its box is recomputed after the graph (one
// prefill up to its last token, exact in fp32), reported as a fallback
// event, and the run still yields the exact cache. Any other error fails
// the run.
//
// Compute chunks cover every layer from layer 0 (segments above it are
// refused); the runner's prefill session keeps them and fallbacks exact in
// any order. Fetches that carry a staging slot read and decode into that
// slot's host buffers, reused across chunks and rounds (ShadowServe's
// bounded staging); the upload frees them, and the slot's device buffers
// are held until the scatter.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_EXEC_EXECUTOR_H
#define KVC_RUNTIME_EXEC_EXECUTOR_H

#include "kvc/Runtime/Device/PagedKVCache.h"
#include "kvc/Runtime/Device/TaskGraph.h"
#include "kvc/Runtime/Exec/LayerProgress.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/ModelRunner.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvc {

/// What one restore reads and writes.
struct RestoreTarget {
  /// The device the cache is on; the CPU device when null.
  Device *device = nullptr;
  /// The model computed chunks and projections run (kvc's LlamaModel or a
  /// server's own).
  const ModelCompute *model = nullptr;
  /// The model's runner on the device (over weights the server holds
  /// there: createCudaRunner); the device's own runner of `model`
  /// (Device::createRunner) when null.
  ModelRunner *runner = nullptr;
  /// Stores by tier name (the `tier` of the plan's fetches), or by the
  /// node a receive plan's recvs receive from.
  std::map<std::string, ChunkStore *> stores;
  const std::vector<int32_t> *tokens = nullptr;
  PagedKVCache *cache = nullptr;
  const BlockTable *table = nullptr;
};

struct RestoreOptions {
  /// Writes a Chrome trace of the run here when not empty.
  std::string tracePath;
  /// Told of every chunk written, so a caller can wait for layer i while
  /// later layers load; reset when the restore starts, finished when it
  /// ends (with its error, if it fails).
  LayerProgress *progress = nullptr;
  /// The kernel table of the plan's bundle: the generated code its tasks
  /// name. Without it, every task runs the runtime's own code.
  const std::vector<BundleKernel> *kernels = nullptr;
  /// Tokens [0, resident) are in the cache already (a server's own prefix
  /// hit) and are not written: the tasks of chunks below it do not run, and
  /// their layers count as written. A plan with a chunk across it, or a
  /// compute chunk above it, is refused: the first would overwrite blocks
  /// the server may share, the second reads a context the plan did not
  /// restore.
  int64_t resident = 0;
  /// When set and true, the restore stops at its next task and fails with
  /// restoreCancelled(); what it wrote stays written.
  const std::atomic<bool> *cancel = nullptr;
  /// Whether chunks that could not be loaded intact are recomputed (exact,
  /// with the target's model) before the restore ends; when false they are
  /// left unwritten for the caller, in RestoreMetrics::fallbackTokens.
  bool recomputeFallbacks = true;
  /// Whether an object a check finds damaged (its checksum, its length,
  /// its values) is removed from its store, so that the next save of its
  /// chunk writes it again instead of finding it stored (a server's loads:
  /// host::Connector sets it); its chunk is recomputed either way.
  bool removeDamaged = false;
};

/// The error of a restore stopped through RestoreOptions::cancel.
Status restoreCancelled();

/// Where Cake's two-sided walk (DynamicCake.h) met: tokens [0, mergeToken)
/// were computed, the rest loaded (or recomputed after a failed load).
struct CakeWalk {
  int64_t mergeToken = 0;
  /// The compiler's merge point, when given (DynamicCakeOptions).
  std::optional<int64_t> predictedMergeToken;
  int64_t chunksComputed = 0;
  int64_t chunksLoaded = 0;
};

/// Bytes a restore's loads moved through host memory, by what moved them.
/// A raw chunk read in place moves each byte once on the host (read): into
/// pinned staging, which the device then copies into the cache (scattered:
/// a GPU's DMA), or on a CPU straight into the paged cache's rows.
struct HostTraffic {
  /// Stored bytes the tiers put into host memory (a file's read, a memory
  /// tier's copy, a network reply).
  int64_t read = 0;
  /// Host-to-host copies of bytes already read: a tier's second copy (one
  /// that does not read in place, Tier::readsInPlace), a raw payload
  /// copied out of its object, rows moved within a chunk.
  int64_t copied = 0;
  /// Bytes decoders wrote: dequantized, decompressed or converted values.
  int64_t decoded = 0;
  /// Loaded K and V in the cache, 16-bit words.
  int64_t delivered = 0;
  /// Of those, what the device copied there from staging (its upload and
  /// scatter; a generated kernel's decode): none where the host read them
  /// into the cache itself.
  int64_t scattered = 0;

  /// Host bytes moved per byte delivered: (read + copied + decoded) /
  /// delivered; 0 when nothing was delivered.
  double perByte() const {
    return delivered ? double(read + copied + decoded) / double(delivered)
                     : 0.0;
  }
  HostTraffic &operator+=(const HostTraffic &other) {
    read += other.read;
    copied += other.copied;
    decoded += other.decoded;
    delivered += other.delivered;
    scattered += other.scattered;
    return *this;
  }
  HostTraffic operator-(const HostTraffic &other) const {
    HostTraffic out = *this;
    out.read -= other.read;
    out.copied -= other.copied;
    out.decoded -= other.decoded;
    out.delivered -= other.delivered;
    out.scattered -= other.scattered;
    return out;
  }
  /// Bytes of each kind by name (`read`, `copied`, ...: `read_bytes` and
  /// so on in compare --json and a trace's task events).
  std::vector<std::pair<std::string, int64_t>> counters() const {
    return {{"read", read},
            {"copied", copied},
            {"decoded", decoded},
            {"delivered", delivered},
            {"scattered", scattered}};
  }
};

struct RestoreMetrics {
  double makespanSeconds = 0; ///< The graph plus any fallback recompute.
  double fallbackSeconds = 0;
  std::map<std::string, double> busySeconds;
  std::map<std::string, int64_t> bytesRead; ///< Per tier.
  HostTraffic hostTraffic;
  /// The same by the plan step that moved it (`fetch`, `decompress`,
  /// `transfer_to_device`, `scatter`, ...: a step's own work and what it
  /// ran for it, an upload's decode of a chunk no decompress read).
  std::map<std::string, HostTraffic> hostTrafficByStep;
  double flops = 0;
  /// Staging the plan's slots hold for their chunks (host and device):
  /// buffers reused by every later chunk through the slot, so bounded by
  /// the slot count times the largest chunk, whatever the context length
  /// (host buffers kept from earlier restores may have room for more).
  int64_t stagingBytes = 0;
  /// Bytes of the private fp32 prefill held to recompute chunks that need
  /// an exact context the paged cache does not have (fallbacks, compute
  /// after loaded tokens): 0 otherwise, since computed chunks attend over
  /// the paged cache itself.
  int64_t exactContextBytes = 0;
  /// One line per chunk recomputed instead of loaded (or, without
  /// RestoreOptions::recomputeFallbacks, left unwritten), with why.
  std::vector<std::string> fallbacks;
  /// The tokens of those chunks, one range per chunk, in plan order, and
  /// the fault that failed each (ChunkFault::None for an error that names
  /// none).
  std::vector<BundleRange> fallbackTokens;
  std::vector<ChunkFault> fallbackFaults;
  /// Chunks generated kernels wrote into the cache on the device: restore
  /// kernels decoding stored KV, projections' epilogues.
  int64_t kernelChunks = 0;
  /// Launches that wrote them: chunks of one restore kernel that were
  /// ready together share a launch; a projection counts once.
  int64_t kernelLaunches = 0;
  /// Why chunks whose task names a generated kernel were decoded on the
  /// host instead, one line per kernel and reason (none on a device that
  /// launches no kernels: it decodes every chunk on the host by design).
  std::vector<std::string> kernelsNotLaunched;
  /// Per layer, seconds from the restore's start to when the layer held
  /// every token, so waitLayer(i) returned (its last write; the end of the
  /// restore for a layer its writes did not complete).
  std::vector<double> layerReadySeconds;
  /// The plan's predictions beside the measures above: the compiler's
  /// makespan, busy time per resource (its tasks' predicted times), bytes
  /// per tier (its fetches' priced bytes) and per layer when its last
  /// scatter finishes, when the plan was estimated; and the FLOPs the
  /// plan's compute and projections take.
  std::optional<double> predictedSeconds;
  std::map<std::string, double> predictedBusySeconds;
  std::map<std::string, int64_t> predictedBytesRead;
  std::vector<double> predictedLayerReadySeconds;
  double plannedFlops = 0;
  /// Where the sides met, when the restore was Cake's dynamic walk.
  std::optional<CakeWalk> walk;
};

/// True for the errors a recompute recovers from: a chunk missing, damaged,
/// another model's or filed under another key, or its tier unreachable.
bool recoverableByRecompute(const Status &status);

/// The pool a task runs in: io tasks in their tier's ("io:ssd").
std::string poolOf(const BundleTask &task);

/// The resources and lanes a plan's tasks need (for ResourcePools::create).
std::map<std::string, int> planResources(const BundlePlan &plan);

/// Restores `target.tokens` into `target.cache` by running `plan`.
StatusOr<RestoreMetrics> restore(ResourcePools &pools, const BundlePlan &plan,
                                 const RestoreTarget &target,
                                 const RestoreOptions &options = {});

/// How far a restored cache is from a full prefill of the request.
struct RestoreError {
  /// The largest |restored - prefill| over every layer's K and V, relative
  /// to the largest |K| or |V| of the prefill. A lossless restore stays
  /// within bf16 rounding (2^-8); one wrong value anywhere shows here.
  double max = 0;
  /// The worst relative L2 error of one layer's K or V: the measure a lossy
  /// codec's stated quality bounds.
  double relativeL2 = 0;
  /// Values of the restored cache, and of the full prefill, that are NaN or
  /// infinite; either makes both measures above infinite (a comparison with
  /// NaN would drop it).
  int64_t nonFiniteRestored = 0, nonFiniteReference = 0;
};

/// Verification of `cache` against a full prefill of `tokens` on `device`.
StatusOr<RestoreError> restoreError(const ModelCompute &model,
                                    const std::vector<int32_t> &tokens,
                                    const PagedKVCache &cache,
                                    const BlockTable &table,
                                    Device &device = cpuDevice());
/// The same against a full prefill of the request's `tokens` tokens already
/// computed (to verify many restores of one request).
StatusOr<RestoreError> restoreError(const ModelCompute &model,
                                    const ModelCompute::Cache &reference,
                                    int64_t tokens, const PagedKVCache &cache,
                                    const BlockTable &table,
                                    Device &device = cpuDevice());

} // namespace kvc

#endif // KVC_RUNTIME_EXEC_EXECUTOR_H
