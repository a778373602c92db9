//===- KVCVocabularyTest.cpp - The dialect speaks kvc's vocabulary --------===//

#include "kvc/Dialect/KVC/IR/KVCVocabulary.h"
#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Planning/Pipeline.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace kvc::compiler;

namespace {

TEST(KVCVocabularyTest, EnumsHaveTheVocabularysNames) {
  for (int i = 0; i < kvc::kNumForms; ++i) {
    auto form = static_cast<kvc::Form>(i);
    EXPECT_EQ(stringifyForm(fromVocabulary(form)), kvc::name(form));
  }
  for (int i = 0; i < kvc::kNumResources; ++i) {
    auto resource = static_cast<kvc::Resource>(i);
    EXPECT_EQ(stringifyResource(fromVocabulary(resource)), kvc::name(resource));
  }
  for (int i = 0; i < kvc::kNumCodecStages; ++i) {
    auto stage = static_cast<kvc::CodecStage>(i);
    EXPECT_EQ(stringifyCodecStage(fromVocabulary(stage)), kvc::name(stage));
  }
  // And no more of them than the vocabulary has.
  EXPECT_FALSE(symbolizeForm(kvc::kNumForms));
  EXPECT_FALSE(symbolizeResource(kvc::kNumResources));
  EXPECT_FALSE(symbolizeCodecStage(kvc::kNumCodecStages));
}

// The dialect's codec enums are the codec registry's rows: each row's name
// is the case of its enumerator, every case but "none" is a row, and a
// quantization is also data a rate holds on.
TEST(KVCVocabularyTest, CodecEnumsAreTheRegistrysRows) {
  using kvc::StageKind;
  auto caseOf = [](const kvc::CodecStageInfo &row) -> std::string {
    switch (row.kind) {
    case StageKind::Transform:
      return stringifyTransform(Transform(row.enumerator)).str();
    case StageKind::Quant:
      return stringifyQuant(Quant(row.enumerator)).str();
    case StageKind::Lossless:
      return stringifyLossless(Lossless(row.enumerator)).str();
    }
    return "";
  };
  for (const kvc::CodecStageInfo &row : kvc::codecStages()) {
    EXPECT_EQ(caseOf(row), row.name);
    EXPECT_EQ(stringifyCodecStage(fromVocabulary(row.rate)),
              kvc::name(row.rate));
    if (row.kind == StageKind::Quant) {
      std::optional<CodecData> data = symbolizeCodecData(row.name);
      EXPECT_TRUE(data) << row.name << " is no #kvc.codec_rate data";
    }
  }
  EXPECT_FALSE(symbolizeTransform(1 + kvc::countStages(StageKind::Transform)));
  EXPECT_FALSE(symbolizeQuant(1 + kvc::countStages(StageKind::Quant)));
  EXPECT_FALSE(symbolizeLossless(1 + kvc::countStages(StageKind::Lossless)));
  // "any", "raw" and the quantizations.
  EXPECT_FALSE(symbolizeCodecData(2 + kvc::countStages(StageKind::Quant)));
}

TEST(KVCVocabularyTest, EveryStepKindIsADataflowOp) {
  MLIRContext context;
  context.loadDialect<KVCDialect>();
  for (int i = 0; i < kvc::kNumStepKinds; ++i) {
    std::string op =
        std::string("kvc.") + kvc::name(static_cast<kvc::StepKind>(i));
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
  for (int i = 0; i < kvc::kNumStepKinds; ++i) {
    auto kind = static_cast<kvc::StepKind>(i);
    OperationState state(builder.getUnknownLoc(),
                         std::string("kvc.") + kvc::name(kind));
    Operation *op = Operation::create(state); // Never verified: no operands.
    for (bool onHost : {true, false}) {
      Resource resource =
          fromVocabulary(kvc::planning::stepResource(kind, onHost));
      EXPECT_TRUE(cast<DataflowOpInterface>(op).canRunOn(resource))
          << kvc::name(kind) << " on " << stringifyResource(resource).str();
    }
    op->destroy();
  }
}

TEST(KVCVocabularyTest, NamesParseBack) {
  for (int i = 0; i < kvc::kNumStepKinds; ++i) {
    auto kind = static_cast<kvc::StepKind>(i);
    EXPECT_EQ(kvc::parseStepKind(kvc::name(kind)), kind);
  }
  EXPECT_EQ(kvc::parseForm("hidden"), kvc::Form::Hidden);
  EXPECT_FALSE(kvc::parseForm("KV"));
  EXPECT_EQ(kvc::poolName(kvc::Resource::IO, "ssd"), "io:ssd");
  EXPECT_EQ(kvc::poolName(kvc::Resource::H2D), "h2d");
}

} // namespace
