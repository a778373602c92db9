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
/// allow (their stated quality plus bf16 rounding), and the largest error:
/// the caller's bound when given, else twice bf16 rounding for a plan that
/// loads nothing lossy, where one wrong value must not hide in an average.
struct VerifyBound {
  double relativeL2 = 0;
  std::optional<double> max;
  const char *maxFrom = ""; ///< What set `max`, for messages.
};

/// The bound for a restore loading `codecs`; `maxError` (relative to the
/// largest |K| or |V| of the prefill) when the caller sets one.
VerifyBound verifyBound(const std::vector<CodecSpec> &codecs,
                        std::optional<double> maxError = std::nullopt);

/// The codecs of the chunks `plan` loads.
std::vector<CodecSpec> planCodecs(const BundlePlan &plan);

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
