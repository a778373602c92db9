//===- Generate.cpp - Decoding after a restore ----------------------------===//

#include "kvc/Host/Tools/Generate.h"

#include <algorithm>

namespace kvc::host {

namespace {

/// Greedy decoding over `step`, which runs tokens at a position and gives
/// the logits after the last; the first call runs `first` at `position`.
template <typename Step>
StatusOr<std::vector<int32_t>>
decode(const ModelCompute &model, Step step, int64_t position,
       std::vector<int32_t> first, const GenerateOptions &options) {
  std::vector<float> logits(size_t(model.config().vocabSize));
  std::vector<int32_t> out;
  std::vector<int32_t> input = std::move(first);
  while (int64_t(out.size()) < options.steps) {
    if (position + int64_t(input.size()) > model.config().maxPositions)
      break; // The model's context is full.
    KVC_RETURN_IF_ERROR(step(position, input, logits.data()));
    position += int64_t(input.size());
    int32_t token = greedyToken(logits);
    out.push_back(token);
    if (token == options.stop)
      break;
    input = {token};
  }
  return out;
}

} // namespace

int32_t greedyToken(const std::vector<float> &logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) -
                 logits.begin());
}

StatusOr<std::vector<int32_t>>
generateAfterRestore(Device &device, const ModelCompute &model,
                     PagedKVCache &cache, const BlockTable &table,
                     const std::vector<int32_t> &prompt,
                     const GenerateOptions &options) {
  if (prompt.empty())
    return invalidArgument("generate: the prompt is empty");
  const int64_t n = int64_t(prompt.size());
  const int64_t room = table.capacity(cache.config().blockSize);
  // The last generated token is not run.
  if (room < std::min(n + options.steps - 1, model.config().maxPositions))
    return invalidArgument(
        "generate: the block table holds " + std::to_string(room) +
        " tokens, " + std::to_string(n) + " prompt tokens and " +
        std::to_string(options.steps) + " generated ones need more");
  std::unique_ptr<ModelRunner> runner = device.createRunner(model);
  auto step = [&](int64_t position, const std::vector<int32_t> &tokens,
                  float *logits) {
    return runner->decode(cache, table, position, tokens.data(),
                          int64_t(tokens.size()), logits);
  };
  return decode(model, step, n - 1, {prompt.back()}, options);
}

StatusOr<std::vector<int32_t>>
generateAfterPrefill(const ModelCompute &model,
                     const std::vector<int32_t> &prompt,
                     const GenerateOptions &options) {
  if (prompt.empty())
    return invalidArgument("generate: the prompt is empty");
  ModelCompute::Cache cache = model.newCache();
  auto step = [&](int64_t position, const std::vector<int32_t> &tokens,
                  float *logits) {
    KVC_RETURN_IF_ERROR(model.nextLogits(cache, position, tokens.data(),
                                         int64_t(tokens.size()), logits));
    cache.tokens = position + int64_t(tokens.size());
    return Status::ok();
  };
  return decode(model, step, 0, prompt, options);
}

} // namespace kvc::host
