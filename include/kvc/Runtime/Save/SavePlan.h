//===- SavePlan.h - Running compiled save plans -----------------*- C++ -*-===//
//
// Executes a save plan (kvc-opt --kvc-save-pipeline, or savePlanFor) over a
// request's KV in a paged cache: the plan's tasks become a TaskGraph on
// shared ResourcePools, lanes as the plan says, as a restore's do
// (Executor.h), and each task's steps run on the object its chain carries:
//
//   gather, transfer_to_host
//                   the snapshot: Backend::readBack copies the object's
//                   layers of K and V out of the cache to host fp32
//   transform, quant
//                   done by the host's encode
//   compress        encodes the object (ChunkObjects::encode: transform,
//                   quantization, lossless stage, header and checksums)
//   store           writes it to the step's tier unless a readable copy is
//                   stored already (ChunkStore::putEncoded); encodes it
//                   first when the plan has no compress step
//
// HCache's two stages: the gathers copy out of the cache (stage one), and
// once the last has run the caller may reuse the cache's blocks while the
// encodes and writes go on (stage two; SaveRunOptions::snapshotted). A
// cache still being filled is saved while it fills: each gather waits until
// its layers hold its tokens (SaveTarget::filling), so the save overlaps the
// prefill. A failed save removes the objects it wrote (SaveJournal).
//
// The plan must store every object of the store's layout once, in one
// encoding (saveOptionsFor's check). Hidden states are not in a paged
// cache: a plan that saves them runs through saveContext, whose prefill
// snapshots them.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_SAVE_SAVEPLAN_H
#define KVC_RUNTIME_SAVE_SAVEPLAN_H

#include "kvc/Runtime/Backend/Backend.h"
#include "kvc/Runtime/Exec/LayerProgress.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Exec/TaskGraph.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvc {

/// What one save reads and writes.
struct SaveTarget {
  /// The device the cache is on; the CPU backend when null.
  Backend *backend = nullptr;
  /// Stores by tier name (the `tier` of the plan's stores).
  std::map<std::string, ChunkStore *> stores;
  const std::vector<int32_t> *tokens = nullptr;
  const PagedKVCache *cache = nullptr;
  const BlockTable *table = nullptr;
  /// The cache's progress while a prefill still fills it in token order:
  /// each gather first waits until its layers hold its tokens, and fails
  /// with the prefill's error. Null when the cache holds the request.
  const LayerProgress *filling = nullptr;
};

struct SaveRunOptions {
  /// Writes a Chrome trace of the run here when not empty.
  std::string tracePath;
  /// Called once, from a worker, when every gather has copied its object
  /// out of the cache: from then on the save reads the cache no more.
  /// Never called for a save that fails before.
  std::function<void()> snapshotted;
};

struct SaveMetrics {
  double makespanSeconds = 0;
  /// Seconds from the start until the last gather.
  double snapshotSeconds = 0;
  std::map<std::string, double> busySeconds;
  int64_t written = 0, skipped = 0;
  std::map<std::string, int64_t> bytesWritten; ///< Per tier.
  std::optional<double> predictedSeconds;
};

/// Saves the KV of `target.tokens` from `target.cache` by running `plan`.
StatusOr<SaveMetrics> save(ResourcePools &pools, const BundlePlan &plan,
                           const SaveTarget &target,
                           const SaveRunOptions &options = {});

/// The save plan a caller without the compiler runs: per object of
/// `objects`' layout for `tokens` tokens and each of `forms`, a gather on
/// the compute lane, a compress on the decode lane (for a codec with a
/// stage past raw) and a store to `tier` on its io lane, in the order a
/// prefill completes them.
BundlePlan savePlanFor(const ChunkObjects &objects, int64_t tokens,
                       const std::vector<Form> &forms, const CodecSpec &codec,
                       const std::string &tier);

} // namespace kvc

#endif // KVC_RUNTIME_SAVE_SAVEPLAN_H
