//===- PlanBundle.h - The serialized exec-level plan ------------*- C++ -*-===//
//
// A plan bundle is what the compiler hands the runtime: the exec-level IR of
// one or more plans (after kvc-schedule) as versioned JSON — tasks on
// resource lanes, their dependencies, the tasks whose values they read, the
// staging slot each one fills, and the dataflow steps each one runs with
// their chunk ranges and codecs. The format is specified in
// docs/plan-bundle.md; `kvc-opt --kvc-emit-bundle=file=F` writes it.
//
// Reading validates everything the executor relies on, so that a bundle
// that parses is safe to run: known version, task ids dense and in order,
// references to existing tasks, an acyclic graph, every value read by a task
// written by one of its (transitive) dependencies, staging slots in range
// and never refilled while a task still reads them.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_EXEC_PLANBUNDLE_H
#define KVC_RUNTIME_EXEC_PLANBUNDLE_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Device/Kernel.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Support/Vocabulary.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

/// The bundle format version the compiler writes; this runtime reads it and
/// every version from kOldestPlanBundleVersion on (version 1 has no kernel
/// table; version 2's kernels, which took one chunk's origin as scalars,
/// are refused: its plans are read only without them; version 3's kernels
/// are PTX by fields of their own, "arch" and "ptx", which read as version
/// 4's format "ptx", target and binary).
inline constexpr int64_t kPlanBundleVersion = 4;
inline constexpr int64_t kOldestPlanBundleVersion = 1;

/// A half-open range [begin, end).
struct BundleRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const BundleRange &o) const {
    return begin == o.begin && end == o.end;
  }
  bool operator!=(const BundleRange &o) const { return !(*this == o); }
};

/// One dataflow step inside a task.
struct BundleStep {
  StepKind kind = StepKind::Fetch;
  Form form = Form::KV;
  BundleRange tokens;
  BundleRange layers;
  /// The codec of the chunk the step consumes (of the stored chunk for a
  /// fetch).
  CodecSpec codec;
  /// The store tier a fetch reads or a store writes; empty for other steps.
  std::string tier;
  /// The node a send sends to or a recv receives from; empty for other
  /// steps.
  std::string node;
  /// The bytes the compiler priced a fetch to read, when estimated.
  std::optional<int64_t> predictedBytes;
};

struct BundleTask {
  int64_t id = 0;
  Resource resource = Resource::Compute;
  int64_t lane = 0;
  /// Tasks that must finish first.
  std::vector<int64_t> after;
  /// Tasks whose values this task reads.
  std::vector<int64_t> inputs;
  /// The staging slot this task's result fills, if any.
  std::optional<int64_t> slot;
  /// The fused kernel the task launches ("" when it runs plain steps).
  std::string kernel;
  /// Its generated code: the name of an entry of the bundle's kernel table
  /// ("" when the compiler generated none for it).
  std::string entry;
  /// A projection's generated RMSNorm, run before the runtime's K/V GEMM
  /// whose output `entry` (a RopeScatter kernel) reads ("" when none).
  std::string prologue;
  std::vector<BundleStep> steps;
  /// The compiler's predicted [start, finish] in ns, when estimated.
  std::optional<std::pair<int64_t, int64_t>> predictedNs;
};

struct BundlePlan {
  std::string name;
  BundleRange tokens;
  BundleRange layers;
  /// The compiler's predicted makespan, when estimated.
  std::optional<int64_t> predictedUs;
  /// A save's or a sender's: the tokens a step of the prefill it runs beside
  /// computes (kvc-expand's choice, which saveOptionsFor and sendOptionsFor
  /// follow unless the caller chose), when the plan names one.
  std::optional<int64_t> prefillStep;
  /// Number of staging slots (1 + the largest slot used; 0 when none).
  int64_t stagingSlots = 0;
  std::vector<BundleTask> tasks;

  /// Whether `other` runs the same tasks over the same chunks: the same
  /// plan under another name (a joint plan that chose a baseline's split),
  /// whatever the predictions say.
  bool sameSchedule(const BundlePlan &other) const;
};

struct PlanBundle {
  int64_t version = kPlanBundleVersion;
  /// The model's weights fingerprint the plan was compiled for ("" when the
  /// model carried none).
  std::string modelFingerprint;
  std::vector<BundlePlan> plans;
  /// Generated kernels (version 2).
  std::vector<BundleKernel> kernels;

  const BundlePlan *findPlan(std::string_view name) const;
  const BundleKernel *findKernel(std::string_view name) const;
};

/// Parses and validates a bundle. Errors name the offending field by JSON
/// path ("plans[0].tasks[3].after[1]: task 7 does not exist").
StatusOr<PlanBundle> parsePlanBundle(std::string_view json);
/// Reads, parses and validates the bundle at `path`.
StatusOr<PlanBundle> readPlanBundle(const std::string &path);

/// The semantic checks parsePlanBundle runs, for bundles built in memory.
Status validatePlanBundle(const PlanBundle &bundle);

/// FailedPrecondition when `bundle` was compiled for another model's
/// weights than those of `fingerprint` (a bundle that names none fits any
/// model): its plans' shapes and kernels may not be this model's.
Status checkCompiledFor(const PlanBundle &bundle,
                        const std::string &fingerprint);

} // namespace kvc

#endif // KVC_RUNTIME_EXEC_PLANBUNDLE_H
