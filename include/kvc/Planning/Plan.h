//===- Plan.h - Requests, plans and their chunks ----------------*- C++ -*-===//
//
// The planner's view of a restore: what is stored where (`Source`), what must
// become resident (`Request`), and how (`Plan`: a method per token range x
// layer range, the strategy level of the kvc dialect). `chunkPlan` splits a
// plan into the per-chunk units that both the simulator and kvc-expand use.
// Ranges are half-open. Nothing here depends on LLVM or MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_PLAN_H
#define KVC_PLANNING_PLAN_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Support/Vocabulary.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvc::planning {

enum class Method { Compute, LoadKV, LoadHidden };

const char *methodName(Method method);

/// A block of tokens x layers, half-open in both.
struct Box {
  int64_t t0 = 0, t1 = 0, l0 = 0, l1 = 0;
  int64_t tokens() const { return t1 - t0; }
  int64_t layers() const { return l1 - l0; }
  bool contains(const Box &o) const {
    return t0 <= o.t0 && o.t1 <= t1 && l0 <= o.l0 && o.l1 <= l1;
  }
  bool empty() const { return t1 <= t0 || l1 <= l0; }
};

/// Stored KV or hidden states.
struct Source {
  std::string tier;
  Form form = Form::KV;
  CodecSpec codec;
  Box box;
  /// Tokens and layers per stored object, grouped from token and layer 0:
  /// a load reads whole objects, so loads from this source start and end on
  /// group boundaries.
  int64_t tokenGroup = 1;
  int64_t layerGroup = 1;
};

/// Make the KV of tokens [0, tokens) of every layer resident.
struct Request {
  int64_t tokens = 0;
  std::vector<Source> sources;
  /// Largest relative error a lossy source may add.
  double maxError = std::numeric_limits<double>::infinity();
  /// Largest KL divergence (nats) of the next-token distribution a lossy
  /// source may add, as the codec profile measured it on the model
  /// (`kvc-run profile-codecs`); a lossy codec without that measure is
  /// excluded while this is finite.
  double maxKl = std::numeric_limits<double>::infinity();
  /// Restore-time objective; plans slower than this are reported.
  double sloSeconds = std::numeric_limits<double>::infinity();
  /// The server's forward pass after the restore: the new tokens it runs
  /// (a suffix's prefill, or 1 for the first decode step), layer by layer
  /// as the restore completes each. With any, the planner minimizes when
  /// that pass ends (Evaluation::firstTokenSeconds); 0: the restore's
  /// makespan.
  int64_t forwardTokens = 0;
};

/// One method over a block. Loads read `source`; a compute segment that
/// starts above layer 0 may read the hidden states entering its first layer
/// from `source` (else from a compute segment that ends there).
struct Segment {
  Method method = Method::Compute;
  Box box;
  int source = -1; ///< Index into Request::sources, or -1.
};

struct Plan {
  std::string strategy; ///< "compute", "kv", "hidden", "cake", "hcache", "joint", ...
  std::vector<Segment> segments;
};

/// A per-chunk unit: one token block (aligned to the chunk grid) of one
/// segment, over a group of its layers (loads) or all of them (compute).
struct Chunk {
  int segment = 0;
  Method method = Method::Compute;
  Box box;
  int source = -1;
};

/// Splits every segment along the token grid of `chunkTokens`, and load
/// segments also into runs of `loadLayers` layers (so that a chunk fits the
/// staging buffers). Chunks come out segment by segment, tokens ascending.
std::vector<Chunk> chunkPlan(const Plan &plan, int64_t chunkTokens,
                             int64_t loadLayers);

/// Whether chunk `later` reads what chunk `earlier` writes: a computed
/// chunk attends over every earlier token of its layers, and starts above
/// layer 0 from the hidden states a computed chunk of its tokens ends with.
bool dependsOn(const Chunk &later, const Chunk &earlier);

/// The order chunks are issued in. Token-major: by first token, then first
/// layer. Layer-wise, for a server that runs its forward pass beside the
/// restore and needs layer 0 first: each segment's loads layer by layer
/// (every token of a run of layers before the next run's), its computes by
/// token; the segments advance together, each chunk placed at the fraction
/// of its segment it completes, so the resources they use stay as busy as
/// token-major keeps them. Either way no chunk precedes one it depends on.
enum class ChunkOrder { TokenMajor, LayerWise };

/// Sorts `chunks` (as chunkPlan made them) into `order`.
void orderChunks(std::vector<Chunk> &chunks, ChunkOrder order);

/// Checks that `plan`'s segments tile [0, tokens) x [0, layers) exactly and
/// that every load names a source of its form that holds its block.
Status verifyPlan(const Plan &plan, const Request &request, int64_t layers);

} // namespace kvc::planning

#endif // KVC_PLANNING_PLAN_H
