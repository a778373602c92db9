//===- Generate.h - Decoding after a restore --------------------*- C++ -*-===//
//
// What a model says next, greedily: after a restore, from the paged cache
// it filled (a server's decode step), and after a full prefill, the
// reference a restore's decode is compared with. A restore writes K and V
// but not the logits after the prompt, so decoding after one runs the last
// prompt token again (rewriting its K and V with a fresh computation), as a
// server's prefix cache recomputes at least the last token.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_TOOLS_GENERATE_H
#define KVC_HOST_TOOLS_GENERATE_H

#include "kvc/Runtime/Model/ModelRunner.h"

#include <cstdint>
#include <vector>

namespace kvc::host {

struct GenerateOptions {
  int64_t steps = 32; ///< Tokens to generate at most.
  int32_t stop = -1;  ///< A token that ends generation (EOS), or -1.
};

/// The next-token choice: the highest logit, the lowest id among equals.
int32_t greedyToken(const std::vector<float> &logits);

/// Greedy tokens after `prompt`, whose K and V `cache` holds through
/// `table`; the table needs room for the generated tokens too.
StatusOr<std::vector<int32_t>>
generateAfterRestore(Device &device, const ModelCompute &model,
                     PagedKVCache &cache, const BlockTable &table,
                     const std::vector<int32_t> &prompt,
                     const GenerateOptions &options);

/// Greedy tokens after a full prefill of `prompt` in fp32 vectors (the
/// reference).
StatusOr<std::vector<int32_t>>
generateAfterPrefill(const ModelCompute &model,
                     const std::vector<int32_t> &prompt,
                     const GenerateOptions &options);

} // namespace kvc::host

#endif // KVC_HOST_TOOLS_GENERATE_H
