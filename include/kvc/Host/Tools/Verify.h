//===- Verify.h - What a restored cache is held to --------------*- C++ -*-===//
//
// A restore is verified against a full prefill of the request
// (restoreError): within bf16 rounding of it where the plan loads nothing
// lossy, and within the stated quality of the codecs it loads otherwise
// (planning::CodecProfile), so a lossy object restored where raw was
// planned, or one wrong value anywhere, fails.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_TOOLS_VERIFY_H
#define KVC_HOST_TOOLS_VERIFY_H

#include "kvc/Runtime/Exec/Executor.h"

#include <optional>
#include <string>
#include <vector>

namespace kvc::host {

/// The relative L2 error of each layer's K and V that the loaded codecs
/// allow (their stated quality plus bf16 rounding, and the rounding a bf16
/// recompute accumulates), and the largest error: the caller's bound when
/// given, else twice bf16 rounding for a plan that loads nothing lossy,
/// where one wrong value must not hide in an average.
struct VerifyBound {
  double relativeL2 = 0;
  std::optional<double> max;
  const char *maxFrom = ""; ///< What set `max`, for messages.
};

/// The bound for a restore loading `codecs` that recomputes K and V through
/// at most `depth` layers (0: it computes none; a projection of stored
/// hidden states: 1; a chunk computed through layers 0..L: L); `maxError`
/// (relative to the largest |K| or |V| of the prefill) when the caller sets
/// one. A recompute rounds as the full prefill does but over other GEMM
/// shapes (chunks), so their bf16 roundings differ at each layer and the
/// differences add up through the residual stream: sqrt(1 + depth) times
/// bf16's 2^-8 (on an H200, a projection came within 0.0036 and 8 layers
/// of 256-token chunks within 0.0066 of the full prefill).
VerifyBound verifyBound(const std::vector<CodecSpec> &codecs,
                        std::optional<double> maxError = std::nullopt,
                        int64_t depth = 0);

/// The codecs of the chunks `plan` loads.
std::vector<CodecSpec> planCodecs(const BundlePlan &plan);

/// How many layers deep `plan` recomputes K and V (see verifyBound).
int64_t planDepth(const BundlePlan &plan);

/// verifyBound for `plan`'s codecs and depth, the plan's every layer deep
/// where `run` recomputed chunks it was to load (its fallbacks).
VerifyBound planBound(const BundlePlan &plan, const RestoreMetrics &run,
                      std::optional<double> maxError = std::nullopt);

/// DataLoss when `error` exceeds `bound`.
Status checkVerification(const RestoreError &error, const VerifyBound &bound);

/// Writes what a restore left in `cache` for `tokens` to `path`, a
/// safetensors file another implementation can hold its own KV against
/// (scripts/hf-reference.py --kv): "tokens" [n] (the ids, exact in f32)
/// and per layer l "layers.l.key" and "layers.l.value" [n][kv heads][head
/// dim], the cache's bf16 values read back through `device` as f32.
Status writeRestoredKv(const std::string &path, Device &device,
                       const ModelCompute &model, const PagedKVCache &cache,
                       const BlockTable &table,
                       const std::vector<int32_t> &tokens);

} // namespace kvc::host

#endif // KVC_HOST_TOOLS_VERIFY_H
