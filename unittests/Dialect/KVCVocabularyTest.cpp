//===- KVCVocabularyTest.cpp - The dialect speaks kvc's vocabulary --------===//

#include "kvc/Dialect/KVC/IR/KVCVocabulary.h"
#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Planning/Pipeline.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::kvc;

namespace {

TEST(KVCVocabularyTest, EnumsHaveTheVocabularysNames) {
  for (int i = 0; i < ::kvc::kNumForms; ++i) {
    auto form = static_cast<::kvc::Form>(i);
    EXPECT_EQ(stringifyForm(fromVocabulary(form)), ::kvc::name(form));
  }
  for (int i = 0; i < ::kvc::kNumResources; ++i) {
    auto resource = static_cast<::kvc::Resource>(i);
    EXPECT_EQ(stringifyResource(fromVocabulary(resource)),
              ::kvc::name(resource));
  }
  for (int i = 0; i < ::kvc::kNumCodecStages; ++i) {
    auto stage = static_cast<::kvc::CodecStage>(i);
    EXPECT_EQ(stringifyCodecStage(fromVocabulary(stage)), ::kvc::name(stage));
  }
  // And no more of them than the vocabulary has.
  EXPECT_FALSE(symbolizeForm(::kvc::kNumForms));
  EXPECT_FALSE(symbolizeResource(::kvc::kNumResources));
  EXPECT_FALSE(symbolizeCodecStage(::kvc::kNumCodecStages));
}

TEST(KVCVocabularyTest, EveryStepKindIsADataflowOp) {
  MLIRContext context;
  context.loadDialect<KVCDialect>();
  for (int i = 0; i < ::kvc::kNumStepKinds; ++i) {
    std::string op =
        std::string("kvc.") + ::kvc::name(static_cast<::kvc::StepKind>(i));
    std::optional<RegisteredOperationName> name =
        RegisteredOperationName::lookup(op, &context);
    ASSERT_TRUE(name) << op << " is not an op of the kvc dialect";
    EXPECT_TRUE(name->hasInterface<DataflowOpInterface>()) << op;
  }
}

TEST(KVCVocabularyTest, EveryStepRunsWhereThePipelinePutsIt) {
  // The resources the dialect lets each op run on (its ODS list) include
  // the one planning::stepResource assigns it, in either space.
  MLIRContext context;
  context.loadDialect<KVCDialect>();
  OpBuilder builder(&context);
  for (int i = 0; i < ::kvc::kNumStepKinds; ++i) {
    auto kind = static_cast<::kvc::StepKind>(i);
    OperationState state(builder.getUnknownLoc(),
                         std::string("kvc.") + ::kvc::name(kind));
    Operation *op = Operation::create(state); // Never verified: no operands.
    for (bool onHost : {true, false}) {
      Resource resource =
          fromVocabulary(::kvc::planning::stepResource(kind, onHost));
      EXPECT_TRUE(cast<DataflowOpInterface>(op).canRunOn(resource))
          << ::kvc::name(kind) << " on " << stringifyResource(resource).str();
    }
    op->destroy();
  }
}

TEST(KVCVocabularyTest, NamesParseBack) {
  for (int i = 0; i < ::kvc::kNumStepKinds; ++i) {
    auto kind = static_cast<::kvc::StepKind>(i);
    EXPECT_EQ(::kvc::parseStepKind(::kvc::name(kind)), kind);
  }
  EXPECT_EQ(::kvc::parseForm("hidden"), ::kvc::Form::Hidden);
  EXPECT_FALSE(::kvc::parseForm("KV"));
  EXPECT_EQ(::kvc::poolName(::kvc::Resource::IO, "ssd"), "io:ssd");
  EXPECT_EQ(::kvc::poolName(::kvc::Resource::H2D), "h2d");
}

} // namespace
