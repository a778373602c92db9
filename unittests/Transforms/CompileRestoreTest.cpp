//===- CompileRestoreTest.cpp - The compiler in process -------------------===//
//
// compileRestore, as a server binds it through a PlanHook: one plan per
// strategy, and with a GPU chip every kernel those plans launch in the
// bundle's table, once; compileChosen, which lowers a plan priced already
// without searching again; and the bundle built in memory, which is what its
// JSON reads back as.
//
//===----------------------------------------------------------------------===//

#include "kvc/Transforms/CompileRestore.h"

#include "kvc/Planning/CostModel.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Desc/TargetDesc.h"
#include "kvc/Transforms/EmitBundle.h"

#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <set>

namespace kvc {
namespace {

class CompileRestoreTest : public ::testing::Test {
protected:
  void SetUp() override {
    StatusOr<ModelConfig> config = loadModelConfig(
        KVC_SOURCE_DIR "/unittests/Runtime/Inputs/exec-model/config.json");
    ASSERT_TRUE(config) << config.status().toString();
    model_ = *config;
    StatusOr<TargetDesc> target =
        loadTargetDesc(KVC_SOURCE_DIR "/targets/h100-sxm.json");
    ASSERT_TRUE(target) << target.status().toString();
    target_ = *target;
    // 300 tokens of raw KV in DRAM, in objects of 64 tokens x 2 layers.
    planning::Source kv;
    kv.tier = "dram";
    kv.box = {0, 300, 0, model_.numLayers};
    kv.tokenGroup = 64;
    kv.layerGroup = 2;
    request_.tokens = 300;
    request_.sources = {kv};
  }

