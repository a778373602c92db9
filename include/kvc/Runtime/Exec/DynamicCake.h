//===- DynamicCake.h - Cake's run-time merge point --------------*- C++ -*-===//
//
// Cake's dynamic mode: computation walks forward from the first chunk and
// loading walks back from the last; each side claims its next chunk only
// while the two have not met, so the merge point lands wherever the
// machine's compute rate and bandwidth put it on this run — a slower store
// or a busier GPU moves it without replanning. The compiler's merge point
// (when given) is reported beside the one the run found.
//
// The walk is a task graph on the same pools and the same chunk steps
// (fetch, decode, upload, scatter on the target's device) as compiled
// plans: compute runs on the "compute" worker (prefill is sequential: each
// chunk attends to the ones before it); one loader per worker of
// "io:<tier>" fetches, checks and decodes a whole chunk (every layer group)
// and scatters it. A chunk that cannot be loaded (missing, corrupt, another
// model's, tier down) is handed back to the compute side (recomputed after
// both sides, reported), so the cache is always exact.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_EXEC_DYNAMICCAKE_H
#define KVC_RUNTIME_EXEC_DYNAMICCAKE_H

#include "kvc/Runtime/Exec/Executor.h"

namespace kvc {

struct DynamicCakeOptions {
  /// The tier loads read (a key of RestoreTarget::stores).
  std::string tier = "dram";
  /// The stored encoding loads read; a chunk not stored in it is
  /// recomputed.
  CodecSpec codec;
  /// The compiler's merge point, reported beside the measured one.
  std::optional<int64_t> predictedMergeToken;
};

/// The dynamic mode of a compiled Cake plan: the tier and codec its loads
/// read, and its merge point as the prediction the run reports against
/// (the walk starts at both ends whatever it is). InvalidArgument unless the
/// plan computes a prefix of the tokens through every layer and loads the KV of
/// every layer for the rest from one tier (Cake's shape; plans that split
/// layers have no two-sided walk).
StatusOr<DynamicCakeOptions> dynamicCakeOptions(const BundlePlan &plan);

/// Restores `target.tokens` with Cake's two-sided walk over the store's
/// chunks. `pools` needs "compute" and "io:<tier>" workers.
/// `run` traces the walk and reports layer-wise progress as restore() does;
/// the metrics' walk says where the sides met.
StatusOr<RestoreMetrics> restoreDynamicCake(ResourcePools &pools,
                                            const RestoreTarget &target,
                                            const DynamicCakeOptions &options,
                                            const RestoreOptions &run = {});

} // namespace kvc

#endif // KVC_RUNTIME_EXEC_DYNAMICCAKE_H
