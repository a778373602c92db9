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
/// are refused: its plans are read only without them).
inline constexpr int64_t kPlanBundleVersion = 3;
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

/// A generated kernel (kvc-lower-kernels, kvc-kernels-to-ptx): its PTX, its
/// launch shape and argument ABI, and what it is specialized for.
struct BundleKernel {
  /// What the kernel computes: `Restore` decodes a stored KV payload into
  /// the cache; `RopeScatter` is the epilogue of a hidden-state projection
  /// (its payload is the K/V GEMM's f32 output; it applies RoPE to K);
  /// `Save` gathers KV from the cache and encodes it into the payload as
  /// the runtime's codecs store it (before their lossless stage); `RmsNorm`
  /// is a projection's prologue (RmsNorm.h), normalizing hidden states
  /// into the bf16 input of the K/V GEMM.
  enum class Kind { Restore, RopeScatter, Save, RmsNorm };

  /// The symbol tasks name in `entry`.
  std::string name;
  Kind kind = Kind::Restore;
  /// The PTX .entry to launch.
  std::string function;
  /// "sm_90", ...: the architecture the PTX targets.
  std::string arch;
  std::string ptx;
  /// Blocks and threads per block, x y z, for one chunk: constants, the
  /// chunk's shape being part of the specialization. A kernel that
  /// addresses the cache runs grid[1] (1 here) times the chunks of its
  /// launch's chunk table (KernelAbi.h).
  std::array<int64_t, 3> grid{1, 1, 1}, block{1, 1, 1};
  /// The kernel's parameters in order, by name (KernelGen.h): buffers
  /// ("payload", "key_cache", "value_cache", "block_table", "chunks", for
  /// RopeScatter "rope_table"; for RmsNorm "hidden", "norm_weights",
  /// "normed") each pass as the five values of an MLIR memref descriptor
  /// (base, aligned base, offset, size, stride), integers ("layer_rows";
  /// RmsNorm's "first_layer") as one 64-bit value.
  std::vector<std::string> args;
  /// The specialization.
  int64_t tokens = 0, layers = 0, kvHeads = 0, headDim = 0, blockSize = 0;
  /// RmsNorm: the model's hidden size (the row it normalizes) and the
  /// epsilon it adds to the mean square.
  int64_t hidden = 0;
  double eps = 0;
  /// "bf16", "f16" or "f32": unquantized stored values ("f32" for
  /// RopeScatter, whose payload holds the projection's output; for RmsNorm
  /// the hidden states' type).
  std::string storage = "bf16";
  /// The payload's codec (no lossless stage: decompressed on the host).
  CodecSpec codec;
  /// Bytes of the payload the kernel reads or writes (RmsNorm: of the
  /// hidden states it reads).
  int64_t payloadBytes = 0;
};

/// "restore", "rope_scatter", "save" or "rms_norm".
const char *bundleKernelKindName(BundleKernel::Kind kind);
/// The kind bundleKernelKindName() names `name`, if any.
std::optional<BundleKernel::Kind> parseBundleKernelKind(std::string_view name);

/// The kernel of `kernels` named `name`, if any.
const BundleKernel *findKernel(const std::vector<BundleKernel> &kernels,
                               std::string_view name);

/// The argument names a kernel of `kind` takes, each once, in the order of
/// the generated function's parameters (KernelGen.h).
const std::vector<std::string> &bundleKernelArgNames(BundleKernel::Kind kind);

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

} // namespace kvc

#endif // KVC_RUNTIME_EXEC_PLANBUNDLE_H
