//===- Saver.h - Saving a context's KV and hidden states --------*- C++ -*-===//
//
// The prefill's side of a save (streamContext): the prefill runs on the
// caller's thread, on the options' device (ModelRunner::streamPrefill); each
// layer's K, V and hidden states are copied into host buffers (HCache's
// stage one, a memcpy) and handed, as complete objects (a token chunk x a
// layer group), to a sink on background threads. A save's sink is a save
// plan's hand-over (SavePlan.h: saveContext and saveDuringPrefill run the
// plan's gathers, encodes and writes, stage two); an uncompiled transfer's
// sends. The buffers are bounded: when the sink falls behind, the copy
// waits for room (back-pressure) rather than growing memory. Saving is
// idempotent: objects already stored in the codec are skipped; the
// context's other encodings stay beside the new one.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_SAVE_SAVER_H
#define KVC_RUNTIME_SAVE_SAVER_H

#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/ModelRunner.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

namespace kvc {

struct SaveOptions {
  std::vector<Form> forms = {Form::KV, Form::Hidden};
  CodecSpec codec;
  int writers = 2;
  /// Host buffers for objects waiting to be written (default 256 MiB).
  size_t bufferBytes = size_t(256) << 20;
  /// Run the prefill without saving anything (the baseline for overhead).
  bool dryRun = false;
  /// Where the prefill runs (ModelRunner::streamPrefill); the CPU device when
  /// null.
  Device *device = nullptr;
  /// KV of the request computed before (a full prefill's): streamed as
  /// it is, without a prefill. Only the KV form can be taken from it.
  const ModelCompute::Cache *computed = nullptr;
  /// Tokens each prefill step runs through every layer, a multiple of the
  /// layout's chunk (0: one chunk; saveOptionsFor sets a compiled plan's). A
  /// step of several chunks hands over its objects layer group by layer group,
  /// so a transfer's first layers complete at the receiver while the prefill
  /// computes the later ones; its activations grow with the span.
  int64_t prefillTokens = 0;
  /// Called after each prefill step with the tokens prefilled so far and
  /// the request's (a long save's progress).
  std::function<void(int64_t done, int64_t total)> progress;
  /// Set (by another thread, or a signal handler: a lock-free store) to stop
  /// the save: it ends as a failed save, Unavailable "the save was
  /// interrupted", and takes back the objects it wrote.
  const std::atomic<bool> *cancel = nullptr;
};

/// The error of a save stopped through SaveOptions::cancel.
Status saveInterrupted();

struct SaveStats {
  double prefillSeconds = 0; ///< The prefill itself, copies included.
  double totalSeconds = 0;   ///< Until the last object is written.
  double stallSeconds = 0;   ///< Time the prefill waited for buffer room.
  int64_t written = 0, skipped = 0;
  size_t peakBufferedBytes = 0;
};

/// The objects one save wrote, so that a failed save takes them back: a
/// store never keeps part of a failed save. Objects the save found stored
/// stay, and no object is ever visible half-written (Tier::put). Thread-safe.
class SaveJournal {
public:
  void wrote(ChunkStore &store, const ChunkRef &ref);
  /// Removes every object recorded and returns `failure`, naming the
  /// objects that could not be removed.
  Status rollback(const Status &failure);

private:
  std::mutex mutex_;
  std::vector<std::pair<ChunkStore *, ChunkRef>> written_;
};

/// The objects a compiled plan ends in at its `endpoint` steps (a save's
/// stores, a transfer's sends or receives): the forms, and the one encoding.
struct PlanObjects {
  std::vector<Form> forms;
  CodecSpec codec;
};

/// Checks that `plan` covers `tokens` tokens and every layer, has only the
/// steps of its kind, and ends every object of `objects`' layout once per
/// form, in one encoding, in an `endpoint` step; anything else is
/// InvalidArgument naming what differs (a plan compiled for another layout
/// names the one it was compiled for).
StatusOr<PlanObjects> planObjects(const BundlePlan &plan,
                                  const ChunkObjects &objects, int64_t tokens,
                                  StepKind endpoint);

/// The save a compiled save plan describes (kvc-save-pipeline): its forms,
/// the encoding it stores (planObjects' check, with the store's layout) and
/// its prefill step unless `base` chose one, over `base`'s other options:
/// what saveContext needs to save as the plan would, not following its
/// tasks and lanes. saveDuringPrefill
/// (SavePlan.h) runs the plan itself.
StatusOr<SaveOptions> saveOptionsFor(const BundlePlan &plan,
                                     const ChunkStore &store, int64_t tokens,
                                     SaveOptions base = {});

/// Where the objects of a streamed prefill go: called on a writer thread
/// with each complete object (its ref carries the options' codec, its
/// values the ref's shape, in fp32); returns whether it wrote the object
/// (false: it was there already). After the first error the prefill stops
/// and no later object is handed over.
using ObjectSink =
    std::function<StatusOr<bool>(const ChunkRef &ref, const float *values)>;

/// The tokens each of a save's prefill steps runs (SaveOptions::
/// prefillTokens, or one chunk of `layout`); InvalidArgument for a step
/// that is not whole chunks.
StatusOr<int64_t> prefillSpan(const SaveOptions &options,
                              const StoreLayout &layout);

/// Prefills `tokens` chunk by chunk (`objects`' layout) and hands every
/// object of `options.forms` to `sink` as soon as its layer group is
/// computed, from `options.writers` threads, the two stages overlapping
/// within `options.bufferBytes`. A save's sink writes to a store; a
/// transfer's sends to the decode node (Transfer.h).
StatusOr<SaveStats> streamContext(const LlamaModel &model,
                                  const ChunkObjects &objects,
                                  const std::vector<int32_t> &tokens,
                                  const SaveOptions &options,
                                  const ObjectSink &sink);

/// Prefills `tokens` and saves the chosen forms to `store` (SavePlan.cpp):
/// the save plan a compiler would write for the store's layout
/// (savePlanFor), run by the save executor beside the prefill as a compiled
/// one is (saveDuringPrefill), its encodes and writes on `options.writers`
/// lanes and at most `options.bufferBytes` of objects between a gather and
/// its store. A dry run prefills alone. A failed save removes the objects it
/// wrote (SaveJournal).
StatusOr<SaveStats> saveContext(const LlamaModel &model, ChunkStore &store,
                                const std::vector<int32_t> &tokens,
                                const SaveOptions &options);

} // namespace kvc

#endif // KVC_RUNTIME_SAVE_SAVER_H
