//===- Pipeline.h - A chunk's journey, defined once -------------*- C++ -*-===//
//
// A loaded chunk is fetched on its tier's IO lanes, decoded on the host's
// decode lanes, copied to the device still quantized, and finished there
// (dequantization, the inverse transform, projection, scatter); a computed
// chunk is one prefill on the compute device, then a scatter. This file
// defines that journey once: which steps a chunk becomes and in what order
// (`restoreSteps`, `computeSteps`, and a saved chunk's `saveSteps`), which
// resource runs each step and which ready step a resource prefers, which step
// frees the host staging memory a fetch takes and how much it takes, and what
// each step costs. Its users: kvc-expand emits the steps, the planner's
// simulator (Planner::buildJobs) prices them as jobs, kvc-schedule places them
// as tasks and slots and kvc-estimate prices the scheduled steps; the executor
// runs the tasks and resources the bundle carries from kvc-schedule.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_PIPELINE_H
#define KVC_PLANNING_PIPELINE_H

#include "kvc/Planning/Plan.h"
#include "kvc/Support/Vocabulary.h"

#include <vector>

namespace kvc {
struct TierDesc;
} // namespace kvc

namespace kvc::planning {

class CostModel;

/// A chunk's data between two steps: its form, its encoding and whether it
/// is in device memory.
struct ChunkState {
  Form form = Form::KV;
  CodecSpec codec;
  bool onDevice = false;
  /// The stored objects as a fetch or a recv read them: no decompress has
  /// checked and copied them out yet (an upload of them does).
  bool asStored = false;
  /// K and V as a store held them, decoded at most (not projected from
  /// hidden states): a host whose cache is its own memory reads or decodes
  /// them straight into it (writesCacheRows), with no upload or scatter.
  bool fromStore = false;
};

/// Whether a chunk in `state` goes into the paged cache by its read or its
/// decode on the host (ChunkSteps::fetchIntoCache, decodeIntoCache):
/// stored K and V, on a target whose cache is host memory (a CPU).
bool writesCacheRows(const CostModel &cost, const ChunkState &state);

/// Whether the fetch of a chunk in `state` from `tier` reads its raw
/// objects straight into the cache's rows and checks each as it lands
/// (ChunkSteps::fetchIntoCache): writesCacheRows, raw, from a tier that
/// reads in place (memory and disk; a remote store's replies are read
/// whole, then copied and checked as an upload checks them).
bool checksAsRead(const CostModel &cost, const ChunkState &state,
                  const TierDesc *tier);

/// One step of a chunk's journey and the data it reads and produces (a
/// fetch reads nothing: its `in` is its `out`; a scatter produces nothing:
/// its `out` is its `in`).
struct PipelineStep {
  StepKind kind;
  ChunkState in, out;
};

/// The steps that bring data stored as `form` with `codec` to raw data of
/// its form on the device: fetch (or, for a transfer's receiver, recv:
/// `from`), decompress on the host (a codec with a lossless stage),
/// transfer_to_device (still quantized), dequant and untransform on the
/// device (a codec with those stages). With `toCache` the journey goes on
/// into the cache: project (hidden states), scatter.
std::vector<PipelineStep> restoreSteps(Form form, const CodecSpec &codec,
                                       bool toCache,
                                       StepKind from = StepKind::Fetch);

/// The steps that save a chunk of `form` encoded with `codec` (the inverse
/// journey): gather from the cache (KV) or the prefill's snapshot (hidden
/// states) on the device, transform and quant there, transfer_to_host
/// (already quantized), compress on the host (a codec with a lossless
/// stage), store (or, for a transfer's sender, send: `to`).
std::vector<PipelineStep> saveSteps(Form form, const CodecSpec &codec,
                                    StepKind to = StepKind::Store);

/// A computed chunk: chunk_compute, then scatter into the cache.
std::vector<PipelineStep> computeSteps();

/// The resource `kind` runs on. Codec stages (decompress, dequant,
/// untransform and their inverses) run on the host's decode lanes when
/// their input is in host memory and on the compute device otherwise.
Resource stepResource(StepKind kind, bool inputOnHost);
inline Resource stepResource(const PipelineStep &step) {
  return stepResource(step.kind, !step.in.onDevice);
}

/// Which ready step a resource runs first (higher first): the later a
/// load's stage, the higher (fetch 1, decompress 2, the copy 3, device
/// steps 4), so that chunks in flight drain before new ones enter and their
/// staging buffers come back; prefill and the save and transfer sides 0.
int stepPriority(StepKind kind);

/// True for the step that frees the host staging memory its chunk's fetch
/// took: the copy to the device (ShadowServe's bounded buffers).
bool freesStaging(StepKind kind);

/// Host staging bytes a fetch of `box` stored as `form` with `codec` holds
/// until its chunk's copy: the fetched objects and their decoded copy.
double stagingBytes(const CostModel &cost, Form form, const CodecSpec &codec,
                    const Box &box);

/// What a step costs: its seconds on its resource, the bytes it reads from
/// a tier (a fetch) and the FLOPs it computes.
struct StepCost {
  double seconds = 0;
  double bytesRead = 0;
  double flops = 0;
};

/// The cost of `step` over `box` on `cost`'s target; fetches and stores
/// read or write `tier` (a step on an unknown tier costs nothing there), and
/// the steps after a fetch get the tier it read (checksAsRead).
StepCost stepCost(const CostModel &cost, const PipelineStep &step,
                  const Box &box, const TierDesc *tier = nullptr);

/// When the prefill a save or a sender runs beside has written the K and V
/// of `box`'s last token in `box`'s last layer, in seconds from its start.
/// The prefill computes tokens [0, `tokens`) in steps of `step` tokens,
/// every one of `layers` layers of a step before the next step, each layer
/// a `layers`-th of the step's time (CostModel::prefillSeconds), whose K and
/// V are written once projected (CostModel::kvWrittenSeconds).
double prefillReadySeconds(const CostModel &cost, int64_t tokens, int64_t step,
                           int64_t layers, const Box &box);

} // namespace kvc::planning

#endif // KVC_PLANNING_PIPELINE_H
