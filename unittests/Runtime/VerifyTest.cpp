//===- VerifyTest.cpp - What a restored cache is held to ------------------===//
//
// A plan that loads raw K and V is held to one bf16 rounding of the full
// prefill; one that recomputes is allowed the roundings its depth adds up
// (a GPU's chunked bf16 recompute differs from its full prefill by more
// than one rounding), and never a wrong value: the largest error's bound
// stays.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Tools/Verify.h"

#include <gtest/gtest.h>

namespace kvc::host {
namespace {

BundlePlan planOf(std::initializer_list<std::pair<StepKind, BundleRange>> steps) {
  BundlePlan plan;
  plan.name = "p";
  plan.tokens = {0, 1024};
  plan.layers = {0, 8};
  for (const auto &[kind, layers] : steps) {
    BundleTask task;
    task.id = int64_t(plan.tasks.size());
    BundleStep step;
    step.kind = kind;
    step.tokens = {0, 256};
    step.layers = layers;
    task.steps.push_back(step);
    plan.tasks.push_back(task);
  }
  return plan;
}

RestoreError errorOf(double max, double relativeL2) {
  RestoreError error;
  error.max = max;
  error.relativeL2 = relativeL2;
  return error;
}

TEST(VerifyTest, APlansDepthIsHowManyLayersItRecomputes) {
  EXPECT_EQ(planDepth(planOf({{StepKind::Fetch, {0, 8}},
                              {StepKind::Scatter, {0, 8}}})),
            0);
  EXPECT_EQ(planDepth(planOf({{StepKind::Fetch, {0, 4}},
                              {StepKind::Project, {0, 4}}})),
            1);
  EXPECT_EQ(planDepth(planOf({{StepKind::ChunkCompute, {0, 8}},
                              {StepKind::Project, {0, 4}}})),
            8);
}

TEST(VerifyTest, ALoadIsHeldToOneRoundingARecomputeToItsDepths) {
  // The H200's measured errors (docs/results.md): 8 layers of 256-token
  // chunks, and a projection.
  const RestoreError recomputed = errorOf(0.00615, 0.0066);
  const RestoreError projected = errorOf(0.0041, 0.0036);
  const BundlePlan load = planOf({{StepKind::Fetch, {0, 8}}});
  const BundlePlan compute = planOf({{StepKind::ChunkCompute, {0, 8}}});
  const BundlePlan project = planOf({{StepKind::Project, {0, 8}}});
  EXPECT_FALSE(checkVerification(recomputed, planBound(load, {})).isOk());
  EXPECT_TRUE(checkVerification(recomputed, planBound(compute, {})).isOk());
  EXPECT_TRUE(checkVerification(projected, planBound(project, {})).isOk());
  EXPECT_NEAR(planBound(compute, {}).relativeL2, 3.0 / 256, 1e-12);
  // A recompute's wrong chunk still fails, on average or in one value.
  EXPECT_FALSE(checkVerification(errorOf(0.006, 0.02), planBound(compute, {})).isOk());
  EXPECT_FALSE(checkVerification(errorOf(0.01, 0.005), planBound(compute, {})).isOk());
  // A load's chunk recomputed instead is held as a recompute.
  RestoreMetrics fellBack;
  fellBack.fallbacks.emplace_back();
  EXPECT_TRUE(checkVerification(recomputed, planBound(load, fellBack)).isOk());
  // The caller's bound on the largest error replaces bf16's.
  EXPECT_TRUE(checkVerification(errorOf(0.01, 0.005), planBound(compute, {}, 0.02)).isOk());
}

} // namespace
} // namespace kvc::host
