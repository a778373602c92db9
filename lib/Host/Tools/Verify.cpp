//===- Verify.cpp - What a restored cache is held to ----------------------===//

#include "kvc/Host/Tools/Verify.h"

#include "kvc/Planning/CodecProfile.h"
#include "kvc/Runtime/Model/Safetensors.h"

#include <algorithm>
#include <cmath>

namespace kvc::host {

VerifyBound verifyBound(const std::vector<CodecSpec> &codecs,
                        std::optional<double> maxError, int64_t depth) {
  const planning::CodecProfile &profile = planning::CodecProfile::defaults();
  VerifyBound bound;
  bound.relativeL2 =
      profile.restoreErrorBound(codecs) +
      (std::sqrt(1.0 + double(std::max<int64_t>(depth, 0))) - 1.0) / 256;
  bool lossy =
      std::any_of(codecs.begin(), codecs.end(), [&](const CodecSpec &codec) {
        return profile.quality(codec) > 0;
      });
  if (maxError) {
    bound.max = maxError;
    bound.maxFrom = "--max-error";
  } else if (!lossy) {
    bound.max = 1.0 / 128;
    bound.maxFrom = "bf16 rounding";
  }
  return bound;
}

std::vector<CodecSpec> planCodecs(const BundlePlan &plan) {
  std::vector<CodecSpec> codecs;
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch)
        codecs.push_back(step.codec);
  return codecs;
}

int64_t planDepth(const BundlePlan &plan) {
  int64_t depth = 0;
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps) {
      if (step.kind == StepKind::ChunkCompute)
        depth = std::max(depth, step.layers.end);
      else if (step.kind == StepKind::Project)
        depth = std::max<int64_t>(depth, 1);
    }
  return depth;
}

VerifyBound planBound(const BundlePlan &plan, const RestoreMetrics &run,
                      std::optional<double> maxError) {
  return verifyBound(planCodecs(plan), maxError,
                     run.fallbacks.empty() ? planDepth(plan) : plan.layers.end);
}

Status checkVerification(const RestoreError &error, const VerifyBound &bound) {
  if (error.nonFiniteReference > 0)
    return dataLoss("the full prefill holds " +
                    std::to_string(error.nonFiniteReference) +
                    " non-finite K or V values: the model's weights or inputs "
                    "hold NaN or infinity");
  if (error.nonFiniteRestored > 0)
    return dataLoss("the restored cache holds " +
                    std::to_string(error.nonFiniteRestored) +
                    " non-finite K or V values (NaN or infinity)");
  if (error.relativeL2 > bound.relativeL2)
    return dataLoss("the restored cache differs from a full prefill by more "
                    "than the plan's codecs allow");
  if (bound.max && error.max > *bound.max)
    return dataLoss("the restored cache differs from a full prefill by more "
                    "than " +
                    std::string(bound.maxFrom));
  return Status::ok();
}

Status writeRestoredKv(const std::string &path, Device &device,
                       const ModelCompute &model, const PagedKVCache &cache,
                       const BlockTable &table,
                       const std::vector<int32_t> &tokens) {
  const ModelConfig &config = model.config();
  const int64_t n = int64_t(tokens.size());
  TensorMap tensors;
  Tensor &ids = tensors["tokens"];
  ids.shape = {n};
  ids.data.assign(tokens.begin(), tokens.end());
  for (int64_t l = 0; l < config.numLayers; ++l) {
    const std::string prefix = "layers." + std::to_string(l);
    Tensor &k = tensors[prefix + ".key"], &v = tensors[prefix + ".value"];
    for (Tensor *t : {&k, &v}) {
      t->shape = {n, config.numKvHeads, config.headDim};
      t->data.resize(size_t(t->numel()));
    }
    KVC_RETURN_IF_ERROR(
        device.readBack(cache, table, l, 0, n, k.data.data(), v.data.data()));
  }
  return writeSafetensors(path, tensors, DType::F32);
}

} // namespace kvc::host