  ModelConfig model_;
  TargetDesc target_;
  planning::Request request_;
};

TEST_F(CompileRestoreTest, AGpuChipPutsThePlansKernelsInTheTable) {
  CompileRestoreOptions options;
  options.plan.strategies = {planning::Strategy::Kv, planning::Strategy::Joint};
  options.plan.chunkTokens = 64;
  options.plan.gpuChip = "none";
  StatusOr<PlanBundle> plain =
      compileRestore(model_, "", target_, request_, options);
  ASSERT_TRUE(plain) << plain.status().toString();
  EXPECT_TRUE(plain->kernels.empty());
  // Without a chip, a target's own: an explicit one wins.
  options.plan.gpuChip = "";
  target_.compute.chip = "sm_80";
  StatusOr<PlanBundle> targets =
      compileRestore(model_, "", target_, request_, options);
  ASSERT_TRUE(targets) << targets.status().toString();
  ASSERT_FALSE(targets->kernels.empty());
  EXPECT_EQ(targets->kernels.front().target, "sm_80");

  options.plan.gpuChip = "sm_90";
  StatusOr<PlanBundle> bundle =
      compileRestore(model_, "", target_, request_, options);
  ASSERT_TRUE(bundle) << bundle.status().toString();
  ASSERT_EQ(bundle->plans.size(), 2u);
  std::set<std::string> named, listed;
  for (const BundlePlan &plan : bundle->plans)
    for (const BundleTask &task : plan.tasks) {
      EXPECT_EQ(task.kernel.empty(), task.entry.empty())
          << plan.name << " task " << task.id;
      if (!task.entry.empty())
        named.insert(task.entry);
    }
  for (const BundleKernel &kernel : bundle->kernels) {
    EXPECT_TRUE(listed.insert(kernel.name).second)
        << kernel.name << " appears twice";
    EXPECT_EQ(kernel.target, "sm_90");
    EXPECT_FALSE(kernel.binary.empty()) << kernel.name;
  }
  EXPECT_FALSE(named.empty());
  EXPECT_EQ(named, listed);
  EXPECT_TRUE(validatePlanBundle(*bundle).isOk());
}

// A model whose heads the generated RoPE epilogue cannot rotate (head_dim
// 24: its 8-channel pieces would straddle a head's halves) still compiles:
// the projection's kernel is left to the runtime, and the caller is told
// why.
TEST_F(CompileRestoreTest, AKernelWithoutAGeneratedFormIsLeftToTheRuntime) {
  model_.hiddenSize = 192;
  model_.numHeads = 8;
  model_.numKvHeads = 4;
  model_.headDim = 24;
  planning::Source hidden = request_.sources.front();
  hidden.form = Form::Hidden;
  request_.sources = {hidden};
  CompileRestoreOptions options;
  options.plan.strategies = {planning::Strategy::Hidden};
  options.plan.chunkTokens = 64;
  options.plan.gpuChip = "sm_90";
  std::vector<std::string> warnings;
  options.warnings = &warnings;
  StatusOr<PlanBundle> bundle =
      compileRestore(model_, "", target_, request_, options);
  ASSERT_TRUE(bundle) << bundle.status().toString();
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.front().find("RoPE over head_dim 24 needs 8 or a "
                                  "multiple of 16"),
            std::string::npos)
      << warnings.front();
  int64_t projections = 0;
  for (const BundleTask &task : bundle->plans.front().tasks)
    if (task.kernel == "project_scatter") {
      ++projections;
      EXPECT_TRUE(task.entry.empty()) << task.id;
    }
  EXPECT_GT(projections, 0);
  EXPECT_TRUE(bundle->kernels.empty());
  EXPECT_TRUE(validatePlanBundle(*bundle).isOk());
}

// The Connector prices a request with the planner, then compiles the plan it
// chose: compileChosen lowers that plan on the caller's cost model, and the
// result is the plan kvc-plan would have searched for, without searching.
TEST_F(CompileRestoreTest, AChosenPlanIsCompiledWithoutSearchingAgain) {
  CompileRestoreOptions options;
  options.plan.chunkTokens = 64;
  options.plan.layerWise = true;
  options.plan.gpuChip = "sm_90";
  auto cost = std::make_shared<const planning::CostModel>(
      model_, target_, planning::CodecProfile::defaults());
  for (planning::Strategy strategy :
       {planning::Strategy::Kv, planning::Strategy::Joint}) {
    const std::string name = planning::strategyName(strategy);
    SCOPED_TRACE(name);
    options.plan.strategies = {strategy};
    planning::Planner planner(*cost, request_, options.plan);
    ASSERT_TRUE(planner.validate().isOk());
    std::optional<planning::Evaluation> chosen = planner.plan(strategy);
    ASSERT_TRUE(chosen);

    const int64_t searched = planning::Planner::plansMade();
    StatusOr<PlanBundle> compiled =
        compileChosen(model_, "fp", cost, request_, name, *chosen, options);
    ASSERT_TRUE(compiled) << compiled.status().toString();
    EXPECT_EQ(planning::Planner::plansMade(), searched)
        << "compileChosen searched for the plan again";
    ASSERT_EQ(compiled->plans.size(), 1u);
    EXPECT_EQ(compiled->plans.front().name, name);
    EXPECT_EQ(compiled->modelFingerprint, "fp");
    EXPECT_TRUE(validatePlanBundle(*compiled).isOk());

    // What the pipeline's own search compiles for the same request.
    StatusOr<PlanBundle> searchedFor =
        compileRestore(model_, "fp", target_, request_, options);
    ASSERT_TRUE(searchedFor) << searchedFor.status().toString();
    EXPECT_GT(planning::Planner::plansMade(), searched);
    const BundlePlan &plan = compiled->plans.front();
    const BundlePlan &reference = searchedFor->plans.front();
    EXPECT_TRUE(plan.sameSchedule(reference));
    EXPECT_EQ(plan.predictedUs, reference.predictedUs);
    ASSERT_EQ(compiled->kernels.size(), searchedFor->kernels.size());
    for (std::size_t i = 0; i < compiled->kernels.size(); ++i)
      EXPECT_EQ(compiled->kernels[i].binary, searchedFor->kernels[i].binary);
    // Loads of stored K and V launch generated kernels.
    if (strategy == planning::Strategy::Kv) {
      EXPECT_FALSE(compiled->kernels.empty());
    }
  }
}

// The planner's candidates (how many of the analytic search's points it
// simulates) reach the pipeline's search: for each count, the compiled
// joint plan is the one the planner chooses with it, and the counts here
// choose different plans (else this would not tell).
TEST_F(CompileRestoreTest, TheSearchsCandidatesReachThePipeline) {
  // Llama 3.1 8B's 32 layers over a remote tier: a space where simulating
  // more of the analytic search's points finds another plan.
  StatusOr<ModelConfig> model = loadModelConfig(
      KVC_SOURCE_DIR "/examples/models/llama-3.1-8b/config.json");
  ASSERT_TRUE(model) << model.status().toString();
  auto cost = std::make_shared<const planning::CostModel>(
      *model, target_, planning::CodecProfile::defaults());
  planning::Request request;
  request.tokens = 8192;
  for (Form form : {Form::KV, Form::Hidden}) {
    planning::Source source;
    source.tier = "remote";
    source.form = form;
    source.box = {0, request.tokens, 0, model->numLayers};
    source.tokenGroup = 256;
    request.sources.push_back(source);
  }
  CompileRestoreOptions options;
  options.plan.strategies = {planning::Strategy::Joint};
  options.plan.chunkTokens = 256;
  options.plan.gpuChip = "none";
  std::vector<BundlePlan> plans;
  for (int candidates : {1, 64}) {
    SCOPED_TRACE(std::to_string(candidates) + " candidates");
    options.plan.candidates = candidates;
    planning::Planner planner(*cost, request, options.plan);
    std::optional<planning::Evaluation> chosen =
        planner.plan(planning::Strategy::Joint);
    ASSERT_TRUE(chosen);
    StatusOr<PlanBundle> planned =
        compileChosen(*model, "", cost, request, "joint", *chosen, options);
    StatusOr<PlanBundle> searched =
        compileRestore(*model, "", target_, request, options);
    ASSERT_TRUE(planned) << planned.status().toString();
    ASSERT_TRUE(searched) << searched.status().toString();
    EXPECT_TRUE(searched->plans.front().sameSchedule(planned->plans.front()));
    plans.push_back(searched->plans.front());
  }
  EXPECT_FALSE(plans[0].sameSchedule(plans[1]))
      << "the candidates no longer change this request's plan";
}

// The bundle an in-process compile hands the runtime is the bundle its
// JSON (kvc-emit-bundle's) reads back as: written, parsed and written again,
// the text is the same.
TEST_F(CompileRestoreTest, TheBundleBuiltInMemoryIsTheOneItsJsonReads) {
  CompileRestoreOptions options;
  options.plan.strategies = {planning::Strategy::Kv, planning::Strategy::Joint};
  options.plan.chunkTokens = 64;
  options.plan.gpuChip = "sm_90";
  StatusOr<PlanBundle> bundle =
      compileRestore(model_, "fp", target_, request_, options);
  ASSERT_TRUE(bundle) << bundle.status().toString();
  ASSERT_FALSE(bundle->kernels.empty());
  std::string written;
  llvm::raw_string_ostream os(written);
  compiler::writePlanBundle(*bundle, os);
  StatusOr<PlanBundle> read = parsePlanBundle(written);
  ASSERT_TRUE(read) << read.status().toString();
  std::string again;
  llvm::raw_string_ostream os2(again);
  compiler::writePlanBundle(*read, os2);
  EXPECT_EQ(written, again);
  ASSERT_EQ(read->plans.size(), bundle->plans.size());
  for (std::size_t i = 0; i < read->plans.size(); ++i)
    EXPECT_TRUE(read->plans[i].sameSchedule(bundle->plans[i]));
}

TEST_F(CompileRestoreTest, AnUnknownChipIsAnError) {
  CompileRestoreOptions options;
  options.plan.strategies = {planning::Strategy::Kv};
  options.plan.gpuChip = "sm_1";
  StatusOr<PlanBundle> bundle =
      compileRestore(model_, "", target_, request_, options);
  ASSERT_FALSE(bundle);
  EXPECT_NE(bundle.status().message().find(
                "compiling a kv plan: targets chip \"sm_1\", which NVPTX "
                "does not know"),
            std::string::npos)
      << bundle.status().message();
}

} // namespace
} // namespace kvc
